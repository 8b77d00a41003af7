"""The ``redis`` limit store: several gateway hosts sharing one Redis.

Each admission, settlement and lease step is one Lua script (:mod:`.redis_scripts`) run by the
server (atomic), sent as ``EVALSHA`` with a fallback to ``EVAL``: one round trip; a settlement
queued with ``settle_later`` rides along in the next admission's round trip. A plugin's keys share
one hash tag (one cluster slot); their layout is in docs/design.md, "Limits and leases".

Every socket operation is bounded by the time the caller gives (the call's remaining deadline,
capped by ``limits.store_timeout``); redis-py's own retries are off, so a Redis that is down or
stalled fails fast into ``on_store_error``. ``now`` comes from the caller: hosts sharing a Redis
need synchronised clocks (NTP); a skew only shifts window edges. redis-py is imported when this
store is first used, never at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
from typing import Any

from plugin_llm.limits.redis_scripts import (
    ADMIT_LUA,
    BREAKER_ACQUIRE_LUA,
    BREAKER_CLEAR_LUA,
    BREAKER_DELETE_LUA,
    BREAKER_READ_LUA,
    BREAKER_REPORT_LUA,
    LEASE_LUA,
    READ_LUA,
    RESET_LUA,
    SETTLE_LUA,
)
from plugin_llm.limits.settings import MAX_TOTAL, PluginLimits, plugin_phrase, redact_url, url_secrets
from plugin_llm.limits.store import (
    MAX_BREAKER_ROUTES,
    MAX_PROBE_SECONDS,
    Admission,
    BreakerState,
    breaker_row,
    breaker_state,
    check_route,
    Counters,
    Denial,
    LeaseGrant,
    LeaseOp,
    QueuedStore,
    Reservation,
    SettlementQueue,
    StoreDataError,
    StoreError,
    buckets_at,
    lease_denial,
    limit_caps,
    deny,
    new_reservation_id,
)

__all__ = ["RedisStore", "ADMIT_LUA", "SETTLE_LUA", "LEASE_LUA", "BREAKER_ACQUIRE_LUA", "BREAKER_REPORT_LUA"]

_log = logging.getLogger("plugin_llm.limits")

_MAX_IDLE = 64  # idle connections kept for reuse


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _breaker_from(value: Any):
    """A hash value -> a checked row, or None (not one this store writes)."""
    parts = _text(value).split(" ")
    if len(parts) != 6 or not parts[1].isdigit() or len(parts[1]) > 12:
        return None
    numbers = []
    for part in parts[2:5]:
        try:
            numbers.append(None if part == "-" else float(part))
        except ValueError:
            return None
    return breaker_row(parts[0], int(parts[1]), *numbers)


_COUNT = re.compile(rb"\d{1,19}")  # a settled count as Redis holds it (INCRBY keeps it below 2**63)
_PLAIN_ID = re.compile(r"^[A-Za-z0-9_.\-/@+:]{1,128}$")


def _key_id(plugin_id: str) -> str:
    """The plugin id inside a key: verbatim when plain, else a digest (a brace or a newline in an id
    must not be able to reach into another plugin's keys)."""
    if _PLAIN_ID.match(plugin_id):
        return plugin_id
    return "sha256-" + hashlib.sha256(plugin_id.encode("utf-8", "surrogatepass")).hexdigest()


def _bulk(value: Any) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _pack_head(command: str, script: str, nkeys: int, nargs: int) -> bytes:
    return b"*%d\r\n" % (3 + nkeys + nargs) + _bulk(command) + _bulk(script) + _bulk(nkeys)


def _pack_tail(keys: list[str], args: list[Any]) -> bytes:
    """RESP encoding of the keys and arguments (redis-py's generic packer costs more than the round trip)."""
    return b"".join([_bulk(k) for k in keys] + [_bulk(a) for a in args])


def _reason(exc: BaseException, secrets: tuple[str, ...]) -> str:
    text = str(exc) or type(exc).__name__
    for secret in secrets:
        text = text.replace(secret, "***")
    return text if len(text) <= 200 else text[:197] + "..."


class RedisStore(QueuedStore):
    """Redis store at ``url``; keys under ``prefix``. Connections are reused across threads (a small idle list); a forked child opens its own."""

    name = "redis"
    supports_leases = True

    def __init__(self, url: str, *, prefix: str = "plugin_llm", timeout: float = 2.0) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:  # pragma: no cover - redis is a dependency
            raise StoreError("limits.store is redis but the redis package is not installed: pip install 'redis>=5'") from None
        self._redis = redis
        self._display = redact_url(url)
        self._secret = url_secrets(url)
        try:
            self._pool = redis.ConnectionPool.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0,
            )
            self._pool.make_connection()  # (not connected yet) the URL's options are the connection's
        except (TypeError, ValueError, redis.RedisError) as exc:  # an option redis-py does not take, say
            raise StoreError(f"limits.redis_url ({self._display}) is not usable: {_reason(exc, self._secret)}; "
                             "fix it in config.yaml") from None
        self.prefix = prefix
        self._sha: dict[str, str] = {}
        self._queue = SettlementQueue(self._apply_queued, "redis", timeout)
        self._idle: list[Any] = []  # connections not in use, most recently used last
        self._idle_lock = threading.Lock()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"RedisStore({self._display!r})"

    # -- one round trip, bounded by the caller's time
    def _take(self):
        """An idle connection, or a new one (opened with the URL's settings on first use)."""
        pid = os.getpid()
        with self._idle_lock:
            if self._pid != pid:  # forked: the parent's sockets are not ours (redis-py never shuts them here)
                self._idle, self._pid = [], pid
            if self._idle:
                return self._idle.pop()
        return self._pool.connection_class(**self._pool.connection_kwargs)

    def _give_back(self, conn) -> None:
        with self._idle_lock:
            if self._pid == os.getpid() and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.disconnect()

    def _send_and_read(self, conn, commands: list[tuple[str, list[str], list[Any]]], *, source_always: bool = False) -> list:
        """Send every script in one write and read every reply: one round trip. An error reply is
        returned as its exception (the connection stays in step)."""
        redis = self._redis
        packed = []
        for source, keys, args in commands:
            sha = None if source_always else self._sha.get(source)
            head = (_pack_head("EVALSHA", sha, len(keys), len(args)) if sha is not None
                    else _pack_head("EVAL", source, len(keys), len(args)))
            packed.append(head + _pack_tail(keys, args))
        conn.send_packed_command([b"".join(packed)], check_health=False)
        replies: list[Any] = []
        for source, _, _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
                continue
            if source not in self._sha:
                self._sha[source] = hashlib.sha1(source.encode()).hexdigest()
        return replies

    def _run_scripts(self, commands: list[tuple[str, list[str], list[Any]]], timeout: float) -> list:
        """Run ``commands`` (source, keys, args) in one round trip (two if the server lost its script cache)."""
        redis = self._redis
        t = max(0.001, timeout)
        conn = None
        sent = False
        try:
            conn = self._take()
            conn.socket_timeout = conn.socket_connect_timeout = t
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                sock.settimeout(t)
            if sock is None:
                conn.connect()  # connect first, so that a refused connection is known to have sent nothing
            sent = True
            replies = self._send_and_read(conn, commands)
            lost = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
            if lost:  # the server restarted or flushed its script cache: send those sources again
                for i, reply in zip(lost, self._send_and_read(conn, [commands[i] for i in lost], source_always=True)):
                    replies[i] = reply
            self._give_back(conn)
            return replies
        except (redis.RedisError, OSError, AttributeError, IndexError, TypeError, ValueError) as exc:
            if conn is not None:
                conn.disconnect()
            if isinstance(exc, (redis.RedisError, OSError)):
                error = StoreError(f"the Redis limits store ({self._display}) failed: {_reason(exc, self._secret)}")
            else:  # what redis-py raises when the server does not speak Redis
                error = StoreError(f"the Redis limits store ({self._display}) does not answer as a Redis server "
                                   f"does ({type(exc).__name__}): is limits.redis_url a Redis server?")
            error.maybe_applied = sent
            raise error from None
        except BaseException:
            if conn is not None:
                conn.disconnect()  # a half-read reply must not be read by the next call
            raise

    def _script(self, source: str, keys: list[str], args: list[Any], timeout: float):
        (reply,) = self._run_scripts([(source, keys, args)], timeout)
        if isinstance(reply, Exception):
            raise StoreError(f"the Redis limits store ({self._display}) refused the script: {_reason(reply, self._secret)}")
        return reply

    def _with_queued(self, script: str, plugin_id: str, b: Any, args: list[Any], timeout: float,
                     more_keys: tuple[str, ...] = ()) -> Any:
        """Run ``script`` for the plugin's buckets (and ``more_keys``) in one round trip, after the queued
        settlements (they ride along, in order, before it); its reply, or StoreError when Redis refused it."""
        queued = self._queue.take()
        keys = [*self._keys(plugin_id, b.minute, b.day, b.month), *more_keys]
        try:
            replies = self._run_scripts([*queued, (script, keys, args)], timeout)
        except StoreError as exc:
            if queued:
                self._lost(queued, exc)
            raise
        self._settled(replies, len(queued))
        reply = replies[-1]
        if isinstance(reply, Exception):
            raise StoreError(f"the Redis limits store ({self._display}) refused the script: {_reason(reply, self._secret)}")
        return reply

    def _settled(self, replies: list, count: int) -> None:
        for reply in replies[:count]:
            if isinstance(reply, Exception):
                _log.error("limits: the Redis limits store (%s) refused a settlement: %s", self._display,
                           _reason(reply, self._secret))

    def _lost(self, items: list, exc: StoreError) -> None:
        """Settlements a failed round trip may not have applied go back to the queue. Those that were
        sent (applied or not, nobody knows) are sent again as retries, which Redis applies only while
        the reservation is still there: at most once (once it expired, as a reservation it counted)."""
        if getattr(exc, "maybe_applied", True):
            items = [(source, keys, [*args[:3], 1]) if source is SETTLE_LUA else (source, keys, args)
                     for source, keys, args in items]
        self._queue.put_back(items)

    @contextlib.contextmanager
    def _parsing(self, what: str):
        """A reply that is not what the script returns (not a Redis, a proxy, a tampered script) is a store error."""
        try:
            yield
        except (IndexError, KeyError, TypeError, ValueError, OverflowError) as exc:
            raise StoreError(f"the Redis limits store ({self._display}) answered {what} with something that is "
                             f"not a limits reply ({type(exc).__name__}): is limits.redis_url a Redis server?") from None

    def _not_counts(self, plugin_id: str, more: str) -> StoreDataError:
        return StoreDataError(f"the Redis limits store ({self._display}) holds a count that is not a whole number of 0 "
                              f"or more for {plugin_phrase(plugin_id)} (edited?){more}; fix or delete its keys "
                              f"({self.prefix}:{{{_key_id(plugin_id)}}}:*): a reset does not erase what it cannot read "
                              "and record")

    def _prefix(self, plugin_id: str) -> str:
        return f"{self.prefix}:{{{_key_id(plugin_id)}}}"  # one hash tag: every key of a plugin in one slot

    def _keys(self, plugin_id: str, minute: str, day: str, month: str) -> list[str]:
        p = self._prefix(plugin_id)
        return [f"{p}:res", f"{p}:resv", f"{p}:mi:{minute}", f"{p}:d:{day}", f"{p}:mo:{month}"]

    def admit(self, plugin_id: str, reservation: Reservation, limits: PluginLimits, now: float, *,
              timeout: float) -> Admission | Denial:
        b = buckets_at(now)
        rid = new_reservation_id()
        expires = now + max(0.0, reservation.ttl)
        caps = limit_caps(limits)
        args = [repr(now), repr(expires), rid, int(reservation.cost_nano), int(reservation.tokens), b.minute, b.day, b.month,
                *(-1 if c is None else int(c) for c in caps)]
        reply = self._with_queued(ADMIT_LUA, plugin_id, b, args, timeout)
        with self._parsing("an admission"):
            if int(reply[0]) == 1:
                return Admission(plugin_id, rid, reservation.cost_nano, reservation.tokens, b, expires)
            earliest = float(reply[4])
            return deny(plugin_id, limits, int(reply[1]) - 1, int(reply[2]), int(reply[3]), reservation, b,
                        earliest if earliest >= 0 else None)

    def lease(self, plugin_id: str, op: LeaseOp, limits: PluginLimits, *, timeout: float) -> LeaseGrant | Denial:
        b = op.buckets
        caps = limit_caps(limits)
        total = (min(MAX_TOTAL, a + s) for a, s in zip(op.applied, op.settled))
        args = [repr(op.now), repr(op.expires), op.lease_id, b.minute, b.day, b.month, *total, *op.keep, *op.ask,
                *op.want, *(-1 if c is None else int(c) for c in caps), repr(op.keep_expires)]
        counted = f"{self._prefix(plugin_id)}:lt:{op.lease_id}"  # what the lease settled in all, as counted here
        reply = self._with_queued(LEASE_LUA, plugin_id, b, args, timeout, (counted,))
        with self._parsing("a lease step"):
            if int(reply[0]) == 1:
                held = (int(reply[1]), int(reply[2]), int(reply[3]), int(reply[4]))
                return LeaseGrant(held, op.expires if any(held) else op.keep_expires)
            earliest = float(reply[4])
            return lease_denial(plugin_id, limits, op, int(reply[1]) - 1, int(reply[2]), int(reply[3]),
                                earliest if earliest >= 0 else None)

    def _settle_item(self, admission: Admission, cost_nano: int, tokens: int) -> tuple[str, list[str], list[Any]]:
        a, b = admission, admission.buckets
        return (SETTLE_LUA, self._keys(a.plugin_id, b.minute, b.day, b.month),
                [a.reservation_id, max(0, int(cost_nano)), max(0, int(tokens))])

    def settle(self, admission: Admission, cost_nano: int, tokens: int, *, timeout: float) -> None:
        self._script(*self._settle_item(admission, cost_nano, tokens), timeout)

    def _apply_queued(self, items: list, timeout: float) -> None:
        try:
            replies = self._run_scripts(items, timeout)
        except StoreError as exc:
            self._lost(items, exc)
            raise
        self._settled(replies, len(items))

    def counters(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        b = self._caught_up(plugin_id, now, timeout)
        r = self._script(READ_LUA, self._keys(plugin_id, b.minute, b.day, b.month), [repr(now), b.minute, b.day, b.month], timeout)
        with self._parsing("a read"):
            earliest = float(r[1])
            if not all(_COUNT.fullmatch(v if isinstance(v, bytes) else str(v).encode()) for v in r[6:10]) \
                    or min(int(v) for v in r[:1] + r[2:6]) < 0:  # (the settled counts come as Redis holds them)
                raise self._not_counts(plugin_id, "")
            return Counters(
                in_flight=int(r[0]), earliest_expiry=earliest if earliest >= 0 else None,
                minute_tokens_reserved=int(r[2]), day_reserved=int(r[3]), month_reserved=int(r[4]),
                minute_requests_reserved=int(r[5]), minute_requests=int(r[6]), minute_tokens=int(r[7]),
                day_spent=int(r[8]), month_spent=int(r[9]),
            )

    def reset(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        b = self._caught_up(plugin_id, now, timeout)
        keys = self._keys(plugin_id, b.minute, b.day, b.month)[2:]
        r = self._script(RESET_LUA, keys, [], timeout)  # what is deleted is what is read: one script
        if r and r[0] in (b"corrupt", "corrupt"):  # checked before anything was deleted
            raise self._not_counts(plugin_id, "; nothing was deleted")
        with self._parsing("a reset"):
            counts = [int(v) for v in r]
            if len(counts) != 4 or min(counts) < 0:
                raise ValueError("not four counts of 0 or more")
            return Counters(minute_requests=counts[0], minute_tokens=counts[1], day_spent=counts[2],
                            month_spent=counts[3])

    # -- circuit breakers: one hash for every route, each step one script
    def _breakers_key(self) -> str:
        return f"{self.prefix}:breakers"

    def _state_reply(self, reply: Any, what: str) -> str:
        state = _text(reply)
        if state not in ("closed", "open", "half_open", "probe"):
            with self._parsing(what):
                raise ValueError(state[:40])
        return state

    def breaker_acquire(self, route: str, policy, now: float, *, timeout: float, probe_for: float) -> str:
        check_route(route)
        if policy.failures <= 0:
            return "closed"
        probe_until = now + max(0.0, min(float(probe_for), MAX_PROBE_SECONDS))
        reply = self._script(BREAKER_ACQUIRE_LUA, [self._breakers_key()], [route, repr(float(now)), repr(probe_until)],
                             timeout)
        return self._state_reply(reply, "a breaker step")

    def breaker_report(self, route: str, ok: bool, policy, now: float, *, timeout: float) -> str:
        check_route(route)
        if policy.failures <= 0:
            return "closed"
        if ok:
            self._script(BREAKER_DELETE_LUA, [self._breakers_key()], [route], timeout)
            return "closed"
        now = float(now)
        args = [route, repr(now), int(policy.failures), repr(float(policy.window)), repr(now + policy.cooldown),
                MAX_BREAKER_ROUTES]
        return self._state_reply(self._script(BREAKER_REPORT_LUA, [self._breakers_key()], args, timeout),
                                 "a breaker report")

    def breaker_states(self, now: float, *, timeout: float) -> dict[str, BreakerState]:
        reply = self._script(BREAKER_READ_LUA, [self._breakers_key()], [], timeout)
        out: dict[str, BreakerState] = {}
        with self._parsing("a breaker read"):
            for field, value in zip(reply[::2], reply[1::2]):
                route, row = _text(field), _breaker_from(value)
                if row is not None:  # (an edited value counts as closed: not listed)
                    out[route] = breaker_state(route, row)
        return dict(sorted(out.items()))

    def breaker_reset(self, route: str | None, *, timeout: float) -> None:
        if route is None:
            self._script(BREAKER_CLEAR_LUA, [self._breakers_key()], [], timeout)
        else:
            self._script(BREAKER_DELETE_LUA, [self._breakers_key()], [check_route(route)], timeout)

    def close(self) -> None:
        self._close_leases_and_queue()
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            try:
                conn.disconnect()
            except Exception:  # closing is best effort
                pass
