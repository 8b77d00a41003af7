"""The own path for the other OpenAI-compatible providers (``_compat.PROVIDERS``) does what litellm does.

Provider by provider against litellm's own config, piece by piece (for every model of the price map
under that provider and names it does not know: the model name sent, the endpoint, the parameters
passed on, the prices and the cost, schema support; the request body and headers of many request
shapes; the reading of replies; the error of every error status), then whole calls on the wire
against the fake upstream through the own path, litellm's fast path and ``litellm.completion``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from plugin_llm import PluginLlm, PluginLlmError
from plugin_llm.config import parse_config
from plugin_llm.routing import resolve_route
from plugin_llm.transport import LitellmTransport, _compat, _fastpath, _openai
from plugin_llm.transport._errors import map_error
from plugin_llm.transport._pricemap import price_map_path
from plugin_llm.transport._reply import read_reply, usage
from tests.conftest import audit_lines
from tests.servers import FakeServer, Reply
from tests import test_transport_parity as parity
from tests.test_transport_parity import SCHEMA, TOOLS, USER, assert_parity, calls, configure, outcome, same_ids
from tests.test_transport_own import VARYING

pytestmark = pytest.mark.slow  # litellm's import, and whole calls on the wire
taken = parity.taken  # (autouse: the path of every attempt, which assert_parity checks)
PROVIDERS = sorted(_compat.PROVIDERS)
MODES = ["sync", "async"]
UNKNOWN = ["some-model", "unknown-x", "llama3", "meta-llama/Llama-3-8b", "gpt-4o", "gpt-4", "deepseek-chat",
           "Mixtral-8x7B", "mistralai/Mistral-7B-Instruct-v0.1", "gemini-3-pro", "claude-fable-5", "o3-mini"]


def _route(home, provider: str, model: str, base: str | None = "http://127.0.0.1:9/v1"):
    text = f"model:\n  provider: {provider}\n  model: {json.dumps(model)}\n"
    if base:
        text += f"  base_url: {base}\n"
    return resolve_route(parse_config(home, text))


def _corpus(provider: str) -> list[str]:
    raw = json.loads(price_map_path().read_text())
    names = [k.split("/", 1)[1] if k.startswith(provider + "/") else k
             for k, v in raw.items() if isinstance(v, dict) and v.get("litellm_provider") == provider]
    variants = [variant for name in names[:25] for variant in (name.upper(), name + "-2031-01-02", name + "-x")]
    return names + variants + UNKNOWN


def _fast(litellm, route):
    _fastpath._ROUTES.clear()
    return _fastpath._build(litellm, route)


def _usages(seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(8):
        prompt, completion = rng.randint(0, 200_000), rng.randint(0, 30_000)
        cached = rng.randint(0, prompt)
        out.append({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                    "prompt_tokens_details": {"cached_tokens": cached},
                    "completion_tokens_details": {"reasoning_tokens": rng.randint(0, completion)}})
    return out


# --------------------------------------------------------------------------- the route, against litellm


@pytest.mark.parametrize("provider", PROVIDERS)
def test_routes_are_litellms(hermes_home, litellm, prices, provider):
    """For every model of the map under the provider (and variants, and names it does not know): where the
    own path serves it, the same model name, endpoint, parameters, priced or not, the same cost of the same
    usage and the same schema support as litellm's config; where it does not, litellm's fast path does."""
    served = 0
    for name in _corpus(provider):
        route = _route(hermes_home, provider, name)
        own = _openai._build(route, prices)
        if not isinstance(own, _openai.OwnRoute):
            assert own.startswith(("litellm may price", "the model's prices need")), (name, own)
            continue
        served += 1
        fast = _fast(litellm, route)
        assert isinstance(fast, _fastpath.FastRoute), name
        assert (own.model, own.supported) == (fast.model, fast.supported), name
        assert own.url == fast.config.get_complete_url(fast.api_base, None, fast.model, {}, fast.litellm_params), name
        assert (own.prices is not None) == fast.priced, name
        for reported in _usages(len(name)):
            counts = (reported["prompt_tokens"], reported["completion_tokens"],
                      reported["prompt_tokens_details"]["cached_tokens"], 0)
            assert own.cost(route, {"usage": reported}, *counts) == fast.cost(route, {"usage": reported}, *counts), name
        expected = bool(litellm.supports_response_schema(model=name, custom_llm_provider=provider))
        assert _openai.supports_schema(provider, name) == expected, name
    assert served >= 5


@pytest.mark.parametrize("provider", PROVIDERS)
def test_default_endpoint_and_its_variable_are_litellms(hermes_home, litellm, monkeypatch, provider):
    spec = _compat.PROVIDERS[provider]
    for variable in spec.base_env:
        monkeypatch.delenv(variable, raising=False)
    route = _route(hermes_home, provider, "some-model", base=None)
    own = _openai._build(route)
    if spec.default_base is None:  # no endpoint: litellm decides (its own call)
        assert isinstance(own, str) and "no endpoint" in own
    else:
        fast = _fast(litellm, route)
        assert own.url == fast.config.get_complete_url(fast.api_base, None, fast.model, {}, fast.litellm_params)
    monkeypatch.setenv(spec.base_env[0], "http://127.0.0.1:9/from-env/v1/")
    _openai.reset_routes()
    own, fast = _openai._build(route), _fast(litellm, route)
    assert own.url.startswith("http://127.0.0.1:9/from-env/v1")
    assert own.url == fast.config.get_complete_url(fast.api_base, None, fast.model, {}, fast.litellm_params)


# --------------------------------------------------------------------------- request, reply, error

TEXT_PARTS = [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "text", "text": " more"}]}]
REQUESTS = [
    (USER, {}),
    (USER, {"temperature": 0.2, "max_tokens": 9, "top_p": 0.9, "stop": ["x"], "seed": 3, "presence_penalty": 0.1,
            "frequency_penalty": 0.2, "logit_bias": {"5": 1}, "user": "u-1", "n": 1}),
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi", "name": "ann"}], {}),
    (TEXT_PARTS, {}),
    ([{"role": "user", "content": [{"type": "text", "text": ""}]}], {}),
    ([{"role": "user", "content": "define x"},
      {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "lookup", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "x is y"}], {"tools": TOOLS, "tool_choice": "auto"}),
    ([{"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "20"}]}], {}),
    ([{"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
     {}),
    (USER, {"tool_choice": "auto"}),
    (USER, {"tools": TOOLS, "tool_choice": "required"}),
    (USER, {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}}),
    (USER, {"response_format": {"type": "json_object"}}),
    (USER, {"temperature": 0}),
]
#: requests whose handling litellm's config of some provider rewrites: the own path hands them to litellm there
HANDED_ON = [
    ([{"role": "user", "content": [{"type": "text", "text": "see"},
                                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}], {}),
    (USER, {"tools": [{"type": "mcp", "server_label": "x"}]}),
    (USER, {"response_format": {"type": "json_schema", "schema": {"type": "object"}}}),
    (USER, {"temperature": 0}),
]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_requests_are_litellms(hermes_home, litellm, prices, provider):
    """The same body bytes (key order included) and headers as litellm's config builds, for every request the
    own path sends itself; a plain request always is one."""
    names = ["some-model", "mistralai/Mistral-7B-Instruct-v0.1"] + _corpus(provider)[:12]
    for name in names:
        route = _route(hermes_home, provider, name)
        own = _openai._build(route, prices)
        if not isinstance(own, _openai.OwnRoute):
            continue
        fast = _fast(litellm, route)
        assert own.prepare(USER, {"max_tokens": 5}) is not None, name
        for messages, params in REQUESTS + HANDED_ON:
            prepared = own.prepare(messages, dict(params))
            if prepared is None:
                continue
            url, headers, body = _fastpath._request(fast, json.loads(json.dumps(messages)),
                                                    fast.optional_params(dict(params)), "sk-t")
            assert (own.url, own.headers("sk-t")) == (url, headers)
            assert json.dumps(prepared[0]) == json.dumps(body), (name, messages, params)


def test_what_each_config_changes_is_reproduced(hermes_home, prices):
    """The differences themselves, so that the comparison above cannot pass by sending nothing."""
    def body(provider, messages, params, model="some-model"):
        prepared = _openai._build(_route(hermes_home, provider, model), prices).prepare(messages, params)
        return None if prepared is None else prepared[0]

    assert body("deepseek", TEXT_PARTS, {})["messages"][0]["content"] == "see more"
    assert body("sambanova", TEXT_PARTS, {})["messages"][0]["content"] == "see more"
    assert body("together_ai", TEXT_PARTS, {})["messages"][0]["content"] == TEXT_PARTS[0]["content"]
    assert "tool_choice" not in body("deepinfra", USER, {"tools": TOOLS, "tool_choice": "auto"})
    assert body("deepinfra", [{"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "20"}]}],
                {})["messages"][0]["content"] == "20"
    assert body("cerebras", USER, {"n": 2, "seed": 1}) == {"model": "some-model", "messages": USER, "seed": 1}
    assert body("hyperbolic", USER, {"logit_bias": {}}) == {"model": "some-model", "messages": USER}
    assert body("deepseek", USER, {"tools": [{"type": "mcp", "server_label": "x"}]}) is None
    assert body("deepinfra", USER, {"temperature": 0}, model="mistralai/Mistral-7B-Instruct-v0.1") is None
    assert body("lm_studio", USER, {"response_format": {"type": "json_schema", "schema": {}}}) is None


REPLIES = [
    {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": r}],
     "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}} for r in ("stop", "length", None)
] + [
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "{\"word\": \"a\"}"}}]},
                  "finish_reason": "tool_calls"}], "model": "m"},
    {"id": "x", "model": "deepseek-chat", "choices": [{"index": 0, "message": {"role": "assistant", "content": "c"},
                                                      "logprobs": None, "finish_reason": "stop"}],
     "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110,
               "prompt_tokens_details": {"cached_tokens": 60}, "prompt_cache_hit_tokens": 64,
               "prompt_cache_miss_tokens": 36}},
    {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}],
     "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110,
               "prompt_tokens_details": {"cached_tokens": 5}, "cache_read_input_tokens": 7}},
]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_replies_read_as_litellm_reads_them(hermes_home, litellm, prices, provider):
    """The text, tool calls, finish reason, reported model (named as litellm.completion names it) and usage,
    DeepSeek's and Anthropic-style cache counts included, and so the cost."""
    import httpx

    for name in ("some-model", *[n for n in _corpus(provider)[:3]]):
        route = _route(hermes_home, provider, name)
        own = _openai._build(route, prices)
        if not isinstance(own, _openai.OwnRoute):
            continue
        fast = _fast(litellm, route)
        for doc in REPLIES:
            content = json.dumps(doc).encode()
            mine = own.reply(content)
            assert mine is not None, doc
            theirs = fast.reader(fast.config, model=fast.model, raw_response=httpx.Response(200, content=content),
                                 model_response=fast.model_response(), logging_obj=_fastpath._NULL_LOGGING,
                                 request_data={}, messages=USER, optional_params={"tools": TOOLS},
                                 litellm_params=fast.litellm_params, encoding=None, api_key=None, json_mode=None)
            assert read_reply(route, mine, []) == read_reply(route, theirs, []), doc
            assert usage(route, mine, [], own.cost) == usage(route, theirs, [], fast.cost), doc


