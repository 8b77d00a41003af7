"""Cost of per-plugin limits (issue 11): admission + settlement per call, no limits / local / redis.

Measured in one run, interleaved so that machine noise hits every contender
alike, against a ``PluginLlm.complete`` on the local model served over HTTP
on 127.0.0.1 (the server in its own process, so its CPU is not counted here;
the same call ``bench_gateway.py`` measures). Each store is measured twice:
``per call`` (one store step per admission, the design before leases:
``plugin_llm.limits.leases.ENABLED = False``) and ``leases`` (the default:
a busy plugin's calls admitted in memory under this process's lease).

1. Admission + settlement through the facade, back to back: CPU time of this
   process (all its threads, so the lease keeper's and the settlement flusher's
   work is included) per call, median of interleaved blocks, as a share of
   one ``complete``'s wall time and CPU time.
2. Whole ``complete`` calls of a plugin with limits configured (the pipeline's
   own admission), CPU per call, vs limits off.
3. 64 concurrent async calls: calls/s and CPU per call, limits off vs on.

CPU time, not wall time, where it can be: the machine is shared and noisy.
Targets: ``local`` adds under 2% to a call, ``redis`` under 5% on loopback.
Printed, not asserted: ``python benchmarks/bench_limits.py [--quick]``.
Needs ``redis-server`` on PATH for the redis rows (skipped with a note otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
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


class Variant:
    """One way of running a limited call: the store (None = no limits) and leases on or off."""

    def __init__(self, name: str, store: str | None, lease: bool, base_url: str, redis_url: str | None) -> None:
        self.name, self.store, self.lease = name, store, lease
        self.home = Path(tempfile.mkdtemp(prefix="bench-limits-"))
        text = config_text(base_url, store, redis_url if store == "redis" else None)
        if store == "redis":  # each variant its own keys
            text = text.replace("  redis_url:", f"  redis_key_prefix: bench{uuid.uuid4().hex[:8]}\n  redis_url:")
        (self.home / "config.yaml").write_text(text)
        self.settings = limit_settings(text)
        from plugin_llm import PluginLlm
        from plugin_llm.types import PluginLlmUsage

        self.llm = PluginLlm(PLUGIN, home=self.home)
        self.usage = PluginLlmUsage(input_tokens=12, output_tokens=20, total_tokens=32, cost_usd=None)

    def __enter__(self) -> "Variant":
        from plugin_llm.limits import leases

        leases.ENABLED = self.lease
        return self

    def __exit__(self, *exc: object) -> None:
        from plugin_llm.limits import leases

        leases.ENABLED = True

    def pair(self) -> None:
        """One admission + settlement through the facade, as the pipeline makes them."""
        from plugin_llm import limits

        limits.admit(self.settings, self.home, PLUGIN, messages=MESSAGES, provider="custom", model="local-echo-1",
                     max_tokens=256, deadline=time.monotonic() + 30).settle(self.usage)


def variants(base_url: str, redis_url: str | None) -> list[Variant]:
    out = [Variant("no limits", None, True, base_url, None),
           Variant("local, per call", "local", False, base_url, None),
           Variant("local, leases", "local", True, base_url, None)]
    if redis_url:
        out += [Variant("redis, per call", "redis", False, base_url, redis_url),
                Variant("redis, leases", "redis", True, base_url, redis_url)]
    return out


def cpu_per_call(fn, reps: int) -> float:
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


def limits_threads_cpu() -> float:
    """CPU seconds used so far by the limits layer's own threads (lease keeper, settlement flusher)."""
    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith("plugin-llm-limits") and t.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except OSError:  # the thread just ended
                pass
    return total


def quiesce(vs: list[Variant], keep: Variant) -> None:
    """Give back the leases of every variant but ``keep``: the lease keeper then has nothing of
    theirs to renew while ``keep`` is measured (its CPU would be counted against ``keep``)."""
    from plugin_llm import limits

    for v in vs:
        if v is not keep and v.store is not None:
            limits.store_for(v.settings, v.home).return_leases(None, timeout=5.0)


