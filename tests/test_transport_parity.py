"""The gateway's own OpenAI path, the fast path and the litellm.completion fallback give the same results.

Every scenario runs against the fake server once per path (the own path only
for the routes it serves) and compares what the provider received (request
body, path) and what the plugin and the audit log got (text, message, model,
usage, cost, finish reason, audit fields; for errors: type, status, retryable,
Retry-After and the message). A litellm upgrade that changes the
provider-config interface the fast path relies on fails here, loudly.

Which path served a call is checked from the send functions each path goes
through (the own path's, the fast path's, the fallback's).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
from pathlib import Path

import pytest

from plugin_llm import PluginLlm, PluginLlmError
from plugin_llm.llm import HostLlm
from plugin_llm.transport import FAST_PROVIDERS, LitellmTransport, fast_path_decision
from plugin_llm.transport._compat import PROVIDERS as OWN_PROVIDERS
from plugin_llm.transport._fastpath import FAST_PATH_ENV, SDK_READ_PROVIDERS
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply

PATHS = ["own", "fast", "fallback"]
LITELLM_PATHS = ["fast", "fallback"]
MODES = ["sync", "async"]
USER = [{"role": "user", "content": "ping"}]
#: audit fields that differ between any two calls (ids, clocks, chain links)
VARYING = {"call_id", "latency_ms", "overhead_ms", "prev_hash", "seq", "ts", "hash"}
#: what a record's ``gen_ai.response.id`` becomes when it is the fake server's id of the last reply
LAST_REPLY_ID = "<the id of the last reply>"


def same_ids(record: dict, fake: FakeServer) -> dict:
    """``record`` with the fake server's per-request reply id written as :data:`LAST_REPLY_ID` (any other id
    is kept: it must then be the same on every path)."""
    if record.get("gen_ai.response.id") == fake.last_reply_id():
        record["gen_ai.response.id"] = LAST_REPLY_ID
    return record
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]
SCHEMA = {"type": "object", "properties": {"vendor": {"type": "string"}, "total": {"type": "number"}},
          "required": ["vendor", "total"]}
PIXEL = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")).decode()
IMAGE = [{"role": "user", "content": [
    {"type": "text", "text": "What is in this picture?"},
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}]}]


def configure(home: Path, base_url: str, *, provider: str = "custom", model: str = "gpt-4o",
              extra: str = "", key: str = "sk-parity-0123456789") -> None:
    write_config(home, f"model:\n  provider: {provider}\n  model: {model}\n  base_url: {base_url}\n{extra}"
                       "llm:\n  max_retries: 0\n")
    auth = home / "auth.json"
    auth.write_text(json.dumps({"providers": {provider: {"api_key": key}}}), encoding="utf-8")
    os.chmod(auth, 0o600)


@pytest.fixture(autouse=True)
def taken(monkeypatch) -> list[str]:
    """The path of every attempt, in order (the two paths' send functions, wrapped)."""
    from plugin_llm.transport import _fallback, _fastpath, _openai

    seen: list[str] = []
    for module, name in ((_openai, "own"), (_fastpath, "fast"), (_fallback, "fallback")):
        for fn in ("send", "asend"):
            def wrapped(*args, _original=getattr(module, fn), _name=name):
                seen.append(_name)
                return _original(*args)
            monkeypatch.setattr(module, fn, wrapped)
    TAKEN[:] = [seen]
    return seen


TAKEN: list[list[str]] = [[]]


def outcome(result) -> dict:
    if isinstance(result, PluginLlmError):
        return {"error": type(result).__name__, "status": getattr(result, "status", None),
                "retryable": getattr(result, "retryable", None), "retry_after": getattr(result, "retry_after", None),
                "message": str(result)}
    fields = {"text": result.text, "model": result.model, "provider": result.provider, "usage": vars(result.usage)}
    for name in ("message", "finish_reason", "tool_calls", "parsed", "content_type"):
        if hasattr(result, name):
            fields[name] = getattr(result, name)
    return fields


def run_call(home: Path, fake: FakeServer, path: str, mode: str, call, replies, taken: list[str]) -> dict:
    """One call on ``path``: what the server got, what the plugin got, the audit record."""
    taken.clear()
    fake.push(*replies)
    before = len(fake.requests)
    transport = LitellmTransport(fast_path=path != "fallback", own_path=path == "own")
    llm = HostLlm(transport=transport) if getattr(call, "host", False) else PluginLlm("p", transport=transport)
    try:
        result = call(llm) if mode == "sync" else asyncio.run(call(llm))
    except PluginLlmError as exc:
        result = exc
    sent = fake.requests[before:]
    # (the own path hands litellm's fast path what it cannot send exactly: both are then seen)
    assert sent and taken.count(path) == len(sent), (taken, len(sent))
    record = same_ids({k: v for k, v in audit_lines(home)[-1].items() if k not in VARYING}, fake)
    return {"sent": [(r.path, r.json) for r in sent], "outcome": outcome(result), "audit": record}


def assert_parity(home, fake, mode, call, *replies, check=None, paths=PATHS) -> dict:
    seen: list[str] = TAKEN[0]
    first, *others = [run_call(home, fake, path, mode, call, replies, seen) for path in paths]
    for other, path in zip(others, paths[1:]):
        for part in ("sent", "outcome", "audit"):
            assert first[part] == other[part], (part, paths[0], first[part], path, other[part])
    if check is not None:
        check(first)
    return first


def sync_or_async(method: str, *args, **kw):
    """A call of ``llm.<method>`` usable as sync (returns the result) or async (returns the coroutine)."""
    def call(llm):
        return getattr(llm, method)(*args, **kw)
    call.host = method in ("chat", "achat")  # the host's own calls (tools allowed)
    return call


@pytest.fixture
def fake():
    with FakeServer() as server:
        yield server


def calls(mode: str, method: str, *args, **kw):
    return sync_or_async(("a" + method) if mode == "async" else method, *args, **kw)


# --------------------------------------------------------------------------- successful calls


@pytest.mark.parametrize("mode", MODES)
def test_plain_call(hermes_home, fake, mode):
    configure(hermes_home, fake.base_url)
    out = assert_parity(hermes_home, fake, mode, calls(mode, "complete", USER, temperature=0.3, max_tokens=50),
                        Reply(content="pong"))
    assert out["outcome"]["text"] == "pong" and out["sent"][0][1]["temperature"] == 0.3
    assert out["audit"]["gen_ai.response.id"] == LAST_REPLY_ID  # the provider's id of the reply, on every path


@pytest.mark.parametrize("mode", MODES)
def test_tool_call(hermes_home, fake, mode):
    configure(hermes_home, fake.base_url)
    messages = [{"role": "user", "content": "define parity"}]
    out = assert_parity(hermes_home, fake, mode, calls(mode, "chat", messages, tools=TOOLS),
                        Reply.tool_call("lookup", {"word": "parity"}))
    assert out["sent"][0][1]["tools"] == TOOLS
    assert out["outcome"]["message"]["tool_calls"][0]["function"]["name"] == "lookup"


@pytest.mark.parametrize("mode", MODES)
def test_structured_json_schema(hermes_home, fake, mode):
    configure(hermes_home, fake.base_url, extra="  supports_json_schema: true\n")
    call = calls(mode, "complete_structured", instructions="Extract", input=["ACME 12.50"], json_schema=SCHEMA,
                 schema_name="invoice")
    out = assert_parity(hermes_home, fake, mode, call, Reply.json('{"vendor": "ACME", "total": 12.5}'))
    assert out["sent"][0][1]["response_format"]["type"] == "json_schema"
    assert out["outcome"]["parsed"] == {"vendor": "ACME", "total": 12.5}


@pytest.mark.parametrize("mode", MODES)
def test_structured_json_object(hermes_home, fake, mode):
    configure(hermes_home, fake.base_url, model="unknown-model")
    call = calls(mode, "complete_structured", instructions="Extract", input=["ACME 12.50"], json_schema=SCHEMA)
    out = assert_parity(hermes_home, fake, mode, call, Reply.json('{"vendor": "ACME", "total": 12.5}'))
    assert out["sent"][0][1]["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize("mode", MODES)
def test_image_input(hermes_home, fake, mode):
    configure(hermes_home, fake.base_url)
    out = assert_parity(hermes_home, fake, mode, calls(mode, "complete", IMAGE), Reply(content="a pixel"))
    assert out["sent"][0][1]["messages"][0]["content"][1]["type"] == "image_url"


@pytest.mark.parametrize("mode", MODES)
def test_usage_with_cached_tokens_priced(hermes_home, fake, mode):
    configure(hermes_home, fake.base_url, model="gpt-4o-mini")
    usage = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500,
             "prompt_tokens_details": {"cached_tokens": 200}, "completion_tokens_details": {"reasoning_tokens": 0}}
    out = assert_parity(hermes_home, fake, mode, calls(mode, "complete", USER), Reply(model="gpt-4o-mini", usage=usage))
    got = out["outcome"]["usage"]
    assert got["cache_read_tokens"] == 200
    assert got["cost_usd"] == pytest.approx(800 * 0.15e-6 + 200 * 0.075e-6 + 500 * 0.60e-6)


@pytest.mark.parametrize("model", ["gpt-4o", "deepseek-chat-unpriced-here", "local-echo-1"])
def test_cost_priced_and_unpriced(hermes_home, fake, model):
    configure(hermes_home, fake.base_url, model=model)
    out = assert_parity(hermes_home, fake, "sync", calls("sync", "complete", USER), Reply(model="reported-name"))
    assert (out["outcome"]["usage"]["cost_usd"] is None) == (model != "gpt-4o")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cached", [{"prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 236},
                                    {"cache_read_input_tokens": 64}], ids=["deepseek", "anthropic"])
