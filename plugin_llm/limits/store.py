"""The limit store interface (:class:`LimitStore`), with the values and rules it is written in.

A store keeps, per plugin: settled spend per calendar bucket (UTC day and month, in
nano-dollars), finished requests and their tokens per UTC minute, and the in-flight reservations
(each with its worst-case cost and tokens, the buckets it was admitted in, and an expiry).
``admit`` checks every limit and records the reservation in one atomic step; ``settle`` replaces
a reservation by the actual usage (added to the buckets it was admitted in); ``release`` drops it
(the request still counts for ``requests_per_minute``). A reservation past its expiry no longer
counts (its process died), so a crash can hold capacity only until the call's deadline plus the
grace period. Windows are fixed calendar buckets: a window boundary never overwrites spend.

The values are in :mod:`.counts`, the admission and lease rule in :mod:`.admission_rule`, the
breaker rule in :mod:`.breaker_rule`, the settlement queue in :mod:`.settlements`; this module
re-exports them, the names both stores and their callers import from here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from plugin_llm.errors import PluginLlmLimitError
from plugin_llm.limits.admission_rule import (
    DIMS,
    LEASE_SHARE,
    LeaseGrant,
    LeaseOp,
    decide,
    deny,
    lease_denial,
    limit_caps,
    windows,
)
from plugin_llm.limits.breaker_rule import (
    BREAKER_STATES,
    MAX_BREAKER_ROUTES,
    MAX_PROBE_SECONDS,
    MAX_ROUTE_CHARS,
    BreakerRow,
    BreakerState,
    breaker_after_failure,
    breaker_row,
    breaker_state,
    check_route,
)
from plugin_llm.limits.counts import (
    LIMIT_NAMES,
    Admission,
    Buckets,
    Counters,
    Denial,
    Reservation,
    Snapshot,
    StoreDataError,
    StoreError,
    WindowUsage,
    buckets_at,
    iso_utc,
    new_reservation_id,
    usd_text,
)
from plugin_llm.limits.settings import PluginLimits
from plugin_llm.limits.settlements import FLUSH_DELAY, SettlementQueue

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
    "StoreDataError",
    "PluginLlmLimitError",
    "LimitStore",
    "QueuedStore",
    "SettlementQueue",
    "FLUSH_DELAY",
    "buckets_at",
    "decide",
    "deny",
    "lease_denial",
    "limit_caps",
    "windows",
    "iso_utc",
    "usd_text",
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


class QueuedStore(LimitStore):
    """What both stores share beyond the interface: settlements queued in ``self._queue`` (a
    :class:`SettlementQueue` of the items :meth:`_settle_item` makes), reads and resets that see
    this process's leases and queue first, and closing."""

    _queue: SettlementQueue

    def _settle_item(self, admission: Admission, cost_nano: int, tokens: int) -> Any:
        """The store's settlement of ``admission``, as its queue and its batch settle take it."""
        raise NotImplementedError

    def settle_later(self, admission: Admission, cost_nano: int, tokens: int) -> None:
        self._queue.add(self._settle_item(admission, cost_nano, tokens))

    def flush(self, *, timeout: float) -> None:
        self._queue.flush(timeout)

    def _caught_up(self, plugin_id: str, now: float, timeout: float) -> Buckets:
        """Before a read or a reset of the plugin: its leases given back and the queue applied (so the
        store holds exact numbers); the buckets of ``now``."""
        self.return_leases(plugin_id, timeout=timeout)
        self._queue.flush(timeout)
        return buckets_at(now)

    def _close_leases_and_queue(self) -> None:
        """Closing: the leases given back and the queue applied, as far as the store answers."""
        try:
            self.close_leases(timeout=2.0)
        except StoreError:
            pass  # the leases expire by themselves
        try:
            self._queue.flush()
        except StoreError:
            pass  # put back in the queue: its exit hook tries again
