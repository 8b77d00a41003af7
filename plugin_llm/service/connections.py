"""What a client connection may hold before it is a request, and while its answer waits on it.

uvicorn bounds neither the time a connection takes to send a request head
nor how many connections are open (``timeout_keep_alive`` ends on the first
byte; at the open-file limit ``accept`` fails and every new client waits).
The protocols here (uvicorn's httptools or h11 protocol plus
:class:`ConnectionGuard`) close a connection that has not sent a whole head
within ``service.header_timeout`` (from its start, or from its previous
answer; a body gets as long after its head), cap the connections of a worker in total and per client address
(a new one beyond a cap takes the place of the connection that has waited
longest for a head, else it gets 503), and drop a connection whose answer has
waited on a client that does not read for ``service.write_timeout``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import socket
import struct
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["ConnectionLimits", "ConnectionGuard", "GuardedH11Protocol", "PROTOCOL", "H11_PROTOCOL",
           "raise_file_limit", "file_limit", "derived_max_connections", "connection_limits", "guard_of",
           "SCOPE_KEY"]

PROTOCOL = "plugin_llm.service.connections:GuardedHttpToolsProtocol"
H11_PROTOCOL = "plugin_llm.service.connections:GuardedH11Protocol"
#: the ASGI scope key naming the request's connection (the SSE stream drops it at the call's deadline)
SCOPE_KEY = "plugin_llm.connection"
#: files a worker keeps besides client connections: listening sockets, the event loop, the audit log, SQLite
#: and Redis stores, pipes
RESERVED_FILES = 64
#: the largest derived cap: an idle connection still costs memory (protocol, parser, buffers)
_CEILING = 16384


@dataclass(frozen=True)
class ConnectionLimits:
    """One worker's bounds (``service.*``); the caps count that worker's connections only."""

    header_timeout: float = 5.0
    write_timeout: float = 30.0
    max_connections: int = 480
    max_connections_per_address: int = 256
    #: addresses counted in the total only (trusted proxies, from ``--forwarded-allow-ips``); "*": every address
    exempt: tuple[str, ...] = ()


def file_limit() -> tuple[int, int] | None:
    """``(soft, hard)`` RLIMIT_NOFILE of this process, None where there is none (Windows)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_file_limit() -> tuple[int, int] | None:
    """Raise this process's soft open-file limit to its hard limit (workers inherit it).

    Returns ``(soft before, soft now)``; None where there is no such limit."""
    import resource

    limits = file_limit()
    if limits is None:  # pragma: no cover - Windows
        return None
    soft, hard = limits
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # e.g. macOS caps it below the hard limit: keep what we have
            return soft, soft
        return soft, target
    return soft, soft


