"""Gateway cost per call against one OpenAI-compatible server on 127.0.0.1 in its own process.

Printed, in one run (``python benchmarks/bench_gateway.py [--quick] [--hermes-python PATH]``):

* **sync**, per call: p50/p99 wall and client CPU for the ``http.client`` floor, raw httpx, the
  openai SDK, bare ``litellm.completion``, ``PluginLlm.complete`` (fast path and fallback) and the
  fast path's transport alone; **gateway overhead** = ours (fast path) minus the transport alone;
* **Hermes ``ctx.llm``** in its own process when a Hermes interpreter is given
  (``--hermes-python``, default ``$HERMES_PYTHON``; hermes-agent is a reference, never a
  dependency);
* **async** at concurrency 64 and 256: calls/s, p50/p99, CPU per call and peak RSS;
* ``gc.freeze`` on vs off, the cold first call, the pipeline alone, the trust gate, import time.

The server (``--serve``) answers every POST with a canned completion in a few microseconds, so the
client's own cost is what is measured. Method in full: docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MESSAGES = [{"role": "user", "content": "Benchmark ping: say something short."}]
MODEL = "local-echo-1"
BLOCK = 10
REPLY = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Benchmark pong, short."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
}).encode()


# --------------------------------------------------------------------------- the server (own process)
def serve() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(REPLY)

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport):  # noqa: D102
            self.transport, self.buffer = transport, b""

        def data_received(self, data):  # noqa: D102
            self.buffer += data
            while True:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                lowered = self.buffer[:end].lower()
                at = lowered.find(b"content-length:")
                length = int(lowered[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
                if len(self.buffer) < end + 4 + length:
                    return
                self.buffer = self.buffer[end + 4 + length:]
                self.transport.write(head + REPLY)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", 0, backlog=4096)
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
        await server.serve_forever()

    asyncio.run(main())


class server_process:
    def __enter__(self) -> "server_process":
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
        self.base_url = self.proc.stdout.readline().strip()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def make_home(base_url: str) -> Path:
    home = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    (home / "config.yaml").write_text(f"model:\n  provider: custom\n  model: {MODEL}\n  base_url: {base_url}\n")
    return home


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited from the parent across exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


# --------------------------------------------------------------------------- sync contenders
def sync_contenders(base_url: str, home: Path, which: set[str] | None = None) -> dict:
    import httpx
    import litellm
    import openai

    from plugin_llm import PluginLlm
    from plugin_llm.transport import LitellmTransport

    litellm.suppress_debug_info = True
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port)
    body = json.dumps({"model": MODEL, "messages": MESSAGES}).encode()
    path = parts.path + "/chat/completions"
    client = httpx.Client(base_url=base_url, timeout=30)
    sdk = openai.OpenAI(base_url=base_url, api_key="no-key", max_retries=0)
    fast = PluginLlm("bench", home=home, transport=LitellmTransport(fast_path=True))
    fallback = PluginLlm("bench", home=home, transport=LitellmTransport(fast_path=False))

    def floor() -> None:
        conn.request("POST", path, body, {"Content-Type": "application/json", "Authorization": "Bearer no-key"})
        conn.getresponse().read()

    transport_alone = fast_transport_alone(home)
    contenders = {
        "http.client (floor)": floor,
        "raw httpx": lambda: client.post("/chat/completions", content=body,
                                         headers={"Authorization": "Bearer no-key",
                                                  "Content-Type": "application/json"}).read(),
        "openai SDK": lambda: sdk.chat.completions.create(model=MODEL, messages=MESSAGES),
        "bare litellm": lambda: litellm.completion(model=f"openai/{MODEL}", messages=MESSAGES, api_base=base_url,
                                                   api_key="no-key", max_retries=0, timeout=30),
        "ours (fast path)": lambda: fast.complete(MESSAGES),
        TRANSPORT_ALONE: transport_alone,  # next to ours: the gateway overhead is their difference
        "ours (fallback)": lambda: fallback.complete(MESSAGES),
    }
    if which is not None:
        contenders = {k: v for k, v in contenders.items() if k in which}
    return contenders


TRANSPORT_ALONE = "fast-path transport alone"


def fast_transport_alone(home: Path):
    """The fast path's ``LitellmTransport.complete`` on the very request ``PluginLlm.complete`` builds.

    One call through the gateway records its :class:`TransportRequest` (route,
    key source, params); the contender then sends that request straight to
    the transport, so ours minus this is the gateway's own work per call.
    """
    import dataclasses

    from plugin_llm import PluginLlm
    from plugin_llm.transport import LitellmTransport

    transport = LitellmTransport(fast_path=True)
    seen: list = []

    class Recording:
        def ready(self) -> None:
            transport.ready()

        def complete(self, request):
            seen.append(request)
            return transport.complete(request)

    PluginLlm("bench", home=home, transport=Recording()).complete(MESSAGES)
    request = dataclasses.replace(seen[0], deadline=time.monotonic() + 86_400)  # no deadline in the way
    return lambda: transport.complete(request)


def bench_sync(contenders: dict, rounds: int) -> dict[str, dict[str, float]]:
    for fn in contenders.values():  # warm-up: pools, lazy imports, the fast path's route
        for _ in range(30):
            fn()
    walls: dict[str, list[float]] = {n: [] for n in contenders}
    cpus: dict[str, list[float]] = {n: [] for n in contenders}
    threads: dict[str, list[float]] = {n: [] for n in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            c0, t_0 = process_cpu(), time.thread_time()
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                fn()
                walls[name].append(time.perf_counter() - t0)
            threads[name].append((time.thread_time() - t_0) / BLOCK)
            cpus[name].append((process_cpu() - c0) / BLOCK)
    # "cpu": the whole process (litellm's logging threads count); "thread": the calling thread only, which
    # leaves out work another contender's threads do meanwhile (the fast path runs inline on this thread)
    return {n: {"p50": pct(walls[n], 0.5), "p99": pct(walls[n], 0.99), "cpu": statistics.median(cpus[n]) * 1e6,
                "thread": statistics.median(threads[n]) * 1e6} for n in contenders}


# --------------------------------------------------------------------------- async contenders (own process)
ASYNC_CONTENDERS = ["raw aiohttp", "raw httpx.AsyncClient", "bare litellm", "ours (fast path)", "ours (fallback)"]


def async_worker(name: str, base_url: str, home: Path, concurrency: int, calls: int) -> dict:
    async def main() -> dict:
        if name == "raw aiohttp":
            import aiohttp

            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            url = base_url + "/chat/completions"

            async def call() -> None:
                async with session.post(url, json={"model": MODEL, "messages": MESSAGES},
                                        headers={"Authorization": "Bearer no-key"}) as response:
                    await response.read()
        elif name == "raw httpx.AsyncClient":
            import httpx

            session = httpx.AsyncClient(base_url=base_url, timeout=60,
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=1000))

            async def call() -> None:
                (await session.post("/chat/completions", json={"model": MODEL, "messages": MESSAGES},
                                    headers={"Authorization": "Bearer no-key"})).read()
        elif name == "bare litellm":
            import litellm

            litellm.suppress_debug_info = True
            session = None

            async def call() -> None:
                await litellm.acompletion(model=f"openai/{MODEL}", messages=MESSAGES, api_base=base_url,
                                          api_key="no-key", max_retries=0, timeout=60)
        else:
            from plugin_llm import PluginLlm
            from plugin_llm.transport import LitellmTransport

            llm = PluginLlm("bench", home=home, transport=LitellmTransport(fast_path=name == "ours (fast path)"))
            session = None

            async def call() -> None:
                await llm.acomplete(MESSAGES, timeout=60)

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

        await run(min(calls, 300))  # warm-up
        latencies.clear()
        c0 = process_cpu()
        elapsed = await run(calls)
        cpu = (process_cpu() - c0) / calls
        if name == "raw aiohttp":
            await session.close()
        elif name == "raw httpx.AsyncClient":
            await session.aclose()
        return {"rate": calls / elapsed, "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99), "cpu": cpu * 1e6,
                "rss_mb": peak_rss_mb()}

    return asyncio.run(main())


def sync_worker(base_url: str, home: Path, rounds: int) -> dict:
    result = bench_sync(sync_contenders(base_url, home, {"ours (fast path)"}), rounds)["ours (fast path)"]
    result["rss_mb"] = peak_rss_mb()
    return result


def in_process(args: list[str], env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=900,
                         env={**os.environ, **(env or {})})
    if out.returncode != 0:
        raise RuntimeError(f"{args[0]} failed: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_async(base_url: str, home: Path, calls: int, repeats: int, names: list[str],
                env_of: dict | None = None) -> dict:
    results: dict[tuple[str, int], list[dict]] = {}
    for _ in range(repeats):
        for concurrency in (64, 256):
            for name in names:
                base, env = (env_of or {}).get(name, (name, None))
                row = in_process(["--async-worker", base, base_url, str(home), str(concurrency), str(calls)], env)
                results.setdefault((name, concurrency), []).append(row)
    return {key: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for key, rows in results.items()}


# --------------------------------------------------------------------------- Hermes ctx.llm (own interpreter)
# Run by the Hermes interpreter (stdlib + hermes-agent only): argv = mode url calls-or-rounds concurrency.
# Prints one JSON line like the other workers. HERMES_HOME and HOME are throw-away directories.
HERMES_WORKER = r"""
import asyncio, json, resource, statistics, sys, time
from agent.plugin_llm import PluginLlm
mode, url, n, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
MESSAGES = MESSAGES_LITERAL
BLOCK = BLOCK_LITERAL
llm = PluginLlm(plugin_id="bench")

