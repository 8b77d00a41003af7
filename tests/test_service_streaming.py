"""Streaming through the service: real uvicorn, the openai SDK, httpx and GatewayClient against a real
streaming upstream (tests/stream_server.py) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from plugin_llm import PluginLlmProviderError, PluginLlmTrustError
from plugin_llm.client import GatewayClient
from tests.bounded import run_bounded
from tests.conftest import audit_lines, write_config
from tests.service_server import ServiceServer
from tests.stream_server import Stream, StreamServer, wait_for

USER = [{"role": "user", "content": "tell me"}]
CHAT = "/v1/chat/completions"


@pytest.fixture
def upstream(custom_route):
    with StreamServer() as fake:
        custom_route(fake.base_url)
        yield fake


@pytest.fixture
def service(upstream, hermes_home):
    with ServiceServer(hermes_home) as running:
        yield running


def sse(lines):
    """The JSON documents (and ``"[DONE]"``) of an SSE body, as its lines arrive."""
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else json.loads(data)


@pytest.mark.slow
def test_openai_sdk_streams_deltas_with_usage_in_the_last_chunk(service, upstream, hermes_home):
    upstream.default = Stream(pieces=["Quick", " brown", " fox"])
    client = openai.OpenAI(base_url=service.url + "/v1", api_key=service.token("sdk"), max_retries=0)
    chunks = list(client.chat.completions.create(model="default", messages=USER, stream=True,
                                                 stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == "Quick brown fox" and len(deltas) >= 2
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 9 and chunks[-1].usage.completion_tokens == 3
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish[0].choices[0].finish_reason == "stop"
    [line] = audit_lines(hermes_home)
    assert line["status"] == "ok" and line["stream"] is True and line["plugin_id"] == "sdk"
    assert chunks[0].id == f"chatcmpl-{line['call_id']}" and line["mode"] == "async"
    # without stream_options.include_usage there is no usage chunk (as OpenAI does)
    plain = list(client.chat.completions.create(model="default", messages=USER, stream=True))
    assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in plain) == "Quick brown fox"


@pytest.mark.slow
def test_httpx_sees_deltas_before_the_upstream_has_finished(service, upstream, hermes_home):
    upstream.default = Stream(pieces=["first", " second", " third"], stall_after=2)
    token = service.token("raw")

    def read_two_then_hang_up():
        seen = []
        with httpx.stream("POST", service.url + CHAT, headers=service.auth(token), timeout=20,
                          json={"messages": USER, "stream": True, "timeout": 30}) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            for doc in sse(response.iter_lines()):
                delta = doc["choices"][0]["delta"].get("content") if doc["choices"] else None
                if delta:
                    seen.append(delta)
                if len(seen) == 2:  # the upstream is stalled: these came as they arrived
                    return seen
        return seen

    seen = run_bounded(read_two_then_hang_up, 30)
    assert "first second".startswith("".join(seen)) and len("".join(seen)) > len("first")
    assert wait_for(lambda: len(audit_lines(hermes_home)) == 1)  # the disconnect abandons the stream
    [line] = audit_lines(hermes_home)
    assert line["status"] == "abandoned" and line["stream.delivered_chars"] >= len("".join(seen))
    metrics = httpx.get(service.url + "/metrics").text
    assert 'plugin_llm_service_calls_total{endpoint="chat",model="default",plugin="raw",status="abandoned"} 1.0' in metrics


@pytest.mark.slow
def test_a_failure_after_the_headers_is_an_error_event(service, upstream, hermes_home):
    upstream.default = Stream(pieces=["partial", " answer", " never"], cut_after=2)
    token = service.token("raw")
    with httpx.stream("POST", service.url + CHAT, headers=service.auth(token), timeout=20,
                      json={"messages": USER, "stream": True}) as response:
        docs = list(sse(response.iter_lines()))
    assert response.status_code == 200 and docs[-1] != "[DONE]"
    error = docs[-1]["error"]
    assert error["type"] in ("PluginLlmProviderError", "PluginLlmTimeoutError")
    delivered = "".join(d["choices"][0]["delta"].get("content") or "" for d in docs[:-1] if d["choices"])
    assert "partial answer".startswith(delivered) and len(delivered) >= len("partial")
    assert f"after {len(delivered)} characters had been delivered" in error["message"]
    client = openai.OpenAI(base_url=service.url + "/v1", api_key=token, max_retries=0)
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model="default", messages=USER, stream=True))
    lines = audit_lines(hermes_home)
    assert len(lines) == 2 and all(line["stream.partial"] for line in lines)


@pytest.mark.slow
def test_a_denial_before_the_stream_is_an_ordinary_error_answer(service, upstream, hermes_home):
    client = openai.OpenAI(base_url=service.url + "/v1", api_key=service.token("sdk"), max_retries=0)
    with pytest.raises(openai.PermissionDeniedError, match="allow_model_override"):
        client.chat.completions.create(model="gpt-4o-mini", messages=USER, stream=True)
    assert upstream.requests == []
    assert [line["status"] for line in audit_lines(hermes_home)] == ["denied"]


@pytest.mark.slow
def test_gateway_client_stream_is_plugin_llm_stream_over_http(service, upstream, hermes_home):
    upstream.default = Stream(pieces=["Lazy", " dog"])
    with GatewayClient(service.url, service.token("remote")) as client:
        stream = client.stream(USER, purpose="draft")
        assert "".join(stream) == "Lazy dog"
        result = stream.result
        with pytest.raises(PluginLlmTrustError, match="allow_model_override"):
            client.stream(USER, model="gpt-4o-mini")
        upstream.default = Stream(pieces=["a1", " b2", " c3"], stall_after=1)
        with client.stream(USER, timeout=30) as early:
            assert "a1".startswith(next(early))
    assert result.text == "Lazy dog" and result.provider == "custom" and result.usage.output_tokens == 3
    assert wait_for(lambda: len(audit_lines(hermes_home)) == 3)
    ok, denied, abandoned = audit_lines(hermes_home)
    assert ok["call_id"] == result.audit["call_id"] == stream.call_id and ok["purpose"] == "draft"
    assert result.usage.cost_usd == pytest.approx(ok["cost_usd"])
    assert denied["status"] == "denied" and abandoned["status"] == "abandoned"


@pytest.mark.slow
def test_gateway_client_astream_and_a_mid_stream_failure(service, upstream, hermes_home):
    upstream.default = Stream(pieces=["one", " two"])
    token = service.token("remote")

    async def run():
        async with GatewayClient(service.url, token) as client:
            stream = client.astream(USER)
            deltas = [d async for d in stream]
            upstream.default = Stream(pieces=["partial", " answer", " never"], cut_after=2)
            broken = await client.astream(USER, timeout=20)
            got = []
            with pytest.raises((PluginLlmProviderError, Exception)) as caught:
                async for delta in broken:
                    got.append(delta)
            return deltas, stream.result, got, caught.value

    deltas, result, got, error = run_bounded(lambda: asyncio.run(run()), 60)
    assert "".join(deltas) == "one two" == result.text
    assert "partial answer".startswith("".join(got)) and f"{len(''.join(got))} characters" in str(error)
    assert [line["status"] for line in audit_lines(hermes_home)][0] == "ok"


@pytest.mark.slow
def test_a_quota_refusal_of_a_stream_is_429_before_anything_is_sent(hermes_home):
    with StreamServer() as fake:
        write_config(hermes_home, (
            f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
            "limits:\n  store: local\n"
            "plugins:\n  entries:\n    capped:\n      limits:\n        requests_per_minute: 1\n"))
        with ServiceServer(hermes_home) as service:
            client = openai.OpenAI(base_url=service.url + "/v1", api_key=service.token("capped"), max_retries=0)
            assert "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="default", messages=USER, stream=True) if c.choices) == "Hello, world"
            with pytest.raises(openai.RateLimitError, match="requests_per_minute"):
                client.chat.completions.create(model="default", messages=USER, stream=True)
        assert len(fake.requests) == 1
    assert [line["status"] for line in audit_lines(hermes_home)] == ["ok", "quota"]
