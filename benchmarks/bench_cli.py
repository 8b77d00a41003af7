"""Operator CLI start-up, printed with a baseline measured in the same run.

Whole-process time of ``plugin-llm plugins list``, ``trust show``, ``trust check``
and ``doctor`` in a temporary home with 50 installed plugins (all enabled, a few
with trust entries), as the median of N runs each, against ``python -c pass``.
Target: < 300 ms each, and none of them imports litellm (checked from a
``-X importtime`` run of each command). ``plugins enable --dry-run`` is shown
too (it is the one that loads ruamel.yaml to edit config.yaml).

A command whose module does not exist yet is skipped and said so.

Printed, not asserted: ``python benchmarks/bench_cli.py [--quick] [--runs N]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 300.0
PLUGINS = 50

PLUGIN_CODE = textwrap.dedent(
    '''
    SCHEMA = {"description": "tool {i}", "parameters": {"type": "object", "properties": {}}}

    def register(ctx):
        ctx.register_tool("tool_{i}", SCHEMA, lambda args: "ok")
        ctx.register_hook("post_tool_call", lambda tool_name, params, result: None)
        ctx.register_command("cmd-{i}", lambda raw: raw)
    '''
)

#: (label, argv after plugin-llm, module that must exist)
COMMANDS = [
    ("plugins list", ["plugins", "list"], "plugin_llm.cli.plugins_cmd"),
    ("trust show", ["trust", "show"], "plugin_llm.cli.trust_cmd"),
    ("trust check", ["trust", "check"], "plugin_llm.cli.trust_cmd"),
    ("doctor", ["doctor"], "plugin_llm.cli.doctor_cmd"),
    ("plugins enable --dry-run", ["plugins", "enable", "plugin-000", "--dry-run"], "plugin_llm.cli.plugins_cmd"),
]
TARGETED = {"plugins list", "trust show", "trust check", "doctor"}


def make_home(root: Path, count: int) -> Path:
    home = root / "home"
    plugins = home / "plugins"
    names = [f"plugin-{i:03d}" for i in range(count)]
    for i, name in enumerate(names):
        d = plugins / name
        d.mkdir(parents=True)
        (d / "plugin.yaml").write_text(f'name: {name}\nversion: "1.{i}"\ndescription: benchmark plugin {i}\n')
        (d / "__init__.py").write_text(PLUGIN_CODE.replace("{i}", str(i)))
    entries = "".join(
        f"    {n}:\n      llm:\n        allow_model_override: true\n        allowed_models: [local-echo-1]\n"
        for n in names[:10]
    )
    (home / "config.yaml").write_text(
        "# benchmark home\nmodel:\n  provider: local\n  model: local-echo-1\n"
        "plugins:\n  enabled:\n" + "".join(f"    - {n}  # plugin {n}\n" for n in names[1:])
        + "  entries:\n" + entries
    )
    os.chmod(home / "config.yaml", 0o600)
    (home / "logs").mkdir()
    return home


def cli_prefix() -> list[str]:
    return [sys.executable, "-m", "plugin_llm.cli.main"]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start, proc.returncode


def median_ms(cmd: list[str], env: dict[str, str], runs: int) -> tuple[float, int]:
    timed(cmd, env)  # warm-up: byte-compile, page cache
    samples, code = [], 0
    for _ in range(runs):
        seconds, code = timed(cmd, env)
        samples.append(seconds * 1000)
    return statistics.median(samples), code


def imported(cmd_args: list[str], env: dict[str, str]) -> set[str]:
    """Top-level packages the command imports (from ``-X importtime``)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "plugin_llm.cli.main", *cmd_args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[-1].strip().split(".")[0])
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (5)")
    parser.add_argument("--runs", type=int, default=None, help="runs per command (default 15, --quick 5)")
    args = parser.parse_args()
    runs = args.runs or (5 if args.quick else 15)

    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        home = make_home(Path(tmp), PLUGINS)
        env = dict(os.environ, HERMES_HOME=str(home), HOME=str(Path(tmp) / "user"), PYTHONPATH=str(ROOT))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        base, _ = median_ms([sys.executable, "-c", "pass"], env, runs)

        print(f"plugin-llm CLI start-up: {PLUGINS} plugins installed and enabled, median of {runs} runs, "
              f"Python {sys.version.split()[0]}")
        print(f"{'command':<26} {'median ms':>10} {'vs python':>10} {'target':>8} {'litellm':>8} {'ruamel':>7} {'exit':>5}")
        print(f"{'python -c pass':<26} {base:>10.1f} {'1.0x':>10}")
        worst = 0.0
        for label, argv, module in COMMANDS:
            if importlib.util.find_spec(module) is None:
                print(f"{label:<26} {'skipped: ' + module + ' does not exist yet':>40}")
                continue
            ms, code = median_ms(cli_prefix() + argv, env, runs)
            mods = imported(argv, env)
            litellm = "YES" if "litellm" in mods else "no"
            ruamel = "yes" if "ruamel" in mods else "no"
            target = f"<{TARGET_MS:.0f}" if label in TARGETED else "-"
            verdict = ""
            if label in TARGETED:
                worst = max(worst, ms)
                verdict = "  OK" if ms < TARGET_MS and litellm == "no" else "  OVER" if ms >= TARGET_MS else "  LITELLM"
            print(f"{label:<26} {ms:>10.1f} {ms / base:>9.1f}x {target:>8} {litellm:>8} {ruamel:>7} {code:>5}{verdict}")
        if worst:
            print(f"slowest targeted command: {worst:.1f} ms ({'within' if worst < TARGET_MS else 'over'} the "
                  f"{TARGET_MS:.0f} ms target); exit codes are the commands' own (doctor warns on a bare home)")


if __name__ == "__main__":
    main()
