"""Cost of per-plugin limits: what limits add to a call, no limits / local / redis.

Against ``PluginLlm.complete`` on the local model served over HTTP on 127.0.0.1 (its own process),
each store measured *per call* (``plugin_llm.limits.leases.ENABLED = False``) and with *leases*
(the default), interleaved:

1. what limits add to a whole ``complete``: a limited and an unlimited plugin alternate one by one,
   the difference of their CPU plus the limits threads', as a share of one unlimited call (and the
   operator's price on its own line);
2. of which admission + settlement through the facade, around real calls and back to back;
3. 64 concurrent async calls: calls/s and CPU per call, limits off vs on, cold and busy plugin.

Targets: ``local`` adds under 2% to a call, ``redis`` under 5% on loopback. Printed, not asserted:
``python benchmarks/bench_limits.py [--quick]``. Needs ``redis-server`` on PATH for the redis rows
(skipped with a note otherwise). Method: docs/performance.md.
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


def config_text(base_url: str, store: str | None, redis_url: str | None, priced: bool = True) -> str:
    """The benchmark's config: the local model as a custom endpoint, with the operator's price for it
    (``priced``: a budget needs one), and the plugin's limits when a ``store`` is given."""
    text = f"model:\n  provider: custom\n  model: local-echo-1\n  base_url: {base_url}\n"
    if store is None and not priced:
        return text
    text += "limits:\n"
    if priced:
        text += '  prices:\n    "custom/local-echo-1": {input_per_mtok: 0.15, output_per_mtok: 0.60}\n'
    if store is None:
        return text
    text += f"  store: {store}\n"
    if redis_url:
        text += f"  redis_url: {redis_url}\n"
    text += ("plugins:\n  entries:\n    bench:\n      limits:\n"
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

    def __init__(self, name: str, store: str | None, lease: bool, base_url: str, redis_url: str | None,
                 priced: bool = True) -> None:
        self.name, self.store, self.lease = name, store, lease
        self.home = Path(tempfile.mkdtemp(prefix="bench-limits-"))
        text = config_text(base_url, store, redis_url if store == "redis" else None, priced)
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


def quiesce(vs: list[Variant], keep: Variant | None) -> None:
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


def in_pipeline(v: Variant, off: Variant, calls: int) -> float:
    """CPU seconds per call that limits add to a whole ``complete`` (admission, settlement, the
    operator's pricing, the audit record's limits fields, the limits threads): calls of ``v`` and of
    the unlimited ``off`` alternate one by one (so drift and cache effects hit both alike); the
    difference of their calling-thread CPU, plus what the limits threads used meanwhile."""
    with_limits = without = 0.0
    bg0 = limits_threads_cpu()
    clock = time.thread_time
    for _ in range(calls):
        t0 = clock()
        v.llm.complete(MESSAGES)
        t1 = clock()
        off.llm.complete(MESSAGES)
        t2 = clock()
        with_limits += t1 - t0
        without += t2 - t1
    return (with_limits - without + limits_threads_cpu() - bg0) / calls


def bench_sync(vs: list[Variant], bare: Variant, rounds: int, calls: int) -> dict[str, dict[str, float]]:
    """Per variant, medians of interleaved rounds: what limits add to a whole call, admission +
    settlement CPU in context and back to back; what the operator's price alone adds (``vs[0]``
    against ``bare``, a config without ``limits.prices``); a plain complete's wall and CPU time."""
    off = vs[0]
    for v in vs:  # warm-up: pools, lazy imports, the price map, the SQLite file, the script cache, leases
        with v:
            for _ in range(30):
                v.llm.complete(MESSAGES)
                v.pair()
    rows = {v.name: {"pipeline": [], "context": [], "pair": []} for v in vs}
    off_cpu: list[float] = []
    wall: list[float] = []
    pricing: list[float] = []
    for _ in range(rounds):
        for v in vs:
            with v:
                quiesce(vs, v)
                for _ in range(100):  # the lease grows back to its slice (it was given back if v ran last round;
                    # after 20 calls one measured block in ten still had a store step of the ramp-up)
                    v.llm.complete(MESSAGES)
                if v is not off:
                    rows[v.name]["pipeline"].append(in_pipeline(v, off, calls))
                rows[v.name]["context"].append(in_context(v, off, calls))
                rows[v.name]["pair"].append(cpu_per_call(v.pair, calls * 4))
        pricing.append(in_pipeline(off, bare, calls))
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            off.llm.complete(MESSAGES)
        wall.append((time.perf_counter() - t0) / calls)
        off_cpu.append((time.process_time() - c0) / calls)
    med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    out = {name: {k: med(xs) for k, xs in row.items() if xs} for name, row in rows.items()}
    for name, row in rows.items():  # the spread of the headline numbers over the rounds
        if len(row["pipeline"]) >= 4:
            q = statistics.quantiles(row["pipeline"], n=4)
            out[name]["pipeline_iqr"] = (q[0] * 1e6, q[2] * 1e6)
    out["_complete"] = {"wall": med(wall), "cpu": med(off_cpu), "pricing": med(pricing)}
    return out


def bench_async(vs: list[Variant], calls: int, concurrency: int, repeats: int) -> dict[str, dict[str, tuple[float, float]]]:
    """Per variant, calls/s and CPU µs per call of ``calls`` acomplete calls at ``concurrency``
    (limits in the pipeline), medians of interleaved repeats: ``cold``, the first run after every
    lease was given back (what a burst on an idle plugin pays: its ramp-up), and ``warm``, a run
    right after it (a plugin that stays busy)."""

    async def run(v: Variant) -> tuple[float, float]:
        sem = asyncio.Semaphore(concurrency)

        async def bounded() -> None:
            async with sem:
                await v.llm.acomplete(MESSAGES)

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(bounded() for _ in range(calls)))
        return time.perf_counter() - t0, time.process_time() - c0

    async def main() -> dict[str, dict[str, list[tuple[float, float]]]]:
        for v in vs:
            with v:
                await run(v)  # warm-up: pools, lazy imports
        out = {v.name: {"cold": [], "warm": []} for v in vs}
        for _ in range(repeats):
            for v in vs:
                with v:
                    quiesce(vs, None)  # every lease given back: v starts cold
                    out[v.name]["cold"].append(await run(v))
                    out[v.name]["warm"].append(await run(v))
        return out

    def summary(rs: list[tuple[float, float]]) -> tuple[float, float]:
        return calls / statistics.median(w for w, _ in rs), statistics.median(c for _, c in rs) / calls * 1e6

    return {name: {k: summary(rs) for k, rs in row.items()} for name, row in asyncio.run(main()).items()}