def test_cache_counts_of_other_dialects(hermes_home, fake, mode, cached):
    """An OpenAI-compatible endpoint reporting cache hits in DeepSeek's or Anthropic's words: litellm's
    ``Usage`` makes them the cached tokens (over the details' own count), and so does every path."""
    configure(hermes_home, fake.base_url, model="gpt-4o-mini")
    usage = {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320,
             "prompt_tokens_details": {"cached_tokens": 5}, **cached}
    out = assert_parity(hermes_home, fake, mode, calls(mode, "complete", USER), Reply(usage=usage))
    assert out["outcome"]["usage"]["cache_read_tokens"] == 64
    assert out["outcome"]["usage"]["cost_usd"] == pytest.approx(236 * 0.15e-6 + 64 * 0.075e-6 + 20 * 0.60e-6)


def test_anthropic_style_cache_fields(hermes_home, fake):
    configure(hermes_home, fake.base_url, model="gpt-4o")
    usage = {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320, "cache_read_input_tokens": 100,
             "cache_creation_input_tokens": 50}
    out = assert_parity(hermes_home, fake, "sync", calls("sync", "complete", USER), Reply(usage=usage))
    assert out["outcome"]["usage"]["cache_read_tokens"] == 100


@pytest.mark.parametrize("reply", [
    Reply(content="<think>hidden steps</think>The answer."),  # litellm splits the reasoning off
    Reply(content="cut short", finish_reason="length"),
    Reply(content="odd end", finish_reason="eos"),  # a non-OpenAI finish reason, mapped by litellm
    Reply(body={"id": "x", "object": "chat.completion", "created": 1,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "no model, no usage"},
                             "finish_reason": "stop"}]}),
    Reply(body={"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "thinking shown",
                                                     "reasoning_content": "steps"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}}),
], ids=["think-tag", "length", "eos", "bare", "reasoning-field"])
def test_reply_shapes(hermes_home, fake, reply):
    configure(hermes_home, fake.base_url)
    assert_parity(hermes_home, fake, "sync", calls("sync", "complete", USER), reply)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("status", [400, 401, 429, 500])
