"""The limit store interface, its values, and the admission rule both stores implement.

A store keeps, per plugin: settled spend per calendar bucket (UTC day and
month, in nano-dollars), finished requests and their tokens per UTC minute,
and the in-flight reservations (each with its worst-case cost and tokens, the buckets
it was admitted in, and an expiry). ``admit`` checks every limit and records
the reservation in one atomic step; ``settle`` replaces a reservation by the
actual usage (added to the buckets it was admitted in); ``release`` drops it (the request still counts for ``requests_per_minute``).
A request counts in the minute it was admitted: while in flight as its
reservation, afterwards in that minute's bucket.
A reservation past its expiry no longer counts (its process died), so a
crash can hold capacity only until the call's deadline plus the grace period.

Windows are fixed calendar buckets: a new minute/day/month is a new key, so
a window boundary never overwrites spend, and the month keeps every day's.
"""

from __future__ import annotations

import atexit
import calendar
import itertools
import logging
import math
import os
import threading
import time
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from audit import records
from plugin_llm.errors import PluginLlmLimitError
from plugin_llm.limits.settings import NANO, PluginLimits

if TYPE_CHECKING:  # (the stores only read its three numbers: importing the config package is not needed)
    from plugin_llm.config.breakers import BreakerPolicy

__all__ = [
    "LIMIT_NAMES",
    "Reservation",
    "Admission",
    "Denial",
    "WindowUsage",
    "Snapshot",
    "Counters",
    "Buckets",
    "StoreError",
    "PluginLlmLimitError",
    "LimitStore",
    "SettlementQueue",
    "FLUSH_DELAY",
    "buckets_at",
    "decide",
    "deny",
    "windows",
    "iso_utc",
    "new_reservation_id",
    "LeaseOp",
    "LeaseGrant",
    "LEASE_SHARE",
    "DIMS",
    "BreakerState",
    "BreakerRow",
    "BREAKER_STATES",
    "MAX_BREAKER_ROUTES",
    "MAX_ROUTE_CHARS",
    "check_route",
    "breaker_after_failure",
    "breaker_row",
    "breaker_state",
    "MAX_PROBE_SECONDS",
]

_log = logging.getLogger("plugin_llm.limits")

#: limits in the order a store checks them; the first one exceeded decides
LIMIT_NAMES = ("max_concurrent", "requests_per_minute", "tokens_per_minute", "budget_usd.day", "budget_usd.month")


class StoreError(Exception):
    """The store could not answer in time (down, locked, slow, corrupt). Message holds no secret."""


class StoreDataError(StoreError):
    """The store answered, but what it holds for one plugin is not a count (edited, or corrupt): the
    other plugins' counts may be fine (``limits show`` reads them)."""


@dataclass(frozen=True)
class Reservation:
    """What one request asks to hold: worst-case cost (nano-USD; 0 without a budget) and tokens.

    ``ttl`` is the time in seconds until the reservation stops counting if
    it is never settled (the call's remaining deadline plus the grace period).
    """

    cost_nano: int
    tokens: int
    ttl: float


#: the dimensions a lease holds, in this order: calls in flight, requests and tokens of the
#: lease's minute, nano-dollars of its day *and* month (one amount counts in both)
DIMS = ("slots", "requests", "tokens", "nano")


