"""What the service adds: ``plugin-llm serve`` vs in-process ``PluginLlm.acomplete`` (issue 14).

The method of public gateway benchmarks: one upstream (the canned
OpenAI-compatible asyncio server of ``bench_gateway.py --serve``, in its own
process, answering in microseconds), called directly - here in-process
``PluginLlm.acomplete``, the call ``ctx.llm`` makes - and through the gateway
service (``plugin-llm serve --workers W``, W = 1 and 2) by a lean aiohttp
client holding a plugin token. Printed per concurrency (1, 16, 64):

* p50/p99 latency direct and through the service, and the added p50/p99;
* calls/s, and calls/s per worker;
* CPU per call: the client process, and the service's processes (all workers,
  from /proc), so a busy shared machine can be told from a slow service.

Each measurement runs in its own client process; rounds alternate direct and
service so that the machine's noise hits both alike, and the median over
rounds is printed. ``--quick`` runs fewer calls and rounds. Targets (issue 14):
p50 added < 1 ms at concurrency 1; p99 added < 10 ms at concurrency 64 with
2 workers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MESSAGES = [{"role": "user", "content": "Benchmark ping: say something short."}]
MODEL = "local-echo-1"
CONCURRENCY = (1, 16, 64)
_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its children (the service's workers), from /proc."""
    total = 0.0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICKS
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


# --------------------------------------------------------------------------- client processes
async def _measure(call, concurrency: int, calls: int) -> dict:
    latencies: list[float] = []

    async def run(n: int) -> float:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                t0 = time.perf_counter()
                await call()
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - t0

    await run(min(calls, 200))  # warm-up: connections, caches
    latencies.clear()
    c0 = process_cpu()
    elapsed = await run(calls)
    return {"rate": calls / elapsed, "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99),
            "cpu_us": (process_cpu() - c0) / calls * 1e6}


def direct_worker(home: str, concurrency: int, calls: int) -> dict:
    from plugin_llm import PluginLlm

    llm = PluginLlm("bench", home=Path(home))

    async def main() -> dict:
        async def call() -> None:
            await llm.acomplete(MESSAGES, timeout=60)

        return await _measure(call, concurrency, calls)

    return asyncio.run(main())


def service_worker(url: str, token: str, concurrency: int, calls: int) -> dict:
    import aiohttp

    async def main() -> dict:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), skip_auto_headers=("User-Agent",))
        body = json.dumps({"messages": MESSAGES, "timeout": 60}).encode()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        target = url + "/v1/plugin-llm/complete"

        async def call() -> None:
            async with session.post(target, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"the service answered {response.status}")

        try:
            return await _measure(call, concurrency, calls)
        finally:
            await session.close()

    return asyncio.run(main())