@pytest.mark.parametrize("provider", PROVIDERS)
def test_error_statuses_map_as_litellm_maps_them(hermes_home, litellm, prices, provider):
    route = _route(hermes_home, provider, "some-model")
    own, fast = _openai._build(route, prices), _fast(litellm, route)
    deadline = time.monotonic() + 60
    mapped = 0
    for body in (b'{"error": {"message": "MARK refused"}}', b"plain text body", b"", b'{"message": "MARK"}',
                 b'{"error": {"message": "Rate limit reached"}}'):
        for status in [*range(300, 310), *range(400, 600)]:
            headers = [(b"Retry-After", b"7"), (b"Content-Type", b"application/json")]
            mine = own.error(status, headers, body)
            if mine is None:
                continue
            mapped += 1
            a, b = map_error(mine, route, None, deadline), map_error(fast.http_error(status, headers, body), route,
                                                                     None, deadline)
            assert (type(a), str(a), vars(a)) == (type(b), str(b), vars(b)), (status, body)
    assert mapped >= 4 * 210


# --------------------------------------------------------------------------- on the wire


@pytest.fixture
def fake():
    with FakeServer() as server:
        yield server


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_calls_on_the_wire(hermes_home, fake, mode, provider):
    """A call, a tool call, a structured call, a rate limit and a refusal: the same requests on the wire and the
    same results, usage, cost and audit records through the own path, the fast path and litellm.completion."""
    configure(hermes_home, fake.base_url, provider=provider, model="some-model")
    out = assert_parity(hermes_home, fake, mode, calls(mode, "complete", USER, temperature=0.5, max_tokens=20),
                        Reply(content="hello from " + provider))
    assert out["outcome"]["text"] == "hello from " + provider
    assert_parity(hermes_home, fake, mode, calls(mode, "chat", [{"role": "user", "content": "define"}], tools=TOOLS),
                  Reply.tool_call("lookup", {"word": provider}))
    assert_parity(hermes_home, fake, mode, calls(mode, "complete_structured", instructions="Extract",
                                                 input=["ACME 12.50"], json_schema=SCHEMA),
                  Reply.json('{"vendor": "ACME", "total": 12.5}'))
    # (litellm.completion retries a 429 inside the openai SDK for some of these providers: own and fast here)
    got = assert_parity(hermes_home, fake, mode, calls(mode, "complete", USER),
                        Reply.error(429, "slow down", headers={"Retry-After": "7"}), paths=["own", "fast"])["outcome"]
    assert got["status"] == 429 and got["retry_after"] == 7.0
    assert_parity(hermes_home, fake, mode, calls(mode, "complete", USER), Reply.error(401, "who are you"))


