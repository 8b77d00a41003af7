"""The fast path: litellm's provider layer, the request sent on a pooled client the gateway owns.

litellm stays in charge of everything provider-specific, through its provider config class
(``ProviderConfigManager``): parameter mapping, headers, URL, request and reply transforms, error
classes, prices. The gateway sends the request itself: sync on one pooled ``httpx.Client`` (every
socket operation bounded by the call's deadline), async on one pooled ``aiohttp.ClientSession``
per event loop under ``asyncio.timeout``. Per route, once: :class:`FastRoute`. Deadline, retries,
``Retry-After``, key pools and redaction are the transport's, shared with the fallback.

Which routes: :data:`FAST_PROVIDERS` with litellm in :data:`TESTED_LITELLM`, unless
``PLUGIN_LLM_FAST_PATH=0``; each is checked against the fallback by
tests/test_transport_parity.py. :func:`decide` says which and why without importing litellm.
Why it exists (the CPU ``litellm.completion`` spends per call): docs/design.md, "Transport".
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from plugin_llm.routing import Route
from plugin_llm.transport._deadline import IO
from plugin_llm.transport._keys import Key
from plugin_llm.transport._reply import as_cost

__all__ = ["FAST_PROVIDERS", "TESTED_LITELLM", "FAST_PATH_ENV", "decide", "FastRoute", "fast_route", "reset_clients"]

#: litellm providers served by the fast path: their config class implements the
#: transform interface, they authenticate with a key in a header, and
#: tests/test_transport_parity.py finds the same request body, text, model, usage
#: and cost as through ``litellm.completion``. (``custom`` routes are ``openai``.)
FAST_PROVIDERS = frozenset({
    "openai", "openrouter", "deepseek", "mistral", "together_ai", "fireworks_ai", "deepinfra",
    "perplexity", "cerebras", "xai", "nvidia_nim", "hosted_vllm", "lm_studio", "sambanova", "nebius",
    "hyperbolic", "moonshot", "dashscope", "llamafile", "litellm_proxy",
})
#: the fast providers that ``litellm.completion`` sends through the openai SDK (its generic
#: OpenAI-compatible branch): their replies are read as that branch reads them (the OpenAI
#: config's reader, the model named "<provider>/<reported>"); the others through litellm's
#: HTTP handler, which reads them with the provider config's own ``transform_response``.
#: tests/test_transport_parity.py checks this split against litellm's dispatch.
SDK_READ_PROVIDERS = frozenset({
    "openai", "cerebras", "dashscope", "deepinfra", "hyperbolic", "litellm_proxy", "llamafile", "lm_studio",
    "moonshot", "nebius", "nvidia_nim", "perplexity", "sambanova",
})
#: the litellm releases the fast path was tested with: [low, high) by (major, minor)
TESTED_LITELLM = ((1, 110), (1, 111))
#: ``PLUGIN_LLM_FAST_PATH=0`` sends every call through ``litellm.completion``
FAST_PATH_ENV = "PLUGIN_LLM_FAST_PATH"

#: the litellm parameters a request may carry (the gateway sends no others)
_PARAMS = ("temperature", "max_tokens", "response_format", "tools", "tool_choice", "top_p", "stop", "seed",
           "presence_penalty", "frequency_penalty", "logit_bias", "user", "n")
#: price-map entries that do not apply to a plain chat call (service tiers, batches, web search)
_INAPPLICABLE_PRICE_SUFFIXES = ("_priority", "_flex", "_batches")
_SIMPLE_PRICES = frozenset({"input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost",
                            "cache_creation_input_token_cost"})


# ------------------------------------------------------------ which routes
def switched_off() -> bool:
    return os.environ.get(FAST_PATH_ENV, "").strip().lower() in ("0", "off", "false", "no")


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _installed_litellm() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        return None


_VERSION: list[str | None] = []


def litellm_version() -> str | None:
    """The installed litellm's version, from package metadata (never imports it)."""
    if not _VERSION:
        _VERSION.append(_installed_litellm())
    return _VERSION[0]


