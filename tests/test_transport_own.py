"""The gateway's own OpenAI path and the local model's in-process path do what litellm does.

Piece by piece against litellm itself (the route's prices, parameters and URL; the request body
and headers; the reading of a reply; the error of an error status; schema support), then whole
calls on the wire against the fake upstream through the own path, litellm's fast path and
``litellm.completion`` (errors, time-outs, malformed replies, streams), and the local model in
process against the local model through litellm's custom-provider hook.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from plugin_llm import PluginLlm, PluginLlmError
from plugin_llm.config import parse_config
from plugin_llm.routing import resolve_route
from plugin_llm.transport import LitellmTransport, _fastpath, _openai
from plugin_llm.transport._errors import map_error
from plugin_llm.transport._pricemap import price_map_path
from plugin_llm.transport._reply import read_reply, usage
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply
from tests.test_transport_parity import (PATHS, TOOLS, USER, calls, configure, outcome, run_call, same_ids,  # noqa: F401
                                         taken)

pytestmark = pytest.mark.slow  # litellm's import, and whole calls on the wire
#: audit fields that differ between any two calls (ids, clocks, chain links)
VARYING = {"call_id", "latency_ms", "overhead_ms", "prev_hash", "seq", "ts", "hash",
           "gen_ai.response.time_to_first_chunk"}

def _route(home, model: str, provider: str = "custom", base: str | None = "http://127.0.0.1:9/v1"):
    text = f"model:\n  provider: {provider}\n  model: {json.dumps(model)}\n"
    if base:
        text += f"  base_url: {base}\n"
    return resolve_route(parse_config(home, text))


def _corpus() -> list[str]:
    raw = json.loads(price_map_path().read_text())
    names = [k for k, v in raw.items() if isinstance(v, dict) and v.get("litellm_provider") == "openai"]
    extra = ["unknown-model", "local-echo-1", "llama3", "Mixtral-8x7B", "meta-llama/Llama-3-8b", "openai/gpt-4o",
             "gpt-4o-2031-01-02", "ft:gpt-4o-mini:org::id", "ft:gpt-4o-mini-2024-07-18:org::abc", "GPT-4O", "gpt-4"]
    for name in names[:60]:
        extra += [name.upper(), name + "-2031-01-02", "ft:" + name + ":org::id", name + "-x"]
    return names + extra


# --------------------------------------------------------------------------- the route, against litellm


def test_route_prices_params_and_url_are_litellms(hermes_home, litellm, prices):
    """For every openai model of the map (and variants): the own route, where it serves, has the fast
    route's prices, parameters and URL; where it does not, litellm serves it."""
    served = 0
    for name in _corpus():
        route = _route(hermes_home, name)
        own = _openai._build(route, prices)
        if not isinstance(own, _openai.OwnRoute):
            continue
        served += 1
        fast = _fastpath._build(litellm, route)
        assert isinstance(fast, _fastpath.FastRoute), name
        priced, simple = _fastpath._prices(litellm, fast.model, "openai")
        assert (own.prices is not None) == priced, name
        if own.prices is not None:
            assert simple is not None and own.prices == simple[:3], name
        assert own.model == fast.model and own.supported == fast.supported, name
        assert own.url == fast.config.get_complete_url(fast.api_base, None, fast.model, {}, fast.litellm_params), name
    assert served > 100


@pytest.mark.parametrize("base", ["http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1/", "http://h:1/v1/chat/completions",
                                  "https://api.openai.com/v1", "http://u:p@h/x//", "http://h/v1?x=1"])
def test_endpoint_url_is_litellms(hermes_home, litellm, base):
    route = _route(hermes_home, "gpt-4o", base=base)
    own, fast = _openai._build(route), _fastpath._build(litellm, route)
    assert own.url == fast.config.get_complete_url(fast.api_base, None, fast.model, {}, fast.litellm_params)


