"""A non-editable install ships the example plugins and config, so
`plugin-llm demo` works from a wheel; `plugin-llm --version` names the installed version."""

from __future__ import annotations

import pytest

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", "tests",
                               "benchmarks", "*.pyc")


@pytest.mark.slow
def test_wheel_installed_in_a_fresh_venv_runs_the_demo(tmp_path: Path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP, symlinks=True)  # a copy: the build writes nothing in the checkout
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = wheels.glob("plugin_llm_gateway-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    # the dependencies (litellm, PyYAML, ...) come from this interpreter's site-packages; its .pth files are
    # not processed there, so the checkout's editable install is not visible: plugin_llm is the wheel's
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "elsewhere"  # not a checkout: no ./config_examples to fall back on
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HERMES_HOME=str(tmp_path / "home"), HOME=str(tmp_path / "user-home"))
    where = subprocess.run([str(python), "-c", "import plugin_llm; print(plugin_llm.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(venv)), where
    version = subprocess.run([str(venv / "bin" / "plugin-llm"), "--version"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == "plugin-llm 0.1.0", version.stderr
    demo = subprocess.run([str(venv / "bin" / "plugin-llm"), "demo"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=180)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "config_examples" not in demo.stderr
    assert "tldr" in demo.stdout and "audit" in demo.stdout.lower()
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir())  # the demo's own home
