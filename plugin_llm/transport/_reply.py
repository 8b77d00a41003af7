"""Reading a provider's reply: shape checks, the key hidden, token counts clamped, cost.

Both paths hand their reply here: the fallback a litellm ``ModelResponse``,
the fast path the ``ModelResponse`` of the provider config's
``transform_response`` (or, for OpenAI-compatible providers, the parsed JSON
body); :func:`_field` reads attributes and keys alike.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from plugin_llm.routing import Route
from plugin_llm.transport._errors import malformed as _malformed
from plugin_llm.transport._keys import Key
from plugin_llm.transport._types import MAX_TOKENS, MODEL_NAME_LIMIT, RESPONSE_ID_LIMIT
from plugin_llm.types import PluginLlmUsage

__all__ = ["read_reply", "response_id", "hide_key", "usage", "as_cost", "Reply", "field", "CostFn"]

#: the shape of the id litellm gives a reply without one (``litellm.types.utils.generate_id``)
_LITELLM_ID = re.compile(r"chatcmpl-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
#: ``cost(route, response, prompt, completion, cache_read, cache_write)`` -> USD or None (unpriced)
CostFn = Callable[[Route, Any, int, int, int, int], "float | None"]


@dataclass(frozen=True)
class Reply:
    """The parts of a chat completion the gateway uses, type-checked."""

    text: str | None
    tool_calls: tuple[tuple[str, str, str], ...]  # (id, name, arguments JSON text)
    model: str
    finish_reason: str | None
    response_id: str | None = None

    def map(self, fn: Any) -> "Reply":
        """Apply ``fn`` to every provider-written string."""
        return Reply(
            text=fn(self.text) if self.text else self.text,
            tool_calls=tuple((fn(i), fn(n), fn(a)) for i, n, a in self.tool_calls),
            model=fn(self.model),
            finish_reason=self.finish_reason,
            response_id=fn(self.response_id) if self.response_id else self.response_id,
        )


def field(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]`` (litellm objects are both), None when absent."""
    if isinstance(obj, dict):
        return obj.get(name)
    try:
        return getattr(obj, name, None)
    except Exception:  # a property that fails on nonsense input
        return None


def read_reply(route: Route, response: Any, anomalies: list[str]) -> Reply:
    """Check the reply's shape; :class:`PluginLlmProviderError` ("malformed reply") when unusable."""
    choices = field(response, "choices")
    if choices is None or (isinstance(choices, (list, tuple)) and not choices):
        raise _malformed(route, "no choices")
    if not isinstance(choices, (list, tuple)):
        raise _malformed(route, f"'choices' is a {type(choices).__name__}, not a list")
    choice = choices[0]
    message = field(choice, "message")
    if message is None:
        raise _malformed(route, "the first choice has no message")
    content = field(message, "content")
    if content is not None and not isinstance(content, str):
        raise _malformed(route, f"the message content is a {type(content).__name__}, not text")
    raw_calls = field(message, "tool_calls")
    if raw_calls is not None and not isinstance(raw_calls, (list, tuple)):
        raise _malformed(route, f"'tool_calls' is a {type(raw_calls).__name__}, not a list")
    calls = []
    for i, call in enumerate(raw_calls or ()):
        function = field(call, "function")
        name = field(function, "name") if function is not None else None
        if not isinstance(name, str) or not name:
            raise _malformed(route, f"tool call {i} has no function name")
        arguments = field(function, "arguments")
        if arguments is None or arguments == "":
            arguments = "{}"
        elif isinstance(arguments, dict):
            arguments = json.dumps(arguments)
        elif not isinstance(arguments, str):
            raise _malformed(route, f"tool call {i} has arguments of type {type(arguments).__name__}, not JSON text")
        call_id = field(call, "id")
        if call_id is None:
            call_id = f"call_{i}"
        elif not isinstance(call_id, str):
            raise _malformed(route, f"tool call {i} has an id of type {type(call_id).__name__}, not a string")
        calls.append((call_id, name, arguments))
    finish = field(choice, "finish_reason")
    if finish is not None and not isinstance(finish, str):
        anomalies.append(f"finish_reason was a {type(finish).__name__}, not a string; recorded as none")
        finish = None
    model = field(response, "model")
    if not model:
        model = route.model
    elif not isinstance(model, str):
        anomalies.append(f"the reported model was a {type(model).__name__}, not a string; recorded as {route.model}")
        model = route.model
    elif len(model) > MODEL_NAME_LIMIT:
        anomalies.append(f"the reported model name had {len(model)} characters; cut to {MODEL_NAME_LIMIT}")
        model = model[:MODEL_NAME_LIMIT]
    return Reply(content, tuple(calls), model, finish, response_id(field(response, "id")))