def test_openai_default_endpoint_follows_the_environment(hermes_home, litellm, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/proxy/v1")
    route = _route(hermes_home, "gpt-4o", provider="openai", base=None)
    own, fast = _openai._build(route), _fastpath._build(litellm, route)
    assert own.url == "http://127.0.0.1:9/proxy/v1/chat/completions"
    assert own.url == fast.config.get_complete_url(fast.api_base, None, fast.model, {}, fast.litellm_params)


@pytest.mark.parametrize("model, why", [("o3-mini", "o-series"), ("gpt-5", "gpt-5"), ("claude-x", "rewrites"),
                                        ("meta/unknown-x", "rule of its own"), ("ft:gpt-4o:org::id", "rule of its own"),
                                        ("gemini-3-pro", "rule of its own"), ("codex-unknown", "rule of its own")])
def test_routes_litellm_maps_differently_are_left_to_it(hermes_home, model, why):
    assert why in _openai._build(_route(hermes_home, model))


@pytest.mark.parametrize("model", ["gemini-3-pro", "codex-unknown"])
def test_a_model_litellm_describes_by_a_rule_is_priced_by_litellm(hermes_home, litellm, model):
    """The price map's generalization rules give such a name model info (and so a price of 0): the own
    path leaves it to litellm rather than call it unpriced."""
    fast = _fastpath._build(litellm, _route(hermes_home, model))
    assert _fastpath._prices(litellm, fast.model, "openai")[0] is True


def test_schema_support_is_litellms(hermes_home, litellm):
    for name in _corpus()[::3]:
        for provider in ("openai", "custom"):
            expected = bool(litellm.supports_response_schema(model=name, custom_llm_provider=provider))
            assert _openai.supports_schema(provider, name) == expected, (provider, name)


# --------------------------------------------------------------------------- request, reply, error


REQUESTS = [
    (USER, {}),
    (USER, {"temperature": 0.2, "max_tokens": 9, "top_p": 0.9, "stop": ["x"], "seed": 3, "presence_penalty": 0.1,
            "frequency_penalty": 0.2, "logit_bias": {"5": 1}, "user": "u-1", "n": 1}),
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi", "name": "ann"}], {}),
    ([{"role": "user", "content": [{"type": "text", "text": "see"},
                                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA",
                                                                       "detail": "low"}}]}], {}),
    ([{"role": "user", "content": "define x"},
      {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "lookup", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "x is y"}], {"tools": TOOLS, "tool_choice": "auto"}),
    (USER, {"tool_choice": "auto"}),
    (USER, {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}}),
]
DEFERRED = [
    ([{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}], {}),
    ([{"role": "developer", "content": "x"}], {}),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "http://x/y.png"}]}], {}),
    (USER, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": "\\p{L}"}}}}}]}),
]


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4", "some-local-model"])
@pytest.mark.parametrize("base", ["http://127.0.0.1:9/v1", "https://api.openai.com/v1"])
def test_request_is_litellms(hermes_home, litellm, model, base):
    route = _route(hermes_home, model, base=base)
    own, fast = _openai._build(route), _fastpath._build(litellm, route)
    for messages, params in REQUESTS:
        prepared = own.prepare(messages, params)
        assert prepared is not None, (messages, params)
        url, headers, body = _fastpath._request(fast, messages, fast.optional_params(dict(params)), "sk-t")
        assert (own.url, own.headers("sk-t"), prepared[0]) == (url, headers, body)
        assert json.dumps(prepared[0]) == json.dumps(body)  # the same bytes, key order included
    for messages, params in DEFERRED:
        assert own.prepare(messages, params) is None


READ = [
    {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": r}],
     "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
    for r in ("stop", "length", "content_filter", None)
] + [
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "{\"word\": \"a\"}"}},
        {"id": "d", "type": "function", "function": {"name": "other", "arguments": ""}}]},
                  "finish_reason": "tool_calls"}], "model": "m"},
]


def test_plain_replies_read_as_litellm_reads_them(hermes_home, litellm):
    route = _route(hermes_home, "gpt-4o")
    own, fast = _openai._build(route), _fastpath._build(litellm, route)
    for doc in READ:
        content = json.dumps(doc).encode()
        mine = own.read(content)
        assert mine is not None, doc
        theirs = fast.reader(fast.config, model=fast.model, raw_response=_httpx_response(content),
                             model_response=fast.model_response(), logging_obj=_fastpath._NULL_LOGGING,
                             request_data={}, messages=USER, optional_params={"tools": TOOLS},
                             litellm_params=fast.litellm_params, encoding=None, api_key=None, json_mode=None)
        assert read_reply(route, mine, []) == read_reply(route, theirs, [])
        assert usage(route, mine, [], own.cost) == usage(route, theirs, [], fast.cost)