def in_process(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{args[0]} failed: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- orchestration
class upstream:
    def __enter__(self) -> "upstream":
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "bench_gateway.py"), "--serve"],
                                     stdout=subprocess.PIPE, text=True)
        self.base_url = self.proc.stdout.readline().strip()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class service:
    def __init__(self, home: Path, workers: int) -> None:
        self.home, self.workers = home, workers

    def __enter__(self) -> "service":
        import urllib.request

        env = {**os.environ, "HERMES_HOME": str(self.home)}
        self.proc = subprocess.Popen([sys.executable, "-m", "plugin_llm", "serve", "--port", "0", "--workers",
                                      str(self.workers)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        line = self.proc.stdout.readline()
        self.url = line.split("listening on ", 1)[1].split()[0]
        deadline = time.monotonic() + 60
        while True:  # every worker up (each imports litellm at start-up)
            try:
                pids = {json.load(urllib.request.urlopen(self.url + "/healthz", timeout=5))["pid"] for _ in range(20)}
                if self.workers == 1 or len(pids) >= self.workers or time.monotonic() > deadline:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
        time.sleep(1.0 if self.workers > 1 else 0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def make_home(base_url: str) -> tuple[Path, str]:
    from plugin_llm.service.tokens import TokenStore

    home = Path(tempfile.mkdtemp(prefix="bench-service-"))
    (home / "config.yaml").write_text(f"model:\n  provider: custom\n  model: {MODEL}\n  base_url: {base_url}\n")
    store = TokenStore(home)
    token = store.create("bench")[1]
    store.close()
    return home, token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--serve-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--direct", nargs=3, metavar=("HOME", "C", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=4, metavar=("URL", "TOKEN", "C", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.direct:
        print(json.dumps(direct_worker(args.direct[0], int(args.direct[1]), int(args.direct[2]))))
        return
    if args.client:
        url, token, c, n = args.client
        print(json.dumps(service_worker(url, token, int(c), int(n))))
        return

    rounds = 2 if args.quick else 4
    calls = {1: 400, 16: 1500, 64: 3000} if args.quick else {1: 1500, 16: 4000, 64: 8000}
    print(f"bench_service: {os.cpu_count()} CPUs, {rounds} rounds, calls per run {calls}; times in ms, CPU in us/call")
    with upstream() as up:
        home, token = make_home(up.base_url)
        results: dict[tuple, list[dict]] = {}
        for workers in (1, 2):
            with service(home, workers) as svc:
                for _ in range(rounds):
                    for c in CONCURRENCY:
                        direct = in_process(["--direct", str(home), str(c), str(calls[c])])
                        results.setdefault(("direct", workers, c), []).append(direct)
                        cpu0 = tree_cpu(svc.proc.pid)
                        through = in_process(["--client", svc.url, token, str(c), str(calls[c])])
                        # the warm-up calls count in the service's CPU: divide by every call it served
                        through["svc_cpu_us"] = (tree_cpu(svc.proc.pid) - cpu0) / (calls[c] + min(calls[c], 200)) * 1e6
                        results.setdefault(("service", workers, c), []).append(through)

    def med(kind: str, workers: int, c: int, field: str) -> float:
        return statistics.median(r[field] for r in results[(kind, workers, c)])

    print()
    print(f"{'workers':>7} {'conc':>4} | {'direct p50':>10} {'p99':>7} | {'service p50':>11} {'p99':>7} | "
          f"{'added p50':>9} {'p99':>7} | {'direct/s':>8} {'service/s':>9} {'/worker':>8} | "
          f"{'cpu client':>10} {'cpu service':>11} {'cpu direct':>10}")
    for workers in (1, 2):
        for c in CONCURRENCY:
            d50, d99 = med("direct", workers, c, "p50"), med("direct", workers, c, "p99")
            s50, s99 = med("service", workers, c, "p50"), med("service", workers, c, "p99")
            rate = med("service", workers, c, "rate")
            print(f"{workers:>7} {c:>4} | {d50:>10.3f} {d99:>7.3f} | {s50:>11.3f} {s99:>7.3f} | "
                  f"{s50 - d50:>9.3f} {s99 - d99:>7.3f} | {med('direct', workers, c, 'rate'):>8.0f} {rate:>9.0f} "
                  f"{rate / workers:>8.0f} | {med('service', workers, c, 'cpu_us'):>10.0f} "
                  f"{med('service', workers, c, 'svc_cpu_us'):>11.0f} {med('direct', workers, c, 'cpu_us'):>10.0f}")
    a1 = med("service", 1, 1, "p50") - med("direct", 1, 1, "p50")
    a64 = med("service", 2, 64, "p99") - med("direct", 2, 64, "p99")
    print()
    print(f"target p50 added < 1 ms at concurrency 1 (1 worker): {a1:.3f} ms -> {'met' if a1 < 1 else 'NOT met'}")
    print(f"target p99 added < 10 ms at concurrency 64, 2 workers: {a64:.3f} ms -> {'met' if a64 < 10 else 'NOT met'}")
    print("cpu client = the aiohttp client's process; cpu service = all serve processes per call; cpu direct = the "
          "in-process PluginLlm's process. On a machine with fewer cores than client + workers + upstream, "
          "concurrency 64 measures CPU contention as much as the service.")


if __name__ == "__main__":
    main()
