"""The admission rule both stores implement, and the lease step it extends to.

:func:`decide` is the rule of one call's admission (the local store's trigger and the Redis
script implement the same): the first limit, in :data:`LIMIT_NAMES` order, that the request
would exceed refuses it (:func:`deny` words the refusal). A :class:`LeaseOp` is one atomic step
on a lease (see :mod:`.leases`), checked the same way; :func:`windows` is what ``limits show``
reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from plugin_llm.limits.counts import LIMIT_NAMES, Buckets, Counters, Denial, Reservation, WindowUsage
from plugin_llm.limits.settings import PluginLimits

__all__ = ["DIMS", "LeaseOp", "LeaseGrant", "LEASE_SHARE", "limit_caps", "deny", "lease_denial", "decide", "windows"]

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


def limit_caps(limits: PluginLimits) -> tuple[int | None, ...]:
    """The plugin's caps in :data:`LIMIT_NAMES` order (None: no such limit), as the stores send them."""
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
    cap = limit_caps(limits)[index]
    ask = _asks(r)[index]
    resets = (earliest_expiry, b.minute_ends, b.minute_ends, b.day_ends, b.month_ends)[index]
    return Denial(
        plugin_id=plugin_id, limit=name, config_key=limits.key(name), cap=cap, used=used, in_flight=held,
        requested=ask, resets_at=None if cap is None or ask > cap else resets,
    )


def lease_denial(plugin_id: str, limits: PluginLimits, op: LeaseOp, index: int, used: int, held: int,
                 earliest_expiry: float | None) -> Denial:
    """The Denial of a lease step the store refused at limit ``index``: its ``ask`` is the request."""
    r = Reservation(cost_nano=op.ask[3], tokens=op.ask[2], ttl=0.0)
    return deny(plugin_id, limits, index, used, held, r, op.buckets, earliest_expiry)


def decide(plugin_id: str, limits: PluginLimits, c: Counters, r: Reservation, b: Buckets) -> Denial | None:
    """The admission rule (the Redis script implements the same): first limit the request would exceed."""
    for index, (cap, ask, (used, held, _)) in enumerate(zip(limit_caps(limits), _asks(r), _usage(c, b))):
        if cap is not None and used + held + ask > cap:
            return deny(plugin_id, limits, index, used, held, r, b, c.earliest_expiry)
    return None


def windows(limits: PluginLimits, c: Counters, b: Buckets) -> tuple[WindowUsage, ...]:
    """The configured limits with their current usage (for snapshots)."""
    return tuple(
        WindowUsage(name, limits.key(name), cap, used, held, resets)
        for name, cap, (used, held, resets) in zip(LIMIT_NAMES, limit_caps(limits), _usage(c, b))
        if cap is not None
    )
