"""Transport over real HTTP on 127.0.0.1: the local model server and a scriptable fault server."""

from __future__ import annotations

import asyncio
import traceback

import pytest

from plugin_llm import PluginLlm, PluginLlmProviderError, PluginLlmTimeoutError
from plugin_llm.local.server import LocalModelServer
from tests.conftest import audit_lines
from tests.paths import transport_path  # noqa: F401  (every test on both paths)
from tests.servers import FakeServer, Reply

USER = [{"role": "user", "content": "ping"}]
SCHEMA = {"type": "object", "properties": {"vendor": {"type": "string"}, "total": {"type": "number"}}, "required": ["vendor", "total"]}


@pytest.fixture
def fake():
    with FakeServer() as server:
        yield server


@pytest.fixture(scope="module")
def local_server():
    with LocalModelServer() as server:
        yield server


def test_local_server_through_litellm(hermes_home, custom_route, local_server):
    custom_route(local_server.base_url, model="local-echo-1")
    llm = PluginLlm("http-user")
    result = llm.complete([{"role": "user", "content": "over http"}])
    assert "over http" in result.text and result.provider == "custom" and result.model == "local-echo-1"
    assert result.usage.input_tokens > 0 and result.usage.cost_usd is None  # a custom model is unpriced
    structured = llm.complete_structured(instructions="Extract", input=["Vendor: ACME\nTotal: 12.50"], json_schema=SCHEMA)
    assert structured.parsed == {"vendor": "ACME", "total": 12.5}


def test_json_object_and_schema_in_prompt_when_route_lacks_json_schema(hermes_home, custom_route, fake):
    custom_route(fake.base_url, model="unknown-model")
    fake.push(Reply.json('{"vendor": "A", "total": 1}'))
    PluginLlm("p").complete_structured(instructions="x", input=["y"], json_schema=SCHEMA, schema_name="invoice")
    body = fake.requests[0].json
    assert body["response_format"] == {"type": "json_object"}
    system = body["messages"][0]["content"]
    assert "Schema name: invoice" in system and '"vendor"' in system