@dataclass(frozen=True)
class LeaseOp:
    """One atomic step on a lease (a reservation row that holds a slice of a plugin's headroom).

    The store, in one transaction / script: adds ``settled`` (requests, tokens, nano of calls
    that finished under the lease) to the lease's buckets; drops expired reservations; if
    ``ask`` is not zero, checks every limit as :func:`decide` does with this row counting as
    ``keep + ask`` (a refusal leaves the row at ``keep`` until ``keep_expires`` and returns
    the :class:`Denial`); then holds ``keep + ask + extra`` until ``expires``, where each
    dimension's ``extra`` is ``want`` but at most 1/:data:`LEASE_SHARE` of what is still
    free under that limit (0 for a dimension without a limit). ``keep`` (calls in flight
    under the lease) is held unconditionally. A row left holding nothing is deleted.
    Vectors are in :data:`DIMS` order; ``settled`` is (requests, tokens, nano).

    ``applied`` is what the lease's earlier steps are known to have settled (the same three
    numbers, since the lease began): a store whose step can time out after it was applied (Redis)
    keeps the lease's total and adds only what it lacks of ``applied + settled``, so the usage a
    failed step sends again is counted once.
    """

    lease_id: str
    buckets: "Buckets"
    now: float
    expires: float
    keep_expires: float
    settled: tuple[int, int, int]
    keep: tuple[int, int, int, int]
    ask: tuple[int, int, int, int]
    want: tuple[int, int, int, int]
    applied: tuple[int, int, int] = (0, 0, 0)


@dataclass(frozen=True)
class LeaseGrant:
    """What the store now holds for a lease (:data:`DIMS` order) and until when."""

    held: tuple[int, int, int, int]
    expires: float


#: a lease grows by at most this fraction of a limit's free headroom per step, so near a
#: limit leases shrink to exact per-call reservations and several processes share what is left
LEASE_SHARE = 8


@dataclass(frozen=True)
class Buckets:
    """The calendar buckets one instant falls in, and when each ends (UTC)."""

    minute: str
    day: str
    month: str
    minute_ends: float
    day_ends: float
    month_ends: float


_bucket_cache: tuple[int, Buckets] | None = None  # (minute, buckets), swapped as one object


def buckets_at(now: float) -> Buckets:
    """Buckets of ``now`` (Unix seconds): ``2026-12-01T10:05``, ``2026-12-01``, ``2026-12``."""
    global _bucket_cache
    minute = int(now // 60)
    cached = _bucket_cache
    if cached is not None and cached[0] == minute:
        return cached[1]
    t = time.gmtime(minute * 60)
    day_start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
    next_month = (t.tm_year + (t.tm_mon == 12), t.tm_mon % 12 + 1)
    value = Buckets(
        minute=time.strftime("%Y-%m-%dT%H:%M", t),
        day=time.strftime("%Y-%m-%d", t),
        month=time.strftime("%Y-%m", t),
        minute_ends=float((minute + 1) * 60),
        day_ends=float(day_start + 86400),
        month_ends=float(calendar.timegm((*next_month, 1, 0, 0, 0))),
    )
    _bucket_cache = (minute, value)
    return value


class _Ids:
    """Reservation ids: a random per-process prefix plus a counter (no system call per id, unlike
    uuid4); a forked child draws a new prefix."""

    def __init__(self) -> None:
        self._renew()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter):x}"


new_reservation_id = _Ids()


def iso_utc(ts: float | None) -> str | None:
    """``ts`` (Unix seconds) in the CLI's one time format (:func:`plugin_llm.timefmt.utc_iso`:
    ``YYYY-MM-DDTHH:MM:SS.mmmZ``); instants past the year 9999 as its last millisecond."""
    from plugin_llm.timefmt import utc_iso

    return utc_iso(ts)


@dataclass(frozen=True)
class Admission:
    """An admitted request: the reservation the store holds until settled, released or expired."""

    plugin_id: str
    reservation_id: str
    cost_nano: int
    tokens: int
    buckets: Buckets
    expires_at: float


