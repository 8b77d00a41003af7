"""The circuit breaker of a model route as a store keeps it, and the rule of a failure report.

Both stores keep the same fields per route (:class:`BreakerRow`) and apply the same rule
(:func:`breaker_after_failure`; the Redis script implements it too); a row that is not one a
store writes counts as closed. The facade that uses them is :mod:`.breakers`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugin_llm.limits.counts import iso_utc

if TYPE_CHECKING:  # (the stores only read its three numbers: importing the config package is not needed)
    from plugin_llm.config.breakers import BreakerPolicy

__all__ = [
    "BreakerState",
    "BreakerRow",
    "BREAKER_STATES",
    "MAX_BREAKER_ROUTES",
    "MAX_ROUTE_CHARS",
    "MAX_PROBE_SECONDS",
    "check_route",
    "breaker_after_failure",
    "breaker_row",
    "breaker_state",
]

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
