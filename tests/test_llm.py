"""PluginLlm end to end on the embedded local model (in-process through litellm)."""

from __future__ import annotations

import asyncio
import base64

import pytest

from plugin_llm import (
    PluginLlm,
    PluginLlmConfigError,
    PluginLlmImageInput,
    PluginLlmSchemaError,
    PluginLlmStructuredResult,
    PluginLlmTextInput,
    PluginLlmTrustError,
)
from plugin_llm.transport import TransportResponse
from plugin_llm.types import PluginLlmUsage
from tests.conftest import audit_lines, write_config

INVOICE_SCHEMA = {
    "type": "object",
    "properties": {"vendor": {"type": "string"}, "total": {"type": "number"}},
    "required": ["vendor", "total"],
}
USER = [{"role": "user", "content": "Hello from the test"}]


def test_complete_on_local_model(hermes_home):
    result = PluginLlm("greeter").complete(USER, purpose="greeting")
    assert "Hello from the test" in result.text
    assert (result.provider, result.model) == ("local", "local-echo-1")
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
    assert result.usage.total_tokens == result.usage.input_tokens + result.usage.output_tokens
    assert result.usage.cost_usd == 0.0
    assert result.audit == {"plugin_id": "greeter", "purpose": "greeting", "profile": None, "schema_name": None,
                            "call_id": result.audit["call_id"], "task": ""}
    [line] = audit_lines(hermes_home)
    assert line["call_id"] == result.audit["call_id"]
    assert line["plugin_id"] == "greeter" and line["status"] == "ok" and line["decision"] == "allowed"
    assert line["api"] == "complete" and line["mode"] == "sync" and line["purpose"] == "greeting"
    assert line["gen_ai.provider.name"] == "local" and line["gen_ai.response.model"] == "local-echo-1"
    assert line["gen_ai.usage.input_tokens"] == result.usage.input_tokens
    assert line["attempts"] == 1 and line["latency_ms"] >= line["overhead_ms"] >= 0


def test_structured_extraction_fills_schema(hermes_home):
    result = PluginLlm("invoices").complete_structured(
        instructions="Extract the invoice", input=[PluginLlmTextInput("Vendor: ACME\nTotal: 12.50")],
        json_schema=INVOICE_SCHEMA, schema_name="invoice",
    )
    assert isinstance(result, PluginLlmStructuredResult)
    assert result.parsed == {"vendor": "ACME", "total": 12.5} and result.content_type == "json"
    [line] = audit_lines(hermes_home)
    assert line["api"] == "structured" and line["validation"] == "passed" and line["schema_name"] == "invoice"
    assert len(line["schema_sha256"]) == 64 and len(line["prompt_sha256"]) == 64


def test_structured_with_image_bytes(hermes_home):
    seen = {}

    class Spy:
        def supports_json_schema(self, route):
            return True

        def complete(self, request):
            seen["messages"] = request.messages
            seen["params"] = request.params
            return TransportResponse('{"vendor": "X", "total": 1}', {"role": "assistant"}, "m", PluginLlmUsage(1, 1, 2), 1, 0.0)

    result = PluginLlm("vision", transport=Spy()).complete_structured(
        instructions="Read the receipt", input=[PluginLlmImageInput(data=b"\x89PNG fake", mime_type="image/png")],
        json_schema=INVOICE_SCHEMA,
    )
    assert result.parsed == {"vendor": "X", "total": 1}
    parts = seen["messages"][-1]["content"]
    url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
    assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == b"\x89PNG fake"
    assert seen["params"]["response_format"]["type"] == "json_schema"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(instructions="   ", input=["x"]), "instructions"),
        (dict(instructions="do it", input=[]), "input"),
        (dict(instructions="do it", input=["x"], json_schema={"type": "nope"}), "schema"),
    ],
)
def test_structured_bad_input_raises_before_any_call(hermes_home, kwargs, message):
    class Boom:
        def supports_json_schema(self, route):
            raise AssertionError("must not be reached")

        def complete(self, request):
            raise AssertionError("must not be reached")

    with pytest.raises(ValueError, match=message):
        PluginLlm("p", transport=Boom()).complete_structured(**kwargs)
    assert audit_lines(hermes_home) == []


