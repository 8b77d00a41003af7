"""Record schema, canonical JSON, chain rendering and audit settings."""

from __future__ import annotations

import hashlib
import json

import pytest

import audit
from audit.chain import GENESIS_HASH, fast_fields, parse_fields, record_hash, render_line
from audit.records import (
    CALL_FIELDS,
    SCHEMA_VERSION,
    call_record,
    canonical_json,
    changed_entries,
    config_reload_fields,
    is_call_record,
    new_call_id,
    sha256_json,
    sha256_text,
)
from audit.settings import AuditSettings, parse_audit_settings


def test_public_api_is_exported_with_all():
    for name in audit.__all__:
        assert getattr(audit, name) is not None, name
    assert audit.AuditWriteError.__module__ == "audit.errors"
    assert issubclass(audit.AuditLogNotFoundError, FileNotFoundError)


def test_canonical_json_sorts_keys_without_whitespace_and_keeps_utf8():
    assert canonical_json({"b": 1, "a": "é", "c": [1, {"z": None, "y": True}]}) == (
        '{"a":"é","b":1,"c":[1,{"y":true,"z":null}]}'.encode("utf-8")
    )


def test_sha256_helpers():
    assert sha256_text("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha256_json({"b": 1, "a": 2}) == hashlib.sha256(b'{"a":2,"b":1}').hexdigest()


def test_call_record_has_every_spec_field():
    record = call_record(call_id=new_call_id(), plugin_id="p", api="structured", mode="async",
                         decision="allowed", status="ok", validation="passed")
    assert set(CALL_FIELDS) - {"ts"} <= set(record)
    assert record["event"] == "llm.call" and record["kind"] == "call"
    assert len(record["call_id"]) == 32 and int(record["call_id"], 16) >= 0  # the log's and the result's format
    assert is_call_record(record)
    assert SCHEMA_VERSION == 1


@pytest.mark.parametrize("field,value", [("api", "chat"), ("mode", "threaded"), ("status", "fine"),
                                         ("decision", "maybe"), ("validation", "skipped")])
def test_call_record_rejects_unknown_enumerated_values(field, value):
    kwargs = dict(call_id="c", plugin_id="p", api="complete", mode="sync", decision="allowed", status="ok")
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        call_record(**kwargs)


def test_call_record_content_fields_are_checked():
    record = call_record(call_id="c", plugin_id="p", api="complete", mode="sync", decision="allowed", status="ok",
                         content={"gen_ai.input.messages": [{"role": "user", "content": "hi"}]})
    assert record["gen_ai.input.messages"][0]["content"] == "hi"
    with pytest.raises(ValueError, match="unknown audit content"):
        call_record(call_id="c", plugin_id="p", api="complete", mode="sync", decision="allowed", status="ok",
                    content={"prompt": "x"})


def test_operational_events_are_not_call_records():
    assert not is_call_record({"event": "hook_error", "kind": "event"})
    assert is_call_record({"event": "llm.call"})


def test_config_reload_fields_hash_policy_and_list_changed_entries():
    old = {"a": {"allow_model_override": True}, "b": {}}
    new = {"a": {"allow_model_override": False}, "b": {}, "c": {}}
    fields = config_reload_fields(old, new)
    assert fields["changed_entries"] == ["a", "c"]
    assert fields["trust_policy_sha256"] == sha256_json(new)
    assert changed_entries(None, {}) == []


def test_render_line_hash_is_sha256_of_canonical_record_without_hash():
    record = {"seq": 1, "prev_hash": GENESIS_HASH, "purpose": "ü\n", "n": 1.5}
    line, digest = render_line(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    parsed = json.loads(line)
    assert parsed["hash"] == digest == hashlib.sha256(canonical_json(record)).hexdigest()
    assert record_hash(parsed) == digest
    fields = fast_fields(line[:-1])
    assert fields is not None and (fields.seq, fields.prev_hash, fields.hash) == (1, GENESIS_HASH, digest)
    assert parse_fields(parsed) == fields


def test_fast_path_declines_ambiguous_or_rewritten_lines():
    line, _ = render_line({"seq": 2, "prev_hash": GENESIS_HASH, "nested": {"seq": 9}})
    assert fast_fields(line[:-1]) is None  # two "seq" keys: the caller must parse
    rewritten = json.dumps(json.loads(line), indent=1).replace("\n", "").encode()
    assert fast_fields(rewritten) is None
    assert parse_fields(json.loads(rewritten)).seq == 2


def test_settings_validate_their_values():
    assert AuditSettings().fsync == "never" and AuditSettings().max_bytes == 50 * 1024**2
    for bad in ({"fsync": "sometimes"}, {"max_bytes": -1}, {"backup_count": 1.5}, {"required": "yes"}):
        with pytest.raises(ValueError):
            AuditSettings(**bad)


def test_parse_audit_settings_accepts_sizes_and_strict_booleans():
    settings, warnings = parse_audit_settings(
        {"log_content": "true", "required": True, "max_bytes": "10MB", "backup_count": 3, "fsync": "Always"}
    )
    assert settings == AuditSettings(log_content=True, required=True, max_bytes=10 * 1024**2, backup_count=3, fsync="always")
    assert warnings == []


def test_parse_audit_settings_warns_and_falls_back():
    settings, warnings = parse_audit_settings({"requird": True, "required": "yes", "fsync": "sometimes", "max_bytes": "big"})
    assert settings == AuditSettings(required=True)  # a typo'd audit.required fails closed, never open
    text = "\n".join(warnings)
    assert "did you mean audit.required" in text
    assert "audit.required: 'yes' is not true/false; treated as true (fail closed" in text
    assert "audit.fsync" in text and "audit.max_bytes" in text
    assert parse_audit_settings(None) == (AuditSettings(), [])
    assert parse_audit_settings(["x"])[1]


def test_audit_package_depends_on_neither_litellm_nor_the_gateway():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys, audit, audit.writer, audit.reader, audit.verifier, audit.summary; "
        "print(sorted(m for m in sys.modules if m == 'litellm' or m.startswith('plugin_llm')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(root)}, check=True)
    assert out.stdout.strip() == "[]"
