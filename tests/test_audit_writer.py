"""The hash-chained writer: chain fields, restarts, rotation, torn lines, failures, injection."""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from audit import AuditLog, AuditSettings, AuditWriteError, get_audit_log, verify
from audit.chain import GENESIS_HASH
from audit.records import canonical_json

ROOT = Path(__file__).resolve().parents[1]


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_bytes().split(b"\n") if x]


def clock(start: float = 1_767_225_600.0):
    t = [start]

    def now() -> float:
        t[0] += 0.25
        return t[0]

    return now


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "home" / "logs" / "agent.log"


def test_first_records_carry_schema_seq_prev_hash_and_hash(log_path):
    log = AuditLog(log_path, clock=clock())
    first = log.write({"plugin_id": "p", "status": "ok"})
    second = log.write({"plugin_id": "p", "status": "denied"})
    assert (first["schema"], first["seq"], first["prev_hash"]) == (1, 1, GENESIS_HASH)
    assert (second["seq"], second["prev_hash"]) == (2, first["hash"])
    assert first["ts"] == "2026-01-01T00:00:00.250Z" and first["kind"] == "call" and first["event"] == "llm.call"
    on_disk = records(log_path)
    assert on_disk == [first, second]
    body = {k: v for k, v in on_disk[1].items() if k != "hash"}
    assert on_disk[1]["hash"] == hashlib.sha256(canonical_json(body)).hexdigest()
    assert log.head == (2, second["hash"])


def test_caller_supplied_timestamp_is_kept(log_path):
    record = AuditLog(log_path).write({"ts": "2025-01-01T00:00:00+00:00", "plugin_id": "p"})
    assert record["ts"] == "2025-01-01T00:00:00+00:00"


def test_restart_continues_the_chain_in_a_new_instance(log_path):
    AuditLog(log_path).write({"n": 1})
    last = AuditLog(log_path).write({"n": 2})
    again = AuditLog(log_path).write({"n": 3})
    assert (last["seq"], again["seq"], again["prev_hash"]) == (2, 3, last["hash"])
    assert verify(log_path).ok


