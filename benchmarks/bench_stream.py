"""Cost of streaming: ``PluginLlm.stream`` vs ``complete`` and vs a raw httpx SSE read, same upstream, same run.

``python benchmarks/bench_stream.py [--quick]``

Against the embedded local model's HTTP server on 127.0.0.1 (in this process's threads), rounds
interleaved: **raw httpx** reading the SSE stream (the floor), **complete** on the fast path,
**stream** on the fast path and **stream (fallback)** through ``litellm.completion(stream=True)``.
Printed: the median CPU time per call of this process (all threads) and wall p50, and the ratios
stream/complete and stream/raw. Method: docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MESSAGES = [{"role": "user", "content": "Please stream back a reply of some length: " + "word " * 60}]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    rounds, per_round = (20, 5) if args.quick else (60, 10)

    home = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    os.environ["HERMES_HOME"] = str(home)
    import httpx

    from plugin_llm import PluginLlm
    from plugin_llm.local.server import LocalModelServer
    from plugin_llm.transport import _fastpath

    with LocalModelServer() as server:
        (home / "config.yaml").write_text(
            f"model:\n  provider: custom\n  model: local-echo-1\n  base_url: {server.base_url}\n", encoding="utf-8")
        llm = PluginLlm("bench")
        client = httpx.Client()
        body = {"model": "local-echo-1", "messages": MESSAGES, "stream": True,
                "stream_options": {"include_usage": True}}

        def raw() -> None:
            with client.stream("POST", server.base_url + "/chat/completions", json=body) as response:
                for _ in response.iter_lines():
                    pass

        def complete() -> None:
            llm.complete(MESSAGES)

        def stream() -> None:
            for _ in llm.stream(MESSAGES):
                pass

        def stream_fallback() -> None:
            os.environ[_fastpath.FAST_PATH_ENV] = "0"
            try:
                for _ in llm.stream(MESSAGES):
                    pass
            finally:
                os.environ.pop(_fastpath.FAST_PATH_ENV, None)

        contenders = {"raw httpx": raw, "complete": complete, "stream": stream, "stream (fallback)": stream_fallback}
        for fn in contenders.values():  # warm up: imports, pools, price map
            for _ in range(3):
                fn()
        cpu: dict[str, list[float]] = {name: [] for name in contenders}
        wall: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(rounds):
            for name, fn in contenders.items():
                for _ in range(per_round):
                    c0, w0 = time.process_time(), time.perf_counter()
                    fn()
                    cpu[name].append(time.process_time() - c0)
                    wall[name].append(time.perf_counter() - w0)
        deltas = len(list(llm.stream(MESSAGES)))

    print(f"streamed reply: {deltas} deltas; {rounds} rounds x {per_round} calls per contender, interleaved")
    print(f"{'contender':<20}{'CPU/call median':>18}{'wall p50':>12}")
    med = {name: statistics.median(values) for name, values in cpu.items()}
    for name in contenders:
        print(f"{name:<20}{med[name] * 1e3:>15.3f} ms{statistics.median(wall[name]) * 1e3:>9.3f} ms")
    print(f"ratio stream / complete (CPU): {med['stream'] / med['complete']:.2f}")
    print(f"ratio stream / raw httpx (CPU): {med['stream'] / med['raw httpx']:.2f}")
    print(f"ratio stream (fallback) / stream (CPU): {med['stream (fallback)'] / med['stream']:.2f}")


if __name__ == "__main__":
    main()
