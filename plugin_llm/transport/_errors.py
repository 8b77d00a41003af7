"""Every failure of an attempt as the project's errors, with the provider's text redacted, then cut."""

from __future__ import annotations

import email.utils
import re
import time
from typing import Any

from plugin_llm.errors import PluginLlmError, PluginLlmProviderError, PluginLlmTimeoutError
from plugin_llm.config import shown_url
from plugin_llm.routing import Route
from plugin_llm.transport._keys import Key
from plugin_llm.transport._types import MESSAGE_LIMIT, RETRYABLE_STATUSES

__all__ = ["map_error", "malformed", "provider_text"]


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _retry_after(exc: BaseException) -> float | None:
    headers: Any = None
    for candidate in (getattr(getattr(exc, "response", None), "headers", None), getattr(exc, "litellm_response_headers", None)):
        if candidate:
            headers = candidate
            break
    if not headers:
        return None
    try:
        value = headers.get("retry-after") or headers.get("Retry-After")
    except Exception:
        return None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


#: an exception name repeated as its own message's prefix (litellm wraps ``Name: <message>`` in ``Name``)
_STUTTER = re.compile(r"\b([A-Za-z_]\w*(?:Error|Exception)): (?:\1: )+")
#: where a Python traceback starts inside an exception's text (litellm appends one to some of its errors)
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|During handling of the above exception"
                        r"|The above exception was the direct cause")
#: a traceback's frame line that is left anyway (``File "/srv/app/x.py", line 12, in f``)
_FRAME = re.compile(r'File "[^"\n]{0,1000}", line \d+(?:, in [^\s]{1,200})?')
#: characters of an exception's text looked at at all: the message keeps far fewer (MESSAGE_LIMIT)
_SCAN_LIMIT = 20_000


def provider_text(text: str, limit: int, *secrets: str | None) -> str:
    """Text from a provider or a library for an error message: bounded, without a Python traceback
    (its frames name the server's files) or its frame lines, whitespace folded, redacted, *then* cut."""
    from auth.redaction import redact_clipped

    text = text[:_SCAN_LIMIT]
    found = _TRACEBACK.search(text)
    if found is not None:
        text = text[:found.start()]
    text = _FRAME.sub("", text)
    return redact_clipped(" ".join(text.split()).rstrip(" :;,") or "no details", limit, *secrets)


def _clean_message(exc: BaseException, key: Key | None) -> str:
    """The provider's error text for a message: bounded, without a traceback, redacted (the key just sent
    included), *then* cut."""
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    text = text[:_SCAN_LIMIT]
    for noise in ("litellm.", "OpenAIException - ", "Error_str: "):
        text = text.replace(noise, "")
    text = _STUTTER.sub(r"\1: ", text)  # "BadGatewayError: BadGatewayError: x" -> "BadGatewayError: x"
    return provider_text(text, MESSAGE_LIMIT, key.secret() if key is not None else None)


#: litellm's words for a 2xx reply it could not turn into a chat completion -> what was wrong
_MALFORMED_MARKERS = (
    ("provider returned a response with no 'choices'", "no choices"),
    ("provider returned 'choices' that is not a list", "'choices' is not a list"),
    ("Empty or invalid response from LLM endpoint", "the body is not a chat completion"),
    ("Invalid response object", "the reply does not have the chat-completion shape"),
)


def _malformed_reason(exc: BaseException, chain: list[BaseException]) -> str | None:
    """Why a reply that arrived could not be read, or None when ``exc`` is not about that.

    litellm reports an unreadable 2xx reply as an HTTP 500 of its own; a real
    HTTP error response always has an ``httpx.HTTPStatusError`` in the chain.
    """
    names = {type(e).__name__ for e in chain}
    if "HTTPStatusError" in names or "APIConnectionError" in names:
        return None
    text = str(getattr(exc, "message", None) or exc)
    for marker, reason in _MALFORMED_MARKERS:
        if marker in text:
            return reason
    if "JSONDecodeError" in names:
        return "the body is not valid JSON"
    return None


def malformed(route: Route, reason: str) -> PluginLlmProviderError:
    return PluginLlmProviderError(
        f"{route.provider} sent a malformed reply (model {route.model}): {reason}",
        status=None, provider=route.provider, retryable=False,
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes (litellm wraps a refused connection in a 500)."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 10:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def map_error(exc: BaseException, route: Route, key: Key | None, deadline: float) -> PluginLlmError:
    chain = _chain(exc)
    reason = _malformed_reason(exc, chain)
    if reason is not None:
        return malformed(route, reason)
    names = " ".join(type(e).__name__ for e in chain)
    unencodable = next((e for e in chain if isinstance(e, UnicodeEncodeError)), None)
    if unencodable is not None:  # the request itself (a lone surrogate): no attempt can send it, none is retried
        return PluginLlmProviderError(
            f"the request to {route.provider} (model {route.model}) could not be encoded: "
            f"{provider_text(str(unencodable), 200)}"
            + ("; a text in it is not valid Unicode (a lone surrogate)" if "surrogate" in str(unencodable) else ""),
            status=None, provider=route.provider, retryable=False,
        )
    message = _clean_message(exc, key)
    if "Timeout" in names or any(isinstance(e, TimeoutError) for e in chain):
        err: PluginLlmError = PluginLlmTimeoutError(
            f"{route.provider} did not answer in time (model {route.model}): {message}"
        )
        err.retryable = time.monotonic() < deadline  # type: ignore[attr-defined]
        return err
    if "ConnectError" in names or "APIConnectionError" in names or any(isinstance(e, ConnectionError) for e in chain):
        return PluginLlmProviderError(
            f"cannot reach {route.provider} ({shown_url(route.base_url) or 'default endpoint'}): {message}",
            status=None, provider=route.provider, retryable=True,
        )
    status = _status_of(exc)
    retryable = status in RETRYABLE_STATUSES
    label = f"HTTP {status}" if status else type(exc).__name__
    error = PluginLlmProviderError(
        f"{route.provider} refused the call to model {route.model} ({label}): {message}",
        status=status, provider=route.provider, retryable=retryable,
    )
    error.retry_after = _retry_after(exc) if status in (429, 503) else None  # type: ignore[attr-defined]
    return error

