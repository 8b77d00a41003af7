"""The writer's direct renderer: byte for byte the canonical encoder, on every record, hostile ones included.

The chain hashes ``canonical_json`` (the reference encoder ``verify`` checks
against); the writer renders records with ``canonical_record`` and a fused
scrub-and-encode pass. These tests hold the two to the same bytes (and the
same errors) on thousands of generated records, and check the redactor the
host's writer uses (``redact_field``) against ``redact``.
"""

from __future__ import annotations

import enum
import hashlib
import json
import random
from pathlib import Path

import pytest

import auth.redaction as redaction
from audit import AuditLog, AuditSettings, iter_records, verify
from audit.processors import HOST_GENERATED, RecordRenderer
from audit.records import CALL_FIELDS, CONTENT_FIELDS, _layouts, canonical_json, canonical_record
from auth import redact, register_secret
from auth.redaction import FIELD_CACHE_MAX_CHARS, redact_field
from plugin_llm import PluginLlm
from plugin_llm.transport import TransportResponse
from plugin_llm.types import PluginLlmUsage

# text that stresses a JSON string encoder: quotes, escapes, every control character,
# the line separators JSON leaves alone, non-BMP characters, and a lone surrogate
HOSTILE = [
    "", "plain", 'quo"te', "back\\slash", "nl\nnl", "\r\t\b\f", "\x00\x01\x1f\x7f", "\u2028\u2029\x85",
    "é", "日本語", "emoji \U0001f600", "\ufeffbom", "</script>", '{"forged": 1}\n', "%s %d {0}", "null",
    "true", "-0", "1e999",
]
#: lone surrogates: not UTF-8, so no encoder writes them (the writer replaces them first)
SURROGATES = ["\ud800", "a\udfffb", "\udc80\ud800"]


class Level(enum.IntEnum):
    HIGH = 3


class Label(str):
    pass


class Ratio(float):
    pass


def _text(rng: random.Random) -> str:
    if rng.random() < 0.005:
        return rng.choice(SURROGATES)
    if rng.random() < 0.5:
        return rng.choice(HOSTILE)
    alphabet = "ab\"\\\n\x00\u2028é日\U0001f600 {}[]:,"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))


def _value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(14 if depth < 3 else 10)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**63, -(2**70), 10**30])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.5, 1e300, 5e-324, float("nan"), float("inf"), float("-inf"), 0.1 + 0.2])
    if kind in (4, 5, 6):
        return _text(rng)
    if kind == 7:
        return Label(_text(rng))
    if kind == 8:
        return Level.HIGH
    if kind == 9:
        return Ratio(2.5)
    if kind == 10:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 11:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    return {_text(rng): _value(rng, depth + 1) for _ in range(rng.randrange(4))}


def _record(rng: random.Random) -> dict:
    keys = rng.sample(CALL_FIELDS, rng.randrange(len(CALL_FIELDS) + 1))
    keys += [_text(rng) for _ in range(rng.randrange(3))]
    return {key: _value(rng) for key in keys}


def _outcome(encode, record):
    try:
        return encode(record)
    except Exception as exc:  # noqa: BLE001 - the same failure is part of the contract
        return type(exc)


def test_canonical_record_is_canonical_json_byte_for_byte_on_many_records():
    rng = random.Random(20261201)
    records = [_record(rng) for _ in range(3000)]
    records += [{}, {"a": 1}, {"\ud800": 1}, {1: "int key"}, {1: "a", "1": "b"}, {"x": object()},
                {"nested": {1: 2, "a": 3}}, {"deep": [[[[{"k": "é"}]]]]}]
    failures = 0
    for record in records:
        expected = _outcome(canonical_json, record)
        assert _outcome(canonical_record, record) == expected, record
        assert _outcome(canonical_record, record) == expected, record  # again: from the layout cache
        failures += isinstance(expected, type)
    assert 0 < failures < len(records) // 2  # both outcomes were exercised


def test_the_key_order_cache_stays_bounded_when_every_record_has_new_keys():
    for i in range(1000):
        canonical_record({f"field-{i}": i, "event": "x"})
    canonical_record({"k" * 20_000: 1})  # a huge key set is rendered but not remembered
    assert len(_layouts) <= 256 and not any(len(order[0]) > 10_000 for order in _layouts if order)


#: fields the redactor sees (the host's own ids, digests and enums skip it when ASCII)
REDACTED_FIELDS = [name for name in CALL_FIELDS if name not in HOST_GENERATED]


def _reference_line(record: dict) -> bytes:
    """How the chain renders a record, with the reference encoder: canonical JSON, then ``hash`` last."""
    body = canonical_json({k: v for k, v in record.items() if k != "hash"})
    return body[:-1] + b',"hash":"' + hashlib.sha256(body).hexdigest().encode() + b'"}\n'


@pytest.mark.parametrize("log_content", [False, True], ids=["content-dropped", "content-kept"])
def test_every_line_the_writer_renders_is_the_reference_rendering(tmp_path, log_content):
    path = tmp_path / "logs" / "agent.log"

    def scrubber(text: str) -> str:
        return text.replace("hide-me", "[REDACTED]")

    log = AuditLog(path, AuditSettings(log_content=log_content), redact=scrubber, clock=lambda: 1_700_000_000.25)
    rng = random.Random(7)
    written = []
    for i in range(400):
        record = _record(rng)
        record[rng.choice(REDACTED_FIELDS)] = f"a value with hide-me inside {i}"
        if i % 5 == 0:
            record.update({name: [{"role": "user", "content": _text(rng)}] for name in CONTENT_FIELDS})
        result = log.write(record)
        if "hash" in result:
            written.append(result)
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == len(written) > 300
    for line, record in zip(lines, written):
        assert line == _reference_line(record)
        assert b"hide-me" not in line
        assert log_content or not set(CONTENT_FIELDS) & set(record)
    assert verify(path, strict=True).ok