def usd_text(nano: float | None) -> str:
    """``$1.00``, ``$0.995``, ``$0.000013``: cents at least, up to the micro-dollar, never rounded up (so
    $0.996 spent of a $1.00 budget is not shown as "$1.00 used"); the one money format of limits' texts."""
    if nano is None:
        return "-"
    nano = int(nano)
    if nano < 0:  # (no store holds one: they are refused as corrupt)
        return "-" + usd_text(-nano)
    if 0 < nano < 1000:
        return "<$0.000001"
    whole, micro = divmod(nano // 1000, 1_000_000)
    cents = f"{micro:06d}".rstrip("0").ljust(2, "0")
    return f"${whole:,}.{cents}"


@dataclass(frozen=True)
class Denial:
    """Why a call was refused: the plugin, the deciding limit, its config key and when it resets.

    ``used`` is what is settled in the current window, ``in_flight`` what
    admitted calls still hold, ``requested`` what this call needs, ``cap``
    the limit (money in nano-USD). ``resets_at`` is None when waiting cannot
    help (the call alone exceeds the cap, or the configuration is wrong).
    """

    plugin_id: str
    limit: str
    config_key: str
    cap: int | None = None
    used: int = 0
    in_flight: int = 0
    requested: int = 0
    resets_at: float | None = None
    reason: str = ""

    @property
    def message(self) -> str:
        return self.reason or _describe(self)

    def audit_fields(self) -> dict[str, Any]:
        """Fields for the ``quota`` audit record of this denial."""
        return {
            records.DECISION: "denied",
            records.DECISION_REASON: self.message,
            records.DECISION_KEY: self.config_key,
            records.LIMITS_LIMIT: self.limit,
            records.LIMITS_RESETS_AT: iso_utc(self.resets_at),
        }

    def error(self) -> "PluginLlmLimitError":
        return PluginLlmLimitError(self)


_UNITS = {
    "max_concurrent": ("calls in flight", str),
    "requests_per_minute": ("requests this minute", str),
    "tokens_per_minute": ("tokens this minute", str),
    "budget_usd.day": ("today (UTC)", usd_text),
    "budget_usd.month": ("this month (UTC)", usd_text),
}


def _describe(d: Denial) -> str:
    what, fmt = _UNITS.get(d.limit, ("", str))
    head = f"plugin '{d.plugin_id}' is over its {d.limit} limit ({d.config_key} = {fmt(d.cap) if d.cap is not None else '?'})"
    if d.limit in ("max_concurrent", "requests_per_minute"):
        n = d.in_flight if d.limit == "max_concurrent" else d.used + d.in_flight
        body = f"{n} {what if n != 1 else what.replace('s ', ' ', 1)} already"
    else:
        body = f"{fmt(d.used)} settled + {fmt(d.in_flight)} in flight {what}, this call may use up to {fmt(d.requested)}"
    if d.cap == 0:
        tail = "the limit is 0, so no call is admitted until it is raised in config.yaml"
    elif d.resets_at is None:
        tail = ("this call alone needs more than the limit: pass a smaller max_tokens or shorter input, "
                "or raise the limit")
    elif d.limit == "max_concurrent":
        tail = f"a slot frees when a call in flight ends (at the latest {iso_utc(d.resets_at)})"
    else:
        tail = f"the window resets at {iso_utc(d.resets_at)}"
    return f"{head}: {body}; {tail}"


@dataclass(frozen=True)
class WindowUsage:
    """One limit in its current window, for ``limits show``."""

    limit: str
    config_key: str
    cap: int
    used: int
    in_flight: int
    resets_at: float | None

    def as_dict(self) -> dict[str, Any]:
        money = self.limit.startswith("budget_usd")
        scale = (lambda v: v / NANO) if money else (lambda v: v)
        return {
            "limit": self.limit,
            "config_key": self.config_key,
            "cap": scale(self.cap),
            "used": scale(self.used),
            "in_flight": scale(self.in_flight),
            "unit": "usd" if money else ("calls" if self.limit == "max_concurrent" else
                                          "requests" if self.limit == "requests_per_minute" else "tokens"),
            "resets_at": iso_utc(self.resets_at),
            "resets_at_unix": self.resets_at,
        }


@dataclass(frozen=True)
class Counters:
    """What a store read for one plugin at one instant (settled + live reservations)."""

    in_flight: int = 0
    earliest_expiry: float | None = None
    minute_requests: int = 0
    minute_requests_reserved: int = 0
    minute_tokens: int = 0
    minute_tokens_reserved: int = 0
    day_spent: int = 0
    day_reserved: int = 0
    month_spent: int = 0
    month_reserved: int = 0


@dataclass(frozen=True)
class Snapshot:
    """A plugin's usage in the current windows: every configured limit, plus the raw counters."""

    plugin_id: str
    at: float
    counters: Counters
    windows: tuple[WindowUsage, ...]

    def as_dict(self) -> dict[str, Any]:
        c = self.counters
        return {
            "plugin_id": self.plugin_id,
            "at": iso_utc(self.at),
            "in_flight": c.in_flight,
            "spent_usd": {"day": c.day_spent / NANO, "month": c.month_spent / NANO},
            "reserved_usd": {"day": c.day_reserved / NANO, "month": c.month_reserved / NANO},
            "minute": {"requests": c.minute_requests, "requests_reserved": c.minute_requests_reserved,
                       "tokens": c.minute_tokens, "tokens_reserved": c.minute_tokens_reserved},  # (as spent/reserved)
            "limits": [w.as_dict() for w in self.windows],
        }


def _caps(limits: PluginLimits) -> tuple[int | None, ...]:
    return (limits.max_concurrent, limits.requests_per_minute, limits.tokens_per_minute,
            limits.budget_day_nano, limits.budget_month_nano)


def _usage(c: Counters, b: Buckets) -> tuple[tuple[int, int, float | None], ...]:
    """(used, in_flight, resets_at) per limit, in :data:`LIMIT_NAMES` order."""
    return (
        (0, c.in_flight, c.earliest_expiry),
        (c.minute_requests, c.minute_requests_reserved, b.minute_ends),
        (c.minute_tokens, c.minute_tokens_reserved, b.minute_ends),
        (c.day_spent, c.day_reserved, b.day_ends),
        (c.month_spent, c.month_reserved, b.month_ends),
    )


def _asks(r: Reservation) -> tuple[int, ...]:
    return (1, 1, r.tokens, r.cost_nano, r.cost_nano)


def deny(plugin_id: str, limits: PluginLimits, index: int, used: int, held: int, r: Reservation, b: Buckets,
         earliest_expiry: float | None) -> Denial:
    """The Denial for limit ``LIMIT_NAMES[index]`` given what the store saw (shared by both stores)."""
    name = LIMIT_NAMES[index]
    cap = _caps(limits)[index]
    ask = _asks(r)[index]
    resets = (earliest_expiry, b.minute_ends, b.minute_ends, b.day_ends, b.month_ends)[index]
    return Denial(
        plugin_id=plugin_id, limit=name, config_key=limits.key(name), cap=cap, used=used, in_flight=held,
        requested=ask, resets_at=None if cap is None or ask > cap else resets,
    )


def decide(plugin_id: str, limits: PluginLimits, c: Counters, r: Reservation, b: Buckets) -> Denial | None:
    """The admission rule (the Redis script implements the same): first limit the request would exceed."""
    for index, (cap, ask, (used, held, _)) in enumerate(zip(_caps(limits), _asks(r), _usage(c, b))):
        if cap is not None and used + held + ask > cap:
            return deny(plugin_id, limits, index, used, held, r, b, c.earliest_expiry)
    return None


def windows(limits: PluginLimits, c: Counters, b: Buckets) -> tuple[WindowUsage, ...]:
    """The configured limits with their current usage (for snapshots)."""
    return tuple(
        WindowUsage(name, limits.key(name), cap, used, held, resets)
        for name, cap, (used, held, resets) in zip(LIMIT_NAMES, _caps(limits), _usage(c, b))
        if cap is not None
    )


# ----------------------------------------------------------------- circuit breakers
#: a route's breaker: closed (calls go), open (calls skip the route), half_open (one probe is out)
BREAKER_STATES = ("closed", "open", "half_open")
#: the most routes a store keeps a breaker for: a new one beyond it evicts the oldest closed one
#: (else the oldest), so names a store is sent can never grow it without bound
MAX_BREAKER_ROUTES = 1000
MAX_ROUTE_CHARS = 128
#: a failure count saturates here (an open breaker keeps counting the failures of calls in flight)
_MAX_BREAKER_FAILURES = 1_000_000_000
#: the longest probe lease a store grants (a longer one would hold a route shut if its probe died)
MAX_PROBE_SECONDS = 86400.0


@dataclass(frozen=True)
class BreakerState:
    """One route's breaker as a store holds it. ``failures``: its last streak (for an open breaker,
    the failures that opened it and any reported since; a closed one's streak starts again at its
    next failure once its first is older than the window); ``retry_at``: when an open breaker lets
    its probe through, or when a half-open one's probe lease ends (None when closed)."""

    route: str
    state: str
    failures: int
    opened_at: float | None
    retry_at: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"route": self.route, "state": self.state, "failures": self.failures,
                "opened_at": iso_utc(self.opened_at), "retry_at": iso_utc(self.retry_at),
                "retry_at_unix": self.retry_at}