def test_native_json_schema_when_route_supports_it(hermes_home, custom_route, fake):
    custom_route(fake.base_url, extra="", model="m")
    from tests.conftest import write_config

    write_config(hermes_home, f"model:\n  provider: custom\n  model: m\n  base_url: {fake.base_url}\n  supports_json_schema: true\n")
    fake.push(Reply.json('{"vendor": "A", "total": 1}'))
    PluginLlm("p").complete_structured(instructions="x", input=["y"], json_schema=SCHEMA, schema_name="invoice")
    fmt = fake.requests[0].json["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == SCHEMA and fmt["json_schema"]["name"] == "invoice"


def test_provider_reported_model_is_attributed(hermes_home, custom_route, fake):
    custom_route(fake.base_url, model="gpt-4o")
    fake.push(Reply(model="gpt-4o-2024-08-06"))
    result = PluginLlm("p").complete(USER)
    assert result.model == "gpt-4o-2024-08-06"
    assert audit_lines(hermes_home)[0]["gen_ai.response.model"] == "gpt-4o-2024-08-06"
    assert audit_lines(hermes_home)[0]["gen_ai.request.model"] == "gpt-4o"


def test_cost_filled_for_priced_model(hermes_home, custom_route, fake):
    custom_route(fake.base_url, model="gpt-4o-mini")
    fake.push(Reply(model="gpt-4o-mini", usage={"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}))
    result = PluginLlm("p").complete(USER)
    # gpt-4o-mini in litellm's bundled price map: $0.15 / 1M input, $0.60 / 1M output
    assert result.usage.cost_usd == pytest.approx(1000 * 0.15e-6 + 500 * 0.60e-6)
    assert audit_lines(hermes_home)[0]["cost_usd"] == pytest.approx(result.usage.cost_usd)


@pytest.mark.slow
def test_retry_after_500_then_success(hermes_home, custom_route, fake):
    custom_route(fake.base_url)
    fake.push(Reply.error(500, "upstream broke"), Reply(content="second time lucky"))
    result = PluginLlm("p").complete(USER)
    assert result.text == "second time lucky" and len(fake.requests) == 2
    assert audit_lines(hermes_home)[0]["attempts"] == 2


def test_retry_honours_retry_after_on_429(hermes_home, custom_route, fake):
    custom_route(fake.base_url)
    fake.push(Reply.error(429, "slow down", headers={"Retry-After": "0"}), Reply(content="ok now"))
    assert PluginLlm("p").complete(USER).text == "ok now"
    assert len(fake.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_no_retry_on_client_errors(hermes_home, custom_route, fake, status):
    custom_route(fake.base_url)
    fake.push(Reply.error(status, "nope"))
    with pytest.raises(PluginLlmProviderError) as info:
        PluginLlm("p").complete(USER)
    assert info.value.status == status and not info.value.retryable and info.value.provider == "custom"
    assert len(fake.requests) == 1
    [line] = audit_lines(hermes_home)
    assert line["status"] == "provider_error" and line["attempts"] == 1 and line["error.type"] == "PluginLlmProviderError"


def test_retries_are_bounded_by_max_retries(hermes_home, custom_route, fake):
    custom_route(fake.base_url, max_retries=1)
    fake.push(*[Reply.error(503, "down")] * 5)
    with pytest.raises(PluginLlmProviderError) as info:
        PluginLlm("p").complete(USER)
    assert info.value.status == 503 and info.value.retryable
    assert len(fake.requests) == 2 and audit_lines(hermes_home)[0]["attempts"] == 2


@pytest.mark.slow
def test_timeout_against_hanging_server(hermes_home, custom_route, fake):
    custom_route(fake.base_url)
    fake.push(Reply.hanging(), Reply.hanging(), Reply.hanging())
    with pytest.raises(PluginLlmTimeoutError) as info:
        PluginLlm("p").complete(USER, timeout=0.5)
    assert isinstance(info.value, TimeoutError)
    assert audit_lines(hermes_home)[0]["status"] == "timeout"


@pytest.mark.slow
def test_async_timeout_against_hanging_server(hermes_home, custom_route, fake):
    custom_route(fake.base_url)
    fake.push(Reply.hanging(), Reply.hanging(), Reply.hanging())
    with pytest.raises(PluginLlmTimeoutError):
        asyncio.run(PluginLlm("p").acomplete(USER, timeout=0.5))
    assert audit_lines(hermes_home)[0]["status"] == "timeout" and audit_lines(hermes_home)[0]["mode"] == "async"


@pytest.mark.slow
def test_timeout_is_capped_by_max_timeout(hermes_home, custom_route, fake):
    custom_route(fake.base_url, max_timeout=0.5)
    fake.push(Reply.hanging(), Reply.hanging(), Reply.hanging())
    with pytest.raises(PluginLlmTimeoutError):
        PluginLlm("p").complete(USER, timeout=3600)


def test_malformed_body_is_a_provider_error(hermes_home, custom_route, fake):
    custom_route(fake.base_url, max_retries=0)
    fake.push(Reply.malformed())
    with pytest.raises(PluginLlmProviderError):
        PluginLlm("p").complete(USER)


@pytest.mark.slow
def test_connection_refused_is_retryable_provider_error(hermes_home, custom_route):
    with FakeServer() as server:
        url = server.base_url
    custom_route(url, max_retries=1)
    with pytest.raises(PluginLlmProviderError) as info:
        PluginLlm("p").complete(USER, timeout=5)
    assert info.value.retryable and info.value.status is None
    assert audit_lines(hermes_home)[0]["attempts"] == 2


def test_async_retry_parity(hermes_home, custom_route, fake):
    custom_route(fake.base_url)
    fake.push(Reply.error(500, "once"), Reply(content="fine"))
    result = asyncio.run(PluginLlm("p").acomplete(USER))
    assert result.text == "fine" and audit_lines(hermes_home)[0]["attempts"] == 2


def test_error_echoing_the_key_is_scrubbed(hermes_home, custom_route, fake, monkeypatch):
    canary = "sk-canary-TRANSPORT-0123456789abcdef"
    custom_route(fake.base_url)
    (hermes_home / "auth.json").write_text('{"providers": {"custom": {"api_key": "%s"}}}' % canary)
    (hermes_home / "auth.json").chmod(0o600)
    def echo(body, headers, path):
        auth = {k.lower(): v for k, v in headers.items()}.get("authorization")
        return 401, {"error": {"message": f"bad key {auth} at {path}"}}
    fake.push(Reply(body=echo))
    with pytest.raises(PluginLlmProviderError) as info:
        PluginLlm("p").complete(USER)
    assert {k.lower(): v for k, v in fake.requests[0].headers.items()}["authorization"] == f"Bearer {canary}"
    text = "".join(traceback.format_exception(info.value)) + repr(info.value)
    assert canary not in text and "bad key" in text
    assert canary not in (hermes_home / "logs" / "agent.log").read_text()


def test_custom_route_never_sends_the_openai_env_key(hermes_home, custom_route, fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-should-not-leave-0000000000")
    custom_route(fake.base_url)
    PluginLlm("p").complete(USER)
    assert "sk-env-should-not-leave" not in str(fake.requests[0].headers)
