"""The service over real HTTP: uvicorn on 127.0.0.1, httpx and the openai SDK as clients."""

from __future__ import annotations

import json
import logging
import os
import secrets

import httpx
import openai
import pytest

from plugin_llm import limits
from plugin_llm.service.app import EVENT_AUTH_DENIED
from plugin_llm.service.tokens import TokenStore
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply
from tests.service_server import ServiceServer

USER = [{"role": "user", "content": "hello"}]
COMPLETE = "/v1/plugin-llm/complete"
STRUCTURED = "/v1/plugin-llm/complete_structured"
CHAT = "/v1/chat/completions"


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


@pytest.fixture
def service(hermes_home):
    with ServiceServer(hermes_home) as running:
        yield running


def events(home, name):
    path = home / "logs" / "agent.log"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line.get("event") == name]


@pytest.mark.slow
def test_complete_over_http_is_the_plugins_call_with_its_audit_line(service, hermes_home):
    token = service.token("notes")
    response = httpx.post(service.url + COMPLETE, headers=service.auth(token),
                          json={"messages": USER, "purpose": "summary", "max_tokens": 64})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "local" and "hello" in body["text"]
    assert body["usage"]["total_tokens"] > 0 and body["tool_calls"] == []
    [line] = audit_lines(hermes_home)
    assert line["plugin_id"] == "notes" and line["purpose"] == "summary" and line["mode"] == "async"
    assert line["call_id"] == body["audit"]["call_id"] and line["status"] == "ok"


