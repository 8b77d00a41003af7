"""The same call in-process (``PluginLlm``) and out of process (``GatewayClient`` over ``plugin-llm serve``):
same result or same error class and message, and the same audit record.

Each scenario runs twice, once per way, as two plugins with identical settings
(``<name>-a`` in-process, ``<name>-b`` over HTTP), so one's limits never touch
the other's; outcomes and audit records are compared with the names swapped.
"""

from __future__ import annotations

import asyncio

import pytest

from plugin_llm import PluginLlm, PluginLlmError, PluginLlmTextInput, limits
from plugin_llm.client import GatewayClient
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply
from tests.service_server import ServiceServer

USER = [{"role": "user", "content": "hello"}]
#: fields of an audit record that differ between any two calls
VOLATILE = {"ts", "call_id", "seq", "prev_hash", "hash", "latency_ms", "overhead_ms", "mode", "limits.resets_at",
            "limits.reserved_tokens", "limits.reserved_usd",
            "gen_ai.response.id"}  # the fake upstream numbers its replies per request (both have one: below)

SCENARIOS = {
    "model override refused": ("", lambda llm: llm.complete(USER, model="gpt-4o")),
    "model override allowed": ("      llm:\n        allow_model_override: true\n",
                               lambda llm: llm.complete(USER, model="other-model")),
    "provider outside the allowlist": ("      llm:\n        allow_provider_override: true\n"
                                       "        allowed_providers: [openrouter]\n",
                                       lambda llm: llm.complete(USER, provider="anthropic")),
    "profile override refused": ("", lambda llm: llm.complete(USER, profile="work")),
    "agent_id override refused": ("", lambda llm: llm.complete(USER, agent_id="other-agent")),
    "an endpoint argument": ("", lambda llm: llm.complete(USER, api_base="http://127.0.0.1:1/v1")),
    "a key argument": ("", lambda llm: llm.complete(USER, api_key="sk-nope")),
    "bad messages": ("", lambda llm: llm.complete([{"role": "robot", "content": "x"}])),
    "unknown keyword": ("", lambda llm: llm.complete(USER, temprature=0.5)),
    "bad sampling value": ("", lambda llm: llm.complete(USER, top_p=3)),
    "requests per minute": ("      limits:\n        requests_per_minute: 1\n",
                            lambda llm: [llm.complete(USER), llm.complete(USER)]),
    "budget on an unpriced model": ("      limits:\n        budget_usd: {day: 1.0}\n", lambda llm: llm.complete(USER)),
    "structured": ("", lambda llm: llm.complete_structured(
        instructions="Extract the invoice", input=[PluginLlmTextInput("Vendor: ACME\nTotal: 12.50")],
        json_schema={"type": "object", "properties": {"vendor": {"type": "string"}}}, schema_name="invoice")),
    "structured bad input": ("", lambda llm: llm.complete_structured(instructions=" ", input=["y"])),
    "with purpose and sampling": ("", lambda llm: llm.complete(USER, purpose="summary", temperature=0.2, seed=7,
                                                               stop=["\n\n"], max_tokens=50)),
}


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


def outcome(call, llm):
    try:
        value = call(llm)
    except (PluginLlmError, ValueError, TypeError) as exc:
        return ("error", type(exc).__mro__[1].__name__ if type(exc).__name__ == "PluginLlmLimitError"
                else type(exc).__name__, str(exc), getattr(exc, "config_key", None))
    results = value if isinstance(value, list) else [value]
    return ("ok", [(r.text, r.provider, r.model, r.usage, getattr(r, "parsed", None)) for r in results])


