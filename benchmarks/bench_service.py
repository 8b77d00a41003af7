"""What the service adds: ``plugin-llm serve`` vs in-process ``PluginLlm.acomplete``/``astream``.

One upstream (a canned OpenAI-compatible server on uvloop, in its own process), called directly
(``PluginLlm`` at concurrency C) and through ``plugin-llm serve --workers W`` by a lean keep-alive
load generator, plain (``--modes plain``) and streamed (``stream``: SSE, the upstream's whole reply
in one write), rounds interleaved, medians printed. ``--baseline REV`` also runs git revision
REV's service in the same run and prints this tree's CPU per request over REV's; ``--layer``
measures the service's own layer alone (a stub pipeline); ``--pin``, ``--quick``: see --help.

Printed per mode, workers and concurrency: p50/p99 direct and through the service, calls/s, CPU
per call of the client, the workers (with its spread over rounds), the upstream and the direct
process, and the workers' write system calls per request. Method: docs/performance.md.
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
MODES = ("plain", "stream")
PACKAGES = ("plugin_llm", "audit", "auth")
_TICKS = os.sysconf("SC_CLK_TCK")
REPLY = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Benchmark pong, short."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
}).encode()
#: a streamed reply: a role chunk, these deltas, a finish chunk, a usage chunk and [DONE], in one write
DELTAS = ("Bench", "mark ", "pong", ", ", "short ", "and ", "stream", "ed.")


def _sse_reply() -> bytes:
    def chunk(**fields: object) -> bytes:
        doc = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000, "model": MODEL,
               **fields}
        return b"data: " + json.dumps(doc).encode() + b"\n\n"

    events = [chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    events += [chunk(choices=[{"index": 0, "delta": {"content": d}, "finish_reason": None}]) for d in DELTAS]
    events.append(chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    events.append(chunk(choices=[], usage={"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17}))
    return b"".join(events) + b"data: [DONE]\n\n"


SSE_REPLY = _sse_reply()
#: the events a streamed answer of the service has: role, the deltas, finish, usage, [DONE]
STREAM_EVENTS = len(DELTAS) + 4


def pid_writes(pid: int) -> int:
    """Write system calls of one process so far (``syscw`` in /proc; sockets included), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("syscw:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


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
    if b"transfer-encoding: chunked" in head:
        return _parse_chunked(buffer, int(head[9:12]), end + 4)
    at = head.find(b"content-length:")
    length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
    if len(buffer) < end + 4 + length:
        return None
    status, body = int(head[9:12]), bytes(buffer[end + 4:end + 4 + length])
    del buffer[:end + 4 + length]
    return status, body


def _parse_chunked(buffer: bytearray, status: int, at: int) -> tuple[int, bytes] | None:
    parts = []
    while True:
        line = buffer.find(b"\r\n", at)
        if line < 0:
            return None
        size = int(bytes(buffer[at:line]).split(b";", 1)[0], 16)
        if size == 0:
            if len(buffer) < line + 4:
                return None
            del buffer[:line + 4]
            return status, b"".join(parts)
        if len(buffer) < line + 2 + size + 2:
            return None
        parts.append(bytes(buffer[line + 2:line + 2 + size]))
        at = line + 2 + size + 2


class _Upstream(asyncio.Protocol):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(REPLY)
    streamed = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                % len(SSE_REPLY)) + SSE_REPLY

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
            body = bytes(self.buffer[end + 4:end + 4 + length])
            del self.buffer[:end + 4 + length]
            if b'"stream": true' in body or b'"stream":true' in body:
                self.transport.write(self.streamed)
            else:
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


def direct_worker(home: str, mode: str, concurrency: int, calls: int) -> dict:
    from plugin_llm import PluginLlm

    llm = PluginLlm("bench", home=Path(home))

    async def factory():
        async def call() -> None:
            await llm.acomplete(MESSAGES, timeout=60)

        async def stream() -> None:
            deltas = [delta async for delta in await llm.astream(MESSAGES, timeout=60)]
            if len(deltas) != len(DELTAS):
                raise RuntimeError(f"the stream had {len(deltas)} deltas, not {len(DELTAS)}")
        return stream if mode == "stream" else call

    return asyncio.run(_measure(factory, concurrency, calls))