def test_structured_over_http_parses_and_validates(service, hermes_home):
    token = service.token("invoices")
    schema = {"type": "object", "properties": {"vendor": {"type": "string"}, "total": {"type": "number"}},
              "required": ["vendor", "total"]}
    response = httpx.post(service.url + STRUCTURED, headers=service.auth(token), json={
        "instructions": "Extract the invoice", "input": [{"type": "text", "text": "Vendor: ACME\nTotal: 12.50"}],
        "json_schema": schema, "schema_name": "invoice"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["parsed"] == {"vendor": "ACME", "total": 12.5} and body["content_type"] == "json"
    [line] = audit_lines(hermes_home)
    assert line["api"] == "structured" and line["validation"] == "passed" and line["plugin_id"] == "invoices"


@pytest.mark.parametrize("case", ["missing", "not bearer", "unknown", "malformed", "expired", "revoked"])
def test_every_bad_token_gets_the_same_401_and_an_audit_event_without_the_token(service, hermes_home, case):
    store = TokenStore(hermes_home)
    info, token = store.create("p", expires_in=None)
    headers = {}
    if case == "not bearer":
        headers = {"Authorization": f"Basic {token}"}
    elif case == "unknown":
        token = "plg_" + secrets.token_urlsafe(32)
        headers = service.auth(token)
    elif case == "malformed":
        token = "sk-" + secrets.token_hex(20)
        headers = service.auth(token)
    elif case == "expired":
        expired_info, token = TokenStore(hermes_home, clock=lambda: 0.0).create("p", expires_in=1)
        headers = service.auth(token)
    elif case == "revoked":
        store.revoke(info.id)
        headers = service.auth(token)
    response = httpx.post(service.url + COMPLETE, headers=headers, json={"messages": USER})
    assert response.status_code == 401
    assert response.json() == {"error": {
        "type": "PluginLlmAuthError", "param": None, "code": "invalid_token",
        "message": "the token is not valid: send 'Authorization: Bearer plg_...' with a token the operator "
                   "created with 'plugin-llm tokens create PLUGIN'"}}
    assert response.headers["www-authenticate"].startswith("Bearer")
    [event] = events(hermes_home, EVENT_AUTH_DENIED)
    expected = {"missing": "missing", "not bearer": "missing", "unknown": "unknown", "malformed": "unknown",
                "expired": "expired", "revoked": "revoked"}[case]
    assert event["reason"] == expected and event["path"] == COMPLETE
    if case == "revoked":
        assert event["token_id"] == info.id and event["plugin_id"] == "p"
    log = (hermes_home / "logs" / "agent.log").read_text()
    assert token not in log and token[4:] not in log
    assert audit_lines(hermes_home) == []  # nothing reached the pipeline


@pytest.mark.parametrize("body, kind, param, fragment", [
    (b"{not json", "ValueError", None, "not valid JSON"),
    (b"[1, 2]", "ValueError", None, "must be a JSON object, got a JSON array"),
    (b"", "ValueError", None, "has no body"),
    (b'{"messages": [], "x": NaN}', "ValueError", None, "NaN"),
    (b'[' * 100 + b']' * 100, "ValueError", None, "nested deeper"),
    (b"\xff\xfe", "ValueError", None, "not UTF-8"),
    (b'{"mesages": []}', "TypeError", "mesages", "did you mean 'messages'"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temprature": 1}', "TypeError", "temprature",
     "did you mean 'temperature'"),
    (b'{"purpose": "x"}', "ValueError", "messages", "messages is required"),
    (b'{"messages": "hi"}', "ValueError", "messages", "messages must be a non-empty list"),
    (b'{"messages": [{"role": "robot", "content": "x"}]}', "ValueError", "messages", "messages[0]['role']"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "ValueError", "temperature",
     "temperature must be a number"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 5}', "ValueError", "temperature",
     "temperature must be a number from 0 to 2"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}', "ValueError", "max_tokens",
     "whole number"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_p": 7}', "ValueError", "top_p", "top_p must be"),
    (b'{"messages": [{"role": "user", "content": "x"}], "timeout": "soon"}', "ValueError", "timeout",
     "timeout must be a positive number"),
])
def test_bad_requests_get_400_naming_the_field(service, body, kind, param, fragment):
    token = service.token("p")
    response = httpx.post(service.url + COMPLETE, headers={**service.auth(token), "Content-Type": "application/json"},
                          content=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"]
    assert error["type"] == kind and error["code"] == "invalid_request"


@pytest.mark.slow
def test_structured_bad_requests(service):
    token = service.token("p")
    cases = [({"instructions": "x", "input": ["y"], "n": 1}, "TypeError", "n", "complete()/acomplete() only"),
             ({"instructions": "x", "input": ["y"], "json_mode": "yes"}, "ValueError", "json_mode", "true or false"),
             ({"instructions": "x"}, "ValueError", "input", "input is required"),
             ({"instructions": "x", "input": [{"type": "image", "data": "%%%"}]}, "ValueError", "input", "base64"),
             ({"instructions": "x", "input": 5}, "ValueError", "input", "input must be a string or a list")]
    for payload, kind, param, fragment in cases:
        error = httpx.post(service.url + STRUCTURED, headers=service.auth(token), json=payload).json()["error"]
        assert (error["type"], error["param"]) == (kind, param) and fragment in error["message"], error


def test_an_oversized_body_is_413_before_it_is_read_whole(hermes_home):
    with ServiceServer(hermes_home, max_body=1024) as service:
        token = service.token("p")
        big = {"messages": [{"role": "user", "content": "x" * 5000}]}
        response = httpx.post(service.url + COMPLETE, headers=service.auth(token), json=big)
        assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"

        def chunks():  # no Content-Length: the cap holds on the stream too
            for _ in range(10):
                yield b"x" * 512

        response = httpx.post(service.url + COMPLETE, headers=service.auth(token), content=chunks())
        assert response.status_code == 413


@pytest.mark.slow
def test_errors_map_to_their_status_with_the_in_process_message(hermes_home, custom_route):
    with FakeServer([Reply.error(400, "no such model"), Reply.hanging()]) as upstream:
        custom_route(upstream.base_url, extra="limits:\n  store: local\nplugins:\n  entries:\n    capped:\n"
                                              "      limits:\n        requests_per_minute: 1\n")
        with ServiceServer(hermes_home) as service:
            token = service.token("p")
            provider = httpx.post(service.url + COMPLETE, headers=service.auth(token), json={"messages": USER})
            timeout = httpx.post(service.url + COMPLETE, headers=service.auth(token),
                                 json={"messages": USER, "timeout": 0.5})
            denied = httpx.post(service.url + COMPLETE, headers=service.auth(token),
                                json={"messages": USER, "model": "gpt-4o-mini"})
            forbidden = httpx.post(service.url + COMPLETE, headers=service.auth(token),
                                   json={"messages": USER, "api_base": "http://evil.example"})
            capped = service.token("capped")
            upstream.default = Reply()
            httpx.post(service.url + COMPLETE, headers=service.auth(capped), json={"messages": USER})
            quota = httpx.post(service.url + COMPLETE, headers=service.auth(capped), json={"messages": USER})
    assert provider.status_code == 502 and provider.json()["error"]["type"] == "PluginLlmProviderError"
    assert provider.json()["error"]["status"] == 400 and "no such model" in provider.json()["error"]["message"]
    assert timeout.status_code == 504 and timeout.json()["error"]["type"] == "PluginLlmTimeoutError"
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "PluginLlmTrustError"
    assert denied.json()["error"]["config_key"] == "plugins.entries.p.llm.allow_model_override"
    assert forbidden.status_code == 403 and "endpoint or a key" in forbidden.json()["error"]["message"]
    assert quota.status_code == 429 and quota.json()["error"]["type"] == "PluginLlmQuotaError"
    assert quota.json()["error"]["limit"] == "requests_per_minute"
    assert 1 <= int(quota.headers["retry-after"]) <= 60
    statuses = [line["status"] for line in audit_lines(hermes_home)]
    assert statuses == ["provider_error", "timeout", "denied", "denied", "ok", "quota"]


@pytest.mark.slow
def test_a_max_concurrent_refusal_says_retry_after_one_second_not_at_the_latest_slot(hermes_home, custom_route):
    """A slot frees when any call in flight ends: Retry-After 1, with the latest time in the body."""
    import threading

    with FakeServer(default=Reply(delay=1.0)) as upstream:
        custom_route(upstream.base_url, extra="plugins:\n  entries:\n    capped:\n      limits:\n"
                                              "        max_concurrent: 1\n")
        with ServiceServer(hermes_home) as service:
            auth = service.auth(service.token("capped"))
            slow = threading.Thread(target=httpx.post, args=(service.url + COMPLETE,),
                                    kwargs={"headers": auth, "json": {"messages": USER}, "timeout": 30})
            slow.start()
            for _ in range(200):  # until the slow call is in flight (the upstream has it)
                if upstream.requests:
                    break
                threading.Event().wait(0.02)
            refused = httpx.post(service.url + COMPLETE, headers=auth, json={"messages": USER})
            slow.join(30)
    assert refused.status_code == 429 and refused.json()["error"]["limit"] == "max_concurrent"
    assert refused.headers["retry-after"] == "1" and refused.json()["error"]["resets_at"] is not None


def test_a_schema_error_is_422_with_the_errors_and_the_text(hermes_home, custom_route):
    with FakeServer(default=Reply.json('{"vendor": 1}')) as upstream:
        custom_route(upstream.base_url)
        with ServiceServer(hermes_home) as service:
            token = service.token("p")
            response = httpx.post(service.url + STRUCTURED, headers=service.auth(token), json={
                "instructions": "x", "input": ["y"],
                "json_schema": {"type": "object", "properties": {"vendor": {"type": "string"}}}})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["type"] == "PluginLlmSchemaError" and error["text"] == '{"vendor": 1}'
    assert any(e.startswith("$.vendor") for e in error["errors"]) and error["usage"]["total_tokens"] == 20


@pytest.mark.slow
def test_openai_sdk_against_chat_completions(service, hermes_home):
    token = service.token("sdk-plugin")
    client = openai.OpenAI(base_url=service.url + "/v1", api_key=token, max_retries=0)
    reply = client.chat.completions.create(model="default", messages=USER)
    assert "hello" in reply.choices[0].message.content and reply.choices[0].finish_reason == "stop"
    assert reply.usage.total_tokens > 0 and reply.model == "local-echo-1"
    stream = client.chat.completions.create(messages=USER, model="default", stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == reply.usage.total_tokens
    with pytest.raises(openai.PermissionDeniedError) as denied:
        client.chat.completions.create(model="gpt-4o", messages=USER)
    assert "allow_model_override" in str(denied.value)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.chat.completions.create(model="default", messages=USER, logprobs=True)
    bad = openai.OpenAI(base_url=service.url + "/v1", api_key="plg_" + "x" * 43, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="default", messages=USER)
    lines = audit_lines(hermes_home)
    assert [(line["plugin_id"], line["status"]) for line in lines] == [
        ("sdk-plugin", "ok"), ("sdk-plugin", "ok"), ("sdk-plugin", "denied")]


@pytest.mark.slow
def test_async_openai_sdk_with_a_trusted_model_override(hermes_home, custom_route):
    import asyncio

    with FakeServer() as upstream:
        custom_route(upstream.base_url, extra="plugins:\n  entries:\n    trusted:\n      llm:\n"
                                              "        allow_model_override: true\n")
        with ServiceServer(hermes_home) as service:
            token = service.token("trusted")

            async def run():
                client = openai.AsyncOpenAI(base_url=service.url + "/v1", api_key=token, max_retries=0)
                replies = await asyncio.gather(*[client.chat.completions.create(model="other-model", messages=USER)
                                                 for _ in range(8)])
                await client.close()
                return replies

            replies = asyncio.run(run())
        assert {r.choices[0].message.content for r in replies} == {"ok"}
        assert {r.json.get("model") for r in upstream.requests if r.json} == {"other-model"}
    assert [line["gen_ai.request.model"] for line in audit_lines(hermes_home)] == ["other-model"] * 8


def test_a_provider_qualified_model_on_the_routes_provider_is_the_allowlisted_model(hermes_home, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-" + "0" * 20)
    with FakeServer() as upstream:
        write_config(hermes_home, f"model:\n  provider: openai\n  model: gpt-4o-mini\n  base_url: {upstream.base_url}\n"
                                  "plugins:\n  entries:\n    lite:\n      llm:\n        allow_model_override: true\n"
                                  "        allowed_models: [gpt-4o]\n")
        with ServiceServer(hermes_home) as service:
            headers = service.auth(service.token("lite"))
            ok = httpx.post(service.url + CHAT, headers=headers, json={"model": "openai/gpt-4o", "messages": USER})
            other = httpx.post(service.url + CHAT, headers=headers, json={"model": "anthropic/gpt-4o", "messages": USER})
        assert ok.status_code == 200, ok.text
        assert [r.json["model"] for r in upstream.requests if r.json] == ["gpt-4o"]
    assert other.status_code == 403 and "allowed_models" in other.text
    assert [line["status"] for line in audit_lines(hermes_home)] == ["ok", "denied"]


@pytest.mark.slow
def test_healthz_and_metrics(service):
    token = service.token("metered")
    assert httpx.get(service.url + "/healthz").json()["status"] == "ok"
    httpx.post(service.url + COMPLETE, headers=service.auth(token), json={"messages": USER})
    httpx.post(service.url + COMPLETE, headers=service.auth(token), json={"messages": USER, "model": "x"})
    httpx.post(service.url + COMPLETE, headers=service.auth("plg_" + "y" * 43), json={"messages": USER})
    text = httpx.get(service.url + "/metrics").text
    assert 'plugin_llm_service_calls_total{endpoint="complete",model="default",plugin="metered",status="ok"} 1.0' in text
    assert ('plugin_llm_service_calls_total{endpoint="complete",model="other",plugin="metered",status="denied"} 1.0'
            in text)
    assert 'plugin_llm_service_denials_total{plugin="",reason="unknown"} 1.0' in text
    assert 'plugin_llm_service_tokens_total{direction="output",model="default",plugin="metered"}' in text
    assert 'plugin_llm_service_latency_seconds_count{model="default",plugin="metered",status="ok"} 1.0' in text
    assert "plugin_llm_service_cost_usd" in text


def test_unknown_paths_and_methods(service):
    assert httpx.get(service.url + "/v1/nope").status_code == 404
    response = httpx.get(service.url + COMPLETE)
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.slow
def test_no_token_or_key_in_responses_logs_or_audit(hermes_home, custom_route, caplog):
    secret = f"cnry{secrets.token_hex(16)}"
    auth = hermes_home / "auth.json"
    auth.write_text(json.dumps({"providers": {"custom": {"api_key": secret}}}))
    os.chmod(auth, 0o600)

    def echo(_json, headers, path):  # a provider that echoes the key back in its error
        key = next(v for k, v in headers.items() if k.lower() == "authorization")
        return 401, {"error": {"message": f"Incorrect API key provided: {key}", "type": "invalid_request_error"}}

    caplog.set_level(logging.DEBUG)
    with FakeServer([Reply()], default=Reply(body=echo)) as upstream:
        custom_route(upstream.base_url)
        with ServiceServer(hermes_home) as service:
            token = service.token("p")
            bodies = [httpx.post(service.url + path, headers=service.auth(token), json=payload).text
                      for path, payload in [(COMPLETE, {"messages": USER}), (COMPLETE, {"messages": USER}),
                                            (CHAT, {"messages": USER}), (COMPLETE, {"messages": USER, "model": "m"}),
                                            (COMPLETE, {"messages": USER, "api_key": token})]]
            bodies.append(httpx.post(service.url + COMPLETE, headers=service.auth(token[:-2] + "AA"),
                                     json={"messages": USER}).text)
            bodies.append(httpx.get(service.url + "/metrics").text)
        assert any(secret in r.headers.get("Authorization", "") for r in upstream.requests)  # the key was used
    assert json.loads(bodies[0])["text"] == "ok" and json.loads(bodies[1])["error"]["type"] == "PluginLlmProviderError"
    log = (hermes_home / "logs" / "agent.log").read_text()
    for text in bodies + [log, caplog.text]:
        assert secret not in text and token not in text and token[4:] not in text


from tests.redis_server import own_redis_server  # noqa: E402,F401


@pytest.mark.slow
def test_with_limits_in_redis_tokens_are_shared_across_machines_and_a_down_store_fails_closed(
        tmp_path, own_redis_server, monkeypatch):
    """Two replicas with separate homes (two machines) and one Redis: a token created on one works on the
    other, a revocation on one is refused by the other within a second, and no Redis means 503, not a call."""
    import time

    from plugin_llm.cli.main import main

    homes = [tmp_path / "machine-a", tmp_path / "machine-b"]
    for home in homes:
        home.mkdir()
        write_config(home, f"limits:\n  store: redis\n  redis_url: {own_redis_server.url}\n  store_timeout: 2\n")
    monkeypatch.setenv("HERMES_HOME", str(homes[0]))
    with ServiceServer(homes[1]) as replica:
        import io
        from contextlib import redirect_stdout

        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["tokens", "create", "roaming", "--force", "--json"]) == 0  # on machine A
        created = json.loads(out.getvalue())
        token = created["token"]
        assert not (homes[0] / "service" / "tokens.db").exists()  # in Redis, not in a file
        import shutil

        from plugin_llm.service.tokens import token_key_path

        token_key_path(homes[1]).parent.mkdir(parents=True, exist_ok=True)  # every machine has the same token key
        shutil.copy2(token_key_path(homes[0]), token_key_path(homes[1]))
        call = lambda: httpx.post(replica.url + COMPLETE, headers=replica.auth(token),  # noqa: E731
                                  json={"messages": USER})
        assert call().status_code == 200
        with redirect_stdout(io.StringIO()):
            assert main(["tokens", "revoke", created["id"]]) == 0
        time.sleep(1.0)
        assert call().status_code == 401
        import threading

        own_redis_server.pause()  # paused: it accepts but never answers; the token check waits store_timeout
        other = "plg_" + secrets.token_urlsafe(32)
        answers: list = []
        caller = threading.Thread(target=lambda: answers.append(httpx.post(
            replica.url + COMPLETE, headers=replica.auth(other), json={"messages": USER}, timeout=30)))
        caller.start()
        time.sleep(0.2)
        health = httpx.get(replica.url + "/healthz", timeout=1.5)  # the event loop is not blocked meanwhile
        caller.join(timeout=30)
        own_redis_server.resume()
        down = answers[0]
    assert health.status_code == 200
    assert down.status_code == 503 and down.json()["error"]["code"] == "token_store_unavailable"
    assert [line["plugin_id"] for line in audit_lines(homes[1])] == ["roaming"]
    reasons = [e["reason"] for e in events(homes[1], EVENT_AUTH_DENIED)]
    assert reasons == ["revoked"]  # the address's first refusal; the next one is in its summary, with the detail
    [summary] = events(homes[1], EVENT_AUTH_DENIED + ".summary")
    assert summary["reasons"] == {"store_error": 1} and "redis" in summary["details"][0]
    for home in homes:
        assert token not in (home / "logs" / "agent.log").read_text()


@pytest.mark.slow
def test_models_list_is_exactly_what_the_tokens_plugin_may_name(hermes_home):
    write_config(hermes_home, "plugins:\n  entries:\n    lite:\n      llm:\n        allow_model_override: true\n"
                              "        allowed_models: [gpt-4o, anthropic/claude-3, '*']\n"
                              "    listless:\n      llm:\n        allow_model_override: true\n"
                              "    listed:\n      llm:\n        allowed_models: [gpt-4o]\n")
    with ServiceServer(hermes_home) as service:
        def client(plugin):
            return openai.OpenAI(base_url=service.url + "/v1", api_key=service.token(plugin), max_retries=0)

        lite = client("lite")
        models = lite.models.list()
        assert [m.id for m in models.data] == ["default", "local-echo-1", "gpt-4o", "anthropic/claude-3"]
        assert {m.object for m in models.data} == {"model"} and all(isinstance(m.created, int) for m in models.data)
        assert models.data[0].owned_by == "local" and models.data[3].owned_by == "anthropic"
        assert lite.models.retrieve("anthropic/claude-3").id == "anthropic/claude-3"
        # no allowlist: only what is certain; no override flag: the allowlist grants nothing
        assert [m.id for m in client("listless").models.list().data] == ["default", "local-echo-1"]
        plain = client("listed")
        assert [m.id for m in plain.models.list().data] == ["default"]
        with pytest.raises(openai.NotFoundError) as missing:
            plain.models.retrieve("gpt-4o")
        assert missing.value.body["code"] == "model_not_found"
        with pytest.raises(openai.PermissionDeniedError):  # what the list left out, the gate refuses
            plain.chat.completions.create(model="gpt-4o", messages=USER)
        bad = openai.OpenAI(base_url=service.url + "/v1", api_key="plg_" + "x" * 43, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        assert httpx.get(service.url + "/v1/models/default").status_code == 401


@pytest.mark.slow
def test_health_and_readiness(service, monkeypatch):
    health = httpx.get(service.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json().keys() == httpx.get(service.url + "/healthz").json().keys()
    ready = httpx.get(service.url + "/health/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    from plugin_llm.transport import _loading

    monkeypatch.setattr(_loading, "loaded_litellm", lambda: None)
    starting = httpx.get(service.url + "/health/ready")
    assert starting.status_code == 503 and starting.json()["ready"] is False


@pytest.mark.slow
def test_limits_endpoint_shows_the_tokens_own_plugin_only(hermes_home):
    write_config(hermes_home, "plugins:\n  entries:\n    capped:\n      limits: {requests_per_minute: 5}\n"
                              "    other:\n      limits: {requests_per_minute: 9}\n")
    with ServiceServer(hermes_home) as service:
        capped = service.auth(service.token("capped"))
        assert httpx.post(service.url + COMPLETE, headers=capped, json={"messages": USER}).status_code == 200
        mine = httpx.get(service.url + "/v1/plugin-llm/limits", headers=capped)
        theirs = httpx.get(service.url + "/v1/plugin-llm/limits", headers=service.auth(service.token("other")))
        anonymous = httpx.get(service.url + "/v1/plugin-llm/limits")
    assert mine.status_code == 200, mine.text
    body = mine.json()
    assert body["plugin_id"] == "capped" and body["limits"]["requests_per_minute"] == 5
    [window] = [w for w in body["usage"]["limits"] if w["limit"] == "requests_per_minute"]
    assert window["used"] == 1 and window["cap"] == 5 and window["resets_at"].endswith("Z")
    assert isinstance(window["resets_at_unix"], (int, float))
    other = theirs.json()
    assert other["plugin_id"] == "other" and other["limits"]["requests_per_minute"] == 9
    assert [w["used"] for w in other["usage"]["limits"] if w["limit"] == "requests_per_minute"] == [0]
    assert anonymous.status_code == 401


@pytest.mark.slow
def test_metrics_label_calls_by_route_and_never_by_a_clients_made_up_model(hermes_home):
    write_config(hermes_home, "plugins:\n  entries:\n    lite:\n      llm:\n        allow_model_override: true\n"
                              "        allowed_models: [local-echo-1, Local-Echo-2]\n")
    with ServiceServer(hermes_home) as service:
        client = openai.OpenAI(base_url=service.url + "/v1", api_key=service.token("lite"), max_retries=0)
        client.chat.completions.create(model="default", messages=USER)
        client.chat.completions.create(model="local-echo-1", messages=USER)
        list(client.chat.completions.create(model="LOCAL-ECHO-1", messages=USER, stream=True))
        for i in range(3):  # refused by the gate, counted under one label
            with pytest.raises(openai.PermissionDeniedError):
                client.chat.completions.create(model=f"made-up-{i}-" + "x" * 40, messages=USER)
        text = httpx.get(service.url + "/metrics").text
    assert 'plugin_llm_service_calls_total{endpoint="chat",model="default",plugin="lite",status="ok"} 1.0' in text
    assert 'plugin_llm_service_calls_total{endpoint="chat",model="local-echo-1",plugin="lite",status="ok"} 2.0' in text
    assert 'plugin_llm_service_calls_total{endpoint="chat",model="other",plugin="lite",status="denied"} 3.0' in text
    assert 'plugin_llm_service_latency_seconds_count{model="local-echo-1",plugin="lite",status="ok"} 2.0' in text
    assert 'plugin_llm_service_tokens_total{direction="input",model="local-echo-1",plugin="lite"}' in text
    assert "made-up" not in text
