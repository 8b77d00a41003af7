"""The service when a store is down, a body is not valid Unicode, or a client hangs up (review F1, F2, F3, F6).

Real parts, as in test_service_http: uvicorn on 127.0.0.1 (tests.service_server), httpx, the openai SDK,
GatewayClient, a scripted upstream, a real SQLite store file locked by another connection, a real
redis-server (tests.redis_server) that is killed.
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import sqlite3
import time

import httpx
import openai
import pytest

from plugin_llm import PluginLlm, PluginLlmQuotaError, limits
from plugin_llm.client import GatewayClient
from plugin_llm.service.app import EVENT_AUTH_DENIED
from tests.conftest import audit_lines, write_config
from tests.redis_server import own_redis_server  # noqa: F401
from tests.servers import FakeServer
from tests.service_server import ServiceServer

USER = [{"role": "user", "content": "hello"}]
COMPLETE = "/v1/plugin-llm/complete"
CHAT = "/v1/chat/completions"


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


def _events(home, name):
    path = home / "logs" / "agent.log"
    lines = [json.loads(line) for line in path.read_text().split("\n") if line.strip()] if path.exists() else []
    return [line for line in lines if line.get("event") == name]


def _metric_lines(url: str) -> list[str]:
    return [line for line in httpx.get(url + "/metrics").text.splitlines()
            if line.startswith("plugin_llm_service_calls_total{")]


# --------------------------------------------------------------------------- F1: the limits store is down


@pytest.mark.slow
def test_a_limits_store_outage_is_a_503_with_retry_after_that_names_no_path(hermes_home, custom_route, caplog):
    """A refusal whose deciding limit is the store (limits.on_store_error: deny) is the gateway's outage, not the
    plugin's quota: 503 + Retry-After, a fixed message without the store's file; the log and the audit record
    keep the store's own error. In process it stays PluginLlmQuotaError(limit='store') with the full text."""
    caplog.set_level(logging.WARNING)
    with FakeServer() as upstream:
        custom_route(upstream.base_url, extra="limits:\n  store: local\n  store_timeout: 0.3\nplugins:\n  entries:\n"
                                              "    lk:\n      limits:\n        requests_per_minute: 100\n")
        locker = sqlite3.connect(str(hermes_home / "limits.sqlite3"), isolation_level=None, timeout=0)
        locker.execute("BEGIN EXCLUSIVE")  # another process holds the store: every admission fails
        try:
            with ServiceServer(hermes_home) as service:
                token = service.token("lk")
                native = httpx.post(service.url + COMPLETE, headers=service.auth(token), json={"messages": USER},
                                    timeout=30)
                streamed = httpx.post(service.url + CHAT, headers=service.auth(token), timeout=30,
                                      json={"messages": USER, "stream": True})
                sdk = openai.OpenAI(base_url=service.url + "/v1", api_key=token, max_retries=0)
                with pytest.raises(openai.InternalServerError) as sdk_error:
                    sdk.chat.completions.create(model="default", messages=USER)
                with pytest.raises(PluginLlmQuotaError) as client_error:
                    GatewayClient(service.url, token).complete(USER)
                metrics = _metric_lines(service.url)
            with pytest.raises(PluginLlmQuotaError) as in_process:
                PluginLlm("lk").complete(USER)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert upstream.requests == []  # nothing was sent to the provider
    for response in (native, streamed, sdk_error.value.response):
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        error = response.json()["error"]
        assert error["type"] == "PluginLlmQuotaError" and error["code"] == "limits_store_unavailable"
        assert error["limit"] == "store" and error["config_key"] == "limits.on_store_error"
        assert "limits store is unavailable" in error["message"] and "retry later" in error["message"]
        for internal in (str(hermes_home), "limits.sqlite3", "locked", "/tmp"):
            assert internal not in response.text
    assert client_error.value.limit == "store"  # GatewayClient raises what the library raises
    # the library's own message is unchanged: the operator's text, the store named
    assert in_process.value.limit == "store" and "limits.sqlite3" in str(in_process.value)
    records = audit_lines(hermes_home)
    assert [r["status"] for r in records] == ["quota"] * 5 and all(r["limits.limit"] == "store" for r in records)
    assert "limits.sqlite3" in records[0]["error.message"]  # the audit record keeps the detail
    assert "limits.sqlite3" in caplog.text  # and so does the service's log
    assert any('endpoint="complete",model="default",plugin="lk",status="store_error"' in line for line in metrics)
    assert not any('status="quota"' in line or 'status="error"' in line for line in metrics)


