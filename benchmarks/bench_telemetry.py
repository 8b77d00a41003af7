"""What telemetry costs the audit writer, per call record. Printed, not asserted.

Records/s through the real ``AuditLog`` (``fsync: never``) in three setups, in the same run:
no observer (telemetry off: the one attribute check), telemetry on with the SDK's
BatchSpanProcessor feeding an exporter that drops everything (the cost of building the span and
the metric points, not of the network), and the observer alone without the write. Off is one
attribute check per record (tens of nanoseconds against a write's tens of microseconds); on is
the SDK's span and histogram bookkeeping, reported per record to set against a call's latency.

``python benchmarks/bench_telemetry.py [--quick]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_audit import sample_record  # noqa: E402


class _Drop:
    def export(self, spans):  # the SpanExporter interface, without the network
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _rate(fn, n: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(n):
            fn(i)
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, repeats = (2000, 3) if args.quick else (20000, 5)
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from audit.settings import AuditSettings
    from audit.writer import AuditLog
    from plugin_llm.config.telemetry import TelemetrySettings
    from plugin_llm.telemetry import _Telemetry

    records = [dict(sample_record(i), kind="call") for i in range(256)]
    with tempfile.TemporaryDirectory() as tmp:
        log = AuditLog(Path(tmp) / "logs" / "agent.log", AuditSettings(fsync="never", max_bytes=1 << 40),
                       signer=None)
        off = _rate(lambda i: log.write(records[i % 256]), n, repeats)
        telemetry = _Telemetry(TelemetrySettings("http://127.0.0.1:9"), _Drop(), InMemoryMetricReader())
        log.set_observer(telemetry.observe)
        on = _rate(lambda i: log.write(records[i % 256]), n, repeats)
        written = [log.write(records[i]) for i in range(256)]
        alone = _rate(lambda i: telemetry.observe(written[i % 256]), n, repeats)
        telemetry.shutdown()
        log.close()
    print(f"audit write, telemetry off:   {off:10,.0f} records/s")
    print(f"audit write, telemetry on:    {on:10,.0f} records/s  (on/off: {on / off:.2f})")
    print(f"span + metrics from a record: {alone:10,.0f} records/s  ({1e6 / alone:.1f} us each)")


if __name__ == "__main__":
    main()