def decide(route: Route) -> tuple[bool, str]:
    """Whether ``route`` takes the fast path, and why (no litellm import)."""
    provider = route.litellm_model.split("/", 1)[0]
    if switched_off():
        return False, f"{FAST_PATH_ENV}=0 sends every call through litellm.completion"
    if provider == "local":
        return False, "the embedded local model runs in process through litellm's custom-provider hook"
    if provider not in FAST_PROVIDERS:
        return False, (f"provider {provider} is not on the fast path (it is not OpenAI-compatible, or signs "
                       "requests through its SDK): calls go through litellm.completion")
    version = litellm_version()
    low, high = TESTED_LITELLM
    if version is None or not (low <= _version_tuple(version)[:2] < high):
        return False, (f"litellm {version or '(not installed)'} is outside the range the fast path was tested "
                       f"with ({'.'.join(map(str, low))} to before {'.'.join(map(str, high))}): calls go through "
                       "litellm.completion")
    what = "OpenAI-compatible endpoint" if route.provider == "custom" else f"provider {provider}"
    return True, f"{what} through litellm's {provider} provider config on the gateway's pooled HTTP clients"


# ------------------------------------------------------------ the route, resolved once
class _NullLogging:
    """Stands in for litellm's per-call Logging object: the gateway audits the call itself."""

    def __init__(self) -> None:
        self.model_call_details: dict[str, Any] = {}
        self.optional_params: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return _noop


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


_NULL_LOGGING = _NullLogging()


@dataclass(frozen=True, eq=False)
class FastRoute:
    """What the fast path needs of one route, resolved once."""

    provider: str  # litellm's provider name
    model: str  # the model name the provider sees
    api_base: str | None = field(repr=False)  # its userinfo is a secret
    config: Any  # litellm's provider config (a BaseConfig)
    supported: frozenset[str]
    litellm_params: dict[str, Any] = field(repr=False)  # holds api_base too
    prices: tuple[float, float, float | None, float | None] | None  # simple prices, or None
    priced: bool  # in the price map at all (False: cost is unknown)
    litellm: Any
    plain_replies: bool  # plain replies are read as OpenAIGPTConfig.transform_response reads them: see reply()
    sdk: bool  # litellm.completion reaches this provider through the openai SDK (SDK_READ_PROVIDERS)
    prefixed: bool  # the reported model is named "<provider>/<model>"
    reader: Any  # the transform_response function litellm.completion reads this provider's replies with

    # -- per attempt: request
    def optional_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The provider's optional parameters for ``params`` (unsupported ones dropped, as drop_params does)."""
        given = {k: v for k, v in params.items() if v is not None and k in self.supported}
        if "response_format" in given:
            given["response_format"] = self.config.get_json_schema_from_pydantic_object(given["response_format"])
        return self.config.map_openai_params(given, {}, self.model, True)

    def model_response(self) -> Any:
        response = self.litellm.ModelResponse()
        if self.prefixed:  # as litellm.completion names the model of a provider it reaches through the openai SDK
            response.model = f"{self.provider}/{self.model}"
        return response

    # -- per attempt: reply
    def reply(self, status: int, headers: Any, content: bytes, body: dict, messages: list, optional: dict) -> Any:
        """The provider's reply as litellm's ``ModelResponse`` (``transform_response``).

        For a provider whose config reads replies with the OpenAI config's own
        ``transform_response``, a plain text reply (:func:`_plain_reply`) is read
        straight from the JSON body with litellm's own helpers, to the same
        text, finish reason, model and usage; anything else takes litellm's
        full reader.
        """
        if self.plain_replies:
            plain = _plain_reply(content, self.model, self.provider if self.prefixed else None)
            if plain is not None:
                return plain
        import httpx

        raw = httpx.Response(status, headers=_headers(headers), content=content)
        return self.reader(
            self.config, model=self.model, raw_response=raw, model_response=self.model_response(), logging_obj=_NULL_LOGGING,
            request_data=body, messages=messages, optional_params=optional, litellm_params=self.litellm_params,
            encoding=None, api_key=None, json_mode=optional.get("json_mode"),
        )

    def http_error(self, status: int, headers: Any, content: bytes) -> BaseException:
        """An error status as litellm's exception (``get_error_class``, then litellm's exception mapping)."""
        from litellm.litellm_core_utils.exception_mapping_utils import exception_type

        # the openai SDK hands litellm the error body's message; litellm's HTTP handler, the whole body
        text = _error_text(content) if self.sdk else content.decode("utf-8", "replace")
        provider_error = self.config.get_error_class(error_message=text, status_code=status,
                                                     headers=dict(_headers(headers)))
        try:
            exception_type(model=self.model, original_exception=provider_error, custom_llm_provider=self.provider)
        except Exception as mapped:  # exception_type raises the mapped error
            mapped.__context__ = mapped.__cause__ = None
            return mapped
        return provider_error  # pragma: no cover - exception_type always raises

    def cost(self, route: Route, response: Any, prompt: int, completion: int, cache_read: int,
             cache_write: int) -> float | None:
        """The call's cost from litellm's price map, as litellm's cost calculator computes it."""
        if not self.priced:
            return None
        if self.prices is not None and not cache_write:
            inp, out, read, _ = self.prices
            read = inp if read is None else read
            return (prompt - cache_read) * inp + cache_read * read + completion * out
        usage = response.get("usage") if isinstance(response, dict) else getattr(response, "usage", None)
        if isinstance(usage, dict):  # a plain reply: litellm's calculator takes its Usage
            usage = self.litellm.Usage(**usage)
        if usage is None:
            return None
        try:  # litellm's own calculator (tiers, provider rules such as fireworks' by model size)
            inp_cost, out_cost = self.litellm.cost_per_token(
                model=self.model, custom_llm_provider=self.provider, usage_object=usage,
                prompt_tokens=prompt, completion_tokens=completion)
        except Exception:
            return None
        return as_cost(inp_cost + out_cost)