# --------------------------------------------------------------------------- F6: the token store is down


@pytest.mark.slow
def test_a_token_store_outage_shows_no_redis_address_to_any_caller(tmp_path, own_redis_server, caplog):  # noqa: F811
    home = tmp_path / "replica"
    home.mkdir()
    write_config(home, f"limits:\n  store: redis\n  redis_url: {own_redis_server.url}\n  store_timeout: 1\n")
    caplog.set_level(logging.WARNING)
    with ServiceServer(home) as service:
        own_redis_server.kill()  # Redis goes away: no token can be checked
        made_up = "plg_" + secrets.token_urlsafe(32)
        down = httpx.post(service.url + COMPLETE, headers=service.auth(made_up), json={"messages": USER}, timeout=30)
    assert down.status_code == 503 and down.headers["retry-after"] == "1"
    error = down.json()["error"]
    assert error["code"] == "token_store_unavailable"
    assert "authentication store is unavailable" in error["message"] and "retry later" in error["message"]
    port = str(own_redis_server.port)
    for internal in (port, "127.0.0.1", "redis", "Redis", "ConnectionError", str(home)):
        assert internal not in down.text
    [event] = _events(home, EVENT_AUTH_DENIED)
    assert event["reason"] == "store_error" and port in event["detail"]  # the operator's audit keeps it
    assert port in caplog.text and made_up not in caplog.text  # and the log, never the token


# --------------------------------------------------------------------------- F2: a lone surrogate in the body


@pytest.mark.parametrize("path, body", [
    (CHAT, b'{"messages":[{"role":"user","content":"\\ud800 hi"}]}'),
    (COMPLETE, b'{"messages":[{"role":"user","content":[{"type":"text","text":"ok \\udfff"}]}]}'),
    (COMPLETE, b'{"messages":[{"role":"user","content":"hi","name":"a\\ud83d"}]}'),
])
@pytest.mark.slow
def test_a_lone_surrogate_is_a_400_naming_where_before_anything_is_sent(hermes_home, path, body):
    with ServiceServer(hermes_home) as service:  # the local route: litellm would fail to encode it
        token = service.token("h")
        response = httpx.post(service.url + path, headers={**service.auth(token), "Content-Type": "application/json"},
                              content=body, timeout=60)
        pair = httpx.post(service.url + path, headers={**service.auth(token), "Content-Type": "application/json"},
                          content=b'{"messages":[{"role":"user","content":"a pair \\ud83d\\ude00 is fine"}]}')
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == "messages"
    assert error["message"].startswith("messages[0]['") and "lone surrogate" in error["message"]
    assert "Traceback" not in response.text and "site-packages" not in response.text
    response.content.decode("utf-8")  # the answer itself is valid UTF-8
    assert pair.status_code == 200, pair.text
    assert [r["status"] for r in audit_lines(hermes_home)] == ["ok"]  # the refused call made no attempt


# --------------------------------------------------------------------------- F3: a hang-up during the body


@pytest.mark.slow
@pytest.mark.parametrize("path, endpoint", [(COMPLETE, "complete"), (CHAT, "chat")])
def test_a_client_that_hangs_up_while_sending_the_body_is_no_error(hermes_home, custom_route, caplog, path, endpoint):
    caplog.set_level(logging.DEBUG)
    with FakeServer() as upstream:
        custom_route(upstream.base_url)
        with ServiceServer(hermes_home) as service:
            token = service.token("d")
            body = json.dumps({"messages": USER}).encode()
            with socket.create_connection(("127.0.0.1", service.port)) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                             f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                             + body[:10])
            deadline = time.monotonic() + 20  # until the service has seen the hang-up (not a timing assertion)
            while time.monotonic() < deadline:
                metrics = _metric_lines(service.url)
                if metrics:
                    break
                time.sleep(0.05)
        assert upstream.requests == []
    assert metrics == [f'plugin_llm_service_calls_total{{endpoint="{endpoint}",model="default",plugin="d",'
                       'status="client_closed"} 1.0']
    assert audit_lines(hermes_home) == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert "ClientDisconnect" not in caplog.text and "Traceback" not in caplog.text
