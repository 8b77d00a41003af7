"""Audit log throughput and read costs. Printed, not asserted.

1. Writing through the real ``AuditLog`` with ``fsync: never`` and ``fsync: always``, against
   ``f.write(json.dumps(record) + "\\n")`` on a buffered file, in the same run.
2. ``verify`` and ``query`` over 1,000,000 records (in 50 MB rotated files), each in a fresh
   process so its peak RSS is its own; 100,000 records show whether memory stays flat.
3. The audit share of one ``PluginLlm.complete`` against the local model over HTTP.
4. Signed checkpoints: writer records/s with checkpoints on vs off, and ``verify --pubkey`` of
   1,000,000 records with their checkpoints. Targets: checkpoints cost < 5% of write throughput;
   verify of 1M < 10 s in flat memory.

``python benchmarks/bench_audit.py [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PLUGINS = [f"plugin-{i}" for i in range(10)]
MODELS = ["gpt-4o-mini-2024-07-18", "claude-3-5-haiku-20241022", "local-echo-1"]
STATUSES = ["ok"] * 8 + ["denied", "timeout"]


def sample_record(i: int) -> dict:
    """A call record shaped like the gateway's (every field of a call record)."""
    from audit.records import call_record

    status = STATUSES[i % len(STATUSES)]
    model = MODELS[i % len(MODELS)]
    return call_record(
        call_id=f"call_{i:032x}", plugin_id=PLUGINS[i % len(PLUGINS)], api="complete" if i % 4 else "structured",
        mode="sync" if i % 3 else "async", decision="denied" if status == "denied" else "allowed", status=status,
        purpose=f"summarise ticket #{i}", decision_reason="default route", provider="openai", request_model=model,
        response_model=None if status == "denied" else model, agent_id=None, profile="default",
        input_tokens=120 + i % 50, output_tokens=40 + i % 7, cost_usd=0.000123, attempts=1,
        latency_ms=800.0 + i % 400, overhead_ms=1.25, schema_name=None, prompt_sha256="a" * 64,
        response_sha256="b" * 64,
    )


# -- 1. writing -------------------------------------------------------------------------


def bench_baseline(path: Path, records: list[dict]) -> float:
    t0 = time.perf_counter()
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return time.perf_counter() - t0


def bench_writer(path: Path, records: list[dict], fsync: str, redact=None) -> float:
    from audit import AuditLog, AuditSettings

    log = AuditLog(path, AuditSettings(fsync=fsync), redact=redact)
    log.write({"warm": "up"})
    t0 = time.perf_counter()
    for r in records:
        log.write(r)
    elapsed = time.perf_counter() - t0
    log.close()
    return elapsed


def section_write(tmp: Path, n: int, n_fsync: int) -> float:
    records = [sample_record(i) for i in range(n)]
    base = bench_baseline(tmp / "baseline.log", records)
    never = bench_writer(tmp / "w-never" / "agent.log", records, "never")
    always = bench_writer(tmp / "w-always" / "agent.log", records[:n_fsync], "always")
    try:
        from auth import redact
    except ImportError:
        redact = None
    redacted = bench_writer(tmp / "w-redact" / "agent.log", records, "never", redact) if redact else None

    from audit import verify

    ok = verify(tmp / "w-never" / "agent.log").ok
    rate_base, rate_never, rate_always = n / base, n / never, n_fsync / always
    print(f"\n== write: {n:,} call records (~{len(json.dumps(records[0])):,} bytes each) ==")
    print(f"  baseline f.write(json.dumps(r)+'\\n')  {rate_base:>10,.0f} rec/s  {base / n * 1e6:7.1f} µs/rec")
    print(f"  AuditLog fsync=never                  {rate_never:>10,.0f} rec/s  {never / n * 1e6:7.1f} µs/rec"
          f"   ratio to baseline {rate_never / rate_base:.2f}  (target >= 20,000 rec/s; chain verifies: {ok})")
    if redacted is not None:
        print(f"  AuditLog fsync=never + auth.redact    {n / redacted:>10,.0f} rec/s  {redacted / n * 1e6:7.1f} µs/rec")
    print(f"  AuditLog fsync=always ({n_fsync:,} records)  {rate_always:>8,.0f} rec/s  {always / n_fsync * 1e6:7.1f} µs/rec"
          f"   ({rate_always / rate_never:.3f} of fsync=never)")
    return never / n