def test_rendering_normalises_like_the_reference_scrub(tmp_path):
    """Host-generated ASCII fields skip the redactor; every other string, and non-ASCII text anywhere, is cleaned."""
    seen: list[str] = []

    def spy(text: str) -> str:
        seen.append(text)
        return text.upper()

    renderer = RecordRenderer(clock=lambda: 0.0, redact=spy, log_content=False)
    line, record = renderer.render({
        "call_id": "abc", "status": "ok", "plugin_id": "plug", "event": "llm.call", "seq": 1, "prev_hash": "0" * 64,
        "mode": "sÿnc", "n": float("nan"), "t": (1, "x"), "bad": "\ud800", "kind": "call", "flag": True,
    })
    assert record["call_id"] == "abc" and record["status"] == "ok" and record["plugin_id"] == "PLUG"
    assert record["mode"] == "SŸNC"  # not ASCII, so not the host's own enum: cleaned
    assert record["n"] == "nan" and record["t"] == [1, "X"] and record["bad"] == "?" and record["flag"] is True
    assert "abc" not in seen and "ok" not in seen and "call" not in seen
    assert line == _reference_line(record) and record["ts"] == "1970-01-01T00:00:00.000Z"
    assert HOST_GENERATED >= {"call_id", "status", "event", "kind", "prev_hash", "ts"}


@pytest.mark.slow
def test_an_oversized_or_too_deep_record_still_takes_the_fitting_path(tmp_path):
    path = tmp_path / "logs" / "agent.log"
    log = AuditLog(path)
    deep: object = "leaf"
    for _ in range(80):
        deep = [deep]
    record = log.write({"plugin_id": "p", "deep": deep, "big": "x" * (17 * 1024 * 1024)})
    assert record["audit_truncated"] and "big" in record["audit_truncated"]
    (only,) = iter_records(path)
    assert only["seq"] == 1 and verify(path, strict=True).ok


# -- the host writer's redactor ---------------------------------------------------------------------

def test_redact_field_gives_what_redact_gives():
    register_secret("sk-fastrender-registered-0123456789")
    samples = HOSTILE + [
        "model sk-fastrender-registered-0123456789", "Authorization: Bearer abcdefghijklmnop12",
        "api_key=hunter2hunter2", "gpt-4o-mini", "no overrides requested", "x" * (FIELD_CACHE_MAX_CHARS + 1),
        "https://h/v1?key=AIzaSyA1234567890abcdefghijklmnopqrstuv", Label("Bearer abcdefghijklmnop12"), 12345,
    ]
    for _ in range(2):  # second round: answered from the clean set where a value was clean
        for sample in samples:
            assert redact_field(sample) == redact(sample), sample


def test_a_recurring_clean_value_is_scanned_once(monkeypatch):
    calls: list[str] = []
    real = redaction.redact
    monkeypatch.setattr(redaction, "redact", lambda text: calls.append(text) or real(text))
    value = "openrouter/some-model-name"
    for _ in range(5):
        assert redact_field(value) is value
    assert calls == [value]
    assert redact_field("a key sk-proj-ABCDEFGHIJKLMNOP1234") == "a key [REDACTED]"
    assert redact_field("a key sk-proj-ABCDEFGHIJKLMNOP1234") == "a key [REDACTED]"
    assert calls.count("a key sk-proj-ABCDEFGHIJKLMNOP1234") == 2  # text that had something to hide is not kept


def test_a_secret_registered_after_a_value_was_found_clean_is_hidden_in_it():
    value = "provider-model-fastrender-LATEKEY-42x"
    assert redact_field(value) is value and redact_field(value) is value  # remembered as clean
    register_secret("fastrender-LATEKEY")  # e.g. auth.json reloaded with a new key
    assert "LATEKEY" not in redact_field(value)


def test_the_clean_set_holds_no_secret():
    canary = "canary-fastrender-SECRET-9f8e7d6c5b4a"
    register_secret(canary)
    for text in (f"echo {canary}", f"Bearer {canary}", "clean value"):
        assert canary not in redact_field(text)
    snapshot, clean = redaction._clean_fields
    assert "clean value" in clean and not any(canary in text for text in clean)


# -- the gateway's records ------------------------------------------------------------------------

def test_gateway_records_are_the_reference_rendering_and_redacted(hermes_home):
    secret = "sk-fastrender-provider-echo-ABCDEF0123456789"
    register_secret(secret)

    class Echo:
        def complete(self, request):
            return TransportResponse("ok", {"role": "assistant", "content": "ok"}, f"model-{secret}",
                                     PluginLlmUsage(3, 2, 5), 1, 0.001)

    llm = PluginLlm("fast-render", transport=Echo())
    for purpose in ("first", "second", "日本語 \u2028 purpose"):
        llm.complete([{"role": "user", "content": "hi"}], purpose=purpose)
    path = hermes_home / "logs" / "agent.log"
    lines = [line for line in path.read_bytes().splitlines(keepends=True)]
    records = [json.loads(line) for line in lines]
    calls = [r for r in records if r.get("event") == "llm.call"]
    assert [r["purpose"] for r in calls] == ["first", "second", "日本語 \u2028 purpose"]
    for line, record in zip(lines, records):
        assert line == _reference_line(record)
    assert secret.encode() not in path.read_bytes()
    assert all(r["gen_ai.response.model"].startswith("model-") for r in calls)
    assert verify(hermes_home, strict=True).ok


def test_host_audit_log_uses_the_field_redactor(hermes_home):
    from plugin_llm.auditing import host_audit_log

    assert host_audit_log(Path(hermes_home))._redact is redact_field
