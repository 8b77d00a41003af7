"""What the service adds: ``plugin-llm serve`` vs in-process ``PluginLlm.acomplete``.

One upstream (a canned OpenAI-compatible server on uvloop, in its own process), called directly
(``PluginLlm.acomplete`` at concurrency C) and through ``plugin-llm serve --workers W`` (W = 1, 2)
by a lean keep-alive load generator, rounds interleaved, medians printed. ``--baseline REV`` also
runs git revision REV's service in the same run; ``--layer`` measures the service's own layer
alone (a stub pipeline); ``--pin`` pins processes when there are at least W + 2 CPUs; ``--quick``
runs fewer calls and rounds.

Printed per workers and concurrency (1, 16, 64): p50/p99 direct and through the service, the added
p50/p99, calls/s, and CPU per call of the client, the workers, the supervisor, the upstream and the
direct process; CPU per call is the number to compare on a noisy machine. Targets: p50 added < 1 ms
at concurrency 1; p99 added < 10 ms at concurrency 64 with 2 workers. Method: docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MESSAGES = [{"role": "user", "content": "Benchmark ping: say something short."}]
MODEL = "local-echo-1"
CONCURRENCY = (1, 16, 64)
PACKAGES = ("plugin_llm", "audit", "auth")
_TICKS = os.sysconf("SC_CLK_TCK")
REPLY = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Benchmark pong, short."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
}).encode()


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pid_cpu(pid: int) -> float:
    """CPU seconds of one process (all its threads), from /proc; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, ValueError, IndexError):
        return 0.0


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def run_loop(main):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def pin(cpus: set[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


# --------------------------------------------------------------------------- HTTP/1.1, minimal
def _parse(buffer: bytearray) -> tuple[int, bytes] | None:
    """One complete response at the start of ``buffer`` (removed from it), or None while it is incomplete."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end]).lower()
    at = head.find(b"content-length:")
    length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
    if len(buffer) < end + 4 + length:
        return None
    status, body = int(head[9:12]), bytes(buffer[end + 4:end + 4 + length])
    del buffer[:end + 4 + length]
    return status, body


class _Upstream(asyncio.Protocol):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(REPLY)

    def connection_made(self, transport):  # noqa: D102
        self.transport, self.buffer = transport, bytearray()

    def data_received(self, data):  # noqa: D102
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lowered = bytes(self.buffer[:end]).lower()
            at = lowered.find(b"content-length:")
            length = int(lowered[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            del self.buffer[:end + 4 + length]
            self.transport.write(self.head + REPLY)


def upstream_main() -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", 0, backlog=4096)
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
        await server.serve_forever()

    run_loop(main())


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None

    def connection_made(self, transport):  # noqa: D102
        self.transport = transport

    def data_received(self, data):  # noqa: D102
        self.buffer += data
        if self.waiter is not None and not self.waiter.done():
            answer = _parse(self.buffer)
            if answer is not None:
                self.waiter.set_result(answer)

    def connection_lost(self, exc):  # noqa: D102
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the service closed the connection"))

    async def request(self, data: bytes) -> tuple[int, bytes]:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter


# --------------------------------------------------------------------------- client processes
async def _measure(call_factory, concurrency: int, calls: int) -> dict:
    """``calls`` calls by ``concurrency`` callers (each its own ``call``), after a warm-up."""
    callers = [await call_factory() for _ in range(concurrency)]
    latencies: list[float] = []

    async def caller(call, n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    async def run(n: int) -> float:
        shares = [n // concurrency + (1 if i < n % concurrency else 0) for i in range(concurrency)]
        t0 = time.perf_counter()
        await asyncio.gather(*(caller(call, k) for call, k in zip(callers, shares)))
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

    async def factory():
        async def call() -> None:
            await llm.acomplete(MESSAGES, timeout=60)
        return call

    return asyncio.run(_measure(factory, concurrency, calls))


def service_client(url: str, token: str, concurrency: int, calls: int) -> dict:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    body = json.dumps({"messages": MESSAGES, "timeout": 60}).encode()
    request = (f"POST /v1/plugin-llm/complete HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    connections: list[_Connection] = []

    async def factory():
        _, connection = await asyncio.get_running_loop().create_connection(_Connection, host, int(port))
        connections.append(connection)

        async def call() -> None:
            status, answer = await connection.request(request)
            if status != 200 or b'"text"' not in answer:
                raise RuntimeError(f"the service answered {status}: {answer[:300]!r}")
        return call

    async def main() -> dict:
        try:
            return await _measure(factory, concurrency, calls)
        finally:
            for connection in connections:
                connection.transport.close()

    return run_loop(main())


def in_process(args: list[str], cpus: set[int] | None) -> dict:
    pinned = ["--cpus", ",".join(map(str, sorted(cpus)))] if cpus else []
    out = subprocess.run([sys.executable, __file__, *pinned, *args], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{args[0]} failed: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def stub_serve(source: str, home: str) -> None:
    """The service of ``source`` (``-``: this tree) on uvicorn, one process, its pipeline a stub (``--layer``).

    The stub answers every call at once with a canned result, so the process's CPU per request is uvicorn's and
    the service layer's alone (token check, body, JSON, metrics, response writes), with no model call around it.
    The HTTP protocol is the one that tree's ``plugin-llm serve`` uses.
    """
    if source != "-":
        sys.path.insert(0, source)
    import socket

    import uvicorn

    from plugin_llm.service.app import create_app
    from plugin_llm.types import PluginLlmCompleteResult, PluginLlmUsage

    try:
        from plugin_llm.service.protocol import PROTOCOL as http
    except ImportError:  # a tree from before it: uvicorn's own
        http = "httptools"
    usage = PluginLlmUsage(input_tokens=9, output_tokens=4, total_tokens=13)

    class Stub:
        async def acomplete(self, messages, **kwargs):
            return PluginLlmCompleteResult(text="Benchmark pong, short.", provider="custom", model=MODEL, agent_id=None,
                                           usage=usage, audit={"plugin_id": "bench", "call_id": "c" * 32})

    app = create_app(Path(home), llm_factory=lambda plugin: Stub(), warm=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, http=http, access_log=False, server_header=False, lifespan="on",
                                           log_level="warning"))
    profile = os.environ.get("BENCH_SERVICE_PROFILE")  # a path: cProfile the worker, stats written there at exit
    if not profile:
        return server.run(sockets=[sock])
    import cProfile
    import signal

    signal.signal(signal.SIGTERM, lambda *_: None)  # uvicorn re-raises SIGTERM once drained: return, then dump
    profiler = cProfile.Profile()
    profiler.runcall(server.run, sockets=[sock])
    profiler.dump_stats(f"{profile}.{'after' if source == '-' else 'before'}")


def layer(args: argparse.Namespace) -> None:
    """``--layer``: CPU per request of the service layer alone (stub pipeline), this tree vs ``--baseline``.

    ``BENCH_SERVICE_PROFILE=PATH`` runs each stub worker under cProfile and writes ``PATH.after``/``PATH.before``.
    """
    rounds = 3 if args.quick else 7
    calls = {1: 1500, 16: 3000, 64: 4000} if args.quick else {1: 3000, 16: 6000, 64: 8000}
    baseline = extract(args.baseline) if args.baseline else None
    sources = {"after": "-", **({"before": str(baseline)} if baseline else {})}
    home, token = make_home("http://127.0.0.1:9/v1")
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    results: dict[tuple[str, int], list[dict]] = {}
    try:
        for kind, source in sources.items():
            proc = subprocess.Popen([sys.executable, __file__, "--stub-serve", source, str(home)], stdout=subprocess.PIPE,
                                    text=True, env={**os.environ, "HERMES_HOME": str(home)}, cwd=ROOT)
            procs[kind] = (proc, proc.stdout.readline().strip())
        for _ in range(rounds):
            for c in CONCURRENCY:
                for kind, (proc, url) in procs.items():
                    w0 = pid_cpu(proc.pid)
                    through = in_process(["--client", url, token, str(c), str(calls[c])], None)
                    through["worker_cpu_us"] = (pid_cpu(proc.pid) - w0) / (calls[c] + min(calls[c], 200)) * 1e6
                    results.setdefault((kind, c), []).append(through)
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(timeout=30)
        if baseline is not None:
            shutil.rmtree(baseline, ignore_errors=True)
    print(f"bench_service --layer: the service's own CPU per request (uvicorn + service layer, stub pipeline, "
          f"1 process), {rounds} rounds interleaved, medians; CPU from /proc (user+system)")
    print(f"{'service':>7} {'conc':>4} | {'p50 ms':>7} {'p99 ms':>7} | {'calls/s':>7} | {'CPU us/request':>14}")
    for c in CONCURRENCY:
        for kind in procs:
            rows = results[(kind, c)]
            print(f"{kind:>7} {c:>4} | {statistics.median(r['p50'] for r in rows):>7.3f} "
                  f"{statistics.median(r['p99'] for r in rows):>7.3f} | {statistics.median(r['rate'] for r in rows):>7.0f} "
                  f"| {statistics.median(r['worker_cpu_us'] for r in rows):>14.1f}")
    if "before" in procs:
        ratios = [statistics.median(r["worker_cpu_us"] for r in results[("after", c)])
                  / statistics.median(r["worker_cpu_us"] for r in results[("before", c)]) for c in CONCURRENCY]
        print(f"CPU per request, this tree / baseline {args.baseline}: "
              + ", ".join(f"c={c}: {r:.2f}" for c, r in zip(CONCURRENCY, ratios)))


# --------------------------------------------------------------------------- orchestration
class upstream:
    def __init__(self, cpus: set[int] | None) -> None:
        self.cpus = cpus

    def __enter__(self) -> "upstream":
        pinned = ["--cpus", ",".join(map(str, sorted(self.cpus)))] if self.cpus else []
        self.proc = subprocess.Popen([sys.executable, __file__, *pinned, "--upstream"], stdout=subprocess.PIPE,
                                     text=True)
        self.base_url = self.proc.stdout.readline().strip()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class service:
    """``plugin-llm serve --workers W`` of this tree, or of the packages in ``source`` (a baseline)."""

    def __init__(self, home: Path, workers: int, source: Path | None = None, cpus: set[int] | None = None) -> None:
        self.home, self.workers, self.source, self.cpus = home, workers, source, cpus

    def __enter__(self) -> "service":
        env = {**os.environ, "HERMES_HOME": str(self.home)}
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
        self.proc = subprocess.Popen([sys.executable, "-m", "plugin_llm", "serve", "--port", "0", "--workers",
                                      str(self.workers)], stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=self.source or ROOT, preexec_fn=(lambda: pin(self.cpus)) if self.cpus else None)
        line = self.proc.stdout.readline()
        self.url = line.split("listening on ", 1)[1].split()[0]
        deadline = time.monotonic() + 90
        self.pids: set[int] = set()
        while True:  # every worker up and ready (each imports litellm at start-up)
            try:
                for _ in range(40):
                    health = json.load(urllib.request.urlopen(self.url + "/healthz", timeout=5))
                    if health.get("ready", True):
                        self.pids.add(health["pid"])
                if len(self.pids) >= self.workers or time.monotonic() > deadline:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
        time.sleep(0.5)
        return self

    def cpu(self) -> tuple[float, float]:
        """(CPU seconds of the workers, of the supervisor when it is another process)."""
        workers = sum(pid_cpu(pid) for pid in self.pids)
        return workers, (pid_cpu(self.proc.pid) if self.proc.pid not in self.pids else 0.0)

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def extract(rev: str) -> Path:
    """The packages of git revision ``rev`` in a temporary directory (read from the repository, nothing checked out)."""
    target = Path(tempfile.mkdtemp(prefix="bench-service-baseline-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, *PACKAGES],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def make_home(base_url: str) -> tuple[Path, str]:
    from plugin_llm.service.tokens import TokenStore

    home = Path(tempfile.mkdtemp(prefix="bench-service-"))
    (home / "config.yaml").write_text(f"model:\n  provider: custom\n  model: {MODEL}\n  base_url: {base_url}\n")
    store = TokenStore(home)
    token = store.create("bench")[1]
    store.close()
    return home, token


def _cpus(text: str | None) -> set[int] | None:
    return {int(c) for c in text.split(",")} if text else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--baseline", metavar="REV", help="also measure the service of this git revision")
    parser.add_argument("--pin", action="store_true", help="pin processes to CPUs (needs workers + 2 CPUs)")
    parser.add_argument("--workers", default="1,2", help="worker counts to measure (default 1,2)")
    parser.add_argument("--cpus", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--direct", nargs=3, metavar=("HOME", "C", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=4, metavar=("URL", "TOKEN", "C", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--layer", action="store_true",
                        help="measure the service layer alone: a stub pipeline, this tree vs --baseline")
    parser.add_argument("--stub-serve", nargs=2, metavar=("SOURCE", "HOME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    pin(_cpus(args.cpus))
    if args.upstream:
        return upstream_main()
    if args.direct:
        print(json.dumps(direct_worker(args.direct[0], int(args.direct[1]), int(args.direct[2]))))
        return
    if args.client:
        url, token, c, n = args.client
        print(json.dumps(service_client(url, token, int(c), int(n))))
        return
    if args.stub_serve:
        return stub_serve(*args.stub_serve)
    if args.layer:
        return layer(args)

    worker_counts = [int(w) for w in args.workers.split(",")]
    rounds = 2 if args.quick else 4
    calls = {1: 400, 16: 1500, 64: 3000} if args.quick else {1: 1500, 16: 4000, 64: 8000}
    cpus = sorted(os.sched_getaffinity(0))
    side = work = None
    if args.pin:
        if len(cpus) < max(worker_counts) + 2:
            print(f"--pin: {len(cpus)} CPUs are fewer than workers + 2; not pinning")
        else:
            side, work = {cpus[-1]}, set(cpus[:-1])
    kinds = ["after"] + (["before"] if args.baseline else [])
    print(f"bench_service: {len(cpus)} CPUs, {rounds} rounds, calls per run {calls}; times in ms, CPU in us/call; "
          f"pinning: {'upstream+client on CPU %d, workers and direct on %s' % (cpus[-1], sorted(work)) if work else 'none'}")
    baseline = extract(args.baseline) if args.baseline else None
    results: dict[tuple, list[dict]] = {}
    try:
        with upstream(side) as up:
            home, token = make_home(up.base_url)
            for workers in worker_counts:
                services = {"after": service(home, workers, None, work)}
                if baseline is not None:
                    services["before"] = service(home, workers, baseline, work)
                for svc in services.values():
                    svc.__enter__()
                try:
                    for _ in range(rounds):
                        for c in CONCURRENCY:
                            u0 = pid_cpu(up.proc.pid)
                            direct = in_process(["--direct", str(home), str(c), str(calls[c])], work)
                            direct["up_cpu_us"] = (pid_cpu(up.proc.pid) - u0) / (calls[c] + min(calls[c], 200)) * 1e6
                            results.setdefault(("direct", workers, c), []).append(direct)
                            for kind in kinds:
                                svc = services[kind]
                                (w0, s0), u0 = svc.cpu(), pid_cpu(up.proc.pid)
                                through = in_process(["--client", svc.url, token, str(c), str(calls[c])], side)
                                (w1, s1), served = svc.cpu(), calls[c] + min(calls[c], 200)  # the warm-up counts
                                through.update(worker_cpu_us=(w1 - w0) / served * 1e6, sup_cpu_us=(s1 - s0) / served * 1e6,
                                               up_cpu_us=(pid_cpu(up.proc.pid) - u0) / served * 1e6)
                                results.setdefault((kind, workers, c), []).append(through)
                finally:
                    for svc in services.values():
                        svc.__exit__(None, None, None)
    finally:
        if baseline is not None:
            shutil.rmtree(baseline, ignore_errors=True)

    def med(kind: str, workers: int, c: int, field: str) -> float:
        return statistics.median(r[field] for r in results[(kind, workers, c)])

    print()
    print(f"{'service':>7} {'W':>2} {'conc':>4} | {'direct p50':>10} {'p99':>7} | {'service p50':>11} {'p99':>7} | "
          f"{'added p50':>9} {'p99':>7} | {'direct/s':>8} {'service/s':>9} {'/worker':>7} | CPU us/call: "
          f"{'client':>6} {'workers':>7} {'superv.':>7} {'upstream':>8} {'direct':>6}")
    for workers in worker_counts:
        for c in CONCURRENCY:
            d50, d99 = med("direct", workers, c, "p50"), med("direct", workers, c, "p99")
            for kind in kinds:
                s50, s99 = med(kind, workers, c, "p50"), med(kind, workers, c, "p99")
                rate = med(kind, workers, c, "rate")
                print(f"{kind:>7} {workers:>2} {c:>4} | {d50:>10.3f} {d99:>7.3f} | {s50:>11.3f} {s99:>7.3f} | "
                      f"{s50 - d50:>9.3f} {s99 - d99:>7.3f} | {med('direct', workers, c, 'rate'):>8.0f} {rate:>9.0f} "
                      f"{rate / workers:>7.0f} | {'':>12}{med(kind, workers, c, 'cpu_us'):>6.0f} "
                      f"{med(kind, workers, c, 'worker_cpu_us'):>7.0f} {med(kind, workers, c, 'sup_cpu_us'):>7.0f} "
                      f"{med(kind, workers, c, 'up_cpu_us'):>8.0f} {med('direct', workers, c, 'cpu_us'):>6.0f}")
    print()
    for kind in kinds:
        label = "this tree" if kind == "after" else f"baseline {args.baseline}"
        if 1 in worker_counts:
            a1 = med(kind, 1, 1, "p50") - med("direct", 1, 1, "p50")
            print(f"{label}: p50 added at concurrency 1 (1 worker): {a1:.3f} ms (target < 1 ms: "
                  f"{'met' if a1 < 1 else 'NOT met'})")
        if 2 in worker_counts:
            a64 = med(kind, 2, 64, "p99") - med("direct", 2, 64, "p99")
            print(f"{label}: p99 added at concurrency 64, 2 workers: {a64:.3f} ms (target < 10 ms: "
                  f"{'met' if a64 < 10 else 'NOT met'})")
        for workers in worker_counts:
            cpu = statistics.median(med(kind, workers, c, "worker_cpu_us") - med("direct", workers, c, "cpu_us")
                                    for c in CONCURRENCY)
            print(f"{label}: {workers} worker(s): a request costs the workers {cpu:+.0f} us of CPU over the direct "
                  "call (median over concurrencies)")
    print("workers = CPU of the worker processes per request they served (summed over workers); direct = the "
          "in-process PluginLlm's process per call; client = the load generator; superv. = uvicorn's supervisor "
          "with W > 1.")


if __name__ == "__main__":
    main()