def _headers(headers: Any) -> Any:
    """Reply headers as httpx.Headers (httpcore gives a list of byte pairs, aiohttp a multidict)."""
    import httpx

    if isinstance(headers, list):
        return httpx.Headers(headers)
    return headers


def _error_text(content: bytes) -> str:
    """The message of an error body (``{"error": {"message": ...}}`` and kin), else the body's text."""
    text = content.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    if isinstance(doc, dict):
        error = doc.get("error", doc)
        if isinstance(error, dict):
            message = error.get("message")
            if isinstance(message, str):
                return message
        elif isinstance(error, str):
            return error
        message = doc.get("message")
        if isinstance(message, str):
            return message
    return text


def _prices(litellm: Any, model: str, provider: str) -> tuple[bool, tuple | None]:
    """(priced at all, simple per-token prices or None when litellm's calculator is needed)."""
    try:
        info = litellm.get_model_info(model=model, custom_llm_provider=provider)
    except Exception:  # not in the price map: a provider-wide rule may still price it
        try:
            litellm.cost_per_token(model=model, custom_llm_provider=provider, prompt_tokens=1, completion_tokens=1)
        except Exception:
            return False, None
        return True, None
    costs = {k for k, v in info.items() if "cost" in k and v is not None
             and not k.endswith(_INAPPLICABLE_PRICE_SUFFIXES) and k != "search_context_cost_per_query"}
    if not costs <= _SIMPLE_PRICES or info.get("input_cost_per_token") is None \
            or info.get("output_cost_per_token") is None:
        return True, None
    return True, (float(info["input_cost_per_token"]), float(info["output_cost_per_token"]),
                  None if info.get("cache_read_input_token_cost") is None else float(info["cache_read_input_token_cost"]),
                  None if info.get("cache_creation_input_token_cost") is None
                  else float(info["cache_creation_input_token_cost"]))