TARGETS = {"local": 2.0, "redis": 5.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds, block, calls, repeats = (6, 100, 256, 3) if args.quick else (40, 150, 1024, 5)

    with server_process() as server, redis_process() as redis:
        redis_url = redis.url if redis else None
        print(f"server: {server.base_url}   redis: {redis_url or 'redis-server not installed, skipped'}   "
              f"python {sys.version.split()[0]}   cores: {os.cpu_count()}   load: {os.getloadavg()[0]:.2f}")
        vs = variants(server.base_url, redis_url)
        bare = Variant("no limits, no prices", None, True, server.base_url, None, priced=False)
        print(f"\n== sync: medians of {rounds} interleaved rounds of {block}-call blocks; CPU = this process ==")
        sync = bench_sync(vs, bare, rounds, block)
        base = sync["_complete"]
        print(f"  PluginLlm.complete, limits off: {base['wall']:.0f} µs wall, {base['cpu']:.0f} µs CPU per call")
        print("  what limits add to a whole call (calls of a plugin with limits and of one without, both on the "
              "same operator-priced model, alternating one by one; the difference of their CPU + the limits "
              "threads' CPU):")
        print(f"    {'variant':<18} {'CPU µs':>8} {'(IQR of rounds)':>16} {'% of call wall':>15} {'% of call CPU':>14}   target")
        for v in vs[1:]:
            row = sync[v.name]
            target = TARGETS[v.store]
            share = row["pipeline"] / base["wall"] * 100
            mark = f"< {target:.0f}%  " + ("met" if share < target else "missed") if v.lease else "(before leases)"
            lo, hi = row.get("pipeline_iqr", (float("nan"),) * 2)
            print(f"    {v.name:<18} {row['pipeline']:8.1f} {f'({lo:.1f}-{hi:.1f})':>16} {share:14.2f}% "
                  f"{row['pipeline'] / base['cpu'] * 100:13.2f}%   {mark}")
        print(f"  the operator's price alone (limits.prices set, no limits: any plugin calling a priced model, "
              f"vs no prices): {base['pricing']:.1f} µs = {base['pricing'] / base['wall'] * 100:.2f}% of a call")
        print("  of which admission + settlement through the facade, in context (CPU of the caller in "
              "admit/settle + the limits threads' CPU, at the pace of real calls):")
        print(f"    {'variant':<18} {'CPU µs':>8} {'% of call wall':>15} {'net µs':>7} {'net % wall':>10}")
        floor = sync[vs[0].name]["context"]  # no limits: the clock reads + an UNLIMITED ticket, cold
        for v in vs:
            row = sync[v.name]
            net = row["context"] - floor
            print(f"    {v.name:<18} {row['context']:8.1f} {row['context'] / base['wall'] * 100:14.2f}% "
                  f"{net:7.1f} {net / base['wall'] * 100:9.2f}%")
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

        print(f"\n== async: {calls} calls at concurrency 64, median of {repeats} ==")
        thr = bench_async(vs, calls, 64, repeats)
        for state in ("cold", "warm"):
            print(f"  {state}:" + (" the first run after the leases were given back (a burst on an idle plugin)"
                                    if state == "cold" else " the run right after it (a plugin that stays busy)"))
            off_rate, off_cpu = thr[vs[0].name][state]
            for v in vs:
                rate, cpu = thr[v.name][state]
                rel = "" if v.store is None else (f"   ({(rate / off_rate - 1) * 100:+.1f}% calls/s, "
                                                  f"{(cpu / off_cpu - 1) * 100:+.1f}% CPU vs off)")
                print(f"    {v.name:<18} {rate:9.1f} calls/s {cpu:8.0f} µs CPU/call{rel}")
        from plugin_llm import limits

        limits.close_stores()  # give leases back while the stores are still up
        for v in (*vs, bare):
            shutil.rmtree(v.home, ignore_errors=True)


if __name__ == "__main__":
    main()
