"""The one codec of ``ctx.llm``'s results, stream events and errors as JSON values.

Every boundary a call crosses uses it: the service's answers and the client's reading of them, and
both sides of an isolated plugin's channel. Decoding never trusts its input: wrong types become
defaults or a clear error, strings and lists are bounded, and every string is redacted on the way
out.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from auth.redaction import redact
from plugin_llm import errors
from plugin_llm.types import (
    PluginLlmCompleteResult,
    PluginLlmStructuredResult,
    PluginLlmToolCall,
    PluginLlmUsage,
)

__all__ = ["WireError", "encode_usage", "decode_usage", "encode_result", "decode_result", "encode_error",
           "decode_error", "error_fields", "public_type"]

#: a message, reply text or error detail longer than this is cut (a reply is bounded by its own limits)
MAX_MESSAGE = 4000
_MAX_ERRORS = 100
_USAGE_FIELDS = {f.name: f.type for f in dataclasses.fields(PluginLlmUsage)}


class WireError(ValueError):
    """A value that is not a result of the shape this codec writes."""


# ------------------------------------------------------------------ usage
def encode_usage(usage: PluginLlmUsage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    cost = usage.cost_usd
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens, "cache_read_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "cost_usd": cost if cost is None or _plain_number(cost) else None, "estimated": usage.estimated}


def decode_usage(data: Any) -> PluginLlmUsage | None:
    """A usage from its encoding; None when there is none. Values of the wrong type are dropped."""
    if type(data) is not dict:
        return None
    values: dict[str, Any] = {}
    for name in _USAGE_FIELDS:
        value = data.get(name)
        if name == "estimated":
            if type(value) is bool:
                values[name] = value
        elif name == "cost_usd":
            if _plain_number(value) and type(value) is not bool:
                values[name] = float(value)
        elif type(value) is int:
            values[name] = value
    return PluginLlmUsage(**values)


def _plain_number(value: Any) -> bool:
    return type(value) in (int, bool) or (type(value) is float and math.isfinite(value))


# ------------------------------------------------------------------ results
def encode_result(result: PluginLlmCompleteResult) -> dict[str, Any]:
    """A result as JSON values; ``kind`` says which result class it is. Built by hand: it runs once
    per call of the service, and ``dataclasses.asdict`` would deep-copy every value."""
    out: dict[str, Any] = {
        "kind": "complete", "text": result.text, "provider": result.provider, "model": result.model,
        "agent_id": result.agent_id, "usage": encode_usage(result.usage), "audit": result.audit,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments, "raw_arguments": c.raw_arguments}
                       for c in result.tool_calls],
    }
    if isinstance(result, PluginLlmStructuredResult):
        out.update(kind="structured", parsed=result.parsed, content_type=result.content_type)
    return out


def decode_result(data: Any, *, structured: bool | None = None) -> PluginLlmCompleteResult:
    """The result a boundary sent. ``structured`` forces the class (the HTTP endpoints say it by their
    path); otherwise the encoding's ``kind`` does."""
    if type(data) is not dict:
        raise WireError(f"a ctx.llm result must be an object, not {type(data).__name__}")
    calls = data.get("tool_calls") or ()
    if type(calls) is not list and type(calls) is not tuple:
        raise WireError("a ctx.llm result's tool_calls must be a list")
    common = dict(
        text=_text(data.get("text")), provider=_text(data.get("provider")), model=_text(data.get("model")),
        agent_id=data.get("agent_id") if type(data.get("agent_id")) is str else None,
        usage=decode_usage(data.get("usage")) or PluginLlmUsage(),
        audit=dict(data["audit"]) if type(data.get("audit")) is dict else {},
        tool_calls=tuple(_tool_call(c) for c in calls),
    )
    if structured if structured is not None else data.get("kind") == "structured":
        content_type = data.get("content_type")
        return PluginLlmStructuredResult(**common, parsed=data.get("parsed"),
                                         content_type=content_type if content_type in ("json", "text") else "text")
    return PluginLlmCompleteResult(**common)


