"""The gateway's own OpenAI path: ``openai``, ``custom`` and OpenAI-like routes without importing litellm.

For the routes litellm serves with its plain OpenAI chat config (``OpenAIGPTConfig`` or
``OpenAIUnknownModelConfig``: not o-series, not gpt-5), or with a provider config that is OpenAI's
plus the differences ``_compat`` reproduces, and whose prices are plain per-token ones,
:class:`OwnRoute` builds the request exactly as that config does, sends it on the pooled clients
(``_http``), reads a plain reply, maps an error status to the error litellm would raise, and prices
the usage from litellm's bundled price map (``_pricemap``). Whatever it cannot reproduce exactly (a
request with cache marks or regex patterns, a reply with reasoning fields, an error text that
litellm's mapping inspects, a cache-write usage) is handed to litellm's fast path, litellm loaded
then. tests/test_transport_own.py compares both, request by request, on the wire.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from plugin_llm.routing import Route
from plugin_llm.transport import _compat, _fastpath, _http
from plugin_llm.transport._keys import Key
from plugin_llm.transport._pricemap import PriceMap, described_by_rule, mapped_anywhere, openai_entry, provider_entry

__all__ = ["OwnRoute", "own_route", "send", "asend", "reset_routes", "supports_schema", "warm", "awarm",
           "plain_messages"]

#: finish reasons litellm's ``map_finish_reason`` keeps as they are
_KEPT_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
_ROLES = frozenset({"system", "user", "assistant", "tool"})
#: keys whose presence makes litellm rewrite a request (prompt-cache marks)
_MARKS = frozenset({"cache_control", "prompt_cache_breakpoint"})
#: top-level keys of a tool schema that litellm flattens for api.openai.com
_COMBINATORS = frozenset({"allOf", "anyOf", "oneOf", "enum", "const", "not"})
_SIMPLE_PRICES = _fastpath._SIMPLE_PRICES
#: a price litellm's cost calculator never reads (DeepSeek's alias of the cache-read price)
_INERT_PRICES = frozenset({"input_cost_per_token_cache_hit"})
#: entry fields other than ``*cost*`` ones that change what litellm's calculator charges
_PRICING_RULES = frozenset({"off_peak_pricing", "tiered_pricing", "alias_of"})
#: litellm's exception for an error status of an OpenAI-compatible reply: (class name, message prefix)
_ERRORS = {400: ("BadRequestError", ""), 401: ("AuthenticationError", "AuthenticationError: "),
           404: ("NotFoundError", "NotFoundError: "), 408: ("Timeout", "Timeout Error: "),
           422: ("BadRequestError", ""), 429: ("RateLimitError", "RateLimitError: "),
           500: ("InternalServerError", "InternalServerError: "), 502: ("BadGatewayError", "BadGatewayError: "),
           503: ("ServiceUnavailableError", "ServiceUnavailableError: "), 504: ("Timeout", "Timeout Error: ")}
#: words in an error text that litellm's exception mapping looks at (any one: litellm maps the error)
_INSPECTED = ("429", "rate", "limit", "capacity", "context", "too long", "too large", "maximum", "exceed", "token",
              "model_not_found", "timeout", "timed out", "time out", "invalid_request_error", "policy", "safety",
              "invalid prompt", "encrypted", "verified", "unknown error", "server had an error", "api_key", "mistral",
              "openai", "cyber", "length", "input", "request_too_large")


@dataclass(frozen=True, eq=False)
class OwnRoute:
    """What the own path needs of one route, resolved once, without litellm."""

    model: str  # the name the provider sees
    url: str = field(repr=False)  # its userinfo is a secret
    supported: frozenset[str]
    prices: tuple[float, float, float | None] | None  # input, output, cache read per token; None: unpriced
    openai_host: bool  # api.openai.com: litellm flattens tool schemas' top-level combinators
    provider: str = "openai"  # litellm's provider name
    shape: "_compat.Shape | None" = None  # another provider's differences from OpenAI's config
    prefix: str | None = None  # the reply's model named "<prefix>/<reported>" (litellm through the openai SDK)
    body_errors: bool = False  # an error's text is its whole body (litellm's HTTP handler), not its message

    # -- request
    def prepare(self, messages: list, params: dict) -> tuple[dict, dict] | None:
        """(body, optional params) as litellm's OpenAI config makes them, or None when it would rewrite them."""
        if not plain_messages(messages):
            return None
        optional = {k: v for k, v in params.items() if v is not None and k in self.supported}
        response_format = optional.get("response_format")
        if response_format is not None and type(response_format) is not dict:
            return None
        tools = optional.get("tools")
        if tools is not None and not self._plain_tools(tools):
            return None
        if self.shape is not None:
            adapted = self.shape.adapt(messages, optional)
            if adapted is None:
                return None
            messages, optional = adapted
        if not optional.get("tools"):
            optional.pop("tool_choice", None)
        return {"model": self.model, "messages": messages, **optional}, optional

    def _plain_tools(self, tools: Any) -> bool:
        if type(tools) is not list:
            return False
        for tool in tools:
            if type(tool) is not dict or _marked(tool, patterns=True):
                return False
            if self.openai_host:
                function = tool.get("function")
                parameters = function.get("parameters") if type(function) is dict else None
                if type(parameters) is dict and not _COMBINATORS.isdisjoint(parameters):
                    return False
        return True

    @staticmethod
    def headers(secret: str | None) -> dict[str, str]:
        """``OpenAIGPTConfig.validate_environment``'s headers (only this frame and the sender's hold the key)."""
        if secret is None:
            return {"Content-Type": "application/json"}
        return {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}

    # -- reply
    def read(self, content: bytes) -> dict | None:
        """A plain chat completion (text or function calls) as the fields the gateway reads, else None."""
        try:
            doc = json.loads(content)
        except ValueError:
            return None
        if type(doc) is not dict:
            return None
        choices = doc.get("choices")
        if type(choices) is not list or not choices or type(choices[0]) is not dict:
            return None
        choice = choices[0]
        message = choice.get("message")
        if type(message) is not dict or not choice.keys() <= _fastpath._PLAIN_CHOICE \
                or choice.get("logprobs") is not None:
            return None
        calls = message.get("tool_calls")
        for name, value in message.items():
            if name not in _fastpath._PLAIN_MESSAGE and name != "tool_calls" \
                    and not (name in _fastpath._NULLABLE_MESSAGE and value is None):
                return None
        text = message.get("content")
        finish = choice.get("finish_reason")
        if calls is not None:
            if not _plain_calls(calls) or text is not None or finish != "tool_calls":
                return None
        elif not (text is None or (type(text) is str and not text.startswith("<"))):
            return None
        if finish is None:
            finish = "stop"
        elif finish not in _KEPT_FINISH:
            return None
        usage = doc.get("usage")
        if usage is not None and not _fastpath._plain_usage(usage):
            return None
        model = doc.get("model")
        if model is not None and type(model) is not str:
            return None
        out: dict[str, Any] = {"role": "assistant", "content": text}
        if calls is not None:
            out["tool_calls"] = [{"id": c["id"], "type": "function", "function": dict(c["function"])} for c in calls]
        return {"choices": [{"message": out, "finish_reason": finish}], "model": model, "usage": usage,
                "id": doc.get("id")}

    def reply(self, content: bytes) -> dict | None:
        """:meth:`read`, with the model named and the usage read as litellm.completion names and reads them."""
        out = self.read(content)
        if out is None:
            return None
        usage = out.get("usage")
        read = _fastpath.litellm_usage(usage)
        if read is not usage or self.prefix is not None:
            out = dict(out)
            out["usage"] = read
            if self.prefix is not None:
                out["model"] = f"{self.prefix}/{out['model'] if out['model'] is not None else self.model}"
        return out

    def error(self, status: int, headers: Any, content: bytes) -> BaseException | None:
        """The error litellm raises for this error reply (same class name, message, status, headers), or
        None when litellm's mapping would look into the text (then litellm maps it)."""
        text = content.decode("utf-8", "replace") if self.body_errors else _fastpath._error_text(content)
        lowered = text.lower()
        if any(word in lowered for word in _INSPECTED):
            return None
        name, prefix = _ERRORS.get(status, ("APIError", "APIError: "))
        raised_by = "OpenAI" if self.provider == "openai" else self.provider[:1].upper() + self.provider[1:]
        error = _error_class(name)(f"litellm.{name}: {prefix}{raised_by}Exception - {text}")
        error.message = error.args[0]  # type: ignore[attr-defined]
        error.status_code = status  # type: ignore[attr-defined]
        error.litellm_response_headers = _Headers(headers)  # type: ignore[attr-defined]
        return error

    def cost(self, route: Route, response: Any, prompt: int, completion: int, cache_read: int,
             cache_write: int) -> float | None:
        """The cost the fast path computes from the same prices (a cache write: litellm's calculator)."""
        if self.prices is None:
            return None
        if cache_write:
            from plugin_llm.transport._loading import load_litellm

            fast = _fastpath.fast_route(load_litellm(), route)
            return fast.cost(route, response, prompt, completion, cache_read, cache_write) \
                if isinstance(fast, _fastpath.FastRoute) else None
        inp, out, read = self.prices
        read = inp if read is None else read
        return (prompt - cache_read) * inp + cache_read * read + completion * out


