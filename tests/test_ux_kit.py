"""Issue 13 item 3: the author kit — `plugins new` scaffolds a plugin whose test passes as
generated, plugin_llm.testing (a real ctx on a temporary home, scripted replies), py.typed."""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tests.test_ux_cli import ROOT, cli


def test_scaffolded_plugins_pass_their_own_tests_and_run(hermes_home: Path, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    for name, kind in (("summ", "command"), ("counter", "tool"), ("hinter", "hook")):
        made = cli(hermes_home, "plugins", "new", name, "--kind", kind, "--dir", str(work))
        assert made.returncode == 0, made.stderr
        assert {"plugin.yaml", "__init__.py", "README.md", "tests"} <= {p.name for p in (work / name).iterdir()}
        assert "ctx.llm.complete" in (work / name / "__init__.py").read_text()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "user-home")}
    env.pop("HERMES_HOME", None)  # the generated tests make their own homes
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            *(str(work / n / "tests") for n in ("summ", "counter", "hinter"))],
                           cwd=str(work), env=env, capture_output=True, text=True, timeout=180)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "8 passed" in tests.stdout  # 2 per plugin + the tool's and the hook's own
    # and it works as installed for development
    assert cli(hermes_home, "plugins", "install", "--link", str(work / "summ"), "--enable").returncode == 0
    run = cli(hermes_home, "run", "summ", "First sentence here. Second one.")
    assert run.returncode == 0 and run.stdout.strip(), run.stderr
    assert cli(hermes_home, "plugins", "new", "summ", "--dir", str(work)).returncode == 2  # never overwrites


def test_scaffold_rejects_bad_names(hermes_home: Path, tmp_path: Path):
    for name in ("help", "../x", "a b"):
        out = cli(hermes_home, "plugins", "new", name, "--dir", str(tmp_path))
        assert out.returncode == 2 and "Traceback" not in out.stderr, (name, out.stderr)


def _plugin(where: Path, body: str) -> Path:
    where.mkdir(parents=True)
    (where / "plugin.yaml").write_text(f"name: {where.name}\nversion: 0.1.0\n")
    (where / "__init__.py").write_text(body)
    return where


def test_testing_harness_scripts_replies_and_gives_a_real_ctx(tmp_path: Path):
    from plugin_llm.testing import load_plugin

    plugin_dir = _plugin(tmp_path / "echoer", (
        "def register(ctx):\n"
        "    ctx.register_command('ask', lambda raw: ctx.llm.complete([{'role': 'user', 'content': raw}]).text)\n"))
    before = os.environ.get("HERMES_HOME")
    with load_plugin(plugin_dir, replies=["first", "second"]) as plugin:
        assert os.environ["HERMES_HOME"] == str(plugin.home)
        assert plugin.run_command("ask", "a") == "first"
        assert plugin.ctx.llm.complete([{"role": "user", "content": "b"}]).text == "second"
        assert plugin.run_command("ask", "c").startswith("Local model reply to")  # script used up: the rules
        assert [c["plugin_id"] for c in plugin.calls()] == ["echoer"] * 3
        home = plugin.home
    assert os.environ.get("HERMES_HOME") == before and not home.exists()
    with load_plugin(plugin_dir, replies=lambda messages: messages[-1]["content"].upper()) as plugin:
        assert plugin.run_command("ask", "shout") == "SHOUT"


def test_testing_harness_reports_a_load_failure_with_the_plugin_frames(tmp_path: Path):
    from plugin_llm.testing import PluginLoadError, load_plugin

    plugin_dir = _plugin(tmp_path / "broken", "def register(ctx):\n    raise ValueError('bad setup')\n")
    with pytest.raises(PluginLoadError) as info:
        with load_plugin(plugin_dir):
            pass
    assert "bad setup" in str(info.value) and "__init__.py:2 in register" in str(info.value)


def test_package_is_typed_and_ctx_llm_is_annotated():
    import plugin_llm
    from plugin_llm.llm import PluginLlm
    from plugin_llm.plugins.context import PluginContext

    assert (Path(plugin_llm.__file__).parent / "py.typed").is_file()
    hints = typing.get_type_hints(PluginContext.llm.fget, globalns={"PluginLlm": PluginLlm})
    assert hints["return"] is PluginLlm


def test_harness_config_is_merged_not_appended(tmp_path: Path):
    from plugin_llm.errors import PluginLlmQuotaError, PluginLlmTrustError
    from plugin_llm.testing import PluginLoadError, load_plugin

    plugin_dir = _plugin(tmp_path / "picky", (
        "def register(ctx):\n"
        "    ctx.register_command('ask', lambda raw: ctx.llm.complete([{'role': 'user', 'content': raw}],"
        " model=raw or None).text)\n"))
    # a trust block as YAML text: merged with the harness's own plugins.enabled, not appended after it
    trust_yaml = "plugins:\n  entries:\n    picky:\n      llm:\n        allow_model_override: true\n"
    with load_plugin(plugin_dir, config=trust_yaml, replies=["granted"]) as plugin:
        assert plugin.run_command("ask", "local-echo-1") == "granted"
    with load_plugin(plugin_dir, trust={"allow_model_override": True}, replies=["granted"]) as plugin:
        assert plugin.run_command("ask", "local-echo-1") == "granted"
    with load_plugin(plugin_dir) as plugin:  # no trust block: the override is refused
        with pytest.raises(PluginLlmTrustError):
            plugin.run_command("ask", "local-echo-1")
    with load_plugin(plugin_dir, limits={"tokens_per_minute": 1}) as plugin:
        with pytest.raises(PluginLlmQuotaError):
            plugin.run_command("ask", "")
    # a config that drops the plugin from plugins.enabled: the error names the cause
    with pytest.raises(PluginLoadError, match=r"plugins\.enabled.*without 'picky'"):
        with load_plugin(plugin_dir, config={"plugins": {"enabled": ["other"]}}):
            pass
    with pytest.raises(PluginLoadError, match="must be a YAML mapping"):
        with load_plugin(plugin_dir, config="- a list"):
            pass
