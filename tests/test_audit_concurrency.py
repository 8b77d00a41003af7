"""Threads and processes sharing one home produce one valid chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from audit import AuditLog, AuditSettings, iter_records, verify

ROOT = Path(__file__).resolve().parents[1]
THREADS, PROCESSES, EACH = 8, 2, 200

# A writer process: its own AuditLog on the same file; waits for "go" so that it
# writes while the parent's threads do.
CHILD = """
import sys, time
from audit import AuditLog, AuditSettings
path, name, count, max_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
log = AuditLog(path, AuditSettings(max_bytes=max_bytes, backup_count=1000))
print("ready", flush=True)
sys.stdin.readline()
for i in range(count):
    log.write({"plugin_id": name, "n": i, "status": "ok"})
    time.sleep(0.0002)  # spread the writes so they interleave with the other writers'
print("done", flush=True)
"""


def run_mixed_writers(log_path: Path, max_bytes: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(log_path), f"proc-{i}", str(EACH), str(max_bytes)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        for i in range(PROCESSES)
    ]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready"
        log = AuditLog(log_path, AuditSettings(max_bytes=max_bytes, backup_count=1000))
        start = threading.Barrier(THREADS + 1)

        def worker(name: str) -> None:
            start.wait()
            for i in range(EACH):
                log.write({"plugin_id": name, "n": i, "status": "ok"})
                time.sleep(0.0002)

        threads = [threading.Thread(target=worker, args=(f"thread-{t}",)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        start.wait()
        for t in threads:
            t.join(60)
        for child in children:
            out, _ = child.communicate(timeout=60)
            assert child.returncode == 0 and out.strip() == "done"
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()


@pytest.mark.slow
@pytest.mark.parametrize("max_bytes", [0, 64 * 1024], ids=["one-file", "rotating"])
def test_threads_and_processes_write_one_valid_chain(tmp_path, max_bytes):
    log_path = tmp_path / "home" / "logs" / "agent.log"
    run_mixed_writers(log_path, max_bytes)
    total = THREADS * EACH + PROCESSES * EACH
    result = verify(log_path)
    assert result.ok, result.first_error
    assert result.records == total and result.head_seq == total
    found = list(iter_records(log_path))
    assert [r["seq"] for r in found] == list(range(1, total + 1))
    per_writer: dict[str, list[int]] = {}
    for r in found:
        per_writer.setdefault(r["plugin_id"], []).append(r["n"])
    assert len(per_writer) == THREADS + PROCESSES
    assert all(ns == list(range(EACH)) for ns in per_writer.values())  # nothing lost, nothing doubled
    if max_bytes:
        assert len(result.files) > 3
    for path in log_path.parent.glob("agent.log*"):
        if path.name != "agent.log.lock":
            for raw in path.read_bytes().split(b"\n")[:-1]:
                json.loads(raw)  # every line whole
