"""Errors as HTTP: one stable JSON body for every refusal of the service.

Every error answer has the OpenAI error shape (so OpenAI SDKs read it) with the gateway's own
fields added: ``{"error": {"type": <in-process class name>, "message", "param", "code": <stable
snake_case code>, ...class-specific fields}}``. Status per error: trust 403, quota 429 with
``Retry-After`` (503 ``limits_store_unavailable`` when the limits store cannot answer), schema 422,
timeout 504, provider 502, the host's config 500, bad arguments 400, a bad token 401, too many bad
tokens from one address 429, anything else 500; the table is in docs/reference/http-api.md.

No 5xx body names a path, host, address, URL or exception text: those are for the log and the
audit record (a 502 with the provider's HTTP status keeps its words, scrubbed).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

from plugin_llm import wire
from plugin_llm.wire import (  # noqa: F401 - re-exported: the service's fixed texts
    CONFIG_MESSAGE,
    INTERNAL_MESSAGE,
    PROVIDER_FAILED_MESSAGE,
    TIMEOUT_MESSAGE,
    scrub_host_details,
)
from plugin_llm.errors import (
    PluginLlmConfigError,
    PluginLlmError,
    PluginLlmProviderError,
    PluginLlmQuotaError,
    PluginLlmSchemaError,
    PluginLlmTimeoutError,
    PluginLlmTrustError,
)

__all__ = ["ApiError", "error_for", "UNAUTHORIZED_MESSAGE", "PLUGIN_DISABLED_MESSAGE", "TOO_MANY_FAILURES_MESSAGE",
           "LIMITS_STORE_MESSAGE", "TOKEN_STORE_MESSAGE", "STORE_RETRY_AFTER", "CONFIG_MESSAGE", "INTERNAL_MESSAGE",
           "TIMEOUT_MESSAGE", "PROVIDER_FAILED_MESSAGE", "param_of", "scrub_host_details"]

UNAUTHORIZED_MESSAGE = ("the token is not valid: send 'Authorization: Bearer plg_...' with a token the operator "
                        "created with 'plugin-llm tokens create PLUGIN'")
#: the 429 of an address with too many refused tokens (``service.failed_auth``); says nothing of any token
TOO_MANY_FAILURES_MESSAGE = ("too many requests with a token that is not valid came from this address: it is refused "
                             "for {seconds} s (Retry-After); check that the client sends a current token from "
                             "'plugin-llm tokens create PLUGIN' (the operator sets the limit in config.yaml, "
                             "service.failed_auth)")
#: the 503 of a call refused because the limits store cannot answer (``limits.on_store_error: deny``); the
#: store's own error (its file path, its Redis host and port) goes to the service's log and the audit record only
LIMITS_STORE_MESSAGE = ("the call was refused because the gateway's limits store is unavailable right now, so calls "
                        "with limits cannot be admitted (nothing was sent to a provider); retry later (Retry-After). "
                        "The operator finds the cause in the service's log and the audit record")
#: the 503 of a request whose token cannot be checked because the token store does not answer (before any
#: token is known to be valid: it names no store, host or path)
TOKEN_STORE_MESSAGE = ("tokens cannot be checked now: the gateway's authentication store is unavailable; retry "
                       "later (Retry-After). The operator finds the cause in the service's log")
#: the 403 of a valid token whose plugin the operator disabled (``plugins.disabled``)
PLUGIN_DISABLED_MESSAGE = ("the plugin this token belongs to ({plugin}) is disabled on this gateway: its calls are "
                           "refused until the operator enables it again (plugin-llm plugins enable {plugin})")
#: Retry-After (seconds) of both store outages: a store that is back answers the next call
STORE_RETRY_AFTER = "1"
_MAX_RETRY_AFTER = 86400 * 31
_LEADING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ApiError:
    """One error answer: HTTP status, body fields and extra headers."""

    status: int
    type: str
    message: str
    code: str
    param: str | None = None
    extra: dict[str, Any] | None = None
    headers: dict[str, str] | None = None

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.type, "message": self.message, "param": self.param, "code": self.code}
        if self.extra:
            error.update(self.extra)
        return {"error": error}


def param_of(message: str, fields: frozenset[str] | set[str]) -> str | None:
    """The request field a validation message starts with (``messages[0]...`` -> ``messages``)."""
    match = _LEADING_NAME.match(message)
    if match and match.group() in fields:
        return match.group()
    match = re.search(r"keyword argument '([A-Za-z0-9_]{1,64})'", message)
    return match.group(1) if match else None


def _retry_after(resets_at: Any) -> str | None:
    if type(resets_at) not in (int, float) or not math.isfinite(resets_at):
        return None
    seconds = max(1, math.ceil(resets_at - time.time()))
    return str(min(seconds, _MAX_RETRY_AFTER))


def error_for(exc: BaseException, fields: frozenset[str] | set[str] = frozenset()) -> ApiError:
    """The answer to an exception raised by the pipeline or the request checks: its status and code here,
    its type, message and fields from the one codec (:mod:`plugin_llm.wire`)."""
    if not isinstance(exc, (PluginLlmError, ValueError, TypeError)):
        return ApiError(500, "PluginLlmError", INTERNAL_MESSAGE, "internal_error")
    encoded = wire.encode_error(exc)
    name, message = encoded.pop("type"), encoded.pop("message")
    if isinstance(exc, PluginLlmTrustError):
        encoded.pop("plugin_id", None)  # the caller's own: its token names it
        return ApiError(403, name, message, "trust_denied", extra={"config_key": encoded.get("config_key") or None})
    if isinstance(exc, PluginLlmQuotaError):
        encoded.pop("plugin_id", None)
        if encoded.get("limit") == "store":  # an outage of the gateway's store, not the plugin's quota
            return ApiError(503, name, LIMITS_STORE_MESSAGE, "limits_store_unavailable",
                            extra={**encoded, "resets_at": None}, headers={"Retry-After": STORE_RETRY_AFTER})
        retry = _retry_after(encoded.get("resets_at"))
        if retry is not None and encoded.get("limit") == "max_concurrent":
            retry = "1"  # a slot frees when any call in flight ends; resets_at is only the latest it can be
        if retry is None:
            encoded["resets_at"] = None
        return ApiError(429, name, message, "quota_exceeded", extra=encoded,
                        headers={"Retry-After": retry} if retry is not None else None)
    if isinstance(exc, PluginLlmSchemaError):
        return ApiError(422, name, message, "schema_mismatch", extra=encoded)
    # 5xx: the host's failure, not the caller's request: what a remote caller is told (wire.remote_message)
    text = wire.remote_message(exc, message)
    if isinstance(exc, PluginLlmTimeoutError):
        return ApiError(504, name, text, "timeout")
    if isinstance(exc, PluginLlmProviderError):
        return ApiError(502, name, text, "provider_error", extra=encoded)
    if isinstance(exc, PluginLlmConfigError):
        return ApiError(500, name, text, "config_error")
    if isinstance(exc, PluginLlmError):
        return ApiError(500, name, text, "gateway_error")
    return ApiError(400, name, message, "invalid_request", param=param_of(message, fields))