def _httpx_response(content: bytes):
    import httpx

    return httpx.Response(200, content=content, headers={"content-type": "application/json"})


@pytest.mark.parametrize("body", [b'{"error": {"message": "MARK refused"}}', b"plain text body", b"",
                                  b'{"error": {"message": "This model\'s maximum context length is 8192 tokens"}}',
                                  b'{"error": {"message": "Rate limit reached"}}', b'{"message": "MARK"}'])
def test_error_statuses_map_as_litellm_maps_them(hermes_home, litellm, body):
    route = _route(hermes_home, "gpt-4o")
    own, fast = _openai._build(route), _fastpath._build(litellm, route)
    deadline = time.monotonic() + 60
    mapped = 0
    for status in [*range(300, 310), *range(400, 600)]:
        headers = [(b"Retry-After", b"7"), (b"Content-Type", b"application/json")]
        mine = own.error(status, headers, body)
        if mine is None:
            continue
        mapped += 1
        a, b = map_error(mine, route, None, deadline), map_error(fast.http_error(status, headers, body), route, None,
                                                                 deadline)
        assert (type(a), str(a), vars(a)) == (type(b), str(b), vars(b)), status
    assert mapped == (0 if b"maximum" in body or b"Rate" in body else 210)


# --------------------------------------------------------------------------- on the wire


@pytest.fixture
def fake():
    with FakeServer() as server:
        yield server


def _parity(home, fake, mode, call, *replies, paths=PATHS) -> dict:
    got = [run_call(home, fake, path, mode, call, replies, taken_list()) for path in paths]
    for other, path in zip(got[1:], paths[1:]):
        for part in ("sent", "outcome", "audit"):
            assert got[0][part] == other[part], (part, got[0][part], path, other[part])
    return got[0]


def taken_list() -> list[str]:
    from tests.test_transport_parity import TAKEN

    return TAKEN[0]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("status", [403, 404, 408, 502, 503, 504])
def test_more_error_statuses_on_the_wire(hermes_home, fake, taken, mode, status):
    configure(hermes_home, fake.base_url)
    got = _parity(hermes_home, fake, mode, calls(mode, "complete", USER),
                  Reply.error(status, f"refused with {status}", headers={"Retry-After": "3"}))
    assert got["outcome"]["error"] in ("PluginLlmProviderError", "PluginLlmTimeoutError")
    assert f"refused with {status}" in got["outcome"]["message"]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("reply", [Reply.malformed(), Reply(body={"choices": []}), Reply(body=[1, 2]),
                                   Reply(body="not json at all", headers={"Content-Type": "text/plain"})],
                         ids=["truncated", "no choices", "a list", "text"])
def test_malformed_replies_on_the_wire(hermes_home, fake, taken, mode, reply):
    """The own path reads what it cannot read as plain with litellm's fast path: the same error (the
    fallback's openai SDK words some of these differently, as it did before the own path)."""
    configure(hermes_home, fake.base_url)
    got = _parity(hermes_home, fake, mode, calls(mode, "complete", USER), reply, paths=["own", "fast"])
    assert got["outcome"]["error"] == "PluginLlmProviderError"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_timeout_on_the_wire(hermes_home, fake, taken, mode):
    """The own path times out as the fast path does, on the same clients (the fallback words it as the
    openai SDK does)."""
    configure(hermes_home, fake.base_url)
    got = _parity(hermes_home, fake, mode, calls(mode, "complete", USER, timeout=0.5), Reply(delay=5),
                  paths=["own", "fast"])
    assert got["outcome"]["error"] == "PluginLlmTimeoutError"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_headers_that_matter_are_litellms(hermes_home, fake, taken, mode):
    configure(hermes_home, fake.base_url, key="sk-wire-0123456789abcdef")
    got = []
    for path in PATHS:
        run_call(hermes_home, fake, path, mode, calls(mode, "complete", USER), [Reply(content="x")], taken_list())
        headers = {k.lower(): v for k, v in fake.requests[-1].headers.items()}
        got.append((headers["authorization"], headers["content-type"]))
    assert got == [("Bearer sk-wire-0123456789abcdef", "application/json")] * 3