def service_client(url: str, token: str, mode: str, concurrency: int, calls: int) -> dict:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    if mode == "stream":
        path = "/v1/chat/completions"
        body = json.dumps({"messages": MESSAGES, "timeout": 60, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
    else:
        path, body = "/v1/plugin-llm/complete", json.dumps({"messages": MESSAGES, "timeout": 60}).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    connections: list[_Connection] = []

    async def factory():
        _, connection = await asyncio.get_running_loop().create_connection(_Connection, host, int(port))
        connections.append(connection)

        async def call() -> None:
            status, answer = await connection.request(request)
            if status != 200 or (answer.count(b"data: ") != STREAM_EVENTS or not answer.endswith(b"data: [DONE]\n\n")
                                 if mode == "stream" else b'"text"' not in answer):
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


class _Sampler:
    """A statistical profiler of CPU time: SIGPROF every ``interval`` s of the process's CPU, the main thread's
    Python stack recorded (a C function's time goes to the Python function that called it)."""

    def __init__(self, interval: float = 0.0005) -> None:
        self.interval = interval
        self.samples: dict[tuple, int] = {}

    def _take(self, signum: int, frame) -> None:
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append((code.co_filename, code.co_firstlineno, code.co_name))
            frame = frame.f_back
        key = tuple(stack)
        self.samples[key] = self.samples.get(key, 0) + 1

    def start(self) -> None:
        import signal

        signal.signal(signal.SIGPROF, self._take)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)

    def stop(self) -> None:
        import signal

        signal.setitimer(signal.ITIMER_PROF, 0, 0)


def profile_serve(home: str, out: str) -> None:
    """This tree's real service (the pipeline, the serve protocol) in one process, sampled (``--profile``)."""
    import pickle
    import signal
    import socket

    import uvicorn

    from plugin_llm.service.app import create_app
    from plugin_llm.service.connections import PROTOCOL

    app = create_app(Path(home), warm=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, http=PROTOCOL, access_log=False, server_header=False, lifespan="on",
                                           log_level="warning"))
    signal.signal(signal.SIGTERM, lambda *_: None)  # uvicorn re-raises SIGTERM once drained: return, then dump
    sampler = _Sampler()
    signal.signal(signal.SIGUSR1, lambda *_: sampler.start())  # after the warm-up
    server.run(sockets=[sock])
    sampler.stop()
    Path(out).write_bytes(pickle.dumps(sampler.samples))


def _report(samples: dict[tuple, int], top: int = 30) -> None:
    """Where the sampled CPU went: by package or module (self time), then by function (self and inclusive)."""
    import re

    total = sum(samples.values()) or 1

    def where(filename: str) -> str:
        found = re.search(r"site-packages/([^/]+)", filename)
        if found:
            return found.group(1)
        if filename.startswith(str(ROOT)):
            return filename[len(str(ROOT)) + 1:]
        return "stdlib " + filename.rsplit("/", 1)[-1]

    groups: dict[str, int] = {}
    own: dict[tuple, int] = {}
    inclusive: dict[tuple, int] = {}
    for stack, n in samples.items():
        if not stack:
            continue
        groups[where(stack[0][0])] = groups.get(where(stack[0][0]), 0) + n
        own[stack[0]] = own.get(stack[0], 0) + n
        for frame in set(stack):
            inclusive[frame] = inclusive.get(frame, 0) + n
    print(f"  {total} samples; self time by package/module:")
    for name, n in sorted(groups.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {n / total * 100:5.1f}%  {name}")
    print("  self time by function:")
    for (filename, line, name), n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {n / total * 100:5.1f}%  {where(filename)}:{line} {name}")
    print("  inclusive time by function:")
    for (filename, line, name), n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top * 2]:
        print(f"  {n / total * 100:5.1f}%  {where(filename)}:{line} {name}")


