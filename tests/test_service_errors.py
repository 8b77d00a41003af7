"""No 5xx answer of the service names a host path, address, URL or exception text.

A remote plugin must not learn the host's filesystem layout or network from an outage: the token store's,
the limits store's, a missing provider key's, an unreachable provider's or an unexpected failure's body is a
fixed message; the detail is in the service's log (and, for a call, its audit record). Every case runs in a
home whose path holds a canary directory name, over real HTTP (tests.service_server).
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3

import httpx
import pytest

from plugin_llm import limits
from plugin_llm.errors import (
    PluginLlmConfigError,
    PluginLlmError,
    PluginLlmProviderError,
    PluginLlmQuotaError,
    PluginLlmTimeoutError,
)
from tests.conftest import audit_lines, write_config
from tests.service_server import ServiceServer

USER = [{"role": "user", "content": "hello"}]
COMPLETE = "/v1/plugin-llm/complete"
CHAT = "/v1/chat/completions"
CANARY = "CANARYdir7q"


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


@pytest.fixture
def canary_home(tmp_path, monkeypatch):
    home = tmp_path / CANARY / "hermes"
    home.mkdir(parents=True)
    monkeypatch.setenv("HERMES_HOME", str(home))
    return home


def _assert_fixed(response: httpx.Response, *also_hidden: str) -> dict:
    assert response.status_code >= 500, response.text
    for hidden in (CANARY, "/tmp", *also_hidden):
        assert hidden not in response.text, (hidden, response.text)
    return response.json()["error"]


def _post_both(service: ServiceServer, token: str) -> list[httpx.Response]:
    native = httpx.post(service.url + COMPLETE, headers=service.auth(token), json={"messages": USER}, timeout=30)
    chat = httpx.post(service.url + CHAT, headers=service.auth(token), json={"messages": USER}, timeout=30)
    streamed = httpx.post(service.url + CHAT, headers=service.auth(token), json={"messages": USER, "stream": True},
                          timeout=30)
    return [native, chat, streamed]


def test_a_missing_provider_key_is_a_500_without_the_auth_file_path(canary_home, caplog):
    caplog.set_level(logging.WARNING, logger="plugin_llm.service")
    write_config(canary_home, "model:\n  provider: openai\n  model: gpt-4o\n")
    with ServiceServer(canary_home) as service:
        answers = _post_both(service, service.token("p"))
    for answer in answers:
        error = _assert_fixed(answer, "auth.json", "OPENAI_API_KEY")
        assert answer.status_code == 500 and error["code"] == "config_error"
        assert error["type"] == "PluginLlmConfigError" and "configuration" in error["message"]
    records = audit_lines(canary_home)
    assert len(records) == 3 and all(CANARY in r["error.message"] for r in records)  # the audit keeps the detail
    assert f"{CANARY}/hermes/auth.json" in caplog.text  # and so does the service's log


def test_a_token_store_that_cannot_be_read_is_a_503_without_its_path(canary_home, caplog):
    caplog.set_level(logging.WARNING, logger="plugin_llm.service")
    with ServiceServer(canary_home) as service:
        token = service.token("p")
        service.app.state.service.tokens.close()
        (canary_home / "service" / "tokens.db").write_bytes(b"not a database " * 100)
        answer = httpx.post(service.url + COMPLETE, headers=service.auth(token), json={"messages": USER},
                            timeout=30)
    error = _assert_fixed(answer, "tokens.db", "DatabaseError")
    assert answer.status_code == 503 and error["code"] == "token_store_unavailable"
    assert f"{CANARY}/hermes/service/tokens.db" in caplog.text
    events = [json.loads(line) for line in (canary_home / "logs" / "agent.log").read_text().splitlines()]
    assert any(e.get("reason") == "store_error" and CANARY in e.get("detail", "") for e in events)


@pytest.mark.slow
def test_a_limits_store_outage_is_a_503_without_its_path(canary_home, caplog):
    caplog.set_level(logging.WARNING, logger="plugin_llm.service")
    write_config(canary_home, "model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:9/v1\n"
                              "limits:\n  store: local\n  store_timeout: 0.3\nplugins:\n  entries:\n    lk:\n"
                              "      limits:\n        requests_per_minute: 100\n")
    locker = sqlite3.connect(str(canary_home / "limits.sqlite3"), isolation_level=None, timeout=0)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with ServiceServer(canary_home) as service:
            answers = _post_both(service, service.token("lk"))
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    for answer in answers:
        error = _assert_fixed(answer, "limits.sqlite3")
        assert answer.status_code == 503 and error["code"] == "limits_store_unavailable"
    assert CANARY in caplog.text and all(CANARY in r["error.message"] for r in audit_lines(canary_home))


@pytest.mark.slow
def test_an_unreachable_provider_is_a_502_without_its_address(canary_home, caplog):
    caplog.set_level(logging.WARNING, logger="plugin_llm.service")
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    write_config(canary_home, f"model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:{port}/"
                              f"{CANARY}/v1\nllm:\n  max_retries: 0\n")
    with ServiceServer(canary_home) as service:
        answers = _post_both(service, service.token("p"))
    for answer in answers:
        error = _assert_fixed(answer, str(port), "127.0.0.1", "http://")
        assert answer.status_code == 502 and error["code"] == "provider_error" and error["provider"] == "custom"
        assert error["status"] is None and error["retryable"] is True
    assert str(port) in caplog.text
    assert all(str(port) in r["error.message"] for r in audit_lines(canary_home))


class _Raising:
    """A pipeline stand-in whose every call raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def acomplete(self, *args, **kwargs):
        raise self.exc

    async def acomplete_structured(self, *args, **kwargs):
        raise self.exc

    async def astream(self, *args, **kwargs):
        raise self.exc