_ROUTES: dict[tuple, "FastRoute | str"] = {}
_ROUTES_LOCK = threading.Lock()


def fast_route(litellm: Any, route: Route) -> "FastRoute | str":
    """The route's :class:`FastRoute`, or why it takes the fallback (decided once per route)."""
    if switched_off():  # looked up per call: the switch takes effect without a restart
        return f"{FAST_PATH_ENV}=0 sends every call through litellm.completion"
    key = (route.provider, route.litellm_model, route.base_url)
    found = _ROUTES.get(key)
    if found is None:
        with _ROUTES_LOCK:
            found = _ROUTES.get(key)
            if found is None:
                found = _ROUTES[key] = _build(litellm, route)
    return found


def _build(litellm: Any, route: Route) -> "FastRoute | str":
    fast, why = decide(route)
    if not fast:
        return why
    try:
        from litellm.types.utils import LlmProviders
        from litellm.utils import ProviderConfigManager

        model, provider, _, dynamic_base = litellm.get_llm_provider(model=route.litellm_model, api_base=route.base_url)
        config = ProviderConfigManager.get_provider_chat_config(model=model, provider=LlmProviders(provider))
    except Exception as exc:  # an unknown provider name, a litellm without the interface
        return f"litellm has no provider config for {route.litellm_model} ({type(exc).__name__})"
    missing = [name for name in ("map_openai_params", "validate_environment", "get_complete_url", "transform_request",
                                 "transform_response", "get_error_class", "get_supported_openai_params")
               if not callable(getattr(config, name, None))]
    if config is None or missing:
        return f"litellm's config for {provider} lacks {', '.join(missing) or 'a chat config'}"
    api_base = route.base_url or dynamic_base
    if api_base is None and provider == "openai":
        api_base = config.get_api_base(None)
    priced, prices = _prices(litellm, model, provider)
    from litellm.llms.openai.chat.gpt_transformation import OpenAIGPTConfig

    reader = OpenAIGPTConfig.transform_response if provider in SDK_READ_PROVIDERS else type(config).transform_response
    return FastRoute(
        provider=provider, model=model, api_base=api_base, config=config,
        supported=frozenset(config.get_supported_openai_params(model) or ()) & frozenset(_PARAMS),
        litellm_params={"custom_llm_provider": provider, "api_base": api_base},
        prices=prices, priced=priced, litellm=litellm, plain_replies=reader is OpenAIGPTConfig.transform_response,
        sdk=provider in SDK_READ_PROVIDERS, prefixed=provider in SDK_READ_PROVIDERS and provider != "openai",
        reader=reader,
    )


#: message fields a plain reply may carry (the others, when not null, take litellm's full reader)
_PLAIN_MESSAGE = frozenset({"role", "content"})
_NULLABLE_MESSAGE = frozenset({"tool_calls", "function_call", "refusal", "audio", "annotations"})
_PLAIN_CHOICE = frozenset({"index", "message", "finish_reason", "logprobs"})


def _plain_reply(content: bytes, model: str, prefix: str | None) -> dict | None:
    """A plain text chat completion as the few fields the gateway reads, or None when it is anything else.

    Plain: one or more choices, the first a dict with a ``message`` of role and
    string content only (no tool calls, no reasoning fields, no leading
    ``<think>``-style tag, which litellm would split off), a string finish
    reason, usage of small non-negative integers. The result is what litellm's
    ``convert_to_model_response_object`` makes of such a reply: the finish
    reason mapped by litellm's ``map_finish_reason`` (none -> ``stop``), the
    model named ``<prefix>/<reported>`` when ``prefix`` is given (as
    ``litellm.completion`` names it for providers behind the openai SDK).
    tests/test_transport_parity.py compares both readers on many shapes.
    """
    from litellm.litellm_core_utils.core_helpers import map_finish_reason

    try:
        doc = json.loads(content)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict) or not choice.keys() <= _PLAIN_CHOICE or choice.get("logprobs") is not None:
        return None
    for name, value in message.items():
        if name not in _PLAIN_MESSAGE and not (name in _NULLABLE_MESSAGE and value is None):
            return None
    text = message.get("content")
    if not (text is None or (isinstance(text, str) and not text.startswith("<"))):
        return None
    finish = choice.get("finish_reason")
    if finish is None:
        finish = "stop"
    elif not isinstance(finish, str):
        return None
    usage = doc.get("usage")
    if usage is not None and not _plain_usage(usage):
        return None
    reported = doc.get("model")
    if reported is not None and not isinstance(reported, str):
        return None
    if prefix is not None:
        reported = f"{prefix}/{reported if reported is not None else model}"
    return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": map_finish_reason(finish)}],
            "model": reported, "usage": litellm_usage(usage), "id": doc.get("id")}