def swap(value, a: str, b: str):
    return repr(value).replace(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_http_matches_in_process(hermes_home, name):
    settings, call = SCENARIOS[name]
    a, b = "plug-a", "plug-b"
    with FakeServer() as upstream:
        entries = "".join(f"    {key}:\n{settings}" for key in (a, b)) if settings else ""
        write_config(hermes_home, f"model:\n  provider: custom\n  model: m\n  base_url: {upstream.base_url}\n"
                                  "limits:\n  store: local\n" + (f"plugins:\n  entries:\n{entries}" if entries else ""))
        if name == "structured":  # the local model fills the schema from the facts in the input
            write_config(hermes_home, "limits:\n  store: local\n")
        in_process = outcome(call, PluginLlm(a))
        records_a = audit_lines(hermes_home)
        with ServiceServer(hermes_home) as service, GatewayClient(service.url, service.token(b)) as client:
            over_http = outcome(call, client)
        records_b = audit_lines(hermes_home)[len(records_a):]
    assert swap(over_http, b, a) == swap(in_process, b, a)
    assert len(records_a) == len(records_b) >= (0 if name in ("bad messages", "unknown keyword", "bad sampling value",
                                                               "structured bad input") else 1)
    for ra, rb in zip(records_a, records_b):
        assert rb["mode"] == "async" and ra["mode"] == "sync"
        assert ("gen_ai.response.id" in ra) == ("gen_ai.response.id" in rb)
        strip = lambda r: {k: v for k, v in r.items() if k not in VOLATILE}  # noqa: E731
        assert swap(strip(rb), b, a) == swap(strip(ra), b, a)


def test_async_client_matches_too(hermes_home):
    with ServiceServer(hermes_home) as service:
        client = GatewayClient(service.url, service.token("async-plugin"))

        async def run():
            try:
                ok = await client.acomplete(USER, purpose="p")
                structured = await client.acomplete_structured(instructions="Extract", input=["Vendor: ACME"],
                                                               json_schema={"type": "object"})
                try:
                    await client.acomplete(USER, model="gpt-4o")
                except PluginLlmError as exc:
                    return ok, structured, exc
            finally:
                await client.aclose()

        ok, structured, denied = asyncio.run(run())
    assert ok.audit["plugin_id"] == "async-plugin" and ok.audit["purpose"] == "p" and "hello" in ok.text
    assert structured.content_type == "json" and isinstance(structured.parsed, dict)
    assert type(denied).__name__ == "PluginLlmTrustError"
    assert denied.config_key == "plugins.entries.async-plugin.llm.allow_model_override"
    assert [line["status"] for line in audit_lines(hermes_home)] == ["ok", "ok", "denied"]


def test_client_errors_for_a_bad_token_and_an_unreachable_gateway(hermes_home):
    from plugin_llm import PluginLlmConfigError, PluginLlmProviderError

    with ServiceServer(hermes_home) as service:
        with pytest.raises(PluginLlmConfigError, match="refused this client's token"):
            GatewayClient(service.url, "plg_" + "z" * 43).complete(USER)
        url = service.url
    with pytest.raises(PluginLlmProviderError, match="cannot be reached") as caught:
        GatewayClient(url, "plg_" + "z" * 43).complete(USER)
    assert caught.value.retryable and caught.value.provider == "gateway"
    with pytest.raises(ValueError, match="plg_"):
        GatewayClient(url, "sk-123")
    assert "plg_" not in repr(GatewayClient(url, "plg_" + "q" * 43))


def test_image_bytes_travel_base64(hermes_home):
    from plugin_llm import PluginLlmImageInput

    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    with FakeServer() as upstream:
        write_config(hermes_home, f"model:\n  provider: custom\n  model: m\n  base_url: {upstream.base_url}\n")
        PluginLlm("img").complete_structured(instructions="Describe", input=[PluginLlmImageInput(data=png)])
        with ServiceServer(hermes_home) as service, GatewayClient(service.url, service.token("img")) as client:
            client.complete_structured(instructions="Describe", input=[PluginLlmImageInput(data=png)])
        first, second = [r.json["messages"] for r in upstream.requests]
    assert first == second
    assert [line["prompt_sha256"] for line in audit_lines(hermes_home)][0] == audit_lines(hermes_home)[1]["prompt_sha256"]
