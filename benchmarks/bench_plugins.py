"""Plugin manager speed, printed with baselines measured in the same run.

1. ``plugin-llm plugins list`` with 50 user plugins, whole process, against
   ``python -c pass`` (target < 300 ms; it must not import litellm).
2. Discovery + load of 200 trivial plugins, in process (target < 200 ms).
3. ``invoke_hook`` overhead per callback with 10 callbacks, against calling the
   10 functions directly (target < 5 µs). On the main thread callbacks run inline
   under an interval timer (the time limit); from any other thread they are
   handed to a worker thread, shown as a second line for comparison.

Printed, not asserted: ``python benchmarks/bench_plugins.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PLUGIN_CODE = textwrap.dedent(
    '''
    SCHEMA = {"description": "tool {i}", "parameters": {"type": "object", "properties": {}}}

    def handler(args):
        return "ok"

    def register(ctx):
        ctx.register_tool("tool_{i}", SCHEMA, handler)
        ctx.register_hook("post_tool_call", lambda tool_name, params, result: None)
        ctx.register_command("cmd-{i}", lambda raw: raw)
    '''
)


def make_home(root: Path, count: int) -> Path:
    home = root / f"home-{count}"
    plugins = home / "plugins"
    names = [f"plugin-{i:03d}" for i in range(count)]
    for i, name in enumerate(names):
        d = plugins / name
        d.mkdir(parents=True)
        (d / "plugin.yaml").write_text(f'name: {name}\nversion: "1.{i}"\ndescription: benchmark plugin {i}\n')
        (d / "__init__.py").write_text(PLUGIN_CODE.replace("{i}", str(i)))
    (home / "config.yaml").write_text("plugins:\n  enabled:\n" + "".join(f"    - {n}\n" for n in names))
    return home


def cli_command() -> list[str]:
    script = Path(sys.executable).parent / "plugin-llm"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "plugin_llm.cli.main"]


def run_timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def bench_cli(tmp: Path, rounds: int, *, bytecode: bool) -> None:
    home = make_home(tmp / ("pyc" if bytecode else "nopyc"), 50)
    env = dict(os.environ, HERMES_HOME=str(home))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = cli_command() + ["plugins", "list"]
    baseline = [sys.executable, "-c", "pass"]
    run_timed(cmd, env)  # warm-up: byte-compile, page cache
    run_timed(baseline, env)
    cli, base = [], []
    for _ in range(rounds):  # interleaved so machine noise hits both alike
        base.append(run_timed(baseline, env))
        cli.append(run_timed(cmd, env))
    imports = subprocess.run(cmd, env=dict(env, PYTHONPROFILEIMPORTTIME="1"), capture_output=True, text=True)
    modules = {line.rsplit("|", 1)[-1].strip() for line in imports.stderr.splitlines() if line.startswith("import time:")}
    litellm = any(m == "litellm" or m.startswith("litellm.") for m in modules)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True).stdout
    listed = out.count(" enabled ")
    cli_ms, base_ms = statistics.median(cli) * 1e3, statistics.median(base) * 1e3
    mode = ".pyc written as usual" if bytecode else "PYTHONDONTWRITEBYTECODE=1, fresh plugin dirs: plugins compiled every run"
    print(f"1. `{' '.join(Path(c).name for c in cmd)}` with 50 user plugins ({listed} listed enabled), {rounds} runs, {mode}")
    print(f"   plugins list      median {cli_ms:7.1f} ms   min {min(cli) * 1e3:7.1f} ms   target < 300 ms "
          f"-> {'OK' if cli_ms < 300 else 'OVER'}")
    print(f"   python -c pass    median {base_ms:7.1f} ms   min {min(base) * 1e3:7.1f} ms")
    print(f"   ratio {cli_ms / base_ms:.1f}x the bare interpreter; litellm imported: {'YES' if litellm else 'no'}")


def bench_discovery(tmp: Path, rounds: int) -> None:
    from plugin_llm.plugins import PluginManager

    sys.dont_write_bytecode = False  # measure what an ordinary install does (the first run writes .pyc)
    home = make_home(tmp, 200)
    samples = []
    first = None
    for i in range(rounds + 1):
        manager = PluginManager(home)  # a fresh manager re-imports every plugin (modules purged)
        start = time.perf_counter()
        manager.discover_plugins()
        elapsed = time.perf_counter() - start
        if i == 0:
            first = elapsed
            loaded = sum(1 for p in manager.list_plugins() if p["status"] == "enabled")
            tools = len(manager.tools)
        else:
            samples.append(elapsed)
    ms = statistics.median(samples) * 1e3
    print(f"2. discovery + load of 200 trivial plugins ({loaded} loaded, {tools} tools), {rounds} runs")
    print(f"   median {ms:7.1f} ms   min {min(samples) * 1e3:7.1f} ms   target < 200 ms -> {'OK' if ms < 200 else 'OVER'}")
    print(f"   first run {first * 1e3:7.1f} ms (compiles 200 sources and writes their .pyc; once per install)")
    print(f"   per plugin {ms / 200 * 1e3:6.1f} µs")


def bench_hooks(tmp: Path, iterations: int) -> None:
    from plugin_llm.plugins import PluginManager

    home = tmp / "hook-home"
    home.mkdir()
    manager = PluginManager(home)
    manager.discover_plugins()

    def make(i: int):
        def callback(tool_name, params, result):  # the seed hello-world signature: needs the params alias
            return None
        return callback

    callbacks = [make(i) for i in range(10)]
    for cb in callbacks:
        manager._hooks.register("post_tool_call", "bench", cb)
    kwargs = {"tool_name": "t", "args": {"x": 1}, "result": "r", "task_id": "task"}

    def direct() -> None:
        for cb in callbacks:
            cb(tool_name="t", params=kwargs["args"], result="r")

    def hooked() -> None:
        manager.invoke_hook("post_tool_call", **kwargs)

    for fn in (direct, hooked):  # warm-up
        for _ in range(200):
            fn()
    rounds = 7
    per = {"direct": [], "invoke_hook": []}
    for _ in range(rounds):
        for name, fn in (("direct", direct), ("invoke_hook", hooked)):
            start = time.perf_counter()
            for _ in range(iterations):
                fn()
            per[name].append((time.perf_counter() - start) / iterations)
    direct_us = statistics.median(per["direct"]) * 1e6
    hook_us = statistics.median(per["invoke_hook"]) * 1e6
    overhead = (hook_us - direct_us) / 10
    print(f"3. invoke_hook with 10 callbacks, {iterations} invocations x {rounds} rounds")
    print(f"   direct calls      {direct_us:7.2f} µs per 10 callbacks")
    print(f"   invoke_hook       {hook_us:7.2f} µs per 10 callbacks  ({hook_us / direct_us:.0f}x)")
    print(f"   overhead          {overhead:7.2f} µs per callback   target < 5 µs -> {'OK' if overhead < 5 else 'OVER'}")

    box: dict[str, float] = {}

    def off_main() -> None:  # the worker-pool path: invoke_hook called from a non-main thread
        for _ in range(200):
            hooked()
        start = time.perf_counter()
        for _ in range(iterations // 4):
            hooked()
        box["us"] = (time.perf_counter() - start) / (iterations // 4) * 1e6

    worker = threading.Thread(target=off_main)
    worker.start()
    worker.join()
    print(f"   from another thread (worker-pool path): {box['us']:7.2f} µs per 10 callbacks, "
          f"{(box['us'] - direct_us) / 10:.2f} µs per callback")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-plugins-"))
    try:
        print(f"python {sys.version.split()[0]} on {sys.platform}, {os.cpu_count()} CPUs\n")
        bench_cli(tmp, 5 if args.quick else 15, bytecode=True)
        print()
        bench_cli(tmp, 5 if args.quick else 15, bytecode=False)
        print()
        bench_discovery(tmp, 3 if args.quick else 10)
        print()
        bench_hooks(tmp, 2_000 if args.quick else 20_000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
