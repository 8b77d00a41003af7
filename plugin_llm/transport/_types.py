"""The transport's values and limits: requests, responses, the key source protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from plugin_llm.routing import Route
from plugin_llm.types import PluginLlmUsage

#: statuses retried (with backoff) on the same or, for pools, the next key
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})
#: statuses that cool a pooled key down (the retry uses the next healthy key)
KEY_FAILURE_STATUSES = frozenset({401, 402, 429})
RETRY_AFTER_CAP = 30.0
BACKOFF_BASE = 0.25
BACKOFF_CAP = 8.0
#: placeholder sent to keyless OpenAI-compatible endpoints, so litellm never
#: falls back to OPENAI_API_KEY from the environment for them
NO_KEY = "no-key"
#: provider error text kept in an exception message (after redaction)
MESSAGE_LIMIT = 500
#: token counts above this are provider nonsense: clamped, and recorded as an anomaly
MAX_TOKENS = 10**9
#: a reported model name longer than this is cut (it goes into every audit line)
MODEL_NAME_LIMIT = 200
#: a reported response id longer than this is not kept (ids are tens of characters)
RESPONSE_ID_LIMIT = 200


class Credential(Protocol):
    source: str

    def reveal(self) -> str | None: ...


class KeySource(Protocol):
    """Where the transport gets a key for each attempt (see ``auth``)."""

    def acquire(self) -> Credential: ...
    async def aacquire(self) -> Credential: ...
    def report_failure(self, credential: Credential, status: int, retry_after: float | None = None) -> None: ...
    def report_success(self, credential: Credential) -> None: ...


@dataclass(frozen=True)
class TransportRequest:
    route: Route
    messages: list[dict]
    keys: KeySource
    deadline: float  # time.monotonic() value
    params: dict[str, Any] = field(default_factory=dict)  # temperature, max_tokens, response_format, tools
    #: the operator's price of the route (``limits.prices``), a ``CostFn``: when set, the reply's cost is
    #: what it says, not the price map's (and the transport answers ``priced=True``)
    cost: Callable[..., float | None] | None = None


@dataclass(frozen=True)
class TransportResponse:
    text: str | None
    message: dict[str, Any]
    model: str
    usage: PluginLlmUsage
    attempts: int
    provider_seconds: float
    finish_reason: str | None = None
    #: what was wrong with the reply but survivable (a clamped token count, a
    #: non-string model name): short, bounded sentences, never the raw values
    anomalies: tuple[str, ...] = ()
    #: the usage's cost is the request's ``cost`` (a transport that ignores ``cost`` leaves this
    #: False, and the gateway applies the operator's price itself)
    priced: bool = False
    #: the provider's id of the reply (``gen_ai.response.id``; a stream's from its first chunk), when it sent one
    response_id: str | None = None


@dataclass
class CallState:
    attempts: int = 0
    provider_seconds: float = 0.0
