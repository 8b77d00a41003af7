"""A client without a token cannot rotate genuine records out of the audit log.

Refusals of unauthenticated requests are aggregated (plugin_llm.service.refusals): an address's first refusal
in a window is recorded at once, the rest in one summary record when the window closes or the service stops,
with bounded memory. They are spare records (AuditLog.write_spare_event): they never rotate the log. And
retention never deletes what no signed checkpoint covers (audit.writer._rotate).
"""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from pathlib import Path

import httpx
import pytest

from audit import AuditLog, AuditSettings, verify
from audit.signing import generate_key, key_file, pub_file, read_verifiers, write_new_key
from plugin_llm import limits
from plugin_llm.service.refusals import EVENT_AUTH_DENIED, EVENT_AUTH_DENIED_SUMMARY, RefusalAudit
from tests.servers import FakeServer
from tests.service_server import ServiceServer

USER = [{"role": "user", "content": "hello"}]
COMPLETE = "/v1/plugin-llm/complete"


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


def _all_records(home: Path) -> list[dict]:
    """Every record in agent.log and its backups, oldest file first."""
    logs = home / "logs"
    files = sorted((p for p in logs.glob("agent.log.*") if p.suffix[1:].isdigit()),
                   key=lambda p: -int(p.suffix[1:])) + [logs / "agent.log"]
    return [json.loads(line) for path in files if path.exists()
            for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def _refusal_totals(records: list[dict]) -> Counter:
    totals: Counter = Counter()
    for record in records:
        if record.get("event") == EVENT_AUTH_DENIED:
            totals[record["reason"]] += 1
        elif record.get("event") == EVENT_AUTH_DENIED_SUMMARY:
            totals.update(record["reasons"])
    return totals


# --------------------------------------------------------------------------- the aggregation


class _Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _audit(**kwargs) -> tuple[RefusalAudit, list[tuple[str, dict]], _Clock]:
    written: list[tuple[str, dict]] = []
    clock = _Clock()
    audit = RefusalAudit(lambda event, force=False, **fields: written.append((event, fields)) or True, clock=clock,
                         timer=False, **kwargs)
    return audit, written, clock


def test_one_address_gets_one_record_at_once_and_one_summary_per_window():
    audit, written, clock = _audit(window=60)
    audit.refused("198.51.100.7", "missing", path=COMPLETE)
    assert [event for event, _ in written] == [EVENT_AUTH_DENIED]  # the first: at once, with its detail
    for n in range(9_999):
        clock.now += 0.001
        audit.refused("198.51.100.7", "unknown" if n % 2 else "missing", path=COMPLETE,
                      token_id=f"tok_{n % 20:012d}" if n % 2 else None)
    assert len(written) == 1  # the rest are counted, not written
    clock.now += 60  # the window is over: the next refusal closes it first
    audit.refused("198.51.100.7", "expired", path="/v1/chat/completions", token_id="tok_x", plugin_id="p")
    event, summary = written[1]
    assert event == EVENT_AUTH_DENIED_SUMMARY and summary["client"] == "198.51.100.7"
    assert summary["count"] == 9_999 and summary["reasons"] == {"missing": 5_000, "unknown": 4_999}
    assert summary["first"] < summary["last"] and summary["window_seconds"] == 60
    assert len(summary["token_ids"]) == 8 and summary["paths"] == [COMPLETE]  # bounded lists of names
    assert written[2][0] == EVENT_AUTH_DENIED and written[2][1]["reason"] == "expired"  # the new window's first
    audit.refused("198.51.100.7", "revoked", path=COMPLETE)
    audit.close()  # shutdown: what the open window counted is written, not lost
    assert written[3] == (EVENT_AUTH_DENIED_SUMMARY, {**written[3][1], "count": 1, "reasons": {"revoked": 1}})
    audit.close()
    assert len(written) == 4  # nothing twice


def test_the_window_closes_on_its_timer_without_another_refusal():
    audit, written, clock = _audit(window=60)
    for _ in range(3):
        audit.refused("203.0.113.9", "too_many_failures", path=COMPLETE, retry_after=30)
    assert written[0][1]["retry_after"] == 30 and len(written) == 1
    clock.now += 30
    audit._on_timer()  # early (a clock step): nothing yet
    assert len(written) == 1
    clock.now += 30
    audit._on_timer()
    assert [e for e, _ in written] == [EVENT_AUTH_DENIED, EVENT_AUTH_DENIED_SUMMARY]
    assert written[1][1]["count"] == 2 and written[1][1]["reasons"] == {"too_many_failures": 2}
    audit.close()


def test_many_addresses_are_bounded_in_records_and_memory():
    audit, written, clock = _audit(window=60, max_addresses=50)
    for n in range(10_000):
        audit.refused(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}", "unknown", path=COMPLETE, detail=None)
        clock.now += 0.001
        assert len(audit._seen) <= 50
    audit.close()
    firsts = [fields for event, fields in written if event == EVENT_AUTH_DENIED]
    summaries = [fields for event, fields in written if event == EVENT_AUTH_DENIED_SUMMARY]
    assert len(firsts) == 50 and len(summaries) == 1  # 50 tracked addresses, one refusal each: no summaries
    [other] = summaries
    assert other["other_addresses"] is True and other["client"] is None and other["count"] == 9_950
    assert len(firsts) + sum(s["count"] for s in summaries) == 10_000


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_flood_of_unauthenticated_requests_leaves_every_genuine_record_in_the_log(hermes_home, custom_route):
    with FakeServer() as upstream:
        custom_route(upstream.base_url, extra="audit:\n  max_bytes: 8192\n  backup_count: 2\n"
                                              "service:\n  failed_auth:\n    max_failures: 20\n")
        with ServiceServer(hermes_home) as service:
            token = service.token("genuine")
            call_ids = []
            for _ in range(5):
                answer = httpx.post(service.url + COMPLETE, headers=service.auth(token), json={"messages": USER},
                                    timeout=30)
                assert answer.status_code == 200, answer.text
                call_ids.append(answer.json()["audit"]["call_id"])
            statuses: Counter = Counter()
            with httpx.Client(timeout=30) as client:
                for n in range(10_000):
                    headers = {"Authorization": f"Bearer plg_made-up-{n}"} if n % 2 else {}
                    statuses[client.post(service.url + COMPLETE, content=b"{}", headers=headers).status_code] += 1
    assert statuses[401] > 0 and statuses[429] > 0 and sum(statuses.values()) == 10_000
    records = _all_records(hermes_home)
    kept = [r["call_id"] for r in records if r.get("event") == "llm.call"]
    assert kept == call_ids  # every genuine call record of before the flood is still in the files
    assert sum(_refusal_totals(records).values()) == 10_000  # and every refusal is counted
    # one address: its first refusal and one summary a minute (a slow machine may take more than one)
    assert sum(r.get("event") in (EVENT_AUTH_DENIED, EVENT_AUTH_DENIED_SUMMARY) for r in records) <= 10


async def _refused_asgi(app, client: str, token: str | None) -> int:
    """One request straight into the ASGI app, from ``client`` (as a trusted proxy would name it)."""
    headers = [(b"content-length", b"2")] + ([(b"authorization", f"Bearer {token}".encode())] if token else [])
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": COMPLETE, "raw_path": COMPLETE.encode(), "query_string": b"", "root_path": "",
             "headers": headers, "client": (client, 40000), "server": ("127.0.0.1", 8080)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"]


@pytest.mark.slow
def test_a_flood_from_ten_thousand_addresses_pushes_no_genuine_record_out(hermes_home, custom_route):
    """Past the tracked addresses the refusals are summarized together, and every refusal record is a spare
    record: it never rotates the log, so the operator's retention keeps exactly the genuine records it did."""
    import asyncio

    from plugin_llm import PluginLlm
    from plugin_llm.service.app import create_app

    with FakeServer() as upstream:
        custom_route(upstream.base_url, extra="audit:\n  max_bytes: 8192\n  backup_count: 1\n")
        llm = PluginLlm("genuine")
        call_ids = [llm.complete(USER).audit["call_id"] for _ in range(5)]
    app = create_app(hermes_home, warm=False)

    async def flood() -> Counter:
        statuses: Counter = Counter()
        for n in range(10_000):
            token = f"plg_made-up-{n}" if n % 10 == 0 else None
            statuses[await _refused_asgi(app, f"10.{n // 65536}.{n // 256 % 256}.{n % 256}", token)] += 1
        return statuses

    statuses = asyncio.run(flood())
    app.state.service.refusals.close()  # what the service's shutdown does
    app.state.service.tokens.close()
    assert statuses == {401: 10_000}
    records = _all_records(hermes_home)
    assert [r["call_id"] for r in records if r.get("event") == "llm.call"] == call_ids
    assert sum(_refusal_totals(records).values()) == 10_000  # nothing lost for want of room
    assert not (hermes_home / "logs" / "agent.log.1").exists()  # the flood rotated nothing
    assert (hermes_home / "logs" / "agent.log").stat().st_size <= 8192 * 2 + 4096  # bounded on disk too


def test_spare_records_never_rotate_and_do_not_count_toward_max_bytes(tmp_path):
    path = tmp_path / "logs" / "agent.log"
    log = AuditLog(path, AuditSettings(max_bytes=4000, backup_count=1), signer=None)
    genuine = [log.write({"plugin_id": "p", "i": i, "pad": "g" * 200})["seq"] for i in range(5)]
    other = AuditLog(path, AuditSettings(max_bytes=4000, backup_count=1), signer=None)  # another process's
    results = [(log if i % 2 else other).write_spare_event("service.auth_denied", i=i, pad="s" * 200)
               for i in range(1000)]
    assert results[0] and not results[-1]  # the room (max_bytes per file, shared by every writer) ran out
    assert sum(results) < 20 and other.write_spare_event("summary", force=True, n=1)  # force: written anyway
    assert not path.with_name("agent.log.1").exists()  # no spare record rotated
    for i in range(5, 100):  # genuine records rotate when *they* fill max_bytes, as without the spare ones
        genuine.append(log.write({"plugin_id": "p", "i": i, "pad": "g" * 200})["seq"])
        if path.with_name("agent.log.1").exists():
            break
    rotated = [json.loads(line) for line in path.with_name("agent.log.1").read_text().splitlines()]
    genuine_bytes = sum(len(json.dumps(r)) for r in rotated if r.get("event") == "llm.call")
    assert genuine_bytes > 4000 - 600  # the file held max_bytes of genuine records besides the spare ones
    assert verify(path).ok


# --------------------------------------------------------------------------- retention and checkpoints


def test_retention_never_deletes_records_no_signed_checkpoint_covers(hermes_home, capsys):
    line, signer = generate_key()
    write_new_key(key_file(hermes_home), line, signer)
    pubkeys = read_verifiers(pub_file(key_file(hermes_home)))
    failing = {"on": False}
    log_path = hermes_home / "logs" / "agent.log"

    def write_fn(fd: int, data: bytes) -> int:
        if failing["on"] and fd == log._cp_fd:  # the checkpoints' disk is full; the log's is not
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    log = AuditLog(log_path, AuditSettings(max_bytes=2000, backup_count=2, checkpoint_every=1000), write_fn=write_fn)
    for i in range(20):
        log.write({"plugin_id": "p", "i": i, "pad": "x" * 100})
    oldest = _all_records(hermes_home)[0]["seq"]
    assert oldest > 1  # retention pruned what the rotation checkpoints covered
    failing["on"] = True
    for i in range(20, 200):
        log.write({"plugin_id": "p", "i": i, "pad": "x" * 100})
    seqs = [r["seq"] for r in _all_records(hermes_home)]
    assert seqs == list(range(oldest, 201))  # no rotation deleted a record that no signature covers
    assert len(list(log_path.parent.glob("agent.log.[0-9]*"))) > 2  # past backup_count meanwhile
    assert "not covered by a signature" in capsys.readouterr().err
    failing["on"] = False
    for i in range(200, 230):  # checkpoints can be written again: retention catches up at the next rotation
        log.write({"plugin_id": "p", "i": i, "pad": "x" * 100})
    log.close()
    backups = sorted(p.name for p in log_path.parent.glob("agent.log.[0-9]*"))
    assert backups == ["agent.log.1", "agent.log.2"]
    result = verify(log_path, pubkeys=pubkeys)  # what retention pruned is proven by the signed rotation
    assert result.ok and not result.warnings, (result.problems, result.warnings)
    assert result.head_seq == 230


def test_a_forged_spare_count_cannot_stop_rotation(tmp_path):
    path = tmp_path / "logs" / "agent.log"
    log = AuditLog(path, AuditSettings(max_bytes=2000, backup_count=1), signer=None)
    log.write({"i": 0})
    ino = path.stat().st_ino
    path.with_name("agent.log.lock").write_bytes(f"spare {ino} {10**15}\n".encode())
    for i in range(1, 100):
        log.write({"i": i, "pad": "g" * 200})
    assert path.with_name("agent.log.1").exists() and path.stat().st_size < 2000 * 3 + 400
