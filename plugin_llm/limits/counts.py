"""What a limits store counts and answers: reservations, admissions, denials, counters, snapshots.

The values that cross the store interface (:mod:`.store`), and the calendar buckets a request
counts in (:func:`buckets_at`: UTC minute, day and month). A request counts in the minute it was
admitted: while in flight as its reservation, afterwards in that minute's bucket. A new
minute/day/month is a new key, so the month keeps every day's spend. Money is integer
nano-dollars; :func:`usd_text` and :func:`iso_utc` are the one money and time format of limits' texts.
"""

from __future__ import annotations

import calendar
import itertools
import os
import time
from dataclasses import dataclass
from typing import Any

from audit import records
from plugin_llm.errors import PluginLlmLimitError
from plugin_llm.limits.settings import NANO

__all__ = [
    "LIMIT_NAMES",
    "StoreError",
    "StoreDataError",
    "Reservation",
    "Buckets",
    "buckets_at",
    "new_reservation_id",
    "iso_utc",
    "Admission",
    "usd_text",
    "Denial",
    "WindowUsage",
    "Counters",
    "Snapshot",
]

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
