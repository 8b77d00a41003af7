"""Provider and library failures as error messages: bounded, without a Python traceback (review F2).

Real parts: the in-process ``local`` route through litellm, a scripted OpenAI-compatible server on
127.0.0.1, both transport paths (``tests.paths``).
"""

from __future__ import annotations

import json
import time

import pytest

from plugin_llm import PluginLlm, PluginLlmProviderError
from plugin_llm.config import parse_config
from plugin_llm.credentials import key_source
from plugin_llm.routing import resolve_route
from plugin_llm.transport import LitellmTransport, TransportRequest
from tests.conftest import audit_lines, write_config
from tests.paths import transport_path  # noqa: F401  (every test on both paths)
from tests.servers import FakeServer, Reply

USER = [{"role": "user", "content": "ping"}]
#: what a server that leaks its own traceback puts in an error body (paths, code lines, a long tail)
LEAKY = ("upstream failed: KeyError 'x' Traceback (most recent call last):\n"
         '  File "/srv/secret-app/handlers.py", line 42, in handle\n    return table[key]\n'
         "KeyError: 'x'\n" + "padding " * 20_000)


def _request(home, messages) -> TransportRequest:
    route = resolve_route(parse_config(home, (home / "config.yaml").read_text(encoding="utf-8")))
    return TransportRequest(route=route, messages=messages, keys=key_source(home, route.provider, route.profile),
                            deadline=time.monotonic() + 30)


def _assert_clean(message: str) -> None:
    assert "Traceback" not in message and 'File "' not in message and "site-packages" not in message
    assert "/srv/secret-app" not in message and ".py" not in message
    assert len(message) < 800


def test_an_unencodable_request_is_not_retried_and_carries_no_traceback(hermes_home):
    """Below the request checks (which refuse it first): litellm fails to encode a lone surrogate and wraps
    the UnicodeEncodeError, with its own traceback, in an APIConnectionError. That is not a connection
    problem: one attempt, not retryable, a short message without the traceback's server paths."""
    write_config(hermes_home, "model:\n  provider: local\n  model: local-echo-1\nllm:\n  max_retries: 2\n")
    with pytest.raises(PluginLlmProviderError) as caught:
        LitellmTransport().complete(_request(hermes_home, [{"role": "user", "content": "\ud800 hi"}]))
    error = caught.value
    assert error.retryable is False and getattr(error, "attempts", None) == 1
    assert "could not be encoded" in str(error) and "lone surrogate" in str(error)
    assert "cannot reach" not in str(error)
    _assert_clean(str(error))


@pytest.mark.slow
def test_a_provider_error_body_with_a_traceback_is_cut_before_it(hermes_home, custom_route):
    with FakeServer([Reply.error(500, LEAKY)]) as upstream:
        custom_route(upstream.base_url, max_retries=0)
        with pytest.raises(PluginLlmProviderError) as caught:
            PluginLlm("p").complete(USER)
    message = str(caught.value)
    assert "upstream failed: KeyError 'x'" in message  # the provider's own words are kept
    _assert_clean(message)
    [line] = audit_lines(hermes_home)
    _assert_clean(line["error.message"])


def test_an_error_event_with_a_traceback_in_a_stream_is_cut_before_it(hermes_home, custom_route):
    event = b"data: " + json.dumps({"error": {"message": LEAKY[:3000], "code": 500}}).encode() + b"\n\n"
    with FakeServer([Reply(body=event, headers={"Content-Type": "text/event-stream"})]) as upstream:
        custom_route(upstream.base_url, max_retries=0)
        with pytest.raises(PluginLlmProviderError) as caught:
            with PluginLlm("p").stream(USER) as stream:
                for _ in stream:
                    pass
    message = str(caught.value)
    assert "upstream failed" in message  # the fast path reads the event itself, litellm (fallback) raises it
    _assert_clean(message)


@pytest.mark.parametrize("call", [
    {"instructions": "do \ud800 this"},
    {"input": ["x \udfff"]},
    {"input": [{"type": "text", "text": "x \ud800"}]},
    {"system_prompt": "be \ud800"},
    {"schema_name": "n\ud800"},
    {"json_schema": {"type": "object", "description": "\ud800"}},
    {"json_schema": {"type": "object", "properties": {"\ud800": {"type": "string"}}}},
    {"stop": ["\ud800"]},
    {"user": "u\ud800"},
])
def test_a_lone_surrogate_anywhere_in_a_call_is_refused_before_anything_is_sent(hermes_home, custom_route, call):
    from plugin_llm import PluginLlm

    with FakeServer() as server:
        custom_route(server.base_url)
        llm = PluginLlm("surrogates")
        with pytest.raises(ValueError, match="lone surrogate") as caught:
            if "stop" in call or "user" in call:
                llm.complete([{"role": "user", "content": "hi"}], **call)
            else:
                args = {"instructions": "extract", "input": ["text"], "json_schema": {"type": "object"}, **call}
                llm.complete_structured(**args)
        assert not isinstance(caught.value, UnicodeEncodeError) and server.requests == []