def in_context(v: Variant, off: Variant, calls: int) -> float:
    """CPU seconds per call that admission + settlement add around real calls: the calling thread's
    CPU in ``admit`` and ``settle`` plus everything the limits threads did meanwhile (lease
    renewals, queued settlements), at the pace of real calls."""
    from plugin_llm import limits

    spent = 0.0
    bg0 = limits_threads_cpu()
    for _ in range(calls):
        t0 = time.thread_time()
        ticket = limits.admit(v.settings, v.home, PLUGIN, messages=MESSAGES, provider="custom", model="local-echo-1",
                              max_tokens=256, deadline=time.monotonic() + 30)
        t1 = time.thread_time()
        off.llm.complete(MESSAGES)  # the call itself, unlimited, so nothing is admitted twice
        t2 = time.thread_time()
        ticket.settle(v.usage)
        spent += time.thread_time() - t2 + t1 - t0
    return (spent + limits_threads_cpu() - bg0) / calls


def bench_sync(vs: list[Variant], rounds: int, calls: int) -> dict[str, dict[str, float]]:
    """Per variant, medians of interleaved rounds: admission+settlement CPU in context and back to
    back, and whole limited calls' CPU; plus a plain complete's wall and CPU time."""
    off = vs[0]
    for v in vs:  # warm-up: pools, lazy imports, the price map, the SQLite file, the script cache, leases
        with v:
            for _ in range(30):
                v.llm.complete(MESSAGES)
                v.pair()
    rows = {v.name: {"context": [], "pair": [], "call": []} for v in vs}
    wall: list[float] = []
    for _ in range(rounds):
        for v in vs:
            with v:
                quiesce(vs, v)
                for _ in range(20):  # the lease grows back to its slice (it was given back if v ran last round)
                    v.llm.complete(MESSAGES)
                rows[v.name]["call"].append(cpu_per_call(lambda: v.llm.complete(MESSAGES), calls))
                rows[v.name]["context"].append(in_context(v, off, calls))
                rows[v.name]["pair"].append(cpu_per_call(v.pair, calls * 4))
        t0 = time.perf_counter()
        for _ in range(calls):
            off.llm.complete(MESSAGES)
        wall.append((time.perf_counter() - t0) / calls)
    med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    out = {name: {k: med(xs) for k, xs in row.items()} for name, row in rows.items()}
    out["_complete"] = {"wall": med(wall), "cpu": out[off.name]["call"]}
    return out


def bench_pricing(settings, reps: int) -> tuple[float, float]:
    """CPU µs of applying the operator's price to one response: two ``dataclasses.replace`` (how
    ``_operator_priced`` did it before) vs ``_operator_priced`` now; medians of interleaved blocks."""
    import dataclasses
    from types import SimpleNamespace

    from plugin_llm import limits
    from plugin_llm.llm import _operator_priced
    from plugin_llm.transport import TransportResponse
    from plugin_llm.types import PluginLlmUsage

    admitted = SimpleNamespace(route=SimpleNamespace(provider="custom", model="local-echo-1"),
                               config=SimpleNamespace(limits=settings))
    response = TransportResponse(text="ok", message={"role": "assistant", "content": "ok"}, model="local-echo-1",
                                 usage=PluginLlmUsage(input_tokens=12, output_tokens=20, total_tokens=32),
                                 attempts=1, provider_seconds=0.0005)

    def before() -> TransportResponse:
        price = limits.find_price("custom", "local-echo-1", settings.prices)
        usage = response.usage
        nano = limits.actual_cost_nano(price, None, usage.input_tokens, usage.output_tokens)
        return dataclasses.replace(response, usage=dataclasses.replace(usage, cost_usd=nano / limits.NANO))

    assert before() == _operator_priced(admitted, response)
    old, new = [], []
    for _ in range(15):
        old.append(cpu_per_call(before, reps))
        new.append(cpu_per_call(lambda: _operator_priced(admitted, response), reps))
    return statistics.median(old) * 1e6, statistics.median(new) * 1e6