def test_errors(hermes_home, fake, mode, status):
    configure(hermes_home, fake.base_url)
    headers = {"Retry-After": "7"} if status == 429 else {}
    out = assert_parity(hermes_home, fake, mode, calls(mode, "complete", USER),
                        Reply.error(status, f"refused with {status}", headers=headers))
    got = out["outcome"]
    assert got["error"] == "PluginLlmProviderError" and got["status"] == status
    assert got["retryable"] == (status in (429, 500)) and f"refused with {status}" in got["message"]
    assert got["retry_after"] == (7.0 if status == 429 else None)


def test_error_body_that_is_not_json(hermes_home, fake):
    """Same error, status and flags; the fast path keeps the body's text where the openai SDK has none."""
    configure(hermes_home, fake.base_url)
    call = calls("sync", "complete", USER)
    text = f"upstream-{secrets.token_hex(6)}"  # no word another test may have registered as a secret
    fast = run_call(hermes_home, fake, "fast", "sync", call, [Reply(status=502, body=text)], TAKEN[0])
    fallback = run_call(hermes_home, fake, "fallback", "sync", call, [Reply(status=502, body=text)], TAKEN[0])
    assert fast["sent"] == fallback["sent"]
    messages = fast["outcome"].pop("message"), fallback["outcome"].pop("message")
    assert fast["outcome"] == fallback["outcome"] == {"error": "PluginLlmProviderError", "status": 502,
                                                      "retryable": True, "retry_after": None}
    assert messages[0].endswith(text) and messages[1].endswith("Error code: 502")


def test_retry_after_429_then_success(hermes_home, fake):
    write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
                              "llm:\n  max_retries: 2\n")
    out = assert_parity(hermes_home, fake, "sync", calls("sync", "complete", USER),
                        Reply.error(429, "slow down", headers={"Retry-After": "0"}), Reply(content="now"))
    assert out["outcome"]["text"] == "now" and len(out["sent"]) == 2 and out["audit"]["attempts"] == 2


# --------------------------------------------------------------------------- which providers


