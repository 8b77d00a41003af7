"""Out-of-process plugins: what isolation costs, printed with the in-process baseline.

1. Per-invocation overhead of a hook (``invoke_hook``) and of a tool call (``dispatch_tool``)
   when the plugin runs out of process, against the same plugin in process, measured in the
   same run: median of batches, wall time per call (µs) and the ratio; the host's own CPU
   time per call (``time.process_time``, less sensitive to a noisy machine) is printed too.
   Target: under 0.5 ms per invocation on loopback pipes.
2. Process start + register: a forced re-discovery of one isolated plugin (spawn the child
   through the sandbox, import plugin_llm's worker, import the plugin, register() over the
   channel), median in ms. Target: under 300 ms. Shown for the confinement in effect here
   (bubblewrap when usable) and, for comparison, without bubblewrap.

Printed, not asserted: ``python benchmarks/bench_isolation.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PLUGIN = textwrap.dedent(
    '''
    def register(ctx):
        ctx.register_hook("on_session_start", lambda session_id=None: None)
        ctx.register_tool("echo", {"description": "echo", "parameters": {"type": "object"}},
                          lambda args: args.get("text", ""))
    '''
)


def make_home(root: Path, isolated: bool) -> Path:
    home = root / ("isolated" if isolated else "in-process")
    plugin = home / "plugins" / "bench"
    plugin.mkdir(parents=True)
    (plugin / "plugin.yaml").write_text('name: bench\nversion: "1"\n')
    (plugin / "__init__.py").write_text(PLUGIN)
    entries = "  entries:\n    bench: {isolation: process}\n" if isolated else ""
    (home / "config.yaml").write_text(f"plugins:\n  enabled: [bench]\n{entries}")
    return home


def per_call(fn, batch: int, batches: int) -> tuple[float, float]:
    """(median wall µs per call, median host CPU µs per call) over ``batches`` batches."""
    fn()
    walls, cpus = [], []
    for _ in range(batches):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(batch):
            fn()
        walls.append((time.perf_counter() - w0) / batch * 1e6)
        cpus.append((time.process_time() - c0) / batch * 1e6)
    return statistics.median(walls), statistics.median(cpus)


def start_ms(manager, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        manager.discover_plugins(force=True)
        times.append((time.perf_counter() - t0) * 1000)
        assert manager.get_plugin("bench")["status"] == "enabled", manager.get_plugin("bench")["error"]
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    batch, batches, runs = (200, 5, 5) if args.quick else (1000, 9, 15)

    from plugin_llm.plugins import PluginManager
    from plugin_llm.plugins.isolation import sandbox

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["HERMES_HOME"] = str(root / "unused")
        inproc = PluginManager(make_home(root, False), audit_events=False)
        isolated = PluginManager(make_home(root, True), audit_events=False)
        inproc.discover_plugins()
        isolated.discover_plugins()
        info = isolated.get_plugin("bench")
        assert info["status"] == "enabled", info["error"]
        print(f"isolated plugin: confinement={info['confinement']} ({info.get('confinement_reason')})")

        rows = []
        for label, call in (
            ("hook (invoke_hook)", lambda m: (lambda: m.invoke_hook("on_session_start", session_id="s"))),
            ("tool (dispatch_tool)", lambda m: (lambda: m.dispatch_tool("echo", {"text": "hi"}))),
        ):
            base_wall, base_cpu = per_call(call(inproc), batch, batches)
            iso_wall, iso_cpu = per_call(call(isolated), batch, batches)
            rows.append((label + ", main thread", base_wall, base_cpu, iso_wall, iso_cpu))

        def in_thread(fn):
            box = {}
            thread = threading.Thread(target=lambda: box.update(r=fn()))
            thread.start()
            thread.join()
            return box["r"]

        base = in_thread(lambda: per_call(lambda: inproc.invoke_hook("on_session_start", session_id="s"), batch, batches))
        iso = in_thread(lambda: per_call(lambda: isolated.invoke_hook("on_session_start", session_id="s"), batch, batches))
        rows.append(("hook (invoke_hook), worker thread", base[0], base[1], iso[0], iso[1]))

        print(f"\nper invocation ({batches} batches of {batch}, medians; wall = what the caller waits)")
        print(f"{'':36} {'in process':>12} {'out of process':>15} {'overhead':>10} {'ratio':>7} {'host CPU in/out':>17}")
        for label, bw, bc, iw, ic in rows:
            print(f"{label:36} {bw:10.1f}µs {iw:13.1f}µs {iw - bw:8.1f}µs {iw / bw:6.1f}x {bc:7.1f}/{ic:7.1f}µs")
        worst = max(iw - bw for _, bw, _, iw, _ in rows)
        print(f"worst overhead per invocation: {worst / 1000:.3f} ms (target < 0.5 ms)")

        print(f"\nprocess start + register (forced re-discovery, median of {runs})")
        in_start = start_ms(inproc, runs)
        iso_start = start_ms(isolated, runs)
        print(f"  in process (import + register):        {in_start:8.1f} ms")
        print(f"  out of process, {info['confinement']:<10} confinement: {iso_start:8.1f} ms (target < 300 ms)")
        if info["confinement"] == sandbox.CONFINEMENT_BUBBLEWRAP:
            original = sandbox.bubblewrap_status
            sandbox.bubblewrap_status = lambda: sandbox.BubblewrapStatus(False, None, "benchmark: off")
            try:
                plain = start_ms(isolated, runs)
            finally:
                sandbox.bubblewrap_status = original
            print(f"  out of process, without bubblewrap:    {plain:8.1f} ms (bubblewrap adds {iso_start - plain:.1f} ms)")
        isolated.shutdown()


if __name__ == "__main__":
    main()