_error_classes: dict[str, type] = {}


def _error_class(name: str) -> type:
    """An exception class named as litellm's (the error mapping reads class names: ``Timeout``)."""
    found = _error_classes.get(name)
    if found is None:
        found = _error_classes[name] = type(name, (Exception,), {"__module__": __name__})
    return found


class _Headers:
    """Reply headers, looked up without case (httpcore's list of byte pairs or aiohttp's multidict)."""

    __slots__ = ("_items",)

    def __init__(self, headers: Any) -> None:
        items: dict[str, str] = {}
        pairs = headers if isinstance(headers, list) else list(headers.items()) if headers is not None else []
        for name, value in pairs:
            name = name.decode("latin-1") if isinstance(name, bytes) else str(name)
            value = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            key = name.lower()
            items[key] = f"{items[key]}, {value}" if key in items else value
        self._items = items

    def get(self, name: str, default: Any = None) -> Any:
        return self._items.get(name.lower(), default)

    def __bool__(self) -> bool:
        return bool(self._items)


def _plain_calls(calls: Any) -> bool:
    if type(calls) is not list or not calls:
        return False
    for call in calls:
        if type(call) is not dict or not call.keys() <= {"id", "type", "function", "index"} \
                or call.get("type") != "function" or type(call.get("id")) is not str:
            return False
        function = call.get("function")
        if type(function) is not dict or not function.keys() <= {"name", "arguments"}:
            return False
        name, arguments = function.get("name"), function.get("arguments")
        if type(name) is not str or not name or name == "multi_tool_use.parallel" or type(arguments) is not str:
            return False
    return True