# -- 2. reading -------------------------------------------------------------------------


def generate(log_path: Path, n: int, max_bytes: int = 50 * 1024**2, signer=None, every: int = 1000) -> tuple[int, float]:
    """Write ``n`` chained records in rotated files exactly as the writer lays them out
    (with ``signer``: and a signed checkpoint every ``every`` records, as the writer does)."""
    from audit.chain import GENESIS_HASH, render_line
    from audit.checkpoints import checkpoints_path, render
    from audit.processors import format_ts

    cps = open(checkpoints_path(log_path), "wb") if signer is not None and log_path.parent.mkdir(parents=True, exist_ok=True) is None else None

    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    parts: list[Path] = []
    prev, size, f = GENESIS_HASH, 0, None
    start = time.time() - n * 0.01
    for i in range(n):
        record = sample_record(i)
        record.update(ts=format_ts(start + i * 0.01), schema=1, seq=i + 1, prev_hash=prev)
        line, prev = render_line(record)
        if f is None or (size and size + len(line) > max_bytes):
            if f is not None:
                f.close()
            parts.append(log_path.with_name(f"part-{len(parts):04d}"))
            f = open(parts[-1], "wb", buffering=1 << 20)
            size = 0
        f.write(line)
        size += len(line)
        if cps is not None and (i + 1) % every == 0:
            cps.write(render(signer.name, i + 1, prev, [f"time {record['ts']}", "reason records"], [signer]))
    assert f is not None
    f.close()
    if cps is not None:
        cps.close()
    for index, part in enumerate(reversed(parts)):  # newest is agent.log, then .1, .2 ...
        part.rename(log_path if index == 0 else log_path.with_name(f"agent.log.{index}"))
    total = sum(p.stat().st_size for p in log_path.parent.glob("agent.log*"))
    return total, time.perf_counter() - t0


# VmHWM: this process's own peak (ru_maxrss would include the parent's, kept across exec)
PEAK_RSS = """
def peak_rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

READ_JOB = PEAK_RSS + """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from audit import iter_records, verify
kind, path = sys.argv[2], sys.argv[3]
t0, c0 = time.perf_counter(), time.process_time()
if kind == "verify":
    r = verify(path)
    detail = f"ok={r.ok} records={r.records} files={len(r.files)}"
elif kind == "verify-signed":
    from audit.signing import read_verifiers
    r = verify(path, pubkeys=read_verifiers(sys.argv[4]))
    c = r.checkpoints
    detail = f"ok={r.ok} records={r.records} checkpoints={c.valid} covered={c.covered_seq} warnings={len(r.warnings)}"
elif kind == "verify-strict":
    r = verify(path, strict=True)
    detail = f"ok={r.ok} records={r.records}"
elif kind == "query-selective":
    n = sum(1 for _ in iter_records(path, plugin="plugin-3", status="ok"))
    detail = f"matched={n}"
elif kind == "query-time":
    records = iter_records(path, since="1970-01-01T00:00:00Z")
    n = sum(1 for _ in records)
    detail = f"matched={n} (every record parsed)"