@pytest.mark.parametrize("mode", MODES)
def test_deepseek_cache_hits_priced_on_the_wire(hermes_home, fake, mode):
    """DeepSeek's cache-hit count read as litellm reads it, priced from the map, on every path."""
    configure(hermes_home, fake.base_url, provider="deepseek", model="deepseek-chat")
    reported = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200,
                "prompt_tokens_details": {"cached_tokens": 0}, "prompt_cache_hit_tokens": 640,
                "prompt_cache_miss_tokens": 360}
    out = assert_parity(hermes_home, fake, mode, calls(mode, "complete", USER), Reply(usage=reported))
    got = out["outcome"]["usage"]
    assert got["cache_read_tokens"] == 640 and got["cost_usd"] > 0
    assert out["audit"]["cost_usd"] == got["cost_usd"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", ["deepseek", "together_ai", "cerebras"])
def test_streams_on_the_wire(hermes_home, fake, mode, provider):
    """A stream, a rate-limited stream and a failed one: the same request and outcome through the own path and
    the fast path."""
    configure(hermes_home, fake.base_url, provider=provider, model="some-model")
    for reply in (Reply(content="a streamed reply"), Reply.error(429, "slow", headers={"Retry-After": "0"}),
                  Reply.error(500, "upstream broke")):
        got = []
        for own in (True, False):
            fake.push(reply)
            llm = PluginLlm("p", transport=LitellmTransport(own_path=own))
            try:
                if mode == "sync":
                    result = "".join(llm.stream(USER, max_tokens=30))
                else:
                    async def read():
                        stream = await llm.astream(USER, max_tokens=30)
                        return "".join([d async for d in stream])
                    result = asyncio.run(read())
            except PluginLlmError as exc:
                result = outcome(exc)
            record = same_ids({k: v for k, v in audit_lines(hermes_home)[-1].items() if k not in VARYING}, fake)
            got.append((fake.requests[-1].path, fake.requests[-1].json, result, record))
        assert got[0] == got[1]
    assert got[0][1]["stream"] is True


def test_the_own_path_sends_without_litellm(hermes_home, fake, monkeypatch):
    """A deepseek call on the own path never asks for litellm (its import is what the path saves)."""
    from plugin_llm.transport import _loading

    def refuse():
        raise AssertionError("litellm was loaded")

    configure(hermes_home, fake.base_url, provider="deepseek", model="deepseek-chat")
    monkeypatch.setattr(_loading, "_import", refuse)
    monkeypatch.setattr(_loading, "_litellm", None)
    fake.push(Reply(content="no litellm"))
    transport = LitellmTransport()
    assert transport.path(_route(hermes_home, "deepseek", "deepseek-chat", base=fake.base_url))[0] == "own"
    result = PluginLlm("p", transport=transport).complete(USER)
    assert result.text == "no litellm" and result.usage.cost_usd > 0
