"""``plugin-llm audit tail | query | stats | verify`` through the real CLI entry point."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
from pathlib import Path

from audit import AuditLog, call_record
from plugin_llm.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_772_323_200.0  # 2026-03-01T00:00:00Z


def clock():
    t = [T0 - 60]

    def now() -> float:
        t[0] += 60
        return t[0]

    return now


def fill(home: Path, count: int = 6) -> Path:
    path = home / "logs" / "agent.log"
    log = AuditLog(path, clock=clock())
    for i in range(count):
        status = "denied" if i == 2 else "ok"
        log.write(call_record(
            call_id=f"call_{i}", plugin_id="alpha" if i % 2 == 0 else "beta", api="complete", mode="sync",
            decision="denied" if status == "denied" else "allowed", status=status, request_model="gpt-4o-mini",
            response_model=None if status == "denied" else "gpt-4o-mini-2024-07-18", input_tokens=100 + i,
            output_tokens=10, cost_usd=0.0015, latency_ms=10.0 * (i + 1), purpose=f"job {i}",
        ))
    log.write_event("config_reloaded", trust_policy_sha256="a" * 64, changed_entries=["alpha"])
    log.close()
    return path


def test_missing_log_is_a_clear_error_not_a_traceback(hermes_home, capsys):
    for action in ("tail", "query", "stats", "verify"):
        assert main(["audit", action]) == 2
        err = capsys.readouterr().err
        assert err.startswith("plugin-llm: error: no audit log at ") and str(hermes_home) in err
        assert "Traceback" not in err


def test_bare_audit_prints_help(capsys):
    assert main(["audit"]) == 2
    assert "tail" in capsys.readouterr().out


def test_tail_shows_time_plugin_status_model_tokens_cost_purpose(hermes_home, capsys):
    fill(hermes_home)
    assert main(["audit", "tail", "-n", "3"]) == 0
    header, *out = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["TIME", "PLUGIN", "STATUS", "MODEL"]  # column titles first
    assert len(out) == 3
    assert out[0].split() == ["2026-03-01", "00:04:00Z", "alpha", "ok", "gpt-4o-mini-2024-07-18", "104/10",
                              "$0.001500", "job", "4"]
    assert "[config_reloaded]" in out[2] and "changed_entries=[\"alpha\"]" in out[2]


def test_tail_json_and_explicit_home(hermes_home, tmp_path, capsys, monkeypatch):
    fill(hermes_home)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "elsewhere"))
    assert main(["audit", "tail", "-n", "2", "--json", "--home", str(hermes_home)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["seq"] for r in lines] == [6, 7]


@pytest.mark.slow
def test_tail_follow_stops_after_max_wait(hermes_home, capsys):
    fill(hermes_home)
    assert main(["audit", "tail", "-n", "1", "-f", "--max-wait", "0.05"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # the header row and the record


def test_human_output_escapes_control_characters(hermes_home, capsys):
    AuditLog(hermes_home / "logs" / "agent.log").write(
        {"plugin_id": "p", "status": "ok", "purpose": 'x\n{"forged": 1}\x1b[2J'}
    )
    assert main(["audit", "query"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 2 and "\x1b" not in out  # the header row and the one record and 'x\\n{"forged": 1}\\x1b[2J' in out


def test_query_filters_and_json(hermes_home, capsys):
    fill(hermes_home)
    assert main(["audit", "query", "--plugin", "alpha", "--status", "ok", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["call_id"] for r in rows] == ["call_0", "call_4"]
    assert main(["audit", "query", "--since", "2026-03-01T00:03:00Z", "--until", "2026-03-01T00:04:00Z", "--json"]) == 0
    assert [json.loads(x)["call_id"] for x in capsys.readouterr().out.splitlines()] == ["call_3", "call_4"]
    assert main(["audit", "query", "--model", "gpt-4o-mini-2024*", "--purpose", "JOB 5", "--json"]) == 0
    assert [json.loads(x)["call_id"] for x in capsys.readouterr().out.splitlines()] == ["call_5"]
    assert main(["audit", "query", "--events", "--limit", "2", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["audit", "query", "--since", "1h"]) == 0  # fixture is from 2026-03-01: nothing recent
    assert capsys.readouterr().out == ""


def test_query_rejects_bad_times(hermes_home, capsys):
    fill(hermes_home)
    assert main(["audit", "query", "--since", "last tuesday"]) == 2
    assert "--since: cannot read the time 'last tuesday'" in capsys.readouterr().err
    assert main(["audit", "query", "--since", "2026-03-02", "--until", "2026-03-01"]) == 2
    assert "is after --until" in capsys.readouterr().err


def test_query_reports_skipped_lines(hermes_home, capsys):
    path = fill(hermes_home)
    with open(path, "ab") as f:
        f.write(b"garbage\n")
    assert main(["audit", "query", "--json"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 6
    assert "skipped 1 unreadable line(s), first at " in captured.err and "agent.log:8" in captured.err


def test_stats_table_and_json(hermes_home, capsys):
    fill(hermes_home)
    assert main(["audit", "stats"]) == 0
    out = capsys.readouterr().out
    alpha = next(line for line in out.splitlines() if line.startswith("alpha"))
    # alpha: calls 0, 2 (denied), 4 -> 3 calls, 1 denial; tokens 100+102+104; cost 3 x 0.0015;
    # latencies of non-denied calls: 10, 50 -> p50 10, p95 50
    assert alpha.split() == ["alpha", "3", "1", "0", "306", "30", "0.004500", "0", "10.0", "50.0"]  # 0 unpriced
    assert main(["audit", "stats", "--json", "--plugin", "beta"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (beta,) = doc["by_plugin"]
    assert (beta["calls"], beta["denials"], beta["p50_latency_ms"], beta["p95_latency_ms"]) == (3, 0, 40.0, 60.0)
    assert [m["key"] for m in doc["by_model"]] == ["gpt-4o-mini-2024-07-18"]
    assert main(["audit", "stats", "--plugin", "nobody"]) == 0
    assert "no call records match" in capsys.readouterr().out


def test_verify_ok_then_tampered(hermes_home, capsys):
    path = fill(hermes_home)
    assert main(["audit", "verify"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: 7 records in 1 file, chain whole")
    head = out.split("head: ", 1)[1].split()[0]
    assert main(["audit", "verify", "--anchor", head]) == 0
    capsys.readouterr()

    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"job 3", b"job 9")
    path.write_bytes(b"".join(lines))
    assert main(["audit", "verify"]) == 1
    out = capsys.readouterr().out
    assert f"FAILED: {path}:4: edited" in out
    assert main(["audit", "verify", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["first_error"]["line"] == 4 and doc["first_error"]["kind"] == "edited"


def test_verify_anchor_must_be_well_formed_and_present(hermes_home, capsys):
    path = fill(hermes_home)
    assert main(["audit", "verify", "--anchor", "nonsense"]) == 2
    assert "expected SEQ:HASH" in capsys.readouterr().err
    assert main(["audit", "verify", "--anchor", f"99:{'a' * 64}", "--log", str(path)]) == 1
    assert "anchor" in capsys.readouterr().out


def test_log_option_reads_a_copied_file(hermes_home, tmp_path, capsys):
    path = fill(hermes_home)
    copy = tmp_path / "evidence.log"
    copy.write_bytes(path.read_bytes())
    assert main(["audit", "verify", "--log", str(copy)]) == 0
    assert main(["audit", "query", "--log", str(tmp_path / "missing.log")]) == 2
    assert "no audit log at" in capsys.readouterr().err


def test_audit_cli_never_imports_litellm():
    code = (
        "import sys; from plugin_llm.cli.main import main; "
        "main(['audit', 'verify']); "
        "print('litellm' in sys.modules, 'plugin_llm.llm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip().splitlines()[-1] == "False False"


def fill_refusals(home: Path) -> None:
    """A trust denial (status denied) and a budget refusal (status quota, decision denied), then an ok call."""
    log = AuditLog(home / "logs" / "agent.log", clock=clock())
    for i, (status, decision) in enumerate((("denied", "denied"), ("quota", "denied"), ("ok", "allowed"),
                                            ("timeout", "allowed"))):
        log.write(call_record(call_id=f"r{i}", plugin_id="capped", api="complete", mode="sync", decision=decision,
                              status=status, request_model="m", latency_ms=1.0, purpose=f"refusal {i}"))
    log.close()


def test_every_refusal_stats_counts_as_denied_is_what_query_decision_denied_lists(hermes_home, capsys):
    fill_refusals(hermes_home)
    assert main(["audit", "stats", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["by_plugin"]
    assert (row["calls"], row["denials"], row["errors"]) == (4, 2, 1)
    assert main(["audit", "query", "--decision", "denied", "--json"]) == 0
    denied = [json.loads(x)["call_id"] for x in capsys.readouterr().out.splitlines()]
    assert denied == ["r0", "r1"] and len(denied) == row["denials"]
    assert main(["audit", "query", "--decision", "allowed", "--json"]) == 0
    assert [json.loads(x)["call_id"] for x in capsys.readouterr().out.splitlines()] == ["r2", "r3"]
    assert main(["audit", "stats", "--decision", "denied", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["by_plugin"][0]["calls"] == 2
    assert main(["audit", "export", "--decision", "denied"]) == 0  # jsonl by default
    assert [json.loads(x)["status"] for x in capsys.readouterr().out.splitlines()] == ["denied", "quota"]
    # the table says which query lists its DENIED and ERRORS
    assert main(["audit", "stats"]) == 0
    assert "`audit query --decision denied`" in capsys.readouterr().out
    # --status denied is the gate's status only: a query that finds no denial says where the others are
    assert main(["audit", "query", "--status", "denied", "--plugin", "nobody"]) == 0
    assert "--decision denied lists every refusal" in capsys.readouterr().err
    assert main(["audit", "query", "--decision", "refused"]) == 2
    assert "--decision 'refused': expected allowed or denied" in capsys.readouterr().err


def test_export_defaults_to_json_lines(hermes_home, capsys):
    fill(hermes_home)
    assert main(["audit", "export"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["call_id"] for r in rows] == [f"call_{i}" for i in range(6)]


def test_tail_prints_one_line_per_record_cut_to_the_width_and_v_prints_it_whole(hermes_home, capsys, monkeypatch):
    log = AuditLog(hermes_home / "logs" / "agent.log", clock=clock())
    frames = [{"file": f"/plugins/p/mod{i}.py", "line": i, "function": f"handler_{i}"} for i in range(12)]
    log.write_event("command_error", plugin_id="p", command="go", error="ValueError: " + "x" * 200, frames=frames)
    log.close()
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["audit", "tail"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(len(line) <= 100 for line in lines)
    assert "[command_error]" in lines[1] and lines[1].endswith("...")
    assert main(["audit", "tail", "-v"]) == 0
    whole = capsys.readouterr().out.splitlines()
    assert len(whole) == 2 and len(whole[1]) > 600 and "handler_11" in whole[1]
    monkeypatch.delenv("COLUMNS")
    assert main(["audit", "tail"]) == 0  # not a terminal (a pipe, a file): nothing is cut
    assert "handler_11" in capsys.readouterr().out