def scripted(*texts):
    """A transport that answers with the given texts in order and records requests."""

    class Scripted:
        requests = []

        def supports_json_schema(self, route):
            return True

        def complete(self, request):
            self.requests.append(request)
            return TransportResponse(texts[len(self.requests) - 1], {"role": "assistant"}, "scripted-1",
                                     PluginLlmUsage(10, 5, 15, cost_usd=0.001), 1, 0.0)

        async def acomplete(self, request):
            return self.complete(request)

    return Scripted()


def test_schema_mismatch_then_repair_succeeds(hermes_home):
    transport = scripted('{"vendor": "ACME", "total": "lots"}', '```json\n{"vendor": "ACME", "total": 3}\n```')
    result = PluginLlm("p", transport=transport).complete_structured(instructions="x", input=["y"], json_schema=INVOICE_SCHEMA)
    assert result.parsed == {"vendor": "ACME", "total": 3}
    assert result.usage.total_tokens == 30 and result.usage.cost_usd == pytest.approx(0.002)
    repair_prompt = transport.requests[1].messages[-1]["content"]
    assert "$.total" in repair_prompt
    [line] = audit_lines(hermes_home)
    assert line["attempts"] == 2 and line["repairs"] == 1 and line["validation"] == "passed"


def test_schema_mismatch_after_repairs_raises_schema_error(hermes_home):
    transport = scripted('{"vendor": 1}', '{"vendor": 2}')
    with pytest.raises(PluginLlmSchemaError) as info:
        PluginLlm("p", transport=transport).complete_structured(instructions="x", input=["y"], json_schema=INVOICE_SCHEMA)
    assert isinstance(info.value, ValueError)
    assert info.value.text == '{"vendor": 2}'
    assert any(e.startswith("$.vendor") for e in info.value.errors) and any("total" in e for e in info.value.errors)
    assert info.value.usage.total_tokens == 30
    [line] = audit_lines(hermes_home)
    assert line["status"] == "schema_error" and line["validation"] == "failed"


def test_repair_attempts_is_an_operator_setting(hermes_home):
    write_config(hermes_home, "llm:\n  structured_repair_attempts: 0\n")
    transport = scripted('{"vendor": 1}')
    with pytest.raises(PluginLlmSchemaError):
        PluginLlm("p", transport=transport).complete_structured(instructions="x", input=["y"], json_schema=INVOICE_SCHEMA)
    assert len(transport.requests) == 1


def test_prose_reply_is_text_not_an_error(hermes_home):
    transport = scripted("I cannot do that.")
    result = PluginLlm("p", transport=transport).complete_structured(instructions="x", input=["y"], json_schema=INVOICE_SCHEMA)
    assert result.parsed is None and result.content_type == "text" and result.text == "I cannot do that."


def test_fenced_reply_with_prose_is_parsed(hermes_home):
    transport = scripted('Sure! Here it is:\n```json\n{"vendor": "A", "total": 2.5}\n```\nAnything else?')
    result = PluginLlm("p", transport=transport).complete_structured(instructions="x", input=["y"], json_schema=INVOICE_SCHEMA)
    assert result.parsed == {"vendor": "A", "total": 2.5}


def test_trust_denial_is_audited_and_raised_before_any_call(hermes_home):
    transport = scripted()
    with pytest.raises(PluginLlmTrustError) as info:
        PluginLlm("p", transport=transport).complete(USER, model="gpt-4o", purpose="sneaky")
    assert "plugins.entries.p.llm.allow_model_override" in str(info.value)
    assert transport.requests == []
    [line] = audit_lines(hermes_home)
    assert line["decision"] == "denied" and line["status"] == "denied" and line["purpose"] == "sneaky"
    assert "allow_model_override" in line["decision_reason"] and line["gen_ai.request.model"] == "gpt-4o"


