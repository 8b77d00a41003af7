"""Gateway overhead against one OpenAI-compatible server on 127.0.0.1 (issue 2).

Measured in one run, interleaved so that machine noise hits every contender
alike: raw httpx POST, bare ``litellm.completion``, ``PluginLlm.complete``;
then 1,000 ``acomplete`` calls at concurrency 64 vs bare ``litellm.acompletion``;
the trust gate decision including the config hot-reload check; and the
import time of ``plugin_llm`` (which must not import litellm).

Printed, not asserted: ``python benchmarks/bench_gateway.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
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
BLOCK = 10


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def bench_sync(base_url: str, home: Path, rounds: int) -> dict[str, float]:
    import httpx
    import litellm

    from plugin_llm import PluginLlm

    litellm.suppress_debug_info = True
    client = httpx.Client(base_url=base_url, timeout=30)
    llm = PluginLlm("bench", home=home)
    body = {"model": "local-echo-1", "messages": MESSAGES}

    def raw() -> None:
        client.post("/chat/completions", json=body, headers={"Authorization": "Bearer no-key"}).raise_for_status()

    def bare() -> None:
        litellm.completion(model="openai/local-echo-1", messages=MESSAGES, api_base=base_url, api_key="no-key",
                           max_retries=0, timeout=30)

    log_fd = os.open(home / "bench-append.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lock_fd = os.open(home / "bench-append.lock", os.O_RDWR | os.O_CREAT, 0o600)
    line = b"x" * 900 + b"\n"

    def bare_then_append() -> None:
        # bare litellm followed by what any caller that keeps a log does: one locked
        # append (~5 µs on its own). litellm leaves logging work on a background
        # thread after each call; the first system call after it lets that work run
        # right then instead of during the next request's network wait.
        bare()
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        os.write(log_fd, line)
        fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def gateway() -> None:
        llm.complete(MESSAGES)

    contenders = {"raw httpx": raw, "bare litellm": bare, "bare + append": bare_then_append, "PluginLlm": gateway}
    for fn in contenders.values():  # warm-up: connection pools, lazy imports
        for _ in range(20):
            fn()
    # Each sample is a block of BLOCK back-to-back calls: litellm finishes every
    # call with logging work on a background thread, and a block charges that
    # work to the contender that caused it (a lone call would hide it).
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            c0, t0 = process_cpu(), time.perf_counter()
            for _ in range(BLOCK):
                fn()
            wall[name].append((time.perf_counter() - t0) / BLOCK)
            cpu[name].append((process_cpu() - c0) / BLOCK)
    client.close()
    return {name: median_us(s) for name, s in wall.items()}, {name: median_us(s) for name, s in cpu.items()}


def process_cpu() -> float:
    """CPU seconds of this process, all threads (litellm logs on a background thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_pipeline(home: Path, iterations: int) -> float:
    """PluginLlm with a null transport: gate, routing, result and the real audit write."""
    from plugin_llm import PluginLlm
    from plugin_llm.transport import TransportResponse
    from plugin_llm.types import PluginLlmUsage

    class NullTransport:
        def complete(self, request):
            return TransportResponse("ok", {"role": "assistant", "content": "ok"}, "m", PluginLlmUsage(1, 1, 2), 1, 0.0)

    llm = PluginLlm("bench", home=home, transport=NullTransport())
    for _ in range(100):
        llm.complete(MESSAGES)
    t0 = time.perf_counter()
    for _ in range(iterations):
        llm.complete(MESSAGES)
    return (time.perf_counter() - t0) / iterations * 1e6


def bench_async(base_url: str, home: Path, calls: int, concurrency: int, repeats: int) -> dict[str, float]:
    import litellm

    from plugin_llm import PluginLlm

    llm = PluginLlm("bench-async", home=home)

    async def bare() -> None:
        await litellm.acompletion(model="openai/local-echo-1", messages=MESSAGES, api_base=base_url, api_key="no-key",
                                  max_retries=0, timeout=30)

    async def gateway() -> None:
        await llm.acomplete(MESSAGES)

    async def run(fn) -> float:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                await fn()

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(calls)))
        return time.perf_counter() - t0

    async def main() -> dict[str, list[float]]:
        await run(bare)  # warm-up
        await run(gateway)
        out: dict[str, list[float]] = {"bare litellm.acompletion": [], "PluginLlm.acomplete": []}
        for _ in range(repeats):
            out["bare litellm.acompletion"].append(await run(bare))
            out["PluginLlm.acomplete"].append(await run(gateway))
        return out

    results = asyncio.run(main())
    return {name: statistics.median(v) / calls * 1e6 for name, v in results.items()}