def _text(value: Any) -> str:
    return value if type(value) is str else ""


def _tool_call(data: Any) -> PluginLlmToolCall:
    if type(data) is not dict or type(data.get("id")) is not str or type(data.get("name")) is not str:
        raise WireError("a tool call must be an object with string id and name")
    arguments = data.get("arguments")
    raw = data.get("raw_arguments")
    return PluginLlmToolCall(data["id"], data["name"], arguments if type(arguments) is dict else {},
                             raw if type(raw) is str else "{}")


# ------------------------------------------------------------------ errors
#: the fields each gateway error carries, besides its message
_FIELDS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (errors.PluginLlmTrustError, ("plugin_id", "config_key")),
    (errors.PluginLlmQuotaError, ("limit", "config_key", "resets_at", "plugin_id")),
    (errors.PluginLlmProviderError, ("status", "provider", "retryable")),
    (errors.PluginLlmSchemaError, ("text", "errors", "usage")),
)
_PUBLIC = {name: getattr(errors, name) for name in errors.__all__}


def public_type(exc: BaseException) -> str:
    """The name a boundary sends for ``exc``: the nearest public gateway class (a
    ``PluginLlmLimitError`` is sent as the ``PluginLlmQuotaError`` it is), else its own class name."""
    for cls in type(exc).__mro__:
        if _PUBLIC.get(cls.__name__) is cls and cls is not errors.PluginLlmLimitError:
            return cls.__name__
    return type(exc).__name__


def error_fields(exc: BaseException) -> dict[str, Any]:
    """The class-specific fields of a gateway error, as JSON values, redacted and bounded."""
    out: dict[str, Any] = {}
    for cls, names in _FIELDS:
        if isinstance(exc, cls):
            for name in names:
                try:
                    out[name] = _field(name, getattr(exc, name, None))
                except Exception:  # noqa: BLE001 - a hostile attribute: the field is unknown, not a crash
                    out[name] = None
    return out


def _field(name: str, value: Any) -> Any:
    if name == "usage":
        return encode_usage(value) if isinstance(value, PluginLlmUsage) else None
    if name == "errors":
        return [redact(str(e))[:MAX_MESSAGE] for e in list(value or ())[:_MAX_ERRORS]]
    if type(value) is str:
        return redact(value)[: MAX_MESSAGE * 4 if name == "text" else MAX_MESSAGE]
    if value is None or _plain_number(value):
        return value
    return None


def encode_error(exc: BaseException, *, remote: bool = False) -> dict[str, Any]:
    """An error as JSON values: ``type`` (see :func:`public_type`), ``message`` (redacted; for a
    ``remote`` caller, what :func:`remote_message` says) and its fields."""
    text = redact(_str(exc)[: MAX_MESSAGE * 4])[:MAX_MESSAGE]
    return {"type": public_type(exc), "message": remote_message(exc, text) if remote else text, **error_fields(exc)}


