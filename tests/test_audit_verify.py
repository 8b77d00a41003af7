"""``verify``: each kind of tampering is found, at the right file and line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from audit import AuditLog, AuditLogNotFoundError, AuditSettings, verify
from audit.chain import render_line

N = 10


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    path = tmp_path / "logs" / "agent.log"
    log = AuditLog(path)
    for i in range(N):
        log.write({"plugin_id": f"p{i % 3}", "purpose": f"call number {i}", "status": "ok"})
    log.close()
    return path


def rows(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def save(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


@pytest.mark.parametrize("strict", [False, True], ids=["fast", "strict"])
def test_an_intact_log_verifies(log_path, strict):
    result = verify(log_path, strict=strict)
    assert result.ok and result.first_error is None and not result.warnings
    assert result.records == N and result.files == [str(log_path)] and result.head_seq == N


@pytest.mark.parametrize("strict", [False, True], ids=["fast", "strict"])
def test_one_edited_byte_in_a_middle_line(log_path, strict):
    lines = rows(log_path)
    lines[4] = lines[4].replace(b"call number 4", b"call number 5")
    save(log_path, lines)
    problem = verify(log_path, strict=strict).first_error
    assert (problem.file, problem.line, problem.kind) == (str(log_path), 5, "edited")


def test_an_edit_that_breaks_the_json(log_path):
    lines = rows(log_path)
    lines[6] = lines[6].replace(b'"status":"ok"', b'"status":ok"')
    save(log_path, lines)
    problem = verify(log_path).first_error
    assert (problem.line, problem.kind) == (7, "bad_json")


def test_a_deleted_line(log_path):
    lines = rows(log_path)
    del lines[4]
    save(log_path, lines)
    result = verify(log_path)
    assert not result.ok
    assert (result.first_error.line, result.first_error.kind) == (5, "seq_gap")
    assert "seq 5 missing" in result.first_error.detail


def test_two_swapped_lines(log_path):
    lines = rows(log_path)
    lines[3], lines[4] = lines[4], lines[3]
    save(log_path, lines)
    problem = verify(log_path).first_error
    assert (problem.line, problem.kind) == (4, "seq_order")


def test_an_inserted_forged_line_with_a_recomputed_hash_but_wrong_prev_hash(log_path):
    lines = rows(log_path)
    genuine = json.loads(lines[4])
    forged = {k: v for k, v in genuine.items() if k != "hash"}
    forged.update(purpose="approved by nobody", prev_hash="ab" * 32)
    line, _ = render_line(forged)  # a valid hash for the forged content
    lines.insert(4, line)
    save(log_path, lines)
    problem = verify(log_path).first_error
    assert (problem.line, problem.kind) == (5, "broken_link")


def test_an_inserted_line_that_is_not_a_record(log_path):
    lines = rows(log_path)
    lines.insert(2, b'{"forged": 1}\n')
    save(log_path, lines)
    problem = verify(log_path).first_error
    assert (problem.line, problem.kind) == (3, "not_a_record")


def test_a_truncated_file(log_path):
    data = log_path.read_bytes()
    log_path.write_bytes(data[: len(data) - 40])
    problem = verify(log_path).first_error
    assert (problem.file, problem.line, problem.kind) == (str(log_path), N, "torn")


def test_truncation_at_a_line_boundary_is_caught_by_an_anchor(log_path):
    head = verify(log_path)
    save(log_path, rows(log_path)[:-2])
    assert verify(log_path).ok  # nothing in the file itself can tell
    result = verify(log_path, anchor=(head.head_seq, head.head_hash))
    assert not result.ok and result.first_error.kind == "anchor" and "truncated" in result.first_error.detail
    lines = rows(log_path)
    assert verify(log_path, anchor=(3, json.loads(lines[2])["hash"])).ok
    assert verify(log_path, anchor=(3, "0" * 64)).first_error.line == 3


@pytest.mark.parametrize("strict", [False, True], ids=["fast", "strict"])
def test_a_line_reformatted_but_unchanged_in_content_is_not_the_writers(log_path, strict):
    # the writer's lines are canonical: a re-encoded line (here: spaces, sorted "hash") was not written by it
    lines = rows(log_path)
    lines[2] = json.dumps(json.loads(lines[2]), indent=None, ensure_ascii=True, sort_keys=True).encode() + b"\n"
    save(log_path, lines)
    problem = verify(log_path, strict=strict).first_error
    assert (problem.line, problem.kind) == (3, "not_canonical")


@pytest.fixture
def rotated(tmp_path: Path) -> Path:
    path = tmp_path / "logs" / "agent.log"
    log = AuditLog(path, AuditSettings(max_bytes=1200, backup_count=20))
    for i in range(24):
        log.write({"plugin_id": "p", "purpose": f"rotated {i}", "status": "ok"})
    log.close()
    assert path.with_name("agent.log.3").exists()
    return path


def test_verify_walks_rotated_files_oldest_first(rotated):
    result = verify(rotated)
    assert result.ok and result.records == 24
    assert [Path(f).name for f in result.files][-2:] == ["agent.log.1", "agent.log"]


def test_a_truncated_backup_is_found_at_the_next_file(rotated):
    backup = rotated.with_name("agent.log.2")
    save(backup, rows(backup)[:-1])  # clean cut at a line boundary
    problem = verify(rotated).first_error
    assert (Path(problem.file).name, problem.line, problem.kind) == ("agent.log.1", 1, "seq_gap")


def test_a_deleted_backup_is_found(rotated):
    rotated.with_name("agent.log.2").unlink()
    problem = verify(rotated).first_error
    assert (Path(problem.file).name, problem.line, problem.kind) == ("agent.log.1", 1, "seq_gap")


def test_an_edit_in_a_backup_names_that_file(rotated):
    backup = rotated.with_name("agent.log.3")
    lines = rows(backup)
    lines[1] = lines[1].replace(b"rotated", b"rotatex")
    save(backup, lines)
    problem = verify(rotated).first_error
    assert (Path(problem.file).name, problem.line, problem.kind) == ("agent.log.3", 2, "edited")


def test_a_torn_line_is_only_a_warning_when_the_writer_recorded_the_recovery(log_path):
    with open(log_path, "ab") as f:
        f.write(b'{"event":"llm.call","seq":11,"purp')
    AuditLog(log_path).write({"after": True})
    ok = verify(log_path)
    assert ok.ok and [(w.kind, w.line) for w in ok.warnings] == [("torn", N + 1)]

    # tamper with the torn bytes: the recorded SHA-256 no longer matches
    lines = rows(log_path)
    lines[N] = lines[N].replace(b"purp", b"PURP")
    save(log_path, lines)
    problem = verify(log_path).first_error
    assert (problem.line, problem.kind) == (N + 1, "torn")


def test_a_chain_resumed_event_cannot_excuse_other_bad_lines(log_path):
    lines = rows(log_path)
    lines.insert(3, b"garbage\n")
    save(log_path, lines)
    problem = verify(log_path).first_error
    assert (problem.line, problem.kind) == (4, "bad_json")
    # a writer opening this log resumes after the *last* complete record only
    AuditLog(log_path).write({"after": True})
    assert verify(log_path).first_error.line == 4


def test_torn_bytes_hashes_are_what_the_event_says(log_path):
    with open(log_path, "ab") as f:
        f.write(b"{partial")
    AuditLog(log_path).write({"x": 1})
    event = json.loads(rows(log_path)[N + 1])
    assert event["torn_bytes"] == len(b"{partial") and event["torn_sha256"] == hashlib.sha256(b"{partial").hexdigest()


def test_missing_log_raises_not_found(tmp_path):
    with pytest.raises(AuditLogNotFoundError, match="no audit log"):
        verify(tmp_path)
