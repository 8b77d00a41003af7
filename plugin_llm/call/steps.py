"""The steps a call's pipeline yields to its shell, and the state it keeps while it runs.

A flow yields a :data:`Step` and receives its outcome: a ``TransportRequest``
is sent (``Transport.complete``), a :class:`LimitStep` is admitted under the
plugin's limits in the store, and a stream's flow opens, reads and hands out
deltas (:class:`StreamOpen`, :class:`StreamRead`, :class:`Emit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterable, Union

from audit import records
from plugin_llm.types import PluginLlmUsage

if TYPE_CHECKING:  # for annotations only: a stream's module imports this one, and stays light
    from plugin_llm import limits
    from plugin_llm.call.protocols import AsyncTransportStream, TransportStream
    from plugin_llm.config import HostConfig
    from plugin_llm.limits.settings import LimitSettings
    from plugin_llm.routing import Route
    from plugin_llm.transport import TransportRequest, TransportResponse
    from plugin_llm.trust import Decision

__all__ = ["Step", "Flow", "LimitStep", "StoreStep", "Ready", "READY", "StreamOpen", "StreamRead", "Emit", "StreamProgress", "Call", "Admitted",
           "Run", "Tally", "RepairRefused"]

_MAX_ANOMALIES = 16
#: limits fields that add up over a call's requests (a structured call's repairs reserve again)
_SUMMED_LIMIT_FIELDS = frozenset({records.LIMITS_RESERVED_USD, records.LIMITS_RESERVED_TOKENS,
                                  records.LIMITS_RESERVED_INPUT_TOKENS})


@dataclass(frozen=True)
class LimitStep:
    """Step: admission under the plugin's limits with the store: the sync shell calls
    ``limits.admit``, the async one ``limits.aadmit`` (the store work off the event loop)."""

    settings: "LimitSettings"
    home: Path
    plugin_id: str
    call: dict[str, Any]


@dataclass(frozen=True)
class StoreStep:
    """Step: a store operation that may wait (a route's circuit breaker): the sync shell calls
    ``work()``, the async one runs it in a worker thread (never on the event loop)."""

    work: Callable[[], Any]


@dataclass(frozen=True)
class Ready:
    """Step: the transport's one-time set-up (litellm's import), just before its first request;
    its outcome is whether it was done (or waited for) now. ``route`` and ``request`` (when known)
    tell the transport what the set-up is for: a route it serves without litellm needs none."""

    route: "Route | None" = None
    request: "TransportRequest | None" = None


READY = Ready()


@dataclass(frozen=True)
class StreamOpen:
    """Step: open the provider stream of ``request`` (the transport's ``open_stream``)."""

    request: "TransportRequest"


@dataclass(frozen=True)
class StreamRead:
    """Step: the next text delta of an open transport stream (None at its end)."""

    stream: "TransportStream | AsyncTransportStream"


@dataclass(frozen=True)
class Emit:
    """Step: hand ``text`` to the consumer; the pipeline resumes when the next delta is asked for."""

    text: str


Step = Union["TransportRequest", LimitStep, StoreStep, Ready, StreamOpen, StreamRead, Emit]
#: a call's pipeline: yields steps, receives their outcomes, returns the call's result
Flow = Generator[Step, Any, Any]


class StreamProgress:
    """What a stream delivered so far (for the audit record of a partial stream)."""

    __slots__ = ("delivered", "partial", "stream", "call_id", "deadline", "abandoned_by", "first_chunk_seconds")

    def __init__(self) -> None:
        self.delivered = 0
        self.partial = True
        self.stream: "TransportStream | AsyncTransportStream | None" = None  # the open transport stream
        self.call_id: str | None = None
        self.deadline: float | None = None  # the call's (time.monotonic), once admitted
        self.abandoned_by: str | None = None  # why the host ended it early (e.g. the service's "deadline")
        self.first_chunk_seconds: float | None = None  # from the call's start to the first delta

    def fields(self) -> dict[str, Any]:
        fields = {records.STREAM: True, records.STREAM_PARTIAL: self.partial,
                  records.STREAM_DELIVERED_CHARS: self.delivered}
        if self.abandoned_by is not None:
            fields[records.STREAM_ABANDONED_BY] = self.abandoned_by
        if self.first_chunk_seconds is not None:
            fields[records.TIME_TO_FIRST_CHUNK] = round(self.first_chunk_seconds, 6)
        return fields


@dataclass(frozen=True)
class Call(records.CallFacts):
    """Everything known about one call before it reaches the provider: what its records say, and when it began."""

    started: float


@dataclass(frozen=True)
class Admitted:
    """A call past the trust gate: the config it runs under, its route, the decision and its deadline."""

    config: HostConfig
    route: Route
    decision: Decision
    deadline: float
    #: the routes tried in order (the route first, then its fallbacks); () = the route alone
    chain: "tuple[Route, ...]" = ()


class Run:
    """One call on its way through the pipeline: its facts, its admission and its running totals."""

    __slots__ = ("call", "admitted", "tally")

    def __init__(self, call: Call, admitted: Admitted, tally: "Tally") -> None:
        self.call = call
        self.admitted = admitted  # a structured call's repair runs under the limits as they are then
        self.tally = tally


class RepairRefused(Exception):
    """A structured call's repair refused under the limits: the call ends in its schema mismatch."""

    def __init__(self, failure: "limits.PluginLlmLimitError") -> None:
        super().__init__(str(failure))
        self.failure = failure


class Tally:
    """Running totals of one call across transport requests (repairs), and whether it is on record."""

    __slots__ = ("usage", "attempts", "provider_seconds", "repairs", "schema", "validation", "anomalies",
                 "audited", "audit_messages", "limit_fields", "stream", "repairing", "params", "route_attempts")

    def __init__(self, schema: dict | None = None) -> None:
        self.usage = PluginLlmUsage()
        self.attempts = 0
        self.provider_seconds = 0.0
        self.repairs = 0
        self.repairing = False  # a structured call's repair is being admitted (a refusal ends the call otherwise)
        self.schema = schema
        self.validation = "none"
        self.anomalies: list[str] = []
        self.audited = False
        self.audit_messages: list[dict[str, Any]] | None = None
        self.limit_fields: dict[str, Any] | None = None
        self.stream: StreamProgress | None = None  # a streamed call's progress (stream.* audit fields)
        self.params: dict[str, Any] | None = None  # the request's parameters (the record's sampling fields)
        self.route_attempts: list[dict[str, Any]] | None = None  # each route of a chain tried: the record's

    def add_limits(self, fields: dict[str, Any]) -> None:
        """Limit fields for the audit record; reservations of several requests (repairs) add up."""
        if not fields:
            return
        if self.limit_fields is None:  # the first request's fields (audit_fields() returns a new dict)
            self.limit_fields = fields
            return
        for key, value in fields.items():
            if key in _SUMMED_LIMIT_FIELDS and key in self.limit_fields:
                value = round(self.limit_fields[key] + value, 9)
            elif key == records.LIMITS_INPUT_COUNT and self.limit_fields.get(key) == "bound":
                continue  # one request's input counted by the bound: so is the call's
            self.limit_fields[key] = value

    def add(self, response: TransportResponse) -> "Tally":
        self.usage = self.usage + response.usage
        self.attempts += response.attempts
        self.provider_seconds += response.provider_seconds
        return self

    def note(self, anomalies: Iterable[Any]) -> None:
        for anomaly in anomalies:
            if len(self.anomalies) >= _MAX_ANOMALIES:
                return
            self.anomalies.append(anomaly[:200] if isinstance(anomaly, str) else f"a {type(anomaly).__name__}")