def _str(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a hostile __str__
        return f"<{type(exc).__name__}>"
    return text if type(text) is str else f"<{type(exc).__name__}>"


# ------------------------------------------------------------------ what a remote caller is told
#: the 500 of a call the host's own configuration cannot serve (a provider without a key, a broken auth.json):
#: its text names host files and settings, so it goes to the gateway's log and the audit record only
CONFIG_MESSAGE = ("the gateway cannot make this call because of its own configuration (for example a provider "
                  "without a key); nothing is wrong with the request. The operator finds the cause in the "
                  "gateway's log and the audit record")
#: the 500 of any other gateway failure (a PluginLlmError that is none of the above, or an unexpected exception)
INTERNAL_MESSAGE = ("the gateway failed on this request; the operator can find the cause in the gateway's "
                    "log and the audit record")
#: the 504 of a call whose deadline expired (the transport's text can name the provider's address)
TIMEOUT_MESSAGE = ("the provider did not answer within the call's deadline (the request's timeout, or the "
                   "operator's); retry later or with a longer timeout")
#: the 502 of a provider that could not be reached or sent no usable reply (no HTTP status of its own): the
#: transport's text names the endpoint's address, so only the provider's name and retryable are given
PROVIDER_FAILED_MESSAGE = ("the call to the provider failed before it answered (unreachable, or a reply that could "
                           "not be read); the operator finds the cause in the gateway's log and the audit record")


def remote_message(exc: BaseException, message: str) -> str:
    """The message a caller in another process or on another machine gets for ``exc`` (``message`` is its
    redacted text). A failure of the host rather than of the request names host files, addresses and
    exception text: the caller gets a fixed message, the detail stays in the log and the audit record."""
    delivered = getattr(exc, "delivered_chars", None)
    broke = (f" (the stream broke after {delivered:,} characters had been delivered)"
             if type(delivered) is int and delivered > 0 else "")
    if isinstance(exc, errors.PluginLlmTimeoutError):
        return TIMEOUT_MESSAGE + broke
    if isinstance(exc, errors.PluginLlmProviderError):
        # an HTTP answer is the provider's words about the request (kept, without any address or path)
        return scrub_host_details(message) if type(exc.status) is int else PROVIDER_FAILED_MESSAGE + broke
    if isinstance(exc, errors.PluginLlmConfigError):
        return CONFIG_MESSAGE
    if isinstance(exc, (errors.PluginLlmTrustError, errors.PluginLlmQuotaError, errors.PluginLlmSchemaError,
                        ValueError, TypeError)):
        return message
    return INTERNAL_MESSAGE


_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]{1,15}://[^\s'\"<>)\]]*")
_ADDRESS = re.compile(r"\[?\b(?:\d{1,3}\.){3}\d{1,3}\b\]?(?::\d{1,5})?|\[[0-9A-Fa-f:]{2,}\](?::\d{1,5})?"
                      r"|\blocalhost(?::\d{1,5})?\b")
_PATH = re.compile(r"(?<![\w.:/])(?:~|\.{1,2})?/(?:[^\s/'\"<>:,;()]+/)+[^\s/'\"<>:,;()]*")


def scrub_host_details(text: str) -> str:
    """``text`` without URLs, IP addresses (with a port) and file paths: what the provider said, not where."""
    text = _URL.sub("<url>", text)
    text = _ADDRESS.sub("<address>", text)
    return _PATH.sub("<path>", text)


def decode_error(data: Any) -> BaseException:
    """The exception a boundary described, as the class the plugin would catch in process."""
    if type(data) is not dict:
        return errors.PluginLlmError("the gateway sent an error without a description")
    name = data.get("type") if type(data.get("type")) is str else ""
    message = _text(data.get("message"))[:MAX_MESSAGE]
    cls = _PUBLIC.get(name)
    if cls is errors.PluginLlmTrustError:
        return cls(message, plugin_id=_text(data.get("plugin_id")), config_key=_text(data.get("config_key")))
    if cls is errors.PluginLlmQuotaError or cls is errors.PluginLlmLimitError:
        resets_at = data.get("resets_at")
        return errors.PluginLlmQuotaError(
            message, limit=_opt_text(data.get("limit")), config_key=_opt_text(data.get("config_key")),
            resets_at=float(resets_at) if _plain_number(resets_at) and type(resets_at) is not bool else None,
            plugin_id=_opt_text(data.get("plugin_id")))
    if cls is errors.PluginLlmProviderError:
        status = data.get("status")
        return cls(message, status=status if type(status) is int else None, provider=_text(data.get("provider")),
                   retryable=data.get("retryable") is True)
    if cls is errors.PluginLlmSchemaError:
        found = data.get("errors")
        return cls(message, text=_text(data.get("text")),
                   errors=[e for e in found[:_MAX_ERRORS] if type(e) is str] if type(found) is list else [],
                   usage=decode_usage(data.get("usage")))
    if cls is not None:
        return cls(message)
    if name in ("ValueError", "TypeError"):
        return ValueError(message) if name == "ValueError" else TypeError(message)
    return errors.PluginLlmError(message or "the gateway failed the call")


def _opt_text(value: Any) -> str | None:
    return value if type(value) is str else None