@pytest.mark.parametrize("provider", sorted(FAST_PROVIDERS - {"openai"}))
def test_every_fast_provider_matches_the_fallback(hermes_home, fake, provider):
    """Each provider on the fast path, pointed at the fake server: same URL path, body and result (and
    through the own path too, for the providers it serves)."""
    paths = PATHS if provider in OWN_PROVIDERS else LITELLM_PATHS
    configure(hermes_home, fake.base_url, provider=provider, model="some-model")
    assert_parity(hermes_home, fake, "sync", calls("sync", "complete", USER, temperature=0.5, max_tokens=20),
                  Reply(content="hello from " + provider), paths=paths)
    assert_parity(hermes_home, fake, "sync", calls("sync", "chat", USER, tools=TOOLS),
                  Reply.tool_call("lookup", {"word": provider}), paths=paths)
    assert_parity(hermes_home, fake, "sync", calls("sync", "complete", USER), Reply.error(400, "bad request"),
                  paths=paths)
    # the reply's model as litellm.completion names it for this provider
    fake.push(Reply(content="named"))
    result = PluginLlm("p").complete(USER)
    assert result.model == (f"{provider}/fake-model-2024-01-01" if provider in SDK_READ_PROVIDERS
                            else result.model)


@pytest.mark.parametrize("provider", sorted(FAST_PROVIDERS))
def test_reply_reader_follows_litellm_dispatch(hermes_home, fake, provider, monkeypatch):
    """litellm.completion reaches SDK_READ_PROVIDERS through the openai SDK (X-Stainless-* headers), the rest
    through its HTTP handler; the fast path reads each provider's replies the way its branch does."""
    configure(hermes_home, fake.base_url, provider=provider if provider != "openai" else "custom", model="m")
    fake.push(Reply(content="which branch"))
    PluginLlm("p", transport=LitellmTransport(fast_path=False)).complete(USER)
    through_sdk = "x-stainless-lang" in {k.lower() for k in fake.requests[-1].headers}
    assert through_sdk == (provider in SDK_READ_PROVIDERS)


@pytest.mark.parametrize("provider, fast", [
    ("custom", True), ("openai", True), ("deepseek", True), ("together_ai", True), ("mistral", True),
    ("openrouter", True), ("groq", False), ("local", False), ("bedrock", False), ("vertex_ai", False),
    ("anthropic", False), ("azure", False),
])
def test_path_chosen_per_route(hermes_home, provider, fast, monkeypatch):
    from plugin_llm.config import parse_config
    from plugin_llm.routing import resolve_route

    base = "  base_url: http://127.0.0.1:9/v1\n" if provider == "custom" else ""
    route = resolve_route(parse_config(hermes_home, f"model:\n  provider: {provider}\n  model: m\n{base}"))
    chosen, why = fast_path_decision(route)
    assert chosen is fast and why
    own = {"custom": "own", "openai": "own", "local": "local", **dict.fromkeys(OWN_PROVIDERS, "own")}.get(provider)
    assert LitellmTransport().path(route)[0] == (own or ("fast" if fast else "fallback"))
    assert LitellmTransport(own_path=False).path(route)[0] == ("fast" if fast else "fallback")
    monkeypatch.setenv(FAST_PATH_ENV, "0")
    assert fast_path_decision(route)[0] is False and FAST_PATH_ENV in fast_path_decision(route)[1]
    assert LitellmTransport().path(route)[0] == "fallback"


def test_litellm_outside_the_tested_range_takes_the_fallback(hermes_home, monkeypatch):
    from plugin_llm.config import parse_config
    from plugin_llm.routing import resolve_route
    from plugin_llm.transport import _fastpath

    route = resolve_route(parse_config(hermes_home, "model:\n  provider: openai\n  model: gpt-4o\n"))
    monkeypatch.setattr(_fastpath, "_VERSION", ["1.999.0"])
    chosen, why = fast_path_decision(route)
    assert not chosen and "1.999.0 is outside the range" in why


def test_switch_off_by_environment_sends_through_litellm(hermes_home, fake, monkeypatch):
    configure(hermes_home, fake.base_url)
    monkeypatch.setenv(FAST_PATH_ENV, "0")
    fake.push(Reply(content="via litellm"))
    assert PluginLlm("p").complete(USER).text == "via litellm"
    assert TAKEN[0] == ["fallback"]


@pytest.mark.parametrize("mode", MODES)
def test_the_fast_path_follows_no_redirect(hermes_home, fake, mode):
    """A difference, on purpose: a 3xx is a provider error on the fast path (the key never goes where a Location
    points); the openai SDK under the fallback follows it."""
    configure(hermes_home, fake.base_url)
    moved = Reply(status=307, body={"moved": True}, headers={"Location": fake.base_url + "/elsewhere"})
    out = run_call(hermes_home, fake, "fast", mode, calls(mode, "complete", USER), [moved], TAKEN[0])
    assert len(out["sent"]) == 1
    assert out["outcome"]["error"] == "PluginLlmProviderError" and out["outcome"]["status"] == 307