def _marked(value: Any, *, patterns: bool = False, depth: int = 0) -> bool:
    """Whether ``value`` holds a prompt-cache mark (or, with ``patterns``, a regex keyword) anywhere."""
    if depth > 64:
        return True
    if type(value) is dict:
        for key, item in value.items():
            if key in _MARKS or (patterns and type(key) is str and key.startswith("pattern")):
                return True
            if type(item) in (dict, list) and _marked(item, patterns=patterns, depth=depth + 1):
                return True
    elif type(value) is list:
        return any(type(item) in (dict, list) and _marked(item, patterns=patterns, depth=depth + 1) for item in value)
    return False


def plain_messages(messages: Any) -> bool:
    """Messages litellm's OpenAI config sends as they are: known roles, text (and, from the user, image URL)
    parts, no prompt-cache marks."""
    if type(messages) is not list:
        return False
    for message in messages:
        if type(message) is not dict:
            return False
        role = message.get("role")
        if role not in _ROLES:
            return False
        for key, value in message.items():
            if key == "content":
                if value is None or type(value) is str:
                    continue
                if type(value) is not list or not all(_plain_part(part, role) for part in value):
                    return False
            elif key in ("role", "name", "tool_call_id"):
                if type(value) is not str:
                    return False
            elif key == "tool_calls" and role == "assistant":
                if type(value) is not list or _marked(value):
                    return False
            else:
                return False
    return True


def _plain_part(part: Any, role: str) -> bool:
    if type(part) is not dict:
        return False
    kind = part.get("type")
    if kind == "text":
        return part.keys() <= {"type", "text"} and type(part.get("text")) is str
    if kind == "image_url" and role == "user":
        image = part.get("image_url")
        return part.keys() <= {"type", "image_url"} and type(image) is dict and image.keys() <= {"url", "detail"}
    return False


# ------------------------------------------------------------ the route, resolved once
_ROUTES: dict[tuple, "OwnRoute | str"] = {}
_ROUTES_LOCK = threading.Lock()


def own_route(route: Route) -> "OwnRoute | str":
    """The route's :class:`OwnRoute`, or why litellm serves it (decided once per route, without litellm)."""
    if _fastpath.switched_off():
        return f"{_fastpath.FAST_PATH_ENV}=0 sends every call through litellm.completion"
    key = (route.provider, route.litellm_model, route.base_url)
    found = _ROUTES.get(key)
    if found is None:
        with _ROUTES_LOCK:
            found = _ROUTES.get(key)
            if found is None:
                found = _ROUTES[key] = _build(route)
    return found


