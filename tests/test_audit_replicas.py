"""Several replicas, one view: ``audit verify|query|stats`` over one log per replica, each chain its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit import AuditLog, AuditSettings, call_record
from audit.signing import generate_key, key_file, pub_file, write_new_key
from plugin_llm.cli.main import main

T0 = 1_772_323_200.0  # 2026-03-01T00:00:00Z


def _clock(start: float):
    t = [start - 60]

    def now() -> float:
        t[0] += 60
        return t[0]

    return now


def replica(home: Path, plugin: str, offset: float, count: int = 4) -> Path:
    """A replica's home: its own signing key, its own chain; records a minute apart from T0 + offset."""
    home.mkdir(parents=True)
    line, signer = generate_key()
    write_new_key(key_file(home), line, signer)
    log = AuditLog(home / "logs" / "agent.log", AuditSettings(checkpoint_every=2), clock=_clock(T0 + offset))
    for i in range(count):
        denied = i == 1
        log.write(call_record(
            call_id=f"{plugin}_{i}", plugin_id=plugin, api="complete", mode="sync",
            decision="denied" if denied else "allowed", status="denied" if denied else "ok",
            request_model="gpt-4o-mini", input_tokens=10, output_tokens=5, cost_usd=None if denied else 0.25,
            latency_ms=5.0, purpose=f"{plugin} job {i}",
        ))
    log.close()
    return home


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path]:
    return replica(tmp_path / "east", "alpha", 0), replica(tmp_path / "west", "beta", 30)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_query_merges_the_replicas_by_time_and_names_each(two, capsys):
    east, west = two
    code, out, _ = run(capsys, "audit", "query", "--log", str(east), "--log", str(west), "--json")
    assert code == 0
    records = [json.loads(x) for x in out.splitlines()]
    assert [r["ts"] for r in records] == sorted(r["ts"] for r in records) and len(records) == 8
    assert [r["replica"] for r in records] == ["east", "west"] * 4
    assert {r["plugin_id"] for r in records if r["replica"] == "west"} == {"beta"}
    code, out, _ = run(capsys, "audit", "query", "--log", str(east), "--log", str(west), "--decision", "denied")
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["REPLICA", "TIME"]
    assert [x.split()[0] for x in lines[1:]] == ["east", "west"]


def test_stats_sums_over_the_replicas(two, capsys):
    east, west = two
    code, out, _ = run(capsys, "audit", "stats", "--log", str(east / "logs" / "agent.log"), "--log", str(west), "--json")
    assert code == 0
    doc = json.loads(out)
    assert {r["key"]: (r["calls"], r["denials"], r["cost_usd"]) for r in doc["by_plugin"]} == {
        "alpha": (4, 1, 0.75), "beta": (4, 1, 0.75)}
    assert doc["by_replica"] == {"east": 4, "west": 4}


def test_verify_checks_each_chain_with_its_own_key(two, capsys):
    east, west = two
    code, out, _ = run(capsys, "audit", "verify", "--log", str(east), "--log", str(west), "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["ok"] is True
    assert [(r["replica"], r["ok"], r["checkpoints"]["checked"]) for r in doc["replicas"]] == [
        ("east", True, True), ("west", True, True)]
    assert doc["replicas"][1]["pubkey"] == str(pub_file(key_file(west)))
    # the other replica's key vouches for nothing here: its signatures do not check out
    code, out, _ = run(capsys, "audit", "verify", "--log", str(east), "--log", str(west),
                       "--pubkey", str(pub_file(key_file(east))), "--pubkey", str(pub_file(key_file(east))), "--json")
    assert code == 1
    assert [r["ok"] for r in json.loads(out)["replicas"]] == [True, False]


def test_an_edited_record_in_one_replica_fails_that_replica_only(two, capsys):
    east, west = two
    path = west / "logs" / "agent.log"
    path.write_bytes(path.read_bytes().replace(b"beta job 2", b"beta job X"))
    code, out, _ = run(capsys, "audit", "verify", "--log", str(east), "--log", str(west))
    assert code == 1
    assert "== replica east" in out and "== replica west" in out
    assert "edited" in out.split("== replica west")[1]
    assert out.splitlines()[-1] == "FAILED: 1 of 2 replica chains whole; broken: west"


def test_mismatched_pubkeys_and_one_log_commands_are_clear_errors(two, capsys):
    east, west = two
    code, _, err = run(capsys, "audit", "verify", "--log", str(east), "--log", str(west), "--pubkey", "x.pub")
    assert code == 2 and "one --pubkey per --log" in err
    code, _, err = run(capsys, "audit", "tail", "--log", str(east), "--log", str(west))
    assert code == 2 and "reads one log" in err
    code, _, err = run(capsys, "audit", "query", "--log", str(east), "--log", str(east / "nope"))
    assert code == 2 and "no audit log at" in err and "Traceback" not in err