def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime

def pct(samples, q):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0

if mode == "sync":
    for _ in range(30):
        assert llm.complete(MESSAGES).text
    walls, cpus = [], []
    for _ in range(n):
        c0 = cpu()
        for _ in range(BLOCK):
            t0 = time.perf_counter()
            llm.complete(MESSAGES)
            walls.append(time.perf_counter() - t0)
        cpus.append((cpu() - c0) / BLOCK)
    print(json.dumps({"p50": pct(walls, 0.5), "p99": pct(walls, 0.99), "cpu": statistics.median(cpus) * 1e6,
                      "rss_mb": rss()}))
else:
    async def main():
        latencies = []
        async def run(count):
            sem = asyncio.Semaphore(concurrency)
            async def one():
                async with sem:
                    t0 = time.perf_counter()
                    await llm.acomplete(MESSAGES, timeout=60)
                    latencies.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(count)))
            return time.perf_counter() - t0
        await run(min(n, 300))
        latencies.clear()
        c0 = cpu()
        elapsed = await run(n)
        return {"rate": n / elapsed, "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99),
                "cpu": (cpu() - c0) / n * 1e6, "rss_mb": rss()}
    print(json.dumps(asyncio.run(main())))
"""


class Hermes:
    """Hermes's ``ctx.llm`` in its own interpreter, against our upstream; ``skipped`` says why it cannot run."""

    def __init__(self, python: str | None) -> None:
        self.python, self.version, self.skipped = python, "", ""
        if not python:
            self.skipped = "no Hermes interpreter (pass --hermes-python PATH or set HERMES_PYTHON)"
            return
        try:
            out = subprocess.run([python, "-c", "import importlib.metadata as m, agent.plugin_llm; "
                                  "print(m.version('hermes-agent'))"], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.skipped = f"{python} could not be run ({type(exc).__name__})"
            return
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1][:200]
            self.skipped = f"{python} cannot import hermes-agent's agent.plugin_llm ({last})"
            return
        self.version = out.stdout.strip()

    def run(self, mode: str, base_url: str, n: int, concurrency: int = 1) -> dict:
        assert self.python
        with tempfile.TemporaryDirectory(prefix="bench-hermes-") as tmp:
            home = Path(tmp)
            (home / "user").mkdir()
            (home / "config.yaml").write_text(f"model:\n  provider: custom\n  model: {MODEL}\n  base_url: {base_url}\n")
            source = HERMES_WORKER.replace("MESSAGES_LITERAL", repr(MESSAGES)).replace("BLOCK_LITERAL", str(BLOCK))
            env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
            env.update(HERMES_HOME=str(home), HOME=str(home / "user"))
            out = subprocess.run([self.python, "-c", source, mode, base_url, str(n), str(concurrency)],
                                 capture_output=True, text=True, timeout=900, env=env, cwd=tmp)
        if out.returncode != 0:
            raise RuntimeError(f"Hermes {mode} worker failed: {out.stderr[-1500:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def bench_hermes(hermes: Hermes, base_url: str, home: Path, rounds: int, calls: int, repeats: int) -> None:
    """Hermes and ours (fast path), each in its own process, alternating; sync then async."""
    print(f"\n== Hermes ctx.llm (hermes-agent {hermes.version}, openai SDK) vs ours (fast path), each in its own "
          f"process, alternating, median of {repeats} ==")
    sync_rows: dict[str, list[dict]] = {"Hermes ctx.llm": [], "ours (fast path)": []}
    for _ in range(repeats):
        sync_rows["Hermes ctx.llm"].append(hermes.run("sync", base_url, rounds))
        sync_rows["ours (fast path)"].append(in_process(["--sync-worker", base_url, str(home), str(rounds)]))
    sync = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for name, rows in sync_rows.items()}
    print(f"  sync {'contender':<18} {'p50 µs':>9} {'p99 µs':>9} {'CPU µs/call':>12}")
    for name, row in sync.items():
        print(f"       {name:<18} {row['p50']:9.0f} {row['p99']:9.0f} {row['cpu']:12.0f}")
    ours, theirs = sync["ours (fast path)"], sync["Hermes ctx.llm"]
    print(f"  ours (fast) / Hermes ctx.llm, sync p50: {ours['p50'] / theirs['p50']:.3f}   (target <= 0.35)   "
          f"CPU: {ours['cpu'] / theirs['cpu']:.3f}")
    for concurrency in (64, 256):
        rows: dict[str, list[dict]] = {"Hermes ctx.llm": [], "ours (fast path)": []}
        for _ in range(repeats):
            rows["Hermes ctx.llm"].append(hermes.run("async", base_url, calls, concurrency))
            rows["ours (fast path)"].append(in_process(["--async-worker", "ours (fast path)", base_url, str(home),
                                                        str(concurrency), str(calls)]))
        med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rows.items()}
        h, o = med["Hermes ctx.llm"], med["ours (fast path)"]
        print(f"  async, concurrency {concurrency}: Hermes {h['rate']:.0f} calls/s (p99 {h['p99'] / 1000:.1f} ms, "
              f"peak RSS {h['rss_mb']:.0f} MB), ours {o['rate']:.0f} calls/s (p99 {o['p99'] / 1000:.1f} ms, "
              f"peak RSS {o['rss_mb']:.0f} MB): ours / Hermes = {o['rate'] / h['rate']:.2f}x")