def test_hot_reload_between_two_calls(hermes_home):
    llm = PluginLlm("p")
    with pytest.raises(PluginLlmTrustError):
        llm.complete(USER, model="local-echo-2")
    write_config(hermes_home, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: true\n")
    assert llm.complete(USER, model="local-echo-2").provider == "local"
    write_config(hermes_home, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: false\n")
    with pytest.raises(PluginLlmTrustError):
        llm.complete(USER, model="local-echo-2")


def test_invalid_yaml_after_good_fails_closed_but_calls_still_run(hermes_home):
    write_config(hermes_home, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: true\n")
    llm = PluginLlm("p")
    llm.complete(USER, model="local-echo-2")
    write_config(hermes_home, "plugins: [\n")
    with pytest.raises(PluginLlmTrustError):
        llm.complete(USER, model="local-echo-2")
    assert llm.complete(USER).provider == "local"
    denial = [r for r in audit_lines(hermes_home) if r["decision"] == "denied"][-1]
    assert "config.yaml" in denial["config_error"]


@pytest.mark.parametrize("forbidden", ["api_base", "base_url", "api_key"])
def test_plugins_can_never_set_endpoint_or_key(hermes_home, forbidden):
    with pytest.raises(PluginLlmTrustError, match="never choose an endpoint or a key"):
        PluginLlm("p").complete(USER, **{forbidden: "http://evil.example"})


def test_unknown_keyword_is_a_type_error(hermes_home):
    with pytest.raises(TypeError, match="tempreature"):
        PluginLlm("p").complete(USER, tempreature=0.1)


@pytest.mark.parametrize("messages", [[], "hi", [{"content": "x"}], [{"role": "robot", "content": "x"}], ["x"]])
def test_bad_messages_raise_value_error(hermes_home, messages):
    with pytest.raises(ValueError, match="messages"):
        PluginLlm("p").complete(messages)


def test_bad_timeout_raises_value_error(hermes_home):
    with pytest.raises(ValueError, match="timeout"):
        PluginLlm("p").complete(USER, timeout=-1)


def test_unconfigured_custom_route_is_a_config_error(hermes_home):
    write_config(hermes_home, "model:\n  provider: custom\n  model: m\n")
    with pytest.raises(PluginLlmConfigError, match="model.base_url"):
        PluginLlm("p").complete(USER)
    [line] = audit_lines(hermes_home)
    assert line["status"] == "error" and line["error.type"] == "PluginLlmConfigError"


def test_sync_and_async_parity(hermes_home):
    llm = PluginLlm("twins")
    sync = llm.complete(USER, purpose="parity")
    asynchronous = asyncio.run(llm.acomplete(USER, purpose="parity"))
    assert (sync.text, sync.provider, sync.model, sync.usage) == (asynchronous.text, asynchronous.provider, asynchronous.model, asynchronous.usage)
    s_struct = llm.complete_structured(instructions="x", input=["Vendor: A\nTotal: 1"], json_schema=INVOICE_SCHEMA)
    a_struct = asyncio.run(llm.acomplete_structured(instructions="x", input=["Vendor: A\nTotal: 1"], json_schema=INVOICE_SCHEMA))
    assert s_struct.parsed == a_struct.parsed
    lines = audit_lines(hermes_home)
    assert [line["mode"] for line in lines] == ["sync", "async", "sync", "async"]
    ignore = {"ts", "call_id", "mode", "latency_ms", "overhead_ms", "seq", "prev_hash", "hash"}
    strip = lambda r: {k: v for k, v in r.items() if k not in ignore}  # noqa: E731
    assert strip(lines[0]) == strip(lines[1]) and strip(lines[2]) == strip(lines[3])


def test_async_denial_matches_sync(hermes_home):
    llm = PluginLlm("p")
    with pytest.raises(PluginLlmTrustError):
        asyncio.run(llm.acomplete(USER, provider="openai"))
    [line] = audit_lines(hermes_home)
    assert line["mode"] == "async" and line["status"] == "denied" and "allow_provider_override" in line["decision_reason"]


def test_fifty_concurrent_acomplete_calls(hermes_home):
    llm = PluginLlm("fanout")

    async def main():
        return await asyncio.gather(*(llm.acomplete([{"role": "user", "content": f"question {i}"}]) for i in range(50)))

    results = asyncio.run(main())
    assert [f"question {i}" in r.text for i, r in enumerate(results)] == [True] * 50
    lines = audit_lines(hermes_home)
    assert len(lines) == 50 and {r.audit["call_id"] for r in results} == {line["call_id"] for line in lines}


def test_repr_exposes_identity_only(hermes_home):
    assert repr(PluginLlm("p")) == "PluginLlm(plugin_id='p')"


def test_import_does_not_load_litellm():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, plugin_llm; plugin_llm.PluginLlm; print('litellm' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