def litellm_usage(usage: Any) -> Any:
    """A plain usage as litellm's ``Usage`` gives the counts the gateway reads: DeepSeek's
    ``prompt_cache_hit_tokens``, then an Anthropic-style ``cache_read_input_tokens``, become the cached
    tokens of ``prompt_tokens_details`` (the same object when there is nothing to move)."""
    if type(usage) is not dict:
        return usage
    cached = None
    for name in ("prompt_cache_hit_tokens", "cache_read_input_tokens"):
        if type(usage.get(name)) is int:
            cached = usage[name]
    if cached is None:
        return usage
    details = usage.get("prompt_tokens_details")
    return {**usage, "prompt_tokens_details": {**(details if type(details) is dict else {}), "cached_tokens": cached}}


def _plain_usage(usage: Any) -> bool:
    if not isinstance(usage, dict):
        return False
    for value in usage.values():
        if isinstance(value, dict):
            if not all(v is None or (type(v) is int and 0 <= v <= 10**9) for v in value.values()):
                return False
        elif not (value is None or (type(value) is int and 0 <= value <= 10**9)):
            return False
    return True


# ------------------------------------------------------------ sending
def send(fast: FastRoute, request: Any, key: Key) -> Any:
    """One sync attempt: the provider's ``ModelResponse``, or litellm's exception for an error status."""
    optional = fast.optional_params(request.params)
    outer, IO.deadline = getattr(IO, "deadline", None), request.deadline  # every socket operation bounded
    try:
        status, headers, content, body = _post(fast, request.messages, optional, key, request.deadline)
    finally:
        IO.deadline = outer
    if not 200 <= status < 300:  # redirects are not followed (as by the openai SDK and litellm's handler)
        raise fast.http_error(status, headers, content)
    return fast.reply(status, headers, content, body, request.messages, optional)


async def asend(fast: FastRoute, request: Any, key: Key) -> Any:
    """One async attempt, bounded by the deadline as a whole (``asyncio.timeout``)."""
    optional = fast.optional_params(request.params)
    async with asyncio.timeout(max(request.deadline - time.monotonic(), 0.0)):
        status, headers, content, body = await _apost(fast, request.messages, optional, key)
    if not 200 <= status < 300:
        raise fast.http_error(status, headers, content)
    return fast.reply(status, headers, content, body, request.messages, optional)


def _request(fast: FastRoute, messages: list, optional: dict, secret: str | None) -> tuple[str, dict, dict]:
    """(url, headers, body) of one attempt: only this frame and the sender's hold the headers with the key."""
    config = fast.config
    headers = config.validate_environment({}, fast.model, messages, optional, fast.litellm_params,
                                          api_key=secret, api_base=fast.api_base)
    url = config.get_complete_url(fast.api_base, secret, fast.model, optional, fast.litellm_params)
    body = config.transform_request(fast.model, messages, optional, fast.litellm_params, headers)
    return url, headers, body


