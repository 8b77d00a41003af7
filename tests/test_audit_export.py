"""The auditor's tooling as a new user meets it -- exports parsed back,
enum filters that name the valid values, unpriced calls in stats, header rows."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from audit import AuditLog, AuditSettings
from audit.export import CSV_COLUMNS, GENAI_EVENT
from audit.records import call_record
from plugin_llm.cli.main import main


def fill(home: Path) -> Path:
    log = AuditLog(home / "logs" / "agent.log", AuditSettings(), signer=None)
    log.write(call_record(call_id="call_1", plugin_id="alpha", api="complete", mode="sync", decision="allowed",
                          status="ok", purpose="=HYPERLINK(\"http://x\")", provider="openai",
                          request_model="gpt-4o-mini", response_model="gpt-4o-mini-2024-07-18",
                          input_tokens=100, output_tokens=10, cost_usd=0.0015, latency_ms=12.5, attempts=1))
    log.write(call_record(call_id="call_2", plugin_id="alpha", api="complete", mode="sync", decision="denied",
                          status="denied", purpose="no", decision_reason="model not allowed"))
    log.write(call_record(call_id="call_3", plugin_id="beta", api="structured", mode="async", decision="allowed",
                          status="ok", purpose="a, \"quoted\"\nline", request_model="my-local-model",
                          input_tokens=7, output_tokens=3, cost_usd=None))
    log.write_event("config_reloaded", changed_entries=["alpha"])
    log.close()
    return log.path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_csv_export_parses_back_with_the_csv_module(hermes_home, capsys):
    fill(hermes_home)
    code, out, _ = cli(capsys, "audit", "export", "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out, newline="")))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert [r["call_id"] for r in rows] == ["call_1", "call_2", "call_3"]  # events only with --events
    first, _, third = rows
    assert first["purpose"] == "'=HYPERLINK(\"http://x\")"  # a formula is shown, never evaluated
    assert first["gen_ai.usage.input_tokens"] == "100" and first["cost_usd"] == "0.0015"
    assert third["purpose"] == "a, \"quoted\"\nline" and third["cost_usd"] == ""
    assert len(first["hash"]) == 64 and third["prev_hash"] == rows[1]["hash"]
    code, out, _ = cli(capsys, "audit", "export", "--format", "csv", "--events")
    rows = list(csv.DictReader(io.StringIO(out, newline="")))
    assert rows[-1]["event"] == "config_reloaded" and json.loads(rows[-1]["other"]) == {"changed_entries": ["alpha"]}


def test_jsonl_export_with_filters_and_output_file(hermes_home, tmp_path, capsys):
    fill(hermes_home)
    target = tmp_path / "out.jsonl"
    code, out, err = cli(capsys, "audit", "export", "--format", "jsonl", "--plugin", "alpha", "-o", str(target))
    assert code == 0 and out == "" and "wrote 2 records" in err
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["call_id"] for r in records] == ["call_1", "call_2"] and all("hash" in r for r in records)


def test_otlp_export_has_the_otlp_json_logs_shape(hermes_home, capsys):
    fill(hermes_home)
    code, out, _ = cli(capsys, "audit", "export", "--format", "otlp", "--events")
    assert code == 0
    doc = json.loads(out)
    (resource_logs,) = doc["resourceLogs"]
    assert {"key": "service.name", "value": {"stringValue": "plugin-llm-gateway"}} in resource_logs["resource"]["attributes"]
    (scope_logs,) = resource_logs["scopeLogs"]
    assert scope_logs["scope"]["name"] == "plugin_llm.audit"
    logs = scope_logs["logRecords"]
    assert len(logs) == 4
    ok, denied, _, event = logs
    assert ok["timeUnixNano"].isdigit() and len(ok["timeUnixNano"]) == 19
    assert (ok["severityNumber"], ok["severityText"]) == (9, "INFO")
    assert (denied["severityNumber"], denied["severityText"]) == (13, "WARN")
    assert ok["eventName"] == GENAI_EVENT and event["eventName"] == "plugin_llm.config_reloaded"
    attrs = {a["key"]: a["value"] for a in ok["attributes"]}
    assert attrs["gen_ai.request.model"] == {"stringValue": "gpt-4o-mini"}
    assert attrs["gen_ai.response.model"] == {"stringValue": "gpt-4o-mini-2024-07-18"}
    assert attrs["gen_ai.usage.input_tokens"] == {"intValue": "100"}  # int64 as a string, per OTLP/JSON
    assert attrs["gen_ai.provider.name"] == {"stringValue": "openai"}
    assert attrs["plugin_llm.plugin_id"] == {"stringValue": "alpha"}
    assert attrs["plugin_llm.cost_usd"] == {"doubleValue": 0.0015}
    assert len(attrs["plugin_llm.hash"]["stringValue"]) == 64
    for log in logs:  # every attribute value is one OTLP AnyValue
        for attr in log["attributes"]:
            assert set(attr) == {"key", "value"} and len(attr["value"]) == 1
    event_attrs = {a["key"]: a["value"] for a in event["attributes"]}
    assert event_attrs["plugin_llm.changed_entries"] == {"arrayValue": {"values": [{"stringValue": "alpha"}]}}


def test_export_format_is_checked(hermes_home, capsys):
    fill(hermes_home)
    code, out, err = cli(capsys, "audit", "export", "--format", "xlsx")
    assert code == 2 and out == "" and "--format 'xlsx': expected one of csv, jsonl, otlp" in err


@pytest.mark.parametrize("action", ["query", "stats", "export"])
def test_status_filter_rejects_unknown_values_listing_the_valid_ones(hermes_home, capsys, action):
    fill(hermes_home)
    extra = ["--format", "csv"] if action == "export" else []
    code, out, err = cli(capsys, "audit", action, "--status", "ok,denyed", *extra)
    assert code == 2 and out == ""
    assert "--status 'denyed': not a status (did you mean denied?)" in err
    assert "valid: ok, denied, timeout, provider_error, schema_error, quota, error" in err


def test_stats_shows_unpriced_calls_instead_of_a_zero_cost(hermes_home, capsys):
    fill(hermes_home)
    code, out, _ = cli(capsys, "audit", "stats")
    assert code == 0
    beta = next(line for line in out.splitlines() if line.startswith("beta"))
    cols = beta.split()
    assert cols[6] == "-" and cols[7] == "1"  # COST USD unknown, 1 unpriced call
    alpha = next(line for line in out.splitlines() if line.startswith("alpha"))
    assert alpha.split()[6:8] == ["0.001500", "0"]
    assert "1 successful call had no price" in out
    assert "UNPRICED" in out.splitlines()[0]


def test_tail_and_query_print_a_header_row_but_json_does_not(hermes_home, capsys):
    fill(hermes_home)
    for action in ("tail", "query"):
        code, out, _ = cli(capsys, "audit", action)
        assert code == 0 and out.splitlines()[0].split()[:4] == ["TIME", "PLUGIN", "STATUS", "MODEL"]
        code, out, _ = cli(capsys, "audit", action, "--json")
        assert code == 0 and all(line.startswith("{") for line in out.splitlines())
    code, out, err = cli(capsys, "audit", "query", "--plugin", "nobody")
    assert code == 0 and out == "" and "no records match" in err


# -- read-only commands leave the log alone ------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["plugins", "list"], ["plugins", "list", "--json"], ["plugins", "info", "broken"], ["run", "help"],
])
def test_read_only_commands_append_nothing_to_the_audit_log(hermes_home, capsys, argv):
    from tests.plugin_fixtures import HELLO_WORLD_INIT, HELLO_WORLD_MANIFEST, configure, write_plugin

    root = hermes_home / "plugins"
    write_plugin(root, "hello-world", HELLO_WORLD_INIT, manifest=HELLO_WORLD_MANIFEST)
    write_plugin(root, "broken", "def register(ctx):\n    raise RuntimeError('exploded on load')\n")
    configure(hermes_home, enabled=["hello-world", "broken"])
    log = hermes_home / "logs" / "agent.log"
    before = log.read_bytes() if log.exists() else b""
    main(argv)
    out = capsys.readouterr().out
    assert out  # the command did its job ...
    assert (log.read_bytes() if log.exists() else b"") == before  # ... and wrote no load events