def _stream_parity(home, fake, mode, reply, **kw) -> list:
    """A stream through the own path and the fast path (the fallback names the reply's model after the
    request, as before the own path)."""
    out = []
    for path in ("own", "fast"):
        fake.push(reply)
        llm = PluginLlm("p", transport=LitellmTransport(fast_path=path != "fallback", own_path=path == "own"))
        try:
            if mode == "sync":
                text = "".join(llm.stream(USER, **kw))
            else:
                async def read():
                    stream = await llm.astream(USER, **kw)
                    return "".join([d async for d in stream])
                text = asyncio.run(read())
            result = text
        except PluginLlmError as exc:
            result = outcome(exc)
        record = same_ids({k: v for k, v in audit_lines(home)[-1].items()
                           if k not in VARYING}, fake)
        out.append((fake.requests[-1].json, result, record))
    for other in out[1:]:
        assert out[0][:2] == other[:2]
        assert {k: (v, other[2].get(k)) for k, v in out[0][2].items() if other[2].get(k) != v} == {}
    return out[0]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_streams_on_the_wire(hermes_home, fake, taken, mode):
    configure(hermes_home, fake.base_url)
    sent, text, record = _stream_parity(hermes_home, fake, mode, Reply(content="a streamed reply"), max_tokens=30)
    assert text == "a streamed reply" and sent["stream"] is True and record["cost_usd"] > 0
    _stream_parity(hermes_home, fake, mode, Reply.error(429, "slow", headers={"Retry-After": "0"}))
    _stream_parity(hermes_home, fake, mode, Reply.error(500, "upstream broke"))


# --------------------------------------------------------------------------- the local model


LOCAL_CALLS = [
    ("complete", (USER,), {}),
    ("complete", ([{"role": "user", "content": "a long enough message to cut short"}],), {"max_tokens": 3}),
    ("complete", (USER,), {"temperature": 0.1}),
    ("chat", ([{"role": "user", "content": "lookup word: parity"}],), {"tools": TOOLS}),
    ("complete_structured", (), {"instructions": "Extract", "input": ["vendor: ACME, total: 12.5"],
                                 "json_schema": {"type": "object", "properties": {"vendor": {"type": "string"}}}}),
]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_local_model_in_process_is_the_local_model_through_litellm(hermes_home, mode):
    write_config(hermes_home, "model:\n  provider: local\n  model: local-echo-1\n")
    for method, args, kw in LOCAL_CALLS:
        got = []
        for own in (True, False):
            call = calls(mode, method, *args, **kw)
            transport = LitellmTransport(own_path=own)
            from plugin_llm.llm import HostLlm

            llm = HostLlm(transport=transport) if call.host else PluginLlm("p", transport=transport)
            result = call(llm) if mode == "sync" else asyncio.run(call(llm))
            record = {k: v for k, v in audit_lines(hermes_home)[-1].items()
                      if k not in VARYING}
            got.append((outcome(result), record))
        assert got[0] == got[1], (method, kw)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_local_model_streams_in_process_as_through_litellm(hermes_home, mode):
    write_config(hermes_home, "model:\n  provider: local\n  model: local-echo-1\n")
    got = []
    for own in (True, False):
        llm = PluginLlm("p", transport=LitellmTransport(own_path=own))
        if mode == "sync":
            text = "".join(llm.stream([{"role": "user", "content": "stream these words to me please"}]))
        else:
            async def read():
                stream = await llm.astream([{"role": "user", "content": "stream these words to me please"}])
                return "".join([d async for d in stream])
            text = asyncio.run(read())
        record = {k: v for k, v in audit_lines(hermes_home)[-1].items()
                  if k not in VARYING}
        got.append((text, record))
    assert got[0] == got[1] and "stream these words" in got[0][0]