def bench_render(iterations: int) -> tuple[float, float, float]:
    """CPU µs to render one call record: the writer's direct renderer, the reference encoder, the whole write."""
    import hashlib

    from audit import AuditLog, AuditSettings
    from audit.processors import HOST_GENERATED, RecordRenderer, format_ts
    from audit.records import CONTENT_FIELDS, canonical_json
    from auth.redaction import redact, redact_field

    record = {
        "event": "llm.call", "call_id": "626185cb993945fa844f0365eb569482", "plugin_id": "bench", "purpose": None,
        "api": "complete", "mode": "sync", "decision": "allowed", "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "custom", "gen_ai.request.model": MODEL, "agent_id": None, "profile": None,
        "schema_name": None, "latency_ms": 1.191, "decision_reason": "no overrides requested", "status": "ok",
        "error.type": None, "error.message": None, "gen_ai.response.model": MODEL, "gen_ai.usage.input_tokens": 9,
        "gen_ai.usage.output_tokens": 4, "cost_usd": None, "attempts": 1, "overhead_ms": 0.191,
        "prompt_sha256": "1" * 64, "response_sha256": "2" * 64, "kind": "call", "seq": 1, "prev_hash": "0" * 64,
    }
    renderer = RecordRenderer(clock=time.time, redact=redact_field, log_content=False)
    skip = HOST_GENERATED

    def reference() -> None:
        """The same steps the way the processor chain did them: the generic encoder, ``redact`` on every
        non-host string, a copy per stage (without structlog's own two copies of the record)."""
        event_dict = dict(record)
        if event_dict.get("ts") is None:
            event_dict["ts"] = format_ts(time.time())
        event_dict["schema"] = 1
        for name in CONTENT_FIELDS:
            event_dict.pop(name, None)
        for key, value in event_dict.items():
            if type(value) is str and not (key in skip and value.isascii()):
                event_dict[key] = redact(value)
        body = canonical_json(dict(event_dict))
        body[:-1] + b',"hash":"' + hashlib.sha256(body).hexdigest().encode() + b'"}\n'

    with tempfile.TemporaryDirectory() as tmp:
        log = AuditLog(Path(tmp) / "logs" / "agent.log", AuditSettings(), redact=redact_field)
        fns = {"direct": lambda: renderer.render(dict(record)), "reference": reference, "write": lambda: log.write(record)}
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(20):
            for name, fn in fns.items():
                c0 = time.thread_time()
                for _ in range(iterations // 20):
                    fn()
                samples[name].append((time.thread_time() - c0) / (iterations // 20) * 1e6)
    return tuple(statistics.median(samples[n]) for n in ("direct", "reference", "write"))  # type: ignore[return-value]


# --------------------------------------------------------------------------- cold start, pipeline, gate, import
COLD = {
    "bare litellm": ("import litellm\n"
                     "litellm.completion(model='openai/{model}', messages={messages!r}, api_base='{url}',"
                     " api_key='no-key', max_retries=0, timeout=30)\n"),
    "ours": ("from plugin_llm import PluginLlm\n"
             "PluginLlm('bench', home='{home}').complete({messages!r})\n"),
}


def bench_cold(base_url: str, home: Path, runs: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in COLD}
    for _ in range(runs):
        for name, code in COLD.items():
            source = code.format(model=MODEL, messages=MESSAGES, url=base_url, home=home) + "print('done', flush=True)\n"
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
            line = proc.stdout.readline()
            samples[name].append(time.perf_counter() - t0)
            proc.wait(timeout=60)
            if line.strip() != "done":
                raise RuntimeError(f"cold {name} failed")
    return {name: statistics.median(s) * 1000 for name, s in samples.items()}


def bench_pipeline(home: Path, iterations: int) -> float:
    from plugin_llm import PluginLlm
    from plugin_llm.transport import TransportResponse
    from plugin_llm.types import PluginLlmUsage

    class NullTransport:
        def complete(self, request):
            return TransportResponse("ok", {"role": "assistant", "content": "ok"}, "m", PluginLlmUsage(1, 1, 2), 1, 0.0)

    llm = PluginLlm("bench", home=home, transport=NullTransport())
    for _ in range(100):
        llm.complete(MESSAGES)
    c0 = process_cpu()
    for _ in range(iterations):
        llm.complete(MESSAGES)
    return (process_cpu() - c0) / iterations * 1e6


def bench_gate(home: Path, iterations: int) -> float:
    from plugin_llm.config import get_config_source
    from plugin_llm.trust import Overrides, decide

    source = get_config_source(home)
    overrides = Overrides(model="gpt-4o-mini", active_provider="openai")
    source.current()
    t0 = time.perf_counter()
    for _ in range(iterations):
        decide("bench", source.current().trust_for("bench"), overrides)
    return (time.perf_counter() - t0) / iterations * 1e6


def bench_import(runs: int) -> tuple[float, float, bool]:
    def timed(code: str) -> float:
        samples = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1000

    baseline, ours = timed("pass"), timed("import plugin_llm")
    loaded = subprocess.run([sys.executable, "-c", "import sys, plugin_llm; plugin_llm.PluginLlm; print('litellm' in sys.modules)"],
                            capture_output=True, text=True, cwd=ROOT).stdout.strip() == "True"
    return ours, baseline, loaded


# --------------------------------------------------------------------------- report
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--hermes-python", metavar="PATH", default=os.environ.get("HERMES_PYTHON"),
                        help="a Python with hermes-agent installed, for the Hermes ctx.llm row "
                             "(default: $HERMES_PYTHON; the row is skipped without one)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--async-worker", nargs=5, metavar=("NAME", "URL", "HOME", "CONCURRENCY", "CALLS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--sync-worker", nargs=3, metavar=("URL", "HOME", "ROUNDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve()
    if args.async_worker:
        name, url, home, concurrency, calls = args.async_worker
        print(json.dumps(async_worker(name, url, Path(home), int(concurrency), int(calls))))
        return
    if args.sync_worker:
        url, home, rounds = args.sync_worker
        print(json.dumps(sync_worker(url, Path(home), int(rounds))))
        return

    rounds, calls, repeats, cold_runs = (10, 500, 1, 2) if args.quick else (100, 3000, 3, 5)
    hermes = Hermes(args.hermes_python)
    with server_process() as server:
        home = make_home(server.base_url)
        print(f"server: {server.base_url} (asyncio, own process)   python {sys.version.split()[0]}   "
              f"cores: {os.cpu_count()}   load: {os.getloadavg()[0]:.2f}")

        print(f"\n== sync, per call: {rounds} interleaved rounds of {BLOCK}-call blocks ==")
        contenders = sync_contenders(server.base_url, home)
        sync = bench_sync(contenders, rounds)
        print(f"  {'contender':<26} {'p50 µs':>9} {'p99 µs':>9} {'CPU µs/call':>12} {'thread CPU':>11}")
        for name, row in sync.items():
            print(f"  {name:<26} {row['p50']:9.0f} {row['p99']:9.0f} {row['cpu']:12.0f} {row['thread']:11.0f}")
        ours, bare, fb = sync["ours (fast path)"], sync["bare litellm"], sync["ours (fallback)"]
        for what in ("p50", "cpu"):
            print(f"  ours (fast) / bare litellm, {what}: {ours[what] / bare[what]:.3f}   (target <= 0.25)"
                  f"   ours (fallback) / bare litellm: {fb[what] / bare[what]:.3f}")
        alone = sync[TRANSPORT_ALONE]
        print(f"  gateway overhead (ours fast path minus the fast-path transport alone, same request): "
              f"{ours['thread'] - alone['thread']:.0f} µs thread CPU ({ours['cpu'] - alone['cpu']:.0f} process CPU), "
              f"{ours['p50'] - alone['p50']:.0f} µs p50 per call")
        pipeline = bench_pipeline(home, 2000 if args.quick else 20000)
        print(f"  gateway pipeline alone (null transport; gate, routing, audit write): {pipeline:.0f} µs CPU per call")
        direct, reference, write = bench_render(20_000 if args.quick else 100_000)
        print(f"  audit call record, rendered directly: {direct:.1f} µs vs the processor chain's steps with the "
              f"reference encoder: {reference:.1f} µs ({direct / reference:.2f}x); whole AuditLog.write "
              f"{write:.1f} µs (thread CPU, medians)")
        if hermes.skipped:
            print(f"  Hermes row skipped: {hermes.skipped}")
        else:
            bench_hermes(hermes, server.base_url, home, max(rounds // 2, 5), calls, repeats)

        print(f"\n== async: {calls} calls per run, each contender in its own process, median of {repeats} ==")
        asy = bench_async(server.base_url, home, calls, repeats, ASYNC_CONTENDERS)
        print(f"  {'contender':<22} {'conc':>5} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU µs/call':>12} "
              f"{'peak RSS MB':>12}")
        for (name, concurrency), row in sorted(asy.items(), key=lambda kv: (kv[0][1], ASYNC_CONTENDERS.index(kv[0][0]))):
            print(f"  {name:<22} {concurrency:>5} {row['rate']:9.0f} {row['p50'] / 1000:8.1f} {row['p99'] / 1000:8.1f} "
                  f"{row['cpu']:12.0f} {row['rss_mb']:12.0f}")
        for concurrency in (64, 256):
            ratio = asy[("ours (fast path)", concurrency)]["rate"] / asy[("bare litellm", concurrency)]["rate"]
            print(f"  concurrency {concurrency}: ours (fast) / bare litellm = {ratio:.2f}x calls/s   (target >= 5x)")

        print(f"\n== gc.freeze after litellm loads: ours (fast path), PLUGIN_LLM_GC_FREEZE=0 vs 1, median of {repeats} ==")
        frozen = bench_async(server.base_url, home, calls, repeats, ["freeze", "no freeze"],
                             {"freeze": ("ours (fast path)", {"PLUGIN_LLM_GC_FREEZE": "1"}),
                              "no freeze": ("ours (fast path)", {"PLUGIN_LLM_GC_FREEZE": "0"})})
        for concurrency in (64, 256):
            on, off = frozen[("freeze", concurrency)], frozen[("no freeze", concurrency)]
            print(f"  async, concurrency {concurrency}: {on['rate']:.0f} vs {off['rate']:.0f} calls/s "
                  f"({(on['rate'] / off['rate'] - 1) * 100:+.0f}%), p99 {on['p99'] / 1000:.1f} vs {off['p99'] / 1000:.1f} ms, "
                  f"peak RSS {on['rss_mb']:.0f} vs {off['rss_mb']:.0f} MB")
        sync_rounds = str(max(rounds // 2, 5))
        on_rows, off_rows = [], []
        for _ in range(repeats):
            on_rows.append(in_process(["--sync-worker", server.base_url, str(home), sync_rounds],
                                      {"PLUGIN_LLM_GC_FREEZE": "1"}))
            off_rows.append(in_process(["--sync-worker", server.base_url, str(home), sync_rounds],
                                       {"PLUGIN_LLM_GC_FREEZE": "0"}))
        on = {k: statistics.median(r[k] for r in on_rows) for k in on_rows[0]}
        off = {k: statistics.median(r[k] for r in off_rows) for k in off_rows[0]}
        print(f"  sync: p50 {on['p50']:.0f} vs {off['p50']:.0f} µs, p99 {on['p99']:.0f} vs {off['p99']:.0f} µs, "
              f"CPU {on['cpu']:.0f} vs {off['cpu']:.0f} µs/call")

        print(f"\n== cold first call: process start to first result, median of {cold_runs} ==")
        cold = bench_cold(server.base_url, home, cold_runs)
        print(f"  bare litellm {cold['bare litellm']:.0f} ms   ours {cold['ours']:.0f} ms   "
              f"ratio {cold['ours'] / cold['bare litellm']:.2f}   (target <= 1.1)")

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "config.yaml").write_text("plugins:\n  entries:\n    bench:\n      llm:\n        allow_model_override: true\n"
                                          "        allowed_models: [openai/gpt-4o-mini]\n")
        gate = bench_gate(home, 20_000 if args.quick else 200_000)
        print(f"\n== trust gate incl. hot-reload check: {gate:.2f} µs per decision (target < 20 µs) ==")
    ours_ms, baseline, loaded = bench_import(5 if args.quick else 15)
    print(f"== import plugin_llm: {ours_ms - baseline:.1f} ms over a bare interpreter (target < 150 ms); "
          f"litellm imported: {loaded} ==")


if __name__ == "__main__":
    main()