_WHERE = f"/srv/{CANARY}/hermes/auth.json at http://10.9.8.7:8080/v1 ([fd00::7]:443)"


@pytest.mark.parametrize("exc, status, code", [
    (RuntimeError(f"unexpected: {_WHERE}"), 500, "internal_error"),
    (OSError(13, "Permission denied", f"/srv/{CANARY}/x"), 500, "internal_error"),
    (PluginLlmError(f"gateway: {_WHERE}"), 500, "gateway_error"),
    (PluginLlmConfigError(f"config: {_WHERE}"), 500, "config_error"),
    (PluginLlmTimeoutError(f"no answer from {_WHERE}"), 504, "timeout"),
    (PluginLlmProviderError(f"cannot reach custom ({_WHERE})", provider="custom", retryable=True), 502,
     "provider_error"),
    (PluginLlmProviderError(f"custom refused (HTTP 404): no model here {_WHERE}", status=404, provider="custom"),
     502, "provider_error"),
    (PluginLlmQuotaError(f"the limits store {_WHERE} is down"), 429, "quota_exceeded"),
], ids=["unexpected", "oserror", "gateway", "config", "timeout", "unreachable", "provider-http", "quota"])
def test_no_error_body_names_a_path_address_or_url(hermes_home, caplog, exc, status, code):
    """Every failure class the pipeline raises, with a text full of host details, through every endpoint."""
    caplog.set_level(logging.WARNING, logger="plugin_llm.service")
    if isinstance(exc, PluginLlmQuotaError):
        exc.limit = "store"  # type: ignore[attr-defined]
        status, code = 503, "limits_store_unavailable"
    with ServiceServer(hermes_home, llm_factory=lambda plugin: _Raising(exc)) as service:
        answers = _post_both(service, service.token("p"))
    for answer in answers:
        error = _assert_fixed(answer, "10.9.8.7", "fd00::7", "8080", "http://", "/srv", "auth.json")
        assert answer.status_code == status and error["code"] == code
    if code == "provider_error" and getattr(exc, "status", None) == 404:
        assert "no model here" in answers[0].json()["error"]["message"]  # the provider's own words stay
    assert CANARY in caplog.text  # the operator's log has the detail


def test_the_cause_of_repeated_failures_is_logged_at_most_every_ten_seconds(hermes_home, caplog, monkeypatch):
    from plugin_llm.service import app as service_app

    state = service_app.ServiceState(hermes_home)
    now = [1000.0]
    monkeypatch.setattr(service_app.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.WARNING, logger="plugin_llm.service")
    for n in range(50):  # a plugin repeating a call that fails: one line, not fifty
        service_app._outcome(state, "p", "complete", 0.0, PluginLlmConfigError(f"missing key {n}"), None,
                             frozenset())
    now[0] += 10.5
    service_app._outcome(state, "p", "complete", 0.0, PluginLlmConfigError("missing key again"), None, frozenset())
    lines = [r.getMessage() for r in caplog.records if "missing key" in r.getMessage()]
    assert len(lines) == 2 and "missing key 0" in lines[0] and "missing key again" in lines[1]
    state.tokens.close()