@dataclass(frozen=True)
class BreakerRow:
    """What a store keeps per route (both stores: the same fields, the same rules)."""

    state: str
    failures: int
    first_failure: float | None
    opened_at: float | None
    retry_at: float | None


def check_route(route: Any) -> str:
    """A route name as the stores take it: a printable string of 1 to :data:`MAX_ROUTE_CHARS`
    characters (the operator's catalog name); else ValueError, a defect of the caller."""
    if not isinstance(route, str) or not 0 < len(route) <= MAX_ROUTE_CHARS or not route.isprintable():
        raise ValueError(f"a breaker route is a printable name of 1 to {MAX_ROUTE_CHARS} characters, got "
                         f"{type(route).__name__} of length {len(route) if isinstance(route, str) else '-'}")
    return route


def _number(value: Any) -> float | None:
    return float(value) if type(value) in (int, float) and math.isfinite(value) else None


def breaker_row(state: Any, failures: Any, first_failure: Any, opened_at: Any, retry_at: Any) -> BreakerRow | None:
    """A stored row, checked; None when it is not one a store writes (edited, corrupt): such a route
    counts as closed, and its next failure starts a new streak over it."""
    if state not in BREAKER_STATES or type(failures) is not int or failures < 0:
        return None
    first, opened, retry = _number(first_failure), _number(opened_at), _number(retry_at)
    if state != "closed" and (opened is None or retry is None):
        return None
    return BreakerRow(state, failures, first, opened, retry)


