"""What the call pipeline asks of its collaborators: the transport and the audit sink.

``Transport`` and ``AuditSink`` are what every one must have. The optional
capabilities (a one-time set-up before calls, streaming, a writability
check) are protocols of their own, checked once per transport or sink.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from plugin_llm.routing import Route
from plugin_llm.transport import TransportRequest, TransportResponse

__all__ = ["Transport", "Readies", "AsyncReadies", "Streams", "AsyncStreams", "TransportStream",
           "AsyncTransportStream", "AuditSink", "ChecksWritable"]


class Transport(Protocol):
    """Sends one provider request and returns its answer (``LitellmTransport`` in production)."""

    def complete(self, request: TransportRequest) -> TransportResponse: ...

    async def acomplete(self, request: TransportRequest) -> TransportResponse: ...

    def supports_json_schema(self, route: Route) -> bool: ...


@runtime_checkable
class Readies(Protocol):
    """A transport with set-up to do before its first request (litellm's import), outside the call's
    latency; ``ready()`` is true when it did that set-up (or waited for it) now. A ``ready`` that
    takes two arguments is given the call's route and its transport request (None before the
    request is built): the set-up may depend on them."""

    def ready(self) -> bool | None: ...


@runtime_checkable
class AsyncReadies(Protocol):
    """:class:`Readies` for async calls (the set-up off the event loop)."""

    async def aready(self) -> bool | None: ...


class TransportStream(Protocol):
    """An open provider stream: text deltas, then the whole response."""

    def read(self) -> str | None: ...

    def final(self) -> TransportResponse: ...

    def close(self) -> None: ...


class AsyncTransportStream(Protocol):
    """:class:`TransportStream` read on an event loop."""

    async def read(self) -> str | None: ...

    def final(self) -> TransportResponse: ...

    def close(self) -> None: ...


@runtime_checkable
class Streams(Protocol):
    """A transport that can stream (``stream()``)."""

    def open_stream(self, request: TransportRequest) -> TransportStream: ...


@runtime_checkable
class AsyncStreams(Protocol):
    """A transport that can stream on an event loop (``astream()``)."""

    async def aopen_stream(self, request: TransportRequest) -> AsyncTransportStream: ...


class AuditSink(Protocol):
    """Where a call's records go (the host's ``audit.AuditLog`` in production)."""

    def write(self, record: dict[str, Any]) -> Any: ...


@runtime_checkable
class ChecksWritable(Protocol):
    """A sink that can tell before a call whether a write would fail (a full disk, a size limit)."""

    def check_writable(self) -> None: ...
