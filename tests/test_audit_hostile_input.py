"""Hardening, the audit log: hostile lines, bad flag values, the chain's start, duplicate keys.

- a 10^5-deep line, an over-long line, a FIFO or a directory as the log, and
  every malformed flag value give a bad-line verdict or a one-line error, never
  a traceback;
- the chain must start at seq 1 from the genesis hash unless pruning by
  retention is declared; an anchor that is not in the log is a failure;
- a duplicate key or a re-encoded line is refused by verify and by every reader.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from audit import AuditLog, AuditSettings, iter_records, parse_time, verify
from audit.chain import MAX_DEPTH, MAX_LINE_BYTES, GENESIS_HASH, render_line
from audit.reader import tail_records
from plugin_llm.cli.main import main

N = 6
DEEP = 100_000
DEEP_LINES = {
    "arrays": b"[" * DEEP + b"]" * DEEP + b"\n",
    "objects": b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"\n",
}


def write_log(path: Path, n: int = N, settings: AuditSettings | None = None) -> Path:
    log = AuditLog(path, settings or AuditSettings())
    for i in range(n):
        log.write({"plugin_id": "real", "purpose": f"job {i}", "status": "ok"})
    log.close()
    return path


def rows(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def save(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


@pytest.fixture
def log_path(hermes_home: Path) -> Path:
    return write_log(hermes_home / "logs" / "agent.log")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- 18: hostile lines --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(DEEP_LINES))
@pytest.mark.parametrize("strict", [False, True], ids=["fast", "strict"])
def test_a_deeply_nested_line_is_a_bad_line_for_verify(log_path, shape, strict):
    lines = rows(log_path)
    lines.insert(3, DEEP_LINES[shape])
    save(log_path, lines)
    problem = verify(log_path, strict=strict).first_error
    assert (problem.line, problem.kind) == (4, "oversized")
    assert f"nesting deeper than {MAX_DEPTH}" in str(problem) and str(problem).startswith(f"{log_path}:4:")


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(DEEP_LINES))
def test_readers_skip_a_deeply_nested_line_and_say_why(log_path, shape, capsys):
    with open(log_path, "ab") as f:
        f.write(DEEP_LINES[shape])
    seen = []
    found = list(iter_records(log_path, on_bad_line=lambda p, n, why: seen.append((n, why))))
    assert len(found) == N and seen == [(N + 1, f"nesting deeper than {MAX_DEPTH}")]
    last, _ = tail_records(log_path, 3, on_bad_line=lambda p, n, why: seen.append(why))
    assert [r["purpose"] for r in last] == ["job 3", "job 4", "job 5"]
    for argv in (["tail"], ["tail", "--json"], ["query"], ["query", "--since", "1970-01-01"], ["stats"],
                 ["stats", "--json"], ["tail", "-f", "--max-wait", "0"]):
        code, _out, err = run_cli(capsys, *argv)
        assert code == 0, argv
        assert "skipped 1 unreadable line(s)" in err and "nesting deeper than 64" in err, argv


def test_a_deep_line_at_the_end_does_not_stop_the_writer(log_path, capsys):
    with open(log_path, "ab") as f:
        f.write(DEEP_LINES["arrays"])
    log = AuditLog(log_path, AuditSettings(required=True))  # would fail every call if the resume crashed
    log.write({"plugin_id": "real", "purpose": "after", "status": "ok"})
    log.close()
    assert "RecursionError" not in capsys.readouterr().err
    result = verify(log_path)
    assert result.ok and [w.kind for w in result.warnings] == ["torn"]  # recovered, as any torn tail
    assert [r["purpose"] for r in iter_records(log_path)][-1] == "after"


@pytest.mark.slow
def test_follow_skips_hostile_lines_as_they_arrive(log_path):
    from audit.reader import follow_records

    _, cursor = tail_records(log_path, 1)
    with open(log_path, "ab") as f:
        f.write(DEEP_LINES["objects"])
        f.write(inject_duplicate(rows(log_path)[0]))
        f.write(b'{"pad":"' + b"x" * (MAX_LINE_BYTES + 10))  # growing past the limit, no newline yet
    seen = []
    follower = follow_records(cursor, poll_interval=0.01, max_wait=0.2, on_bad_line=lambda p, n, why: seen.append(why))
    assert list(follower) == []
    with open(log_path, "ab") as f:
        f.write(b'"}\n')
    AuditLog(log_path).write({"plugin_id": "real", "purpose": "after", "status": "ok"})
    follower = follow_records(cursor, poll_interval=0.01, max_wait=0.2)
    assert [r.get("purpose") for r in follower][-1] == "after"
    assert seen == ["nesting deeper than 64", 'duplicate key "plugin_id"', "longer than 16 MiB"]


@pytest.mark.parametrize("digits", [30, 5000])
def test_a_huge_seq_hashed_as_written_is_a_verdict_not_a_crash(log_path, digits):
    lines = rows(log_path)
    body = lines[-1][: -len(b',"hash":"' + b"0" * 64 + b'"}\n')].replace(b'"seq":6', b'"seq":7' + b"0" * digits)
    lines.append(body + b',"hash":"' + hashlib.sha256(body + b"}").hexdigest().encode() + b'"}\n')
    save(log_path, lines)
    for strict in (False, True):
        problem = verify(log_path, strict=strict).first_error
        assert (problem.line, problem.kind) == (N + 1, "not_a_record" if digits < 4300 else "bad_json")
        assert len(str(problem)) < 400


def test_nesting_up_to_the_limit_still_parses(log_path):
    nested: object = "leaf"
    for _ in range(MAX_DEPTH - 1):  # the record itself is one level
        nested = [nested]
    AuditLog(log_path).write({"plugin_id": "real", "purpose": "deep but fine", "status": "ok", "x": nested})
    assert verify(log_path, strict=True).ok
    assert [r["purpose"] for r in iter_records(log_path)][-1] == "deep but fine"


@pytest.mark.slow
def test_an_over_long_line_is_read_past_not_held(log_path, capsys):
    with open(log_path, "ab") as f:
        f.write(b'{"pad":"' + b"x" * (MAX_LINE_BYTES + 10) + b'"}\n')
    AuditLog(log_path).write({"plugin_id": "real", "purpose": "after", "status": "ok"})
    problem = verify(log_path).first_error
    assert (problem.line, problem.kind) == (N + 1, "oversized") and "longer than 16 MiB" in problem.detail
    seen = []
    found = [r["purpose"] for r in iter_records(log_path, on_bad_line=lambda p, n, why: seen.append((n, why)))]
    assert found[-1] == "after" and seen == [(N + 1, "longer than 16 MiB")]
    seen.clear()
    last, _ = tail_records(log_path, 3, include_events=False, on_bad_line=lambda p, n, why: seen.append(why))
    assert [r["purpose"] for r in last] == ["job 4", "job 5", "after"] and seen == ["longer than 16 MiB"]


@pytest.mark.parametrize("kind", ["fifo", "directory"])
@pytest.mark.parametrize("action", ["tail", "query", "stats", "verify"])
def test_a_fifo_or_a_directory_as_the_log_is_a_one_line_error(hermes_home, tmp_path, capsys, kind, action):
    target = tmp_path / "evidence"
    if kind == "fifo":
        os.mkfifo(target)  # opening it for reading would block until a writer appears
        argv = [action, "--log", str(target)]
    else:
        (hermes_home / "logs" / "agent.log").mkdir(parents=True)
        argv = [action]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("plugin-llm: error: cannot read the audit log")
    assert ("a FIFO" if kind == "fifo" else "a directory") in err


BAD_FLAGS = [
    (["query", "--since", "99999999d"], "--since", "out of range"),
    (["query", "--until", "99999999d"], "--until", "out of range"),
    (["stats", "--since", "9" * 5000 + "d"], "--since", "out of range"),
    (["query", "--since", "0001-01-01T00:00:00+01:00"], "--since", "out of range"),
    (["query", "--until", "9999-12-31T23:59:59-05:00"], "--until", "out of range"),
    (["query", "--since", "yesterday"], "--since", "ISO 8601"),
    (["query", "--since", "2026-13-45"], "--since", "ISO 8601"),
    (["query", "--since", "x" * 10_000], "--since", "ISO 8601"),
    (["query", "--since", "1h", "--until", "2h"], "--since", "is after --until"),
    (["query", "--limit", "-5"], "--limit", "whole number >= 1"),
    (["query", "--limit", "0"], "--limit", "whole number >= 1"),
    (["query", "--limit", "ten"], "--limit", "whole number >= 1"),
    (["query", "--limit", "²"], "--limit", "whole number >= 1"),
    (["tail", "-n", "-5"], "--lines", "whole number >= 1"),
    (["tail", "-n", "1.5"], "--lines", "whole number >= 1"),
    (["tail", "-f", "--max-wait", "nan"], "--max-wait", "seconds >= 0"),
    (["tail", "-f", "--max-wait", "-1"], "--max-wait", "seconds >= 0"),
    (["tail", "-f", "--max-wait", "1e999"], "--max-wait", "seconds >= 0"),
    (["verify", "--anchor", "nonsense"], "--anchor", "SEQ:HASH"),
    (["verify", "--anchor", "²:" + "a" * 64], "--anchor", "SEQ:HASH"),
    (["verify", "--anchor", "0:" + "a" * 64], "--anchor", "SEQ:HASH"),
    (["verify", "--anchor", "9" * 5000 + ":" + "a" * 64], "--anchor", "SEQ:HASH"),
    (["verify", "--anchor", "3:" + "g" * 64], "--anchor", "SEQ:HASH"),
    (["verify", "--log", "/nonexistent/agent.log"], "--log", "no audit log"),
]


@pytest.mark.parametrize("argv,flag,accepted", BAD_FLAGS, ids=[" ".join(a)[:50] for a, _, _ in BAD_FLAGS])
def test_every_bad_flag_value_is_one_line_naming_the_flag(log_path, capsys, argv, flag, accepted):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("plugin-llm: error: ") and "Traceback" not in err
    assert flag in err and accepted in err
    assert len(err) < 400  # the rejected value is echoed cut short, never whole


def test_huge_counts_mean_everything(log_path, capsys):
    code, out, _ = run_cli(capsys, "query", "--limit", "1" + "0" * 30)
    assert code == 0 and len(out.splitlines()) == N + 1  # and the header row
    code, out, _ = run_cli(capsys, "query", "--limit", "9" * 5000, "--json")
    assert code == 0 and len(out.splitlines()) == N
    code, out, _ = run_cli(capsys, "tail", "-n", "1" + "0" * 30)
    assert code == 0 and len(out.splitlines()) == N + 1


def test_parse_time_out_of_range_is_a_value_error():
    for text in ("99999999d", "9" * 400 + "w", "0001-01-01T00:00:00+01:00"):
        with pytest.raises(ValueError, match="out of range"):
            parse_time(text)


# -- 21: where the chain starts ---------------------------------------------------------------


def test_deleting_the_first_lines_of_a_never_rotated_log_fails(log_path, capsys):
    save(log_path, rows(log_path)[2:])
    result = verify(log_path)
    assert not result.ok
    problem = result.first_error
    assert (problem.line, problem.kind) == (1, "history_start")
    assert "never rotated" in problem.detail and "seq 3" in problem.detail
    code, out, _ = run_cli(capsys, "verify")
    assert code == 1 and "FAILED" in out and "history_start" in out
    # declared pruning (backup_count 0 discards old files): accepted, with a warning
    allowed = verify(log_path, allow_pruned_head=True)
    assert allowed.ok and [w.kind for w in allowed.warnings] == ["history_start"]
    code, out, _ = run_cli(capsys, "verify", "--allow-pruned-head")
    assert code == 0 and "warning:" in out and "history_start" in out


def test_the_first_record_must_start_from_the_genesis_hash(log_path):
    lines = rows(log_path)
    first = json.loads(lines[0])
    forged = {k: v for k, v in first.items() if k != "hash"}
    forged["prev_hash"] = "ab" * 32
    lines[0], _ = render_line(forged)
    save(log_path, lines)
    assert verify(log_path, allow_pruned_head=True).first_error.kind == "broken_link"
    assert json.loads(rows(log_path)[1])["prev_hash"] != GENESIS_HASH


@pytest.fixture
def rotated(hermes_home: Path) -> Path:
    path = hermes_home / "logs" / "agent.log"
    write_log(path, 24, AuditSettings(max_bytes=1200, backup_count=20))
    assert path.with_name("agent.log.3").exists()
    return path


def oldest(path: Path) -> Path:
    return max(path.parent.glob("agent.log.*[0-9]"), key=lambda p: int(p.name.rsplit(".", 1)[1]))


def test_a_rotated_log_is_whole_from_seq_1(rotated):
    assert verify(rotated).ok and not verify(rotated).warnings


@pytest.mark.parametrize("cut", ["first lines of the oldest file", "the whole oldest file"])
def test_a_rotated_log_missing_its_head_fails_unless_pruning_is_declared(rotated, capsys, cut):
    first = oldest(rotated)
    if cut == "the whole oldest file":
        first.unlink()
    else:
        save(first, rows(first)[1:])
    problem = verify(rotated).first_error
    assert problem.kind == "history_start" and problem.line == 1
    assert "pruned by rotation" in problem.detail and "--allow-pruned-head" in problem.detail
    assert verify(rotated, allow_pruned_head=True).ok
    with pytest.raises(SystemExit):
        main(["audit", "verify", "--help"])
    assert "--allow-pruned-head" in capsys.readouterr().out


@pytest.mark.parametrize("allow", [False, True])
def test_an_anchor_that_is_no_longer_in_the_log_fails(log_path, capsys, allow):
    lines = rows(log_path)
    anchored = json.loads(lines[2])
    save(log_path, lines[4:])  # every line up to and past the anchored record
    result = verify(log_path, anchor=(anchored["seq"], anchored["hash"]), allow_pruned_head=True)
    assert not result.ok and result.first_error.kind == "anchor"
    assert "not in the log" in result.first_error.detail
    argv = ["verify", "--anchor", f"{anchored['seq']}:{anchored['hash']}"] + (["--allow-pruned-head"] if allow else [])
    code, out, _ = run_cli(capsys, *argv)
    assert code == 1 and "FAILED" in out


# -- 22: duplicate keys and re-encoded lines ---------------------------------------------------


def inject_duplicate(line: bytes) -> bytes:
    return line.replace(b'{"', b'{"plugin_id":"evil","', 1)


@pytest.mark.parametrize("strict", [False, True], ids=["fast", "strict"])
def test_a_duplicate_key_injected_into_a_line_fails_verify(log_path, capsys, strict):
    lines = rows(log_path)
    lines[2] = inject_duplicate(lines[2])
    assert json.loads(lines[2])["plugin_id"] == "real"  # a last-wins parser sees the original content
    save(log_path, lines)
    problem = verify(log_path, strict=strict).first_error
    assert (problem.line, problem.kind) == (3, "duplicate_key") and '"plugin_id"' in problem.detail
    code, out, _ = run_cli(capsys, "verify", *(["--strict"] if strict else []))
    assert code == 1 and f"{log_path}:3: duplicate_key" in out


def rehash(body: bytes) -> bytes:
    """A line in the writer's layout whose hash covers exactly ``body`` (a forger's work)."""
    return body + b',"hash":"' + hashlib.sha256(body + b"}").hexdigest().encode() + b'"}\n'


def without_hash(line: bytes) -> bytes:
    return line[: -len(b',"hash":"' + b"0" * 64 + b'"}\n')]


@pytest.mark.parametrize("strict", [False, True], ids=["fast", "strict"])
def test_the_last_line_rewritten_with_a_duplicate_key_and_a_recomputed_hash_fails(log_path, strict):
    # the last record's hash is no other line's prev_hash: it is checked in full even by the fast path
    lines = rows(log_path)
    original = lines[-1]
    lines[-1] = rehash(inject_duplicate(without_hash(original)))
    save(log_path, lines)
    problem = verify(log_path, strict=strict).first_error
    assert (problem.line, problem.kind) == (N, "duplicate_key")
    lines[-1] = rehash(without_hash(original).replace(b'"job 5"', b'"job \\u0035"'))  # same content
    save(log_path, lines)
    problem = verify(log_path, strict=strict).first_error
    assert (problem.line, problem.kind) == (N, "not_canonical")


def test_strict_verify_catches_a_rewritten_chain_with_a_duplicate_key(log_path):
    lines = rows(log_path)
    prev = json.loads(lines[2])["hash"]
    for i in range(3, N):  # rewrite from line 4 on, re-hashing every later line as the writer would
        record = json.loads(lines[i])
        record.pop("hash")
        record["prev_hash"] = prev
        line, prev = render_line(record)
        if i == 3:
            line = rehash(inject_duplicate(without_hash(line)))
            prev = line[-67:-3].decode()
        lines[i] = line
    save(log_path, lines)
    assert verify(log_path).ok  # only the bytes each hash covers are checked, and they chain
    problem = verify(log_path, strict=True).first_error
    assert (problem.line, problem.kind) == (4, "duplicate_key")


def test_readers_refuse_a_line_with_a_duplicate_key(log_path, capsys):
    lines = rows(log_path)
    lines[2] = inject_duplicate(lines[2])
    save(log_path, lines)
    seen = []
    found = list(iter_records(log_path, on_bad_line=lambda p, n, why: seen.append((n, why))))
    assert [r["purpose"] for r in found] == ["job 0", "job 1", "job 3", "job 4", "job 5"]
    assert seen == [(3, 'duplicate key "plugin_id"')]
    assert list(iter_records(log_path, plugin="evil")) == [] and len(list(iter_records(log_path, plugin="real"))) == 5
    last, _ = tail_records(log_path, 10)
    assert len(last) == 5
    for argv in (["query"], ["query", "--plugin", "evil"], ["tail"], ["stats"]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 0 and "evil" not in out and 'duplicate key "plugin_id"' in err, argv


@pytest.mark.parametrize("edit", ["spaces", "escaped character", "key order"])
@pytest.mark.parametrize("strict", [False, True], ids=["fast", "strict"])
def test_a_re_encoded_line_with_unchanged_content_is_not_the_writers(log_path, edit, strict):
    lines = rows(log_path)
    line = lines[3]
    if edit == "spaces":
        line = line.replace(b'":', b'": ')
    elif edit == "escaped character":
        line = line.replace(b'"job 3"', b'"job \\u0033"')
    else:
        record = json.loads(line)
        line = json.dumps(dict(reversed(list(record.items()))), separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    assert line != lines[3] and json.loads(line) == json.loads(lines[3])
    lines[3] = line
    save(log_path, lines)
    problem = verify(log_path, strict=strict).first_error
    assert (problem.line, problem.kind) == (4, "not_canonical")