def bench_async(vs: list[Variant], calls: int, concurrency: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Per variant: calls/s and CPU µs per call of ``calls`` acomplete calls at ``concurrency`` (limits in the pipeline)."""

    async def run(v: Variant) -> tuple[float, float]:
        sem = asyncio.Semaphore(concurrency)

        async def bounded() -> None:
            async with sem:
                await v.llm.acomplete(MESSAGES)

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(bounded() for _ in range(calls)))
        return time.perf_counter() - t0, time.process_time() - c0

    async def main() -> dict[str, list[tuple[float, float]]]:
        for v in vs:
            with v:
                await run(v)  # warm-up
        out: dict[str, list[tuple[float, float]]] = {v.name: [] for v in vs}
        for _ in range(repeats):
            for v in vs:
                with v:
                    out[v.name].append(await run(v))
        return out

    results = asyncio.run(main())
    return {name: (calls / statistics.median(w for w, _ in rs), statistics.median(c for _, c in rs) / calls * 1e6)
            for name, rs in results.items()}


TARGETS = {"local": 2.0, "redis": 5.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds, block, calls, repeats = (6, 100, 256, 3) if args.quick else (20, 150, 1024, 5)

    with server_process() as server, redis_process() as redis:
        redis_url = redis.url if redis else None
        print(f"server: {server.base_url}   redis: {redis_url or 'redis-server not installed, skipped'}   "
              f"python {sys.version.split()[0]}   cores: {os.cpu_count()}   load: {os.getloadavg()[0]:.2f}")
        vs = variants(server.base_url, redis_url)
        print(f"\n== sync: medians of {rounds} interleaved rounds of {block}-call blocks; CPU = this process ==")
        sync = bench_sync(vs, rounds, block)
        base = sync["_complete"]
        print(f"  PluginLlm.complete, limits off: {base['wall']:.0f} µs wall, {base['cpu']:.0f} µs CPU per call")
        print("  admission + settlement per call, in context (CPU of the caller in admit/settle + the limits "
              "threads' CPU, at the pace of real calls):")
        print(f"    {'variant':<18} {'CPU µs':>8} {'% of call wall':>15} {'% of call CPU':>14} "
              f"{'net µs':>7} {'net % wall':>10}   target (on the gross % of wall)")
        floor = sync[vs[0].name]["context"]  # no limits: the clock reads + an UNLIMITED ticket, cold
        for v in vs:
            row = sync[v.name]
            target = TARGETS.get(v.store or "")
            share = row["context"] / base["wall"] * 100
            net = row["context"] - floor
            mark = "" if target is None else f"< {target:.0f}%  " + ("met" if share < target else "missed")
            print(f"    {v.name:<18} {row['context']:8.1f} {share:14.2f}% {row['context'] / base['cpu'] * 100:13.2f}% "
                  f"{net:7.1f} {net / base['wall'] * 100:9.2f}%   {mark}")
        print("    (net = minus the no-limits row: what limits add beyond reading the thread clock 4 times a call)")
        for store in ("local", "redis"):
            before, after = sync.get(f"{store}, per call"), sync.get(f"{store}, leases")
            if before and after:
                print(f"    {store}: leases / per call = {after['context'] / before['context']:.3f} "
                      f"({before['context']:.1f} -> {after['context']:.1f} µs CPU per call)")
        print("  admission + settlement back to back (warm caches, process CPU; lease renewals are rarer "
              "per call at this pace):")
        for v in vs:
            print(f"    {v.name:<18} {sync[v.name]['pair']:8.1f} µs CPU")
        print("  whole limited calls, limits in the pipeline (process CPU per call; noisier):")
        for v in vs:
            row = sync[v.name]
            print(f"    {v.name:<18} {row['call']:8.0f} µs CPU   {(row['call'] / base['cpu'] - 1) * 100:+6.1f}% vs off")

        old_us, new_us = bench_pricing(vs[1].settings, block * 20)
        print(f"  operator pricing of one response (limits.prices set; back to back, CPU): before "
              f"(2x dataclasses.replace) {old_us:.2f} µs, now (_operator_priced) {new_us:.2f} µs "
              f"= {new_us / old_us:.2f}x")

        print(f"\n== async: {calls} calls at concurrency 64, median of {repeats} ==")
        thr = bench_async(vs, calls, 64, repeats)
        off_rate, off_cpu = thr[vs[0].name]
        for v in vs:
            rate, cpu = thr[v.name]
            rel = "" if v.store is None else f"   ({(rate / off_rate - 1) * 100:+.1f}% calls/s, {(cpu / off_cpu - 1) * 100:+.1f}% CPU vs off)"
            print(f"  {v.name:<18} {rate:9.1f} calls/s {cpu:8.0f} µs CPU/call{rel}")
        from plugin_llm import limits

        limits.close_stores()  # give leases back while the stores are still up


if __name__ == "__main__":
    main()