def _post(fast: FastRoute, messages: list, optional: dict, key: Key, deadline: float):
    url, headers, body = _request(fast, messages, optional, key.reveal())
    left = max(deadline - time.monotonic(), 0.001)
    content = json.dumps(body).encode()
    if _proxy(url) is None:  # httpcore's pool directly: httpx's client layers cost ~150 µs of CPU per call
        response = _sync_pool().request(
            "POST", url, content=content, extensions={"timeout": {"connect": left, "read": left, "write": left,
                                                                   "pool": left}},
            headers=[*_SYNC_HEADERS, *((name.encode("ascii"), value.encode("ascii")) for name, value in headers.items())],
        )
        return response.status, response.headers, response.content, body
    response = _sync_client().post(url, content=content, headers=headers, timeout=left)  # through the proxy
    return response.status_code, response.headers, response.content, body


async def _apost(fast: FastRoute, messages: list, optional: dict, key: Key):
    url, headers, body = _request(fast, messages, optional, key.reveal())
    async with _session().post(url, data=json.dumps(body).encode(), headers=headers, proxy=_proxy(url),
                               allow_redirects=False) as response:
        content = await response.read()
        return response.status, response.headers, content, body


# ------------------------------------------------------------ the pooled clients
_CLIENT_LOCK = threading.Lock()
_client: Any = None
_pool: Any = None
_SYNC_HEADERS = ((b"Accept", b"application/json"), (b"User-Agent", b"plugin-llm-gateway"))


def _sync_pool() -> Any:
    """The pooled httpcore connection pool of sync attempts without a proxy (TLS as httpx verifies it)."""
    global _pool
    if _pool is None:
        with _CLIENT_LOCK:
            if _pool is None:
                import httpcore
                import httpx

                _pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), max_connections=None,
                                                max_keepalive_connections=64, keepalive_expiry=5.0)
    return _pool
_sessions: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, Any]]" = weakref.WeakKeyDictionary()


def _sync_client() -> Any:
    """The pooled httpx client of sync attempts through an HTTP(S)_PROXY."""
    global _client
    if _client is None:
        with _CLIENT_LOCK:
            if _client is None:
                import httpx

                _client = httpx.Client(
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                    follow_redirects=False,
                )
    return _client


def _session() -> Any:
    """This event loop's pooled aiohttp session (closed when the loop shuts its async generators down)."""
    loop = asyncio.get_running_loop()
    entry = _sessions.get(loop)
    session = entry[0] if entry is not None else None
    if session is None or session.closed:
        import aiohttp
        import httpx

        connector = aiohttp.TCPConnector(limit=0, ssl=httpx.create_ssl_context(), enable_cleanup_closed=False)
        # trust_env=False: with it aiohttp looks up .netrc and the proxy variables on an executor thread
        # for every request; the proxy is looked up once per endpoint instead (_proxy)
        session = aiohttp.ClientSession(connector=connector, trust_env=False, auto_decompress=True,
                                        cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=None))
        closer = _close_at_shutdown(session)  # held with the session: collected with the loop, not before
        _sessions[loop] = (session, closer)
        loop.create_task(_first_step(closer))  # the loop now tracks it: shutdown_asyncgens() closes the session
    return session


_PROXIES: dict[str, Any] = {}


def _proxy(url: str) -> Any:
    """The proxy for ``url`` from HTTP(S)_PROXY/NO_PROXY (looked up once per scheme and host), or None."""
    origin = url.split("/", 3)[:3]
    where = "/".join(origin)
    if where not in _PROXIES:
        from aiohttp.helpers import get_env_proxy_for_url
        from yarl import URL

        try:
            _PROXIES[where] = get_env_proxy_for_url(URL(url))[0]
        except LookupError:
            _PROXIES[where] = None
    return _PROXIES[where]


async def _first_step(generator: Any) -> None:
    await generator.__anext__()


async def _close_at_shutdown(session: Any):
    try:
        yield
    finally:
        await session.close()


def reset_clients() -> None:
    """Forget the pooled clients (after fork: the child must not share the parent's connections)."""
    global _client, _pool
    _client = _pool = None
    _sessions.clear()
    _PROXIES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reset_clients)