def breaker_after_failure(row: BreakerRow | None, policy: "BreakerPolicy", now: float) -> BreakerRow:
    """The rule of a failure report (the Redis script implements the same): a closed breaker adds it
    to the streak (a streak whose first failure is older than ``window`` starts again at 1) and opens
    at ``failures``; a half-open one (its probe failed) opens again from ``now``; an open one counts it."""
    if row is not None and row.state == "open":
        return BreakerRow("open", min(row.failures + 1, _MAX_BREAKER_FAILURES), row.first_failure, row.opened_at,
                          row.retry_at)
    if row is not None and row.state == "half_open":
        return BreakerRow("open", min(row.failures + 1, _MAX_BREAKER_FAILURES), row.first_failure, now,
                          now + policy.cooldown)
    count, first = 1, now
    if row is not None and row.failures > 0 and row.first_failure is not None and now - row.first_failure <= policy.window:
        count, first = min(row.failures + 1, _MAX_BREAKER_FAILURES), row.first_failure
    if count >= policy.failures:
        return BreakerRow("open", count, first, now, now + policy.cooldown)
    return BreakerRow("closed", count, first, None, None)


def breaker_state(route: str, row: BreakerRow) -> BreakerState:
    return BreakerState(route, row.state, row.failures, row.opened_at, row.retry_at)


