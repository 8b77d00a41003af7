"""Reading: time parsing, query filters across rotated files, tail/follow, stats arithmetic."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from audit import AuditLog, AuditLogNotFoundError, AuditSettings, call_record, iter_records, parse_time, stats
from audit.reader import follow_records, tail_records
from audit.summary import percentile

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
T0 = datetime(2026, 3, 1, 0, 0, 0, tzinfo=timezone.utc).timestamp()


# -- parse_time --------------------------------------------------------------------------


@pytest.mark.parametrize("text,delta", [("90s", 90), ("15m", 900), ("1h", 3600), ("7d", 7 * 86400),
                                        ("2w", 14 * 86400), (" 1.5h ", 5400), ("now", 0)])
def test_relative_times(text, delta):
    assert parse_time(text, now=NOW) == NOW - timedelta(seconds=delta)


def test_iso_times():
    assert parse_time("2026-02-01T10:00:00Z") == datetime(2026, 2, 1, 10, tzinfo=timezone.utc)
    assert parse_time("2026-02-01T10:00:00+02:00") == datetime(2026, 2, 1, 8, tzinfo=timezone.utc)
    naive = parse_time("2026-02-01")  # no offset: local time, as typed
    assert naive.tzinfo is not None and naive == datetime(2026, 2, 1).astimezone()


@pytest.mark.parametrize("bad", ["yesterday", "1y", "", "12:00 tomorrow", "-5m"])
def test_unreadable_times_explain_the_accepted_forms(bad):
    with pytest.raises(ValueError, match="ISO 8601.*90s, 15m, 1h, 7d"):
        parse_time(bad, now=NOW)


# -- a fixture log ----------------------------------------------------------------------


def stepping_clock(start: float, step: float):
    t = [start - step]

    def now() -> float:
        t[0] += step
        return t[0]

    return now


def rec(plugin: str, status: str, model: str | None, *, response_model: str | None = None, tin=None, tout=None,
        cost=None, latency=None, purpose=None) -> dict:
    return call_record(call_id="c", plugin_id=plugin, api="complete", mode="sync",
                       decision="denied" if status == "denied" else "allowed", status=status,
                       request_model=model, response_model=response_model, input_tokens=tin, output_tokens=tout,
                       cost_usd=cost, latency_ms=latency, purpose=purpose)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    """30 records one minute apart from 2026-03-01T00:00Z, spread over several rotated files."""
    path = tmp_path / "home" / "logs" / "agent.log"
    log = AuditLog(path, AuditSettings(max_bytes=2500, backup_count=100), clock=stepping_clock(T0, 60))
    for i in range(30):
        plugin = ("alpha", "beta", "image_gen/openai")[i % 3]
        status = ("ok", "ok", "denied", "timeout", "ok")[i % 5]
        model = "gpt-4o-mini" if i % 2 else "claude-3-5-haiku"
        log.write(rec(plugin, status, model, response_model=f"{model}-2024" if status == "ok" else None,
                      tin=10, tout=2, cost=0.001, latency=float(i), purpose=f"Summarise ticket {i}"))
        if i == 10:
            log.write_event("hook_error", plugin_id="alpha", hook="pre_llm_call", ts="2026-03-01T00:10:30.000Z")
    assert len(list(path.parent.glob("agent.log.*"))) >= 3
    return path


def test_iter_records_streams_oldest_first_across_rotated_files(log_path):
    found = list(iter_records(log_path))
    assert len(found) == 30 and [r["purpose"] for r in found] == [f"Summarise ticket {i}" for i in range(30)]
    with_events = list(iter_records(log_path, include_events=True))
    assert len(with_events) == 31 and with_events[11]["event"] == "hook_error"
    assert len(list(iter_records(log_path.parent.parent))) == 30  # a home works too


def test_filters(log_path):
    def purposes(**kw) -> list[int]:
        return [int(r["purpose"].rsplit(" ", 1)[1]) for r in iter_records(log_path, **kw)]

    assert purposes(plugin="beta") == list(range(1, 30, 3))
    assert purposes(plugin="image_gen/openai,beta") == sorted(list(range(1, 30, 3)) + list(range(2, 30, 3)))
    assert purposes(plugin=["alpha"], status="denied") == [12, 27]
    assert purposes(status="timeout,denied") == sorted(list(range(2, 30, 5)) + list(range(3, 30, 5)))
    assert purposes(model="gpt-4o-mini") == list(range(1, 30, 2))
    assert purposes(model="claude-3-5-haiku-2024") == [i for i in range(0, 30, 2) if i % 5 in (0, 1, 4)]
    assert purposes(model="claude*", status="ok") == [i for i in range(0, 30, 2) if i % 5 in (0, 1, 4)]
    assert purposes(purpose="TICKET 2") == [2, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    assert purposes(plugin="nobody") == []


def test_time_range_is_inclusive_and_accepts_text_and_datetimes(log_path):
    def minutes(**kw) -> list[int]:
        return [int(r["purpose"].rsplit(" ", 1)[1]) for r in iter_records(log_path, **kw)]

    assert minutes(since="2026-03-01T00:10:00Z", until="2026-03-01T00:12:00Z") == [10, 11, 12]
    assert minutes(since=datetime(2026, 3, 1, 0, 28, tzinfo=timezone.utc)) == [28, 29]
    now = datetime(2026, 3, 1, 0, 31, tzinfo=timezone.utc)
    assert minutes(since="3m", now=now) == [28, 29]
    assert minutes(until="30m", now=now) == [0, 1]


def test_time_filter_reads_foreign_timestamp_formats(tmp_path):
    path = tmp_path / "agent.log"
    log = AuditLog(path)
    log.write({"ts": "2026-03-01T01:00:00.123456+00:00", "plugin_id": "a"})
    log.write({"ts": "2026-03-01T03:00:00+02:00", "plugin_id": "b"})  # 01:00Z too
    log.write({"ts": "garbage", "plugin_id": "c"})
    found = [r["plugin_id"] for r in iter_records(path, since="2026-03-01T00:59:00Z", until="2026-03-01T01:01:00Z")]
    assert found == ["a", "b"]


def test_prefilter_never_hides_a_matching_record(tmp_path):
    path = tmp_path / "agent.log"
    log = AuditLog(path)
    odd = 'plügin "quoted" \\ back'
    log.write({"plugin_id": odd, "status": "ok"})
    log.write({"plugin_id": "plain", "status": "ok"})
    assert [r["plugin_id"] for r in iter_records(path, plugin=[odd])] == [odd]


def test_bad_lines_are_skipped_and_reported(log_path):
    with open(log_path, "ab") as f:
        f.write(b"not json\n[1, 2]\n")
    seen = []
    found = list(iter_records(log_path, on_bad_line=lambda p, n, why: seen.append((p.name, why))))
    assert len(found) == 30 and [s[0] for s in seen] == ["agent.log", "agent.log"]


def test_missing_log(tmp_path):
    with pytest.raises(AuditLogNotFoundError):
        list(iter_records(tmp_path / "nowhere"))


# -- tail and follow -----------------------------------------------------------------------


def test_tail_reads_backwards_across_files(log_path):
    last, cursor = tail_records(log_path, 5, include_events=False)
    assert [r["purpose"] for r in last] == [f"Summarise ticket {i}" for i in range(25, 30)]
    everything, _ = tail_records(log_path, 1000)
    assert len(everything) == 31 and everything[0]["seq"] == 1
    assert cursor.path == log_path and cursor.offset == log_path.stat().st_size


def test_follow_sees_new_records_and_survives_rotation(tmp_path):
    path = tmp_path / "agent.log"
    log = AuditLog(path, AuditSettings(max_bytes=700, backup_count=50))
    log.write({"n": -1, "pad": "p" * 50})
    _, cursor = tail_records(path, 1)
    seen: list[int] = []
    done = threading.Event()

    def writer(_delay: float) -> None:
        for i in range(12):  # several rotations while following
            log.write({"n": i, "pad": "p" * 50})
        done.set()

    sleeps = [0]

    def sleep(_seconds: float) -> None:  # the follower's poll: the first one lets the writer run
        sleeps[0] += 1
        if sleeps[0] == 1:
            thread = threading.Thread(target=writer, args=(0,))
            thread.start()
            thread.join()

    for record in follow_records(cursor, poll_interval=0.01, max_wait=5, sleep=sleep):
        seen.append(record["n"])
        if len(seen) == 12:
            break
    assert done.is_set() and seen == list(range(12))


def test_follow_stops_after_max_wait(tmp_path):
    path = tmp_path / "agent.log"
    AuditLog(path).write({"n": 1})
    _, cursor = tail_records(path, 1)
    assert list(follow_records(cursor, poll_interval=0.01, max_wait=0.05)) == []


# -- stats ------------------------------------------------------------------------------


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    values = list(range(1, 11))
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (5, 10, 10)
    values = list(range(1, 21))
    assert (percentile(values, 50), percentile(values, 95)) == (10, 19)


def test_stats_arithmetic_on_a_known_fixture():
    records = []
    for i in range(1, 21):  # alpha: 20 ok calls, latencies 1..20 ms, 3 in/2 out tokens, $0.25 each
        records.append(rec("alpha", "ok", "m1", response_model="m1-v2", tin=3, tout=2, cost=0.25, latency=float(i)))
    records.append(rec("alpha", "denied", "m2", latency=0.0))
    records.append(rec("alpha", "timeout", "m1", latency=500.0))
    records.append(rec("beta", "ok", "m2", tin=100, tout=50, cost=None, latency=10.0))  # unpriced
    records.append(rec("beta", "provider_error", None, latency=7.0))
    records.append({"event": "hook_error", "kind": "event", "plugin_id": "alpha"})  # ignored
    rows = {(r.dimension, r.key): r for r in stats(records)}
    assert list(rows) == [("plugin", "alpha"), ("plugin", "beta"), ("model", "-"), ("model", "m1"),
                          ("model", "m1-v2"), ("model", "m2")]
    alpha = rows["plugin", "alpha"]
    assert (alpha.calls, alpha.denials, alpha.errors) == (22, 1, 1)
    assert (alpha.input_tokens, alpha.output_tokens, alpha.cost_usd, alpha.unpriced) == (60, 40, 5.0, 0)
    # 21 latencies (denial excluded): 1..20 and 500 -> rank ceil(10.5)=11 -> 11; rank ceil(19.95)=20 -> 20
    assert (alpha.p50_latency_ms, alpha.p95_latency_ms) == (11.0, 20.0)
    beta = rows["plugin", "beta"]
    assert (beta.calls, beta.denials, beta.errors, beta.input_tokens, beta.cost_usd, beta.unpriced) == (2, 0, 1, 100, 0.0, 1)
    assert (beta.p50_latency_ms, beta.p95_latency_ms) == (7.0, 10.0)
    assert rows["model", "m1-v2"].calls == 20 and rows["model", "m1"].calls == 1 and rows["model", "-"].calls == 1
    m2 = rows["model", "m2"]
    assert (m2.calls, m2.denials, m2.p50_latency_ms) == (2, 1, 10.0)
    assert json.dumps(alpha.as_dict())


def test_parse_line_accepts_exactly_one_json_value():
    from audit.reader import parse_line

    assert parse_line(b'{"a": 1}\n') == {"a": 1}
    assert parse_line(b'  [1]') == [1]
    for bad in (b'{"a": 1}{"b": 2}\n', b'{"a": ', b"garbage", b"\xff{}", b""):
        with pytest.raises(ValueError):
            parse_line(bad)