elif kind == "query-json-out":
    out = open("/dev/null", "w")
    n = 0
    for r in iter_records(path, model="gpt-4o*"):
        out.write(json.dumps(r, ensure_ascii=False) + "\\n")
        n += 1
    detail = f"printed={n}"
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"seconds": elapsed, "cpu": cpu, "rss_mb": peak_rss_mb(), "detail": detail}))
"""


def run_job(kind: str, path: Path, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-c", READ_JOB, str(ROOT), kind, str(path), *extra], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def section_read(tmp: Path, big: int, small: int) -> None:
    idle = run_job_idle()
    print(f"\n== read: verify and query (fresh process each; python + audit import alone: {idle:.1f} MB RSS) ==")
    for n in (small, big):
        path = tmp / f"r{n}" / "logs" / "agent.log"
        size, gen = generate(path, n)
        print(f"  {n:,} records, {size / 1e6:,.0f} MB in {len(list(path.parent.glob('agent.log*')))} files "
              f"(generated in {gen:.1f} s)")
        jobs = ["verify", "query-selective", "query-time", "query-json-out"]
        if n == small:
            jobs.insert(1, "verify-strict")
        for kind in jobs:
            r = run_job(kind, path)
            print(f"    {kind:<16} {r['seconds']:6.2f} s (cpu {r['cpu']:6.2f} s)  {n / r['seconds']:>10,.0f} rec/s  "
                  f"peak RSS {r['rss_mb']:6.1f} MB   {r['detail']}")
        if n == big:
            print("    (targets: verify and query < 10 s each on 1,000,000 records, RSS flat between sizes)")


def run_job_idle() -> float:
    code = PEAK_RSS + f"import sys; sys.path.insert(0, {str(ROOT)!r}); import audit.reader, audit.verifier; " \
           "print(peak_rss_mb())"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


# -- 4. signed checkpoints ------------------------------------------------------------------


def section_checkpoints(tmp: Path, n_write: int, big: int, small: int, rounds: int = 10) -> None:
    from audit import AuditLog, AuditSettings
    from audit.signing import generate_key

    _, signer = generate_key()
    records = [sample_record(i) for i in range(n_write)]
    results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    for r in range(rounds):  # interleaved: the machine is shared, its load drifts
        for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
            log = AuditLog(tmp / f"cp-{name}-{r}" / "logs" / "agent.log", AuditSettings(),
                           signer=signer if name == "on" else None)
            log.write({"warm": "up"})
            t0, c0 = time.perf_counter(), time.process_time()
            for rec in records:
                log.write(rec)
            results[name].append((time.perf_counter() - t0, time.process_time() - c0))
            log.close()
    print(f"\n== checkpoints: writer, {n_write:,} records x {rounds} interleaved rounds, "
          f"a signed checkpoint every 1,000 records ==")
    for stat_name, pick in (("median", statistics.median), ("best", min)):
        wall = {k: pick(w for w, _ in v) for k, v in results.items()}
        cpu = {k: pick(c for _, c in v) for k, v in results.items()}
        for k in ("off", "on"):
            print(f"  {stat_name:<6} checkpoints {k:<3}  {n_write / wall[k]:>10,.0f} rec/s wall  "
                  f"{wall[k] / n_write * 1e6:6.2f} µs/rec   cpu {cpu[k] / n_write * 1e6:6.2f} µs/rec")
        cost_wall = (wall["on"] - wall["off"]) / wall["off"] * 100
        cost_cpu = (cpu["on"] - cpu["off"]) / cpu["off"] * 100
        print(f"  {stat_name:<6} cost of checkpoints: {cost_wall:+.1f}% wall, {cost_cpu:+.1f}% cpu (target < 5%)")
    print("  (the machine is shared: 'best' is the least disturbed round of each)")

    pub = tmp / "bench.pub"
    pub.write_text(signer.verifier.text() + "\n")
    print(f"\n== checkpoints: verify --pubkey (fresh process each) ==")
    for n in (small, big):
        path = tmp / f"cps{n}" / "logs" / "agent.log"
        size, gen = generate(path, n, signer=signer)
        r = run_job("verify-signed", path, str(pub))
        print(f"  {n:>9,} records ({size / 1e6:,.0f} MB, generated in {gen:.1f} s): {r['seconds']:6.2f} s "
              f"(cpu {r['cpu']:6.2f} s)  {n / r['seconds']:>10,.0f} rec/s  peak RSS {r['rss_mb']:6.1f} MB   {r['detail']}")
    print("  (target: 1,000,000 records < 10 s, RSS flat between sizes)")


# -- 3. share of a gateway call ------------------------------------------------------------


class _NullAudit:
    """An audit sink that does nothing (the 'no audit' contender)."""

    settings = None

    def write(self, record: dict) -> dict:
        return record

    def write_event(self, event: str, **fields) -> None:
        return None

    def check_writable(self) -> None:
        return None


class _TimedSink:
    """The real AuditLog, timing each write as it happens inside a gateway call."""

    def __init__(self, log) -> None:
        self._log = log
        self.settings = log.settings
        self.samples: list[float] = []

    def write(self, record: dict) -> dict:
        t0 = time.perf_counter()
        out = self._log.write(record)
        self.samples.append(time.perf_counter() - t0)
        return out

    def write_event(self, event: str, **fields) -> None:
        self._log.write_event(event, **fields)

    def check_writable(self) -> None:
        self._log.check_writable()


def section_share(rounds: int, per_record_s: float) -> None:
    try:
        import litellm  # noqa: F401

        from plugin_llm import PluginLlm
        from plugin_llm.local.server import serve_forever  # noqa: F401 - the server process needs it
    except ImportError as exc:
        print(f"\n== share of a PluginLlm.complete call: skipped ({exc}) ==")
        return
    from audit import AuditLog

    messages = [{"role": "user", "content": "Benchmark ping: say something short."}]
    # the server runs in a separate process, as a provider would
    server = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                               "from plugin_llm.local.server import serve_forever; serve_forever('127.0.0.1', 0)", str(ROOT)],
                              stdout=subprocess.PIPE, text=True)
    try:
        base_url = server.stdout.readline().split()[-1]
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            (home / "config.yaml").write_text(f"model:\n  provider: custom\n  model: local-echo-1\n  base_url: {base_url}\n")
            sink = _TimedSink(AuditLog(home / "logs" / "agent.log"))
            audited = PluginLlm("bench", home=home, audit_log=sink)
            silent = PluginLlm("bench", home=home, audit_log=_NullAudit())
            for llm in (audited, silent):
                for _ in range(20):
                    llm.complete(messages)
            sink.samples.clear()
            samples: dict[str, list[float]] = {"with audit": [], "no-op sink": []}
            for _ in range(rounds):
                for name, llm in (("with audit", audited), ("no-op sink", silent)):
                    t0 = time.perf_counter()
                    llm.complete(messages, purpose="bench")
                    samples[name].append(time.perf_counter() - t0)
    finally:
        server.kill()
        server.wait()
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    inside = statistics.median(sink.samples) * 1e6
    diff = med["with audit"] - med["no-op sink"]
    print(f"\n== audit share of one PluginLlm.complete, local model over HTTP in another process "
          f"({rounds} interleaved rounds, medians) ==")
    print(f"  call with audit {med['with audit']:8.1f} µs   with a no-op sink {med['no-op sink']:8.1f} µs   "
          f"difference {diff:+.1f} µs ({diff / med['with audit'] * 100:+.1f}%)")
    print(f"  AuditLog.write inside the call: {inside:.1f} µs wall ({inside / med['with audit'] * 100:.1f}% of the call); "
          f"alone (section 1): {per_record_s * 1e6:.1f} µs ({per_record_s * 1e6 / med['with audit'] * 100:.1f}%)")
    print("  (the gap between the two is GIL hand-off: the write's flock/stat/write syscalls release the GIL and "
          "litellm's logging threads, busy right after each completion, run first)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts (a smoke run)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the test logs (default: a temp dir)")
    parser.add_argument("--only", choices=["write", "read", "share", "checkpoints"], default=None, help="run one section")
    args = parser.parse_args()
    n_write, n_fsync, big, small, rounds = (
        (20_000, 500, 200_000, 20_000, 50) if args.quick else (100_000, 2_000, 1_000_000, 100_000, 300)
    )
    print(f"python {sys.version.split()[0]}   cores: {os.cpu_count()}   quick: {args.quick}")
    per_record = 30e-6  # used by the share section when the write section is skipped
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        if args.only in (None, "write", "share"):
            per_record = section_write(tmp, n_write if args.only != "share" else n_write // 5, n_fsync)
        if args.only in (None, "read"):
            section_read(tmp, big, small)
        if args.only in (None, "checkpoints"):
            section_checkpoints(tmp, n_write // 5, big, small)
    if args.only in (None, "share"):
        section_share(rounds, per_record)


if __name__ == "__main__":
    main()