class LimitStore(ABC):
    """One interface, two implementations (:mod:`.local`, :mod:`.redis_store`) with identical semantics.

    ``timeout`` bounds how long a method may wait for the store (lock,
    socket); past it, or on any store failure, :class:`StoreError`.
    """

    name: str = ""
    #: implements :meth:`lease` (the facade then admits most calls in memory, see :mod:`.leases`)
    supports_leases: bool = False

    @abstractmethod
    def admit(self, plugin_id: str, reservation: Reservation, limits: PluginLimits, now: float, *,
              timeout: float) -> Admission | Denial:
        """Check every limit and hold the reservation, atomically; or say which limit refuses it."""

    @abstractmethod
    def settle(self, admission: Admission, cost_nano: int, tokens: int, *, timeout: float) -> None:
        """Replace the reservation by the actual cost and tokens (in the buckets it was admitted in)."""

    def release(self, admission: Admission, *, timeout: float) -> None:
        """Drop the reservation: the request failed and cost nothing known (it still counts as a request)."""
        self.settle(admission, 0, 0, timeout=timeout)

    @abstractmethod
    def counters(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        """The plugin's counters at ``now`` (expired reservations excluded)."""

    def snapshot(self, plugin_id: str, limits: PluginLimits, now: float, *, timeout: float) -> Snapshot:
        """Usage in the current windows, for ``plugin-llm limits show``."""
        c = self.counters(plugin_id, now, timeout=timeout)
        return Snapshot(plugin_id, now, c, windows(limits, c, buckets_at(now)))

    @abstractmethod
    def reset(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        """Forget the plugin's settled usage in the current windows (minute, day, month), in one
        atomic step; returns what was forgotten (the settled fields of :class:`Counters`).

        Calls in flight keep their reservations and settle normally."""

    @abstractmethod
    def breaker_acquire(self, route: str, policy: "BreakerPolicy", now: float, *, timeout: float,
                        probe_for: float) -> str:
        """May a call take ``route``? ``"closed"``: yes; ``"open"``: skip it; ``"probe"``: the breaker was
        open, its cooldown passed, and this caller holds its one half-open probe for ``probe_for``
        seconds (other callers get ``"open"`` until the probe reports or its lease ends). Atomic
        across processes (and hosts, for Redis); a policy with ``failures`` 0 is always closed."""

    @abstractmethod
    def breaker_report(self, route: str, ok: bool, policy: "BreakerPolicy", now: float, *, timeout: float) -> str:
        """Record a call's outcome on ``route`` (see :func:`breaker_after_failure`; a success closes the
        breaker and forgets the streak); returns the new state. Atomic like :meth:`breaker_acquire`."""

    @abstractmethod
    def breaker_states(self, now: float, *, timeout: float) -> dict[str, BreakerState]:
        """Every route the store holds a breaker for (a route not listed is closed, no failures)."""

    @abstractmethod
    def breaker_reset(self, route: str | None, *, timeout: float) -> None:
        """Forget the breaker of ``route`` (None: of every route): it is closed with no failures."""

    def lease(self, plugin_id: str, op: LeaseOp, limits: PluginLimits, *, timeout: float) -> LeaseGrant | Denial:
        """Apply one :class:`LeaseOp` atomically (stores with ``supports_leases``)."""
        raise NotImplementedError(f"the {self.name or type(self).__name__} limits store does not lease")

    def lease_books(self) -> dict:
        """This process's lease books of this store, by plugin (see :mod:`.leases`); created lazily."""
        books = self.__dict__.get("_lease_books")
        if books is None:
            books = self.__dict__.setdefault("_lease_books", {})
        return books

    def return_leases(self, plugin_id: str | None, *, timeout: float) -> None:
        """Settle what this process's leases of ``plugin_id`` (None: of every plugin) hold
        beyond the calls in flight and give the rest back, so a read sees exact numbers."""
        books = self.__dict__.get("_lease_books")
        if not books:
            return
        for pid, book in list(books.items()):
            if plugin_id is None or pid == plugin_id:
                book.give_back(timeout)

    def close_leases(self, *, timeout: float) -> None:
        """Give back every lease of this process and stop using them (closing the store)."""
        books = self.__dict__.get("_lease_books")
        if not books:
            return
        try:
            for book in list(books.values()):
                book.give_back(timeout)
        finally:
            for book in list(books.values()):
                book.close()
            books.clear()

    def settle_later(self, admission: Admission, cost_nano: int, tokens: int) -> None:
        """:meth:`settle`, off the caller's path: queued, then applied in the same transaction (or
        round trip) as this process's next admission, or by a background flush a few ms later,
        whichever comes first; :meth:`counters`, :meth:`reset` and process exit flush first. Until
        applied, the reservation (never less than the actual) keeps counting: conservative.
        The default settles at once."""
        self.settle(admission, cost_nano, tokens, timeout=2.0)

    def flush(self, *, timeout: float) -> None:
        """Apply every queued :meth:`settle_later` now (no-op for a store that never queues)."""

    def close(self) -> None:
        """Release connections (optional)."""


#: how long a queued settlement may wait for the next admission before the background flush
FLUSH_DELAY = 0.005


class SettlementQueue:
    """Settlements waiting to ride along with the next admission (one store operation per call
    instead of two), with a background thread that applies them after :data:`FLUSH_DELAY` when
    no admission comes. ``apply(items, timeout)`` is the store's batch settle; it may raise
    :class:`StoreError`, after which the store decides (``put_back`` when nothing was applied)."""

    def __init__(self, apply: Callable[[list[Any], float], None], name: str, timeout: float) -> None:
        self._apply = apply
        self._name = name
        self._timeout = timeout
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle = True  # the flusher waits for a wake-up (False while it polls)
        self._pid = os.getpid()
        _QUEUES.add(self)

    def _reset_after_fork(self) -> None:
        # the parent's queued settlements are the parent's to apply; this process starts empty
        self._lock = threading.Lock()
        self._items = []
        self._wake = threading.Event()
        self._thread = None
        self._idle = True
        self._pid = os.getpid()

    def add(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"plugin-llm-limits-{self._name}", daemon=True)
                self._thread.start()
            idle = self._idle
        if idle:  # only a waiting flusher needs a wake-up (Event.set is many Python calls and a thread switch)
            self._wake.set()

    def take(self) -> list[Any]:
        if not self._items:  # the common case needs no lock: a racing add is taken next time
            return []
        with self._lock:
            items, self._items = self._items, []
        return items

    def put_back(self, items: list[Any]) -> None:
        """Return settlements a failed operation did not apply (they go first, in order)."""
        if items:
            with self._lock:
                self._items[:0] = items
                idle = self._idle
            if idle:
                self._wake.set()

    def flush(self, timeout: float | None = None) -> None:
        items = self.take()
        if items:
            self._apply(items, self._timeout if timeout is None else timeout)

    def _run(self) -> None:
        logged = -1e9
        while True:
            with self._lock:
                self._idle = not self._items
                if self._idle:
                    self._wake.clear()
            if self._idle:
                self._wake.wait()
                self._idle = False
            time.sleep(FLUSH_DELAY)  # an admission in the meantime takes the items with it
            try:
                self.flush()
            except StoreError as exc:
                if time.monotonic() - logged >= 60.0:  # the store is down: say so once a minute, retry each second
                    logged = time.monotonic()
                    _log.error("limits: %s store: queued settlements not applied yet (retrying): %s", self._name, exc)
                time.sleep(1.0)
            except Exception:  # noqa: BLE001 - the flusher must survive a store defect
                _log.exception("limits: %s store: flushing settlements failed", self._name)


_QUEUES: "weakref.WeakSet[SettlementQueue]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for queue in list(_QUEUES):
        queue._reset_after_fork()


def _flush_at_exit() -> None:
    for queue in list(_QUEUES):
        if queue._pid == os.getpid():
            try:
                queue.flush()
            except Exception:  # noqa: BLE001 - at exit, log and go
                _log.exception("limits: settlements not applied at exit")


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_flush_at_exit)