def reset_routes() -> None:
    _ROUTES.clear()


def _build(route: Route, prices: PriceMap | None = None) -> "OwnRoute | str":
    provider = route.litellm_model.split("/", 1)[0]
    if provider in _compat.PROVIDERS:
        return _build_compat(route, provider, prices if prices is not None else PriceMap())
    if provider != "openai":
        return f"provider {provider} is not one the own path serves"
    fast, why = _fastpath.decide(route)
    if not fast:
        return why
    model = route.litellm_model[len("openai/"):]
    last = model.split("/")[-1]
    if len(last) > 1 and last[0] == "o" and last[1].isdigit():
        return "an o-series model: litellm's o-series config maps its parameters"
    if "gpt-5" in model or "gpt-6" in model:
        return "a gpt-5 series model: litellm's reasoning config maps its parameters"
    if "claude" in model.lower() or "responses/" in model:
        return "litellm rewrites this model's requests (prompt-cache caps, the Responses bridge)"
    prices = prices if prices is not None else PriceMap()
    entry = openai_entry(prices, model)
    if entry is None:
        if "/" in model or ":" in model or described_by_rule(prices, model, "openai"):
            return _PRICED_BY_RULE
        priced = None
    else:
        priced = _simple_prices(entry[1])
        if isinstance(priced, str):
            return priced
    api_base = route.base_url or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE") \
        or "https://api.openai.com/v1"
    host = _host(api_base)
    return OwnRoute(model=model, url=_compat.openai_url(api_base), supported=_compat.openai_params(model, prices),
                    prices=priced, openai_host=host is None or host == "openai.com" or host.endswith(".openai.com"))


_PRICED_BY_RULE = "litellm may price this model name by a rule of its own"


def _build_compat(route: Route, provider: str, prices: PriceMap) -> "OwnRoute | str":
    """An OpenAI-like provider's route (``_compat.PROVIDERS``), or why litellm serves it."""
    fast, why = _fastpath.decide(route)
    if not fast:
        return why
    spec = _compat.PROVIDERS[provider]
    model = route.litellm_model.split("/", 1)[1]
    if "responses/" in model:
        return "litellm rewrites this model's requests (the Responses bridge)"
    base = spec.endpoint(route.base_url)
    if base is None:
        return f"no endpoint is set for provider {provider}: litellm decides where its calls go"
    entry = provider_entry(prices, model, provider)
    if entry is None:
        if mapped_anywhere(prices, model, provider) or described_by_rule(prices, model, provider):
            return _PRICED_BY_RULE
        priced = None
    else:
        priced = _simple_prices(entry[1])
        if isinstance(priced, str):
            return priced
    sdk = provider in _fastpath.SDK_READ_PROVIDERS
    return OwnRoute(model=model, url=spec.url(base), supported=spec.params(model, prices), prices=priced,
                    openai_host=False, provider=provider, shape=spec.shape(model, prices),
                    prefix=provider if sdk else None, body_errors=not sdk)


def _simple_prices(info: dict) -> "tuple[float, float, float | None] | str":
    """(input, output, cache read) per token from a map entry, or why litellm's calculator prices it."""
    costs = {k for k, v in info.items() if "cost" in k and v is not None
             and not k.endswith(_fastpath._INAPPLICABLE_PRICE_SUFFIXES) and k != "search_context_cost_per_query"}
    inp, out, read = info.get("input_cost_per_token"), info.get("output_cost_per_token"), \
        info.get("cache_read_input_token_cost")
    if not costs <= _SIMPLE_PRICES | _INERT_PRICES or not _PRICING_RULES.isdisjoint(info) or not _number(inp) \
            or not _number(out) or not _number(read, optional=True):
        return "the model's prices need litellm's cost calculator"
    return float(inp), float(out), None if read is None else float(read)