def response_id(value: Any) -> str | None:
    """The provider's id of a reply (or of a stream's chunk): a non-empty string of sane length, else None.

    The id litellm makes up for a reply that has none (``chatcmpl-`` and a random UUID) is none: on a
    route served through litellm it cannot be told from the provider's, and every path says the same."""
    if not isinstance(value, str) or not 0 < len(value) <= RESPONSE_ID_LIMIT or _LITELLM_ID.fullmatch(value):
        return None
    return value


def hide_key(reply: Reply, key: Key) -> Reply:
    """The reply with the key just sent (and every loaded secret) hidden: a reply may echo the request."""
    from auth.redaction import redact_secrets

    return reply.map(lambda text: redact_secrets(text, key.secret()))


def _count(value: Any, name: str, anomalies: list[str]) -> int:
    """A token count as a bounded non-negative int; anything else is recorded and counted as 0 or the cap."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        anomalies.append(f"usage.{name} was a {type(value).__name__}, not a number; counted as 0")
        return 0
    if isinstance(value, float):
        if not math.isfinite(value):
            anomalies.append(f"usage.{name} was not a finite number; counted as 0")
            return 0
        value = int(value)
    if value < 0:
        anomalies.append(f"usage.{name} was negative; counted as 0")
        return 0
    if value > MAX_TOKENS:
        digits = int(value.bit_length() * 0.30103) + 1  # str() of a huge int is slow, or refused
        anomalies.append(f"usage.{name} was out of range (about {digits} digits); counted as {MAX_TOKENS}")
        return MAX_TOKENS
    return value


def usage(route: Route, response: Any, anomalies: list[str], cost: CostFn, *, operator: bool = False) -> PluginLlmUsage:
    """The reply's token counts (clamped, anomalies recorded) and its cost by ``cost`` (the embedded
    ``local`` model is free unless ``cost`` is the operator's own price)."""
    reported = field(response, "usage")
    prompt = _count(field(reported, "prompt_tokens"), "prompt_tokens", anomalies)
    completion = _count(field(reported, "completion_tokens"), "completion_tokens", anomalies)
    total = _count(field(reported, "total_tokens"), "total_tokens", anomalies) or min(prompt + completion, MAX_TOKENS)
    details = field(reported, "prompt_tokens_details")
    cache_read = _count(field(details, "cached_tokens"), "prompt_tokens_details.cached_tokens", anomalies) \
        or _count(field(reported, "cache_read_input_tokens"), "cache_read_input_tokens", anomalies)
    cache_write = _count(field(reported, "cache_creation_input_tokens"), "cache_creation_input_tokens", anomalies)
    usd = 0.0 if route.provider == "local" and not operator else cost(route, response, prompt, completion, cache_read,
                                                                       cache_write)
    if usd is not None and not (math.isfinite(usd) and 0 <= usd < 1e9):
        anomalies.append("the computed cost was out of range; recorded as unknown")
        usd = None
    return PluginLlmUsage(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=total,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        cost_usd=usd,
    )


def as_cost(value: Any) -> float | None:
    """A computed cost as a float, None when it is not a number."""
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError, OverflowError):
        return None