def bench_gate(home: Path, iterations: int) -> tuple[float, float]:
    from plugin_llm.config import get_config_source
    from plugin_llm.trust import Overrides, decide

    source = get_config_source(home)
    overrides = Overrides(model="gpt-4o-mini", active_provider="openai")
    source.current()
    t0 = time.perf_counter()
    for _ in range(iterations):
        decide("bench", source.current().trust_for("bench"), overrides)
    gate = (time.perf_counter() - t0) / iterations * 1e6
    t0 = time.perf_counter()
    for _ in range(iterations):
        os.stat(source.path)
    stat = (time.perf_counter() - t0) / iterations * 1e6
    return gate, stat


def bench_import(runs: int) -> tuple[float, float, bool]:
    def timed(code: str) -> float:
        samples = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1000

    baseline = timed("pass")
    ours = timed("import plugin_llm")
    loaded = subprocess.run([sys.executable, "-c", "import sys, plugin_llm; plugin_llm.PluginLlm; print('litellm' in sys.modules)"],
                            capture_output=True, text=True, cwd=ROOT).stdout.strip() == "True"
    return ours, baseline, loaded


class server_process:
    """The local model server in its own process, so it never competes for our GIL."""

    def __enter__(self) -> "server_process":
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "plugin_llm.cli.main", "serve-local", "--port", "0"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )
        line = self.proc.stdout.readline()  # "local model listening on http://127.0.0.1:PORT/v1"
        self.base_url = line.split()[-1]
        if not self.base_url.startswith("http://127.0.0.1:"):
            self.proc.kill()
            raise RuntimeError(f"serve-local did not start: {line!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds, calls, repeats = (10, 200, 1) if args.quick else (100, 1000, 3)

    with tempfile.TemporaryDirectory() as tmp, server_process() as server:
        home = Path(tmp)
        (home / "config.yaml").write_text(
            f"model:\n  provider: custom\n  model: local-echo-1\n  base_url: {server.base_url}\n"
            "plugins:\n  entries:\n    bench:\n      llm:\n        allow_model_override: true\n"
            "        allowed_models: [openai/gpt-4o-mini]\n"
        )
        print(f"server: {server.base_url}   python {sys.version.split()[0]}   cores: {os.cpu_count()}")
        print(f"\n== sync, per call: median over {rounds} interleaved rounds of {BLOCK}-call blocks ==")
        sync, cpu = bench_sync(server.base_url, home, rounds)
        for name, us in sync.items():
            print(f"  {name:<14} {us:9.1f} µs wall   {cpu[name]:9.1f} µs CPU (client process, all threads)")
        ratio = sync["PluginLlm"] / sync["bare litellm"]
        cpu_ratio = cpu["PluginLlm"] / cpu["bare litellm"]
        print(f"  PluginLlm / bare litellm = {ratio:.3f} wall  (overhead {sync['PluginLlm'] - sync['bare litellm']:+.1f} µs, "
              f"{(ratio - 1) * 100:+.1f}%; target <= +5%)")
        print(f"  PluginLlm / bare litellm = {cpu_ratio:.3f} CPU   ({(cpu_ratio - 1) * 100:+.1f}%; less sensitive to other load)")
        print(f"  PluginLlm / (bare litellm + one locked append) = {sync['PluginLlm'] / sync['bare + append']:.3f} wall, "
              f"{cpu['PluginLlm'] / cpu['bare + append']:.3f} CPU")
        print(f"  bare litellm / raw httpx = {sync['bare litellm'] / sync['raw httpx']:.3f}")
        pipeline = bench_pipeline(home, 2000 if args.quick else 20000)
        print(f"  PluginLlm pipeline alone (null transport, real gate + audit write): {pipeline:.1f} µs "
              f"= {pipeline / sync['bare litellm'] * 100:.1f}% of a bare litellm call")

        print(f"\n== async, {calls} calls at concurrency 64, median of {repeats} ==")
        asy = bench_async(server.base_url, home, calls, 64, repeats)
        for name, us in asy.items():
            print(f"  {name:<26} {us:9.1f} µs per call (wall / calls)")
        aratio = asy["PluginLlm.acomplete"] / asy["bare litellm.acompletion"]
        print(f"  PluginLlm.acomplete / bare = {aratio:.3f}  ({(aratio - 1) * 100:+.1f}%; target <= +5%)")

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "config.yaml").write_text("plugins:\n  entries:\n    bench:\n      llm:\n        allow_model_override: true\n"
                                          "        allowed_models: [openai/gpt-4o-mini]\n")
        gate, stat = bench_gate(home, 20_000 if args.quick else 200_000)
        print("\n== trust gate incl. hot-reload check ==")
        print(f"  gate decision: {gate:.2f} µs   (baseline os.stat alone: {stat:.2f} µs, ratio {gate / stat:.2f}; target < 20 µs)")

    ours, baseline, loaded = bench_import(5 if args.quick else 15)
    print("\n== import time ==")
    print(f"  python -c 'import plugin_llm': {ours:.1f} ms   (python -c pass: {baseline:.1f} ms; "
          f"import cost {ours - baseline:.1f} ms; target < 150 ms)   litellm imported: {loaded}")


if __name__ == "__main__":
    main()
