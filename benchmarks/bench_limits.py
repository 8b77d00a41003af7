"""Cost of per-plugin limits (issue 11): admission + settlement per call, no limits / local / redis.

Measured in one run, interleaved so that machine noise hits every contender
alike, against a ``PluginLlm.complete`` on the local model served over HTTP
on 127.0.0.1 (the same call ``bench_gateway.py`` measures). Until the limits
layer is wired into the call pipeline, a limited call is simulated the way
the wiring will do it: ``limits.admit`` (worst-case estimate + one store
transaction / one Redis script) before ``complete`` and ``Ticket.settle``
after it. Then 64 concurrent async calls, limits on vs off.

Targets: ``local`` adds under 2% to a call, ``redis`` under 5% on loopback.
Printed, not asserted: ``python benchmarks/bench_limits.py [--quick]``.
Needs ``redis-server`` on PATH for the redis rows (skipped with a note otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_gateway import server_process  # noqa: E402  (the local model in its own process)

MESSAGES = [{"role": "user", "content": "Benchmark ping: say something short."}]
BLOCK = 10
PLUGIN = "bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class redis_process:
    """redis-server on a free loopback port, no persistence; None when it is not installed."""

    def __enter__(self) -> "redis_process | None":
        binary = shutil.which("redis-server")
        if binary is None:
            return None
        self.port = _free_port()
        self.tmp = tempfile.TemporaryDirectory()
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.tmp.name],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.02)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        return self

    def __exit__(self, *exc: object) -> None:
        if getattr(self, "proc", None) is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.tmp.cleanup()


def config_text(base_url: str, store: str | None, redis_url: str | None) -> str:
    text = f"model:\n  provider: custom\n  model: local-echo-1\n  base_url: {base_url}\n"
    if store is None:
        return text
    text += f"limits:\n  store: {store}\n"
    if redis_url:
        text += f"  redis_url: {redis_url}\n"
    text += ('  prices:\n    "custom/local-echo-1": {input_per_mtok: 0.15, output_per_mtok: 0.60}\n'
             "plugins:\n  entries:\n    bench:\n      limits:\n"
             "        budget_usd: {day: 100000, month: 1000000}\n"
             "        requests_per_minute: 100000000\n        tokens_per_minute: 1000000000000\n"
             "        max_concurrent: 1000\n")
    return text


def limit_settings(text: str):
    import yaml

    from plugin_llm.limits import parse_limit_settings

    data = yaml.safe_load(text)
    settings, issues = parse_limit_settings(data.get("limits"), data.get("plugins"))
    errors = [str(i) for i in issues if i.severity == "error"]
    if errors:
        raise SystemExit("bad benchmark config: " + "; ".join(errors))
    return settings


class admission_pair:
    """One admission + settlement through the facade, as the wired pipeline will make it."""

    def __init__(self, settings, home: Path) -> None:
        from plugin_llm.types import PluginLlmUsage

        self.settings, self.home = settings, home
        self.usage = PluginLlmUsage(input_tokens=12, output_tokens=20, total_tokens=32, cost_usd=None)
        self.ticket = None

    def admit(self) -> None:
        from plugin_llm import limits

        self.ticket = limits.admit(self.settings, self.home, PLUGIN, messages=MESSAGES, provider="custom",
                                   model="local-echo-1", max_tokens=256, deadline=time.monotonic() + 30)

    def settle(self) -> None:
        self.ticket.settle(self.usage)

    def __call__(self) -> None:
        self.admit()
        self.settle()


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def bench_sync(base_url: str, home: Path, redis_url: str | None, rounds: int) -> dict[str, float]:
    from plugin_llm import PluginLlm

    llm = PluginLlm(PLUGIN, home=home)
    stores = {"no limits": limit_settings(config_text(base_url, None, None)),
              "local": limit_settings(config_text(base_url, "local", None))}
    if redis_url:
        stores["redis"] = limit_settings(config_text(base_url, "redis", redis_url))
    pairs = {name: admission_pair(settings, home) for name, settings in stores.items()}

    def complete() -> None:
        llm.complete(MESSAGES)

    log_fd = os.open(home / "bench-append.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lock_fd = os.open(home / "bench-append.lock", os.O_RDWR | os.O_CREAT, 0o600)
    line = b"x" * 200 + b"\n"

    def complete_then_append() -> None:
        # control: any work with system calls right after a call lets the background
        # work litellm leaves behind run right then (see bench_gateway.py) -- that
        # time is litellm's, charged to whoever makes the next system call
        complete()
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        os.write(log_fd, line)
        fcntl.flock(lock_fd, fcntl.LOCK_UN)

    contenders: dict[str, object] = {"PluginLlm.complete": complete, "complete + one locked append": complete_then_append}
    in_context: dict[str, list[float]] = {name: [] for name in pairs}
    for name, pair in pairs.items():
        contenders[f"admit+settle {name}"] = pair

        def limited(pair=pair, spent=in_context[name]) -> None:
            # admission, the call, settlement: the store work times as it costs in the pipeline
            # (caches cold after a call), measured on its own
            t0 = time.perf_counter()
            pair.admit()
            t1 = time.perf_counter()
            complete()
            t2 = time.perf_counter()
            pair.settle()
            spent.append(t1 - t0 + time.perf_counter() - t2)

        contenders[f"complete + {name}"] = limited
    for fn in contenders.values():  # warm-up: pools, lazy imports, the price map, the SQLite file, the script cache
        for _ in range(30):
            fn()
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            reps = BLOCK if not name.startswith("admit+settle") else BLOCK * 20
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            wall[name].append((time.perf_counter() - t0) / reps)
    out = {name: median_us(s) for name, s in wall.items()}
    out.update({f"in context {name}": median_us(s) for name, s in in_context.items()})
    return out


def bench_async(base_url: str, home: Path, redis_url: str | None, calls: int, concurrency: int, repeats: int) -> dict[str, float]:
    from plugin_llm import PluginLlm, limits
    from plugin_llm.types import PluginLlmUsage

    llm = PluginLlm(PLUGIN + "-async", home=home)
    variants = {"off": None, "local": limit_settings(config_text(base_url, "local", None))}
    if redis_url:
        variants["redis"] = limit_settings(config_text(base_url, "redis", redis_url))
    usage = PluginLlmUsage(input_tokens=12, output_tokens=20, total_tokens=32)

    async def one(settings) -> None:
        if settings is None:
            await llm.acomplete(MESSAGES)
            return
        ticket = limits.admit(settings, home, PLUGIN, messages=MESSAGES, provider="custom", model="local-echo-1",
                              max_tokens=256, deadline=time.monotonic() + 30)  # inline, as in the pipeline
        try:
            await llm.acomplete(MESSAGES)
        finally:
            ticket.settle(usage)

    async def run(settings) -> float:
        sem = asyncio.Semaphore(concurrency)

        async def bounded() -> None:
            async with sem:
                await one(settings)

        t0 = time.perf_counter()
        await asyncio.gather(*(bounded() for _ in range(calls)))
        return time.perf_counter() - t0

    async def main() -> dict[str, list[float]]:
        for settings in variants.values():
            await run(settings)  # warm-up
        out: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(repeats):
            for name, settings in variants.items():
                out[name].append(await run(settings))
        return out

    results = asyncio.run(main())
    return {name: calls / statistics.median(v) for name, v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds, calls, repeats = (10, 200, 1) if args.quick else (60, 1000, 3)

    with tempfile.TemporaryDirectory() as tmp, server_process() as server, redis_process() as redis:
        home = Path(tmp)
        (home / "config.yaml").write_text(config_text(server.base_url, None, None))
        redis_url = redis.url if redis else None
        print(f"server: {server.base_url}   redis: {redis_url or 'redis-server not installed, skipped'}   "
              f"python {sys.version.split()[0]}   cores: {os.cpu_count()}")
        print(f"\n== sync, per call: median over {rounds} interleaved rounds ==")
        sync = bench_sync(server.base_url, home, redis_url, rounds)
        base = sync["PluginLlm.complete"]
        print(f"  {'PluginLlm.complete (local model over HTTP)':<44} {base:9.1f} µs")
        print("  admission + settlement per call (back to back, warm caches):")
        for name in ("no limits", "local", "redis"):
            key = f"admit+settle {name}"
            if key not in sync:
                continue
            target = {"local": "target < 2%", "redis": "target < 5%"}.get(name, "")
            print(f"    {name:<42} {sync[key]:9.1f} µs = {sync[key] / base * 100:5.2f}% of a call   {target}")
        print("  admission + settlement per call, timed around each complete() (caches cold after the call):")
        for name in ("no limits", "local", "redis"):
            key = f"in context {name}"
            if key in sync:
                print(f"    {name:<42} {sync[key]:9.1f} µs = {sync[key] / base * 100:5.2f}% of a call")
        print("  whole limited calls (noisier: machine load and litellm's background work land anywhere):")
        control = sync["complete + one locked append"]
        print(f"    {'complete + one locked append (control)':<42} {control:9.1f} µs   (end to end: {(control / base - 1) * 100:+.1f}% vs complete)")
        for name in ("no limits", "local", "redis"):
            key = f"complete + {name}"
            if key in sync:
                print(f"    {key:<42} {sync[key]:9.1f} µs   (end to end: {(sync[key] / base - 1) * 100:+.1f}% vs complete)")

        print(f"\n== async, {calls} calls at concurrency 64, median of {repeats} ==")
        thr = bench_async(server.base_url, home, redis_url, calls, 64, repeats)
        for name, per_s in thr.items():
            rel = "" if name == "off" else f"   ({(per_s / thr['off'] - 1) * 100:+.1f}% vs off)"
            print(f"  limits {name:<6} {per_s:9.1f} calls/s{rel}")
        from plugin_llm import limits

        limits.close_stores()  # apply queued settlements while the stores are still up


if __name__ == "__main__":
    main()