def derived_max_connections(soft: int) -> int:
    """The connection cap the open-file limit allows: each connection may hold an upstream one too."""
    return max(1, min(_CEILING, (soft - RESERVED_FILES) // 2))


def connection_limits(settings: Any, soft: int | None,
                      forwarded_allow_ips: str | None) -> tuple[ConnectionLimits, list[str]]:
    """The limits ``settings`` (a ``ServiceSettings``) ask for under the open-file limit ``soft``, and the
    warnings of what could not be honoured."""
    warnings: list[str] = []
    allowed = derived_max_connections(soft) if soft is not None else _CEILING
    total = settings.max_connections if settings.max_connections is not None else allowed
    if total > allowed:
        warnings.append(f"service.max_connections: {total:,} is more than the open-file limit allows (soft limit "
                        f"{soft:,}: at most {allowed:,} connections, each may hold an upstream connection too); "
                        f"using {allowed:,}. Raise the limit (ulimit -n, systemd LimitNOFILE=) to allow more")
        total = allowed
    exempt = tuple(part.strip() for part in (forwarded_allow_ips or "").split(",") if part.strip())
    return ConnectionLimits(header_timeout=settings.header_timeout, write_timeout=settings.write_timeout,
                            max_connections=total,
                            max_connections_per_address=min(settings.max_connections_per_address, total),
                            exempt=exempt), warnings


def _default_limits() -> ConnectionLimits:
    limits = file_limit()
    return ConnectionLimits(max_connections=derived_max_connections(limits[0]) if limits else _CEILING)


class _Exempt:
    """Membership of a client address in ``exempt`` (addresses, networks, or "*")."""

    def __init__(self, entries: tuple[str, ...]) -> None:
        self.every = "*" in entries
        self.names: set[str] = set()
        self.networks: list[Any] = []
        for entry in entries:
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.names.add(entry)

    def __contains__(self, address: str) -> bool:
        if self.every or address in self.names:
            return True
        if not self.networks:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.networks if net.version == ip.version)


def _refusal_bytes() -> bytes:
    body = json.dumps({"error": {
        "type": "PluginLlmError", "param": None, "code": "too_many_connections",
        "message": "the gateway has too many open connections (from this address, or in all); retry later "
                   "(Retry-After). The operator sets the caps in config.yaml, service.max_connections and "
                   "service.max_connections_per_address"}}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"retry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(body), body))


_REFUSAL = _refusal_bytes()
#: SO_LINGER on, 0 s: close() resets the connection instead of flushing it
_RESET = struct.pack("ii", 1, 0)
#: drops of a connection whose client reads (an idle keep-alive one, a slow head): closed as usual
_GRACEFUL = frozenset({"header_timeout", "evicted"})


class ConnectionGuard:
    """One server's connections: counts per client address, the queues of connections waiting for a request
    head and of answers blocked on their client (oldest first), and one timer for the earliest deadline."""

    def __init__(self, limits: ConnectionLimits, loop: asyncio.AbstractEventLoop) -> None:
        self.limits = limits
        self.loop = loop
        self.open = 0
        self.by_address: dict[str, dict[Any, None]] = {}
        self.waiting: dict[Any, None] = {}  # armed for header_timeout, in the order armed
        self.stalled: dict[Any, None] = {}  # writing paused, in the order paused
        self._exempt = _Exempt(limits.exempt)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        #: what the guard did (read by tests)
        self.counts = {"refused": 0, "evicted": 0, "header_timeout": 0, "write_timeout": 0}

    # admission
    def admit(self, conn: Any, address: str) -> bool:
        """Register ``conn``; False when it must be refused (a cap is reached and no connection waits for a head)."""
        limits = self.limits
        peers = self.by_address.get(address)
        if peers is not None and len(peers) >= limits.max_connections_per_address and address not in self._exempt:
            victim = next((c for c in peers if c._head_by is not None), None)
            if victim is None:
                self.counts["refused"] += 1
                return False
            self._evict(victim)
        if self.open >= limits.max_connections:
            if not self.waiting:
                self.counts["refused"] += 1
                return False
            self._evict(next(iter(self.waiting)))
        self.open += 1
        conn._guard_addr = address
        self.by_address.setdefault(address, {})[conn] = None
        return True

    def _evict(self, victim: Any) -> None:
        self.counts["evicted"] += 1
        self.drop(victim, "evicted")

    def release(self, conn: Any) -> None:
        """Forget ``conn`` (closed); idempotent."""
        address = conn._guard_addr
        if address is None:
            return
        conn._guard_addr = None
        self.open -= 1
        peers = self.by_address.get(address)
        if peers is not None:
            peers.pop(conn, None)
            if not peers:
                del self.by_address[address]
        if conn._head_by is not None:
            conn._head_by = None
            self.waiting.pop(conn, None)
        if conn._stall_by is not None:
            conn._stall_by = None
            self.stalled.pop(conn, None)

    def drop(self, conn: Any, why: str) -> None:
        """Close ``conn`` now, without flushing what it has not sent (its client is not reading, or must go)."""
        self.release(conn)
        conn.closed_by = why
        transport = conn.transport
        sock = transport.get_extra_info("socket") if why not in _GRACEFUL else None
        if sock is not None:  # a reset: the kernel drops what it still holds for a client that does not read
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            except (OSError, AttributeError, TypeError):
                pass
        transport.abort()

    # deadlines
    def arm(self, conn: Any) -> None:
        """``conn`` now waits on its client for a request head (or body): ``header_timeout`` seconds from now."""
        if conn._guard_addr is None:  # closed by the guard while its parser still runs: nothing to wait for
            return
        if conn._head_by is not None:
            del self.waiting[conn]
        when = conn._head_by = self.loop.time() + self.limits.header_timeout
        self.waiting[conn] = None
        if when < self._timer_at:
            self._wake_at(when)

    def stall(self, conn: Any) -> None:
        if conn._stall_by is None and conn._guard_addr is not None:
            when = conn._stall_by = self.loop.time() + self.limits.write_timeout
            self.stalled[conn] = None
            if when < self._timer_at:
                self._wake_at(when)

    def unstall(self, conn: Any) -> None:
        if conn._stall_by is not None:
            conn._stall_by = None
            del self.stalled[conn]

    def _wake_at(self, when: float) -> None:
        """The timer fires at ``when`` (the earliest deadline; one timer for every connection)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._sweep)

    def _schedule(self) -> None:
        when = [next(iter(self.waiting))._head_by] if self.waiting else []
        if self.stalled:
            when.append(next(iter(self.stalled))._stall_by)
        if when:
            self._wake_at(min(when))

    def _sweep(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = self.loop.time()
        while self.waiting:
            conn = next(iter(self.waiting))
            if conn._head_by > now:
                break
            if conn._stall_by is not None or conn.flow.read_paused:
                # its last answer still waits on the client (the write timeout's turn), or the app is not reading
                del self.waiting[conn]
                conn._head_by = now + self.limits.header_timeout
                self.waiting[conn] = None
                continue
            self.counts["header_timeout"] += 1
            self.drop(conn, "header_timeout")
        while self.stalled:
            conn = next(iter(self.stalled))
            if conn._stall_by > now:
                break
            self.counts["write_timeout"] += 1
            self.drop(conn, "write_timeout")
        self._schedule()


def guard_of(protocol: Any) -> ConnectionGuard:
    """The guard of ``protocol``'s server (one per uvicorn server, built on its first connection)."""
    state = protocol.server_state
    guard = getattr(state, "plugin_llm_guard", None)
    if guard is None:
        limits = getattr(protocol.config, "plugin_llm_connections", None) or _default_limits()
        guard = ConnectionGuard(limits, protocol.loop)
        state.plugin_llm_guard = guard
    return guard


def _address(transport: Any) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, (tuple, list)) and peer:
        return str(peer[0])
    return ""  # a Unix socket: one address


class _Guarded:
    """The guard's hooks in a uvicorn HTTP protocol (class attributes: no cost on the hot path's __init__)."""

    _guard: ConnectionGuard
    _guard_addr: str | None = None
    _head_by: float | None = None
    _stall_by: float | None = None
    _refused = False
    #: why the gateway closed this connection (``header_timeout``, ``write_timeout``, ``evicted``, ``deadline``)
    closed_by: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        guard = self._guard = guard_of(self)
        if not guard.admit(self, _address(transport)):
            self._refused = True
            transport.write(_REFUSAL)
            transport.close()
            return
        super().connection_made(transport)  # type: ignore[misc]
        guard.arm(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._guard.release(self)
        super().connection_lost(exc)  # type: ignore[misc]

    def _head_done(self) -> None:
        if self._head_by is not None:
            self._head_by = None
            del self._guard.waiting[self]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        self._guard.stall(self)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        self._guard.unstall(self)

    def drop(self, why: str) -> None:
        """Close this connection now (an answer that must not wait on its client any longer)."""
        if not self._refused:
            self._guard.drop(self, why)


class GuardedH11Protocol(_Guarded, H11Protocol):
    """uvicorn's h11 protocol under the guard."""

    _seen_cycle: Any = None

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return
        if cycle is not self._seen_cycle:  # a request head arrived
            self._seen_cycle = cycle
            self._head_done()
            cycle.scope[SCOPE_KEY] = self  # type: ignore[literal-required]
            if cycle.more_body and not cycle.waiting_for_100_continue:  # its body: within header_timeout too
                self._guard.arm(self)
        elif not cycle.more_body:
            self._head_done()

    def on_response_complete(self) -> None:
        self._guard.arm(self)  # a pipelined request's head (handled below) disarms it again
        super().on_response_complete()


try:
    from plugin_llm.service.protocol import CoalescingHttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency; h11 is uvicorn's own
    GuardedHttpToolsProtocol = None  # type: ignore[assignment,misc]
else:
    class GuardedHttpToolsProtocol(_Guarded, CoalescingHttpToolsProtocol):  # type: ignore[no-redef]
        """The service's httptools protocol (one write per buffered answer) under the guard."""

        def on_headers_complete(self) -> None:
            self.scope[SCOPE_KEY] = self  # type: ignore[literal-required]
            super().on_headers_complete()
            if self.expect_100_continue:  # the client waits for the app to ask for the body
                self._head_done()
            else:  # the body: within header_timeout too (a bodiless request completes at once)
                self._guard.arm(self)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            if self._head_by is not None and not self.cycle.response_complete:  # else: armed for the next head
                self._head_by = None
                del self._guard.waiting[self]

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.pipeline:  # else the next head is already here
                self._guard.arm(self)