def test_restart_continues_the_chain_in_a_fresh_process(log_path):
    first = AuditLog(log_path).write({"n": 1})
    code = (
        "import sys, json; from audit import AuditLog; "
        "print(json.dumps(AuditLog(sys.argv[1]).write({'n': 2})))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(log_path)], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=True)
    child = json.loads(out.stdout)
    assert (child["seq"], child["prev_hash"]) == (2, first["hash"])
    assert AuditLog(log_path).write({"n": 3})["prev_hash"] == child["hash"]
    assert verify(log_path).ok


def test_resume_reads_the_tail_not_the_whole_file(log_path, monkeypatch):
    log = AuditLog(log_path)
    log.write({"n": 1})
    last = log.write({"n": 2})
    # make the file large: megabytes of old lines before the last record
    data = log_path.read_bytes().split(b"\n")
    filler = (data[0] + b"\n") * 12_000
    log_path.write_bytes(filler + data[1] + b"\n")
    read = [0]
    real_pread = os.pread

    def counting_pread(fd, n, offset):
        chunk = real_pread(fd, n, offset)
        read[0] += len(chunk)
        return chunk

    monkeypatch.setattr(os, "pread", counting_pread)
    nxt = AuditLog(log_path).write({"n": 3})
    assert nxt["prev_hash"] == last["hash"] and nxt["seq"] == 3
    assert log_path.stat().st_size > 2_000_000
    assert read[0] < 64 * 1024


def test_rotation_keeps_the_chain_across_files(log_path):
    log = AuditLog(log_path, AuditSettings(max_bytes=1500, backup_count=50))
    written = [log.write({"plugin_id": "p", "n": i, "pad": "x" * 100}) for i in range(40)]
    files = sorted(log_path.parent.glob("agent.log*"))
    backups = [p for p in files if p.name[len("agent.log."):].isdigit()]
    assert len(backups) >= 3
    for path in [log_path, *backups]:
        assert path.stat().st_size <= 1500
    # the first line of each newer file links to the last line of the older one
    ordered = sorted(backups, key=lambda p: -int(p.name.rsplit(".", 1)[1])) + [log_path]
    for older, newer in zip(ordered, ordered[1:]):
        assert records(newer)[0]["prev_hash"] == records(older)[-1]["hash"]
    result = verify(log_path)
    assert result.ok and result.records == 40 and len(result.files) == len(ordered)
    assert result.head_seq == 40 and result.head_hash == written[-1]["hash"]


def test_rotation_drops_files_beyond_backup_count(log_path):
    log = AuditLog(log_path, AuditSettings(max_bytes=600, backup_count=2))
    for i in range(30):
        log.write({"n": i, "pad": "y" * 100})
    names = sorted(p.name for p in log_path.parent.iterdir())
    assert names == ["agent.log", "agent.log.1", "agent.log.2", "agent.log.lock"]
    # retention leaves no trace that tells a pruned head from deleted lines: a failure unless expected
    refused = verify(log_path)
    assert not refused.ok and refused.first_error.kind == "history_start"
    assert "--allow-pruned-head" in refused.first_error.detail
    result = verify(log_path, allow_pruned_head=True)
    assert result.ok and result.head_seq == 30
    assert [w.kind for w in result.warnings] == ["history_start"]


def test_backup_count_zero_and_lowered_retention(log_path):
    log = AuditLog(log_path, AuditSettings(max_bytes=600, backup_count=5))
    for i in range(30):
        log.write({"n": i, "pad": "z" * 100})
    log.update_settings(AuditSettings(max_bytes=600, backup_count=0))
    for i in range(10):
        log.write({"n": i, "pad": "z" * 100})
    assert sorted(p.name for p in log_path.parent.iterdir()) == ["agent.log", "agent.log.lock"]
    assert verify(log_path).first_error.kind == "history_start"  # looks like a never-rotated log missing its head
    assert verify(log_path, allow_pruned_head=True).ok


def test_torn_last_line_is_reported_once_and_the_chain_resumes(log_path, capsys):
    log = AuditLog(log_path)
    for i in range(3):
        last = log.write({"n": i})
    log.close()
    with open(log_path, "ab") as f:  # a crash in the middle of a write
        f.write(b'{"event":"llm.call","kind":"call","plugin_id":"p","seq":4,"pr')
    broken = verify(log_path)
    assert not broken.ok and broken.first_error.kind == "torn" and broken.first_error.line == 4

    fresh = AuditLog(log_path)
    after = fresh.write({"n": "after"})
    fresh.write({"n": "after-2"})
    AuditLog(log_path).write({"n": "third instance"})
    err = capsys.readouterr().err
    assert err.count("not a complete record") == 1 and "resumes from seq 3" in err

    rows = lines(log_path)
    assert rows[3].startswith(b'{"event":"llm.call"') and rows[3].endswith(b'"pr\n')  # torn bytes on their own line
    event = json.loads(rows[4])
    assert event["event"] == "chain_resumed" and event["kind"] == "event"
    assert (event["seq"], event["prev_hash"], event["resumed_from_seq"]) == (4, last["hash"], 3)
    assert event["torn_offset"] == sum(len(r) for r in rows[:3])
    assert event["torn_sha256"] == hashlib.sha256(rows[3][:-1]).hexdigest()
    assert after["seq"] == 5 and after["prev_hash"] == event["hash"]
    result = verify(log_path)
    assert result.ok, result.first_error
    assert [(w.kind, w.line) for w in result.warnings] == [("torn", 4)]


def test_record_missing_only_its_newline_is_completed_not_torn(log_path, capsys):
    log = AuditLog(log_path)
    log.write({"n": 1})
    last = log.write({"n": 2})
    log.close()
    log_path.write_bytes(log_path.read_bytes()[:-1])
    nxt = AuditLog(log_path).write({"n": 3})
    assert nxt["prev_hash"] == last["hash"] and nxt["seq"] == 3
    assert "not a complete record" not in capsys.readouterr().err
    assert verify(log_path).ok and not verify(log_path).warnings


class FailingWrites:
    """An ``os.write`` stand-in: a full disk for the next ``count`` calls.

    With ``partial`` set, the next call first writes that many bytes and
    returns a short count, and the call after it fails (how ENOSPC looks).
    """

    def __init__(self, count: int = 0, err: int = errno.ENOSPC) -> None:
        self.count, self.err, self.partial = count, err, 0

    def __call__(self, fd: int, data: bytes) -> int:
        if self.partial:
            written = os.write(fd, data[: self.partial])
            self.partial = 0
            self.count = max(self.count, 1)
            return written
        if self.count > 0:
            self.count -= 1
            raise OSError(self.err, os.strerror(self.err))
        return os.write(fd, data)


def test_disk_full_without_required_never_raises_and_reports_in_the_next_line(log_path, capsys):
    writes = FailingWrites()
    log = AuditLog(log_path, write_fn=writes)
    log.write({"n": 0})
    writes.count = 3
    lost = [log.write({"n": i, "purpose": "secret-free"}) for i in range(1, 4)]
    assert all("hash" not in r and r["n"] == i + 1 for i, r in enumerate(lost))
    err = capsys.readouterr().err
    assert err.count("cannot be written") == 1 and "No space left on device" in err and str(log_path) in err
    assert "secret-free" not in err
    back = log.write({"n": 4})
    assert back["audit_write_error"]["lost_records"] == 3
    assert "No space left on device" in back["audit_write_error"]["error"]
    assert back["seq"] == 2
    assert "audit_write_error" not in log.write({"n": 5})
    assert verify(log_path).ok


def test_short_write_on_a_full_disk_leaves_a_torn_line_that_is_recovered(log_path, capsys):
    writes = FailingWrites()
    log = AuditLog(log_path, write_fn=writes)
    log.write({"n": 0})
    writes.partial = 20
    log.write({"n": 1})
    back = log.write({"n": 2})
    events = [r for r in records_lenient(log_path) if r.get("event") == "chain_resumed"]
    assert len(events) == 1 and events[0]["torn_bytes"] == 20
    assert back["audit_write_error"]["lost_records"] == 1
    result = verify(log_path)
    assert result.ok and [w.kind for w in result.warnings] == ["torn"]


def records_lenient(path: Path) -> list[dict]:
    out = []
    for raw in path.read_bytes().split(b"\n"):
        try:
            out.append(json.loads(raw))
        except ValueError:
            pass
    return out


def test_disk_full_with_required_raises_a_clear_error(log_path):
    log = AuditLog(log_path, AuditSettings(required=True), write_fn=FailingWrites(count=1))
    with pytest.raises(AuditWriteError) as info:
        log.write({"n": 1, "api_key": "sk-live-123"})
    message = str(info.value)
    assert str(log_path) in message and "No space left on device" in message
    assert "audit.required" in message and "sk-live" not in message
    # events never raise, even when required
    log._write_fn = FailingWrites(count=1)
    assert log.write_event("hook_error", hook="x") is None
    ok = log.write({"n": 2})
    assert ok["audit_write_error"]["lost_records"] == 2 and ok["seq"] == 1


def test_record_event_raises_when_lost_whatever_required_says(log_path):
    log = AuditLog(log_path, AuditSettings(required=False), write_fn=FailingWrites(count=1))
    with pytest.raises(AuditWriteError, match="No space left on device"):
        log.record_event("limits.reset.requested", plugin_id="p")
    assert log.write({"n": 1})["audit_write_error"]["lost_records"] == 1  # counted like any lost record
    written = log.record_event("limits.reset", plugin_id="p")
    assert (written["kind"], written["event"], written["seq"]) == ("event", "limits.reset", 2)
    assert verify(log_path).ok


def test_check_writable(log_path, tmp_path):
    AuditLog(log_path, AuditSettings(required=True)).check_writable()
    assert log_path.exists()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(AuditWriteError, match="cannot be written"):
        AuditLog(blocker / "logs" / "agent.log").check_writable()


def test_log_injection_cannot_forge_a_line(log_path):
    nasty = 'x\n{"forged": 1}'
    also = "a\r\nb\u2028c\u2029d\x85e\x00f"
    log = AuditLog(log_path)
    log.write({"purpose": nasty, "plugin_id": also})
    raw = log_path.read_bytes()
    assert raw.count(b"\n") == 1 and b'{"forged": 1}' not in raw
    (only,) = records(log_path)
    assert only["purpose"] == nasty and only["plugin_id"] == also
    assert verify(log_path).ok


def test_redaction_applies_to_every_string_before_hashing(log_path):
    def redact(text: str) -> str:
        return text.replace("sk-secret", "[REDACTED]")

    log = AuditLog(log_path, redact=redact)
    written = log.write({"purpose": "key sk-secret", "error.message": ["x sk-secret", {"k": "sk-secret"}], "n": 1})
    assert b"sk-secret" not in log_path.read_bytes()
    assert written["error.message"] == ["x [REDACTED]", {"k": "[REDACTED]"}]
    assert verify(log_path, strict=True).ok


def test_content_fields_need_the_operator_opt_in(log_path):
    log = AuditLog(log_path)
    content = {"gen_ai.input.messages": [{"role": "user", "content": "hello"}], "gen_ai.output.text": "hi"}
    assert "gen_ai.input.messages" not in log.write({"n": 1, **content})
    log.update_settings(AuditSettings(log_content=True))
    kept = log.write({"n": 2, **content})
    assert kept["gen_ai.input.messages"][0]["content"] == "hello" and kept["gen_ai.output.text"] == "hi"
    assert b"hello" in log_path.read_bytes() and verify(log_path).ok


def test_odd_values_are_normalised_so_the_hash_verifies(log_path):
    log = AuditLog(log_path)
    log.write({1: "int key", "path": Path("/x"), "nan": float("nan"), "tuple": (1, 2), "bad": "\ud800", "flag": True})
    (rec,) = records(log_path)
    assert rec["1"] == "int key" and rec["path"] == "/x" and rec["nan"] == "nan" and rec["tuple"] == [1, 2]
    assert rec["bad"] == "?" and rec["flag"] is True
    assert verify(log_path, strict=True).ok


def test_write_event_is_chained_with_kind_event(log_path):
    log = AuditLog(log_path)
    log.write({"n": 1})
    assert log.write_event("config_reloaded", trust_policy_sha256="a" * 64, changed_entries=["p"]) is None
    (_, event) = records(log_path)
    assert event["kind"] == "event" and event["event"] == "config_reloaded" and event["seq"] == 2
    assert verify(log_path).ok


def test_get_audit_log_is_one_instance_per_resolved_path(tmp_path, monkeypatch):
    (tmp_path / "real" / "logs").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    a = get_audit_log(tmp_path / "real" / "logs" / "agent.log")
    b = get_audit_log("link/logs/../logs/agent.log")
    assert a is b
    c = get_audit_log(tmp_path / "real" / "logs" / "agent.log", AuditSettings(backup_count=3))
    assert c is a and a.settings.backup_count == 3


def _child_writes(log: AuditLog, count: int) -> None:
    for i in range(count):
        log.write({"who": "child", "n": i})


def test_forked_child_reopens_its_lock_and_keeps_one_chain(log_path):
    log = AuditLog(log_path)
    log.write({"who": "parent"})
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_child_writes, args=(log, 50))
    child.start()
    for i in range(50):
        log.write({"who": "parent", "n": i})
    child.join(30)
    assert child.exitcode == 0
    result = verify(log_path)
    assert result.ok and result.records == 101