def _number(value: Any, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return type(value) in (int, float)


def _host(url: str) -> str | None:
    from urllib.parse import urlparse

    try:
        return urlparse(url).hostname
    except ValueError:
        return None


@functools.lru_cache(maxsize=256)
def supports_schema(provider: str, model: str) -> bool:
    """``litellm.supports_response_schema(model, provider)`` for an own route, from the price map."""
    if provider in _compat.SCHEMA_PROVIDERS:
        return True
    if provider in _compat.PROVIDERS:
        return _compat.supports(PriceMap(), model, provider, "supports_response_schema")
    if provider != "openai":
        return False  # ("custom" is no litellm provider: litellm answers False)
    entry = openai_entry(PriceMap(), model)
    return bool(entry is not None and entry[1].get("supports_response_schema") is True)


def warm(own: OwnRoute) -> bool:
    """Build the sync client for ``own`` (its import); whether that was done now."""
    return _http.warm_sync(own.url)


def awarm() -> bool:
    """Import the async client (run on a worker thread); whether that was done now."""
    return _http.warm_async()


# ------------------------------------------------------------ sending
def _deferred(route: Route) -> "_fastpath.FastRoute":
    from plugin_llm.transport._loading import load_litellm

    fast = _fastpath.fast_route(load_litellm(), route)
    if not isinstance(fast, _fastpath.FastRoute):  # pragma: no cover - an own route is a fast route
        raise RuntimeError(f"litellm's fast path does not serve {route.provider}: {fast}")
    return fast


def send(own: OwnRoute, request: Any, key: Key) -> Any:
    """One sync attempt: the plain reply (or litellm's reading of it), or the error to map."""
    prepared = own.prepare(request.messages, request.params)
    if prepared is None:  # litellm would rewrite the request: its fast path sends it
        return _fastpath.send(_deferred(request.route), request, key)
    body, optional = prepared
    from plugin_llm.transport._deadline import IO

    outer, IO.deadline = getattr(IO, "deadline", None), request.deadline  # every socket operation bounded
    try:
        status, headers, content = _post(own, body, key, request.deadline)
    finally:
        IO.deadline = outer
    answer = _answer(own, status, headers, content)
    if answer is not None:
        return answer
    return _litellm_answer(request, status, headers, content, body, optional)


async def asend(own: OwnRoute, request: Any, key: Key) -> Any:
    """One async attempt, bounded by the deadline as a whole (``asyncio.timeout``)."""
    prepared = own.prepare(request.messages, request.params)
    if prepared is None:
        await _aload()
        return await _fastpath.asend(_deferred(request.route), request, key)
    body, optional = prepared
    async with asyncio.timeout(max(request.deadline - time.monotonic(), 0.0)):
        status, headers, content = await _apost(own, body, key)
    answer = _answer(own, status, headers, content)
    if answer is not None:
        return answer
    await _aload()  # litellm's import off the event loop
    return _litellm_answer(request, status, headers, content, body, optional)


async def _aload() -> None:
    from plugin_llm.transport._loading import load_litellm, loaded_litellm

    if loaded_litellm() is None:
        await asyncio.to_thread(load_litellm)


def _answer(own: OwnRoute, status: int, headers: Any, content: bytes) -> Any:
    """The plain reply, or raises the error of an error status; None when litellm must read it."""
    if not 200 <= status < 300:  # redirects are not followed (as on the fast path)
        error = own.error(status, headers, content)
        if error is not None:
            raise error
        return None
    return own.reply(content)


def _litellm_answer(request: Any, status: int, headers: Any, content: bytes, body: dict, optional: dict) -> Any:
    fast = _deferred(request.route)
    if not 200 <= status < 300:
        raise fast.http_error(status, headers, content)
    return fast.reply(status, headers, content, body, request.messages, optional)


_ACCEPT = ((b"Accept", b"application/json"), (b"User-Agent", b"plugin-llm-gateway"))


def _post(own: OwnRoute, body: dict, key: Key, deadline: float) -> tuple[int, Any, bytes]:
    url = own.url
    left = max(deadline - time.monotonic(), 0.001)
    content = json.dumps(body).encode()
    if _http.proxy(url) is None:
        response = _http.sync_pool(url).request(
            "POST", url, content=content,
            extensions={"timeout": {"connect": left, "read": left, "write": left, "pool": left}},
            headers=[*_ACCEPT, *((name.encode("ascii"), value.encode("ascii"))
                                 for name, value in own.headers(key.reveal()).items())])
        return response.status, response.headers, response.content
    response = _fastpath._sync_client().post(url, content=content, headers=own.headers(key.reveal()), timeout=left)
    return response.status_code, response.headers, response.content


async def _apost(own: OwnRoute, body: dict, key: Key) -> tuple[int, Any, bytes]:
    url = own.url
    async with _http.session().post(url, data=json.dumps(body).encode(), headers=own.headers(key.reveal()),
                                    proxy=_http.proxy(url), allow_redirects=False) as response:
        content = await response.read()
        return response.status, response.headers, content