def profile(args: argparse.Namespace) -> None:
    """``--profile PATH``: where this tree's service spends its CPU under load, per mode, at the highest
    --concurrency (a sampling profiler on CPU time: SIGPROF; samples pickled to PATH.<mode>)."""
    import pickle
    import signal

    c = max(int(c) for c in args.concurrency.split(","))
    with upstream(None) as up:
        home, token = make_home(up.base_url)
        for mode in args.modes.split(","):
            out = f"{args.profile}.{mode}"
            proc = subprocess.Popen([sys.executable, __file__, "--profile-serve", str(home), out],
                                    stdout=subprocess.PIPE, text=True, env={**os.environ, "HERMES_HOME": str(home)},
                                    cwd=ROOT)
            url = proc.stdout.readline().strip()
            deadline = time.monotonic() + 90
            while True:  # listening, and litellm loaded
                try:
                    if json.load(urllib.request.urlopen(url + "/healthz", timeout=5)).get("ready") is True:
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.2)
            in_process(["--client", url, token, mode, str(c), "500"], None)  # warm-up, not sampled
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            c0 = pid_cpu(proc.pid)
            in_process(["--client", url, token, mode, str(c), "4000"], None)
            print(f"{mode}: {(pid_cpu(proc.pid) - c0) / 4200 * 1e6:.0f} us of CPU per request while sampled")
            proc.terminate()
            proc.wait(timeout=60)
            _report(pickle.loads(Path(out).read_bytes()))


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
                    through = in_process(["--client", url, token, "plain", str(c), str(calls[c])], None)
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

    def writes(self) -> int:
        return sum(pid_writes(pid) for pid in self.pids)

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
    parser.add_argument("--modes", default=",".join(MODES), help="plain, stream or both (default plain,stream)")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)),
                        help="concurrencies to measure (default 1,16,64)")
    parser.add_argument("--rounds", type=int, help="rounds (default 4, --quick 2)")
    parser.add_argument("--direct", nargs=4, metavar=("HOME", "MODE", "C", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=5, metavar=("URL", "TOKEN", "MODE", "C", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--layer", action="store_true",
                        help="measure the service layer alone: a stub pipeline, this tree vs --baseline")
    parser.add_argument("--stub-serve", nargs=2, metavar=("SOURCE", "HOME"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", metavar="PATH",
                        help="cProfile this tree's service (one process) under load per mode; stats to PATH.<mode>")
    parser.add_argument("--profile-serve", nargs=2, metavar=("HOME", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    pin(_cpus(args.cpus))
    if args.upstream:
        return upstream_main()
    if args.direct:
        home, mode, c, n = args.direct
        print(json.dumps(direct_worker(home, mode, int(c), int(n))))
        return
    if args.client:
        url, token, mode, c, n = args.client
        print(json.dumps(service_client(url, token, mode, int(c), int(n))))
        return
    if args.stub_serve:
        return stub_serve(*args.stub_serve)
    if args.layer:
        return layer(args)
    if args.profile_serve:
        return profile_serve(*args.profile_serve)
    if args.profile:
        return profile(args)

    worker_counts = [int(w) for w in args.workers.split(",")]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= set(MODES):
        parser.error(f"--modes takes {', '.join(MODES)}")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    rounds = args.rounds or (2 if args.quick else 4)
    sizes = {1: 400, 16: 1500, 64: 3000} if args.quick else {1: 1500, 16: 4000, 64: 8000}
    calls = {c: sizes.get(c, sizes[64]) for c in concurrency}
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
                        for mode in modes:
                            for c in concurrency:
                                served = calls[c] + min(calls[c], 200)  # the warm-up counts
                                u0 = pid_cpu(up.proc.pid)
                                direct = in_process(["--direct", str(home), mode, str(c), str(calls[c])], work)
                                direct["up_cpu_us"] = (pid_cpu(up.proc.pid) - u0) / served * 1e6
                                results.setdefault(("direct", mode, workers, c), []).append(direct)
                                for kind in kinds:
                                    svc = services[kind]
                                    (w0, s0), u0, x0 = svc.cpu(), pid_cpu(up.proc.pid), svc.writes()
                                    through = in_process(["--client", svc.url, token, mode, str(c), str(calls[c])],
                                                         side)
                                    (w1, s1), x1 = svc.cpu(), svc.writes()
                                    through.update(worker_cpu_us=(w1 - w0) / served * 1e6,
                                                   sup_cpu_us=(s1 - s0) / served * 1e6,
                                                   up_cpu_us=(pid_cpu(up.proc.pid) - u0) / served * 1e6,
                                                   writes=(x1 - x0) / served)
                                    results.setdefault((kind, mode, workers, c), []).append(through)
                finally:
                    for svc in services.values():
                        svc.__exit__(None, None, None)
    finally:
        if baseline is not None:
            shutil.rmtree(baseline, ignore_errors=True)

    def med(kind: str, mode: str, workers: int, c: int, field: str) -> float:
        return statistics.median(r[field] for r in results[(kind, mode, workers, c)])

    def spread(kind: str, mode: str, workers: int, c: int, field: str) -> str:
        values = [r[field] for r in results[(kind, mode, workers, c)]]
        return f"{min(values):.0f}-{max(values):.0f}"

    print()
    print(f"{'service':>7} {'mode':>6} {'W':>2} {'conc':>4} | {'direct p50':>10} {'p99':>7} | {'service p50':>11} "
          f"{'p99':>7} | {'direct/s':>8} {'service/s':>9} | CPU us/call: {'client':>6} {'workers':>7} "
          f"{'(spread)':>11} {'upstream':>8} {'direct':>6} | {'writes':>6}")
    for mode in modes:
        for workers in worker_counts:
            for c in concurrency:
                d50, d99 = med("direct", mode, workers, c, "p50"), med("direct", mode, workers, c, "p99")
                for kind in kinds:
                    print(f"{kind:>7} {mode:>6} {workers:>2} {c:>4} | {d50:>10.3f} {d99:>7.3f} | "
                          f"{med(kind, mode, workers, c, 'p50'):>11.3f} {med(kind, mode, workers, c, 'p99'):>7.3f} | "
                          f"{med('direct', mode, workers, c, 'rate'):>8.0f} {med(kind, mode, workers, c, 'rate'):>9.0f} | "
                          f"{'':>12}{med(kind, mode, workers, c, 'cpu_us'):>6.0f} "
                          f"{med(kind, mode, workers, c, 'worker_cpu_us'):>7.0f} "
                          f"{spread(kind, mode, workers, c, 'worker_cpu_us'):>11} "
                          f"{med(kind, mode, workers, c, 'up_cpu_us'):>8.0f} "
                          f"{med('direct', mode, workers, c, 'cpu_us'):>6.0f} | "
                          f"{med(kind, mode, workers, c, 'writes'):>6.1f}")
    print()
    if "before" in kinds:
        for mode in modes:
            for workers in worker_counts:
                ratios = []
                for c in concurrency:
                    pairs = [a["worker_cpu_us"] / b["worker_cpu_us"] for a, b in
                             zip(results[("after", mode, workers, c)], results[("before", mode, workers, c)])]
                    ratios.append(f"c={c}: {med('after', mode, workers, c, 'worker_cpu_us') / med('before', mode, workers, c, 'worker_cpu_us'):.2f} "
                                  f"(rounds {min(pairs):.2f}-{max(pairs):.2f})")
                print(f"{mode:>6}, {workers} worker(s): CPU per request, this tree / baseline {args.baseline}: "
                      + ", ".join(ratios))
        print()
    for kind in kinds:
        label = "this tree" if kind == "after" else f"baseline {args.baseline}"
        for mode in modes:
            for workers in worker_counts:
                cpu = statistics.median(med(kind, mode, workers, c, "worker_cpu_us")
                                        - med("direct", mode, workers, c, "cpu_us") for c in concurrency)
                print(f"{label}: {mode}, {workers} worker(s): a request costs the workers {cpu:+.0f} us of CPU over "
                      "the direct call (median over concurrencies)")
    print("workers = CPU of the worker processes per request they served (summed over workers; spread = min-max over "
          "rounds); direct = the in-process PluginLlm's process per call; client = the load generator; writes = the "
          "workers' write system calls per request (socket sends, the audit log).")

if __name__ == "__main__":
    main()
