"""Circuit breakers of model routes, for the call pipeline's fallback loop.

``acquire`` before a route is tried ("closed": go, "probe": go as the one half-open probe,
"open": skip it), ``report`` after (ok or not); ``states`` and ``reset`` for operators. The state
is kept in the limits store (``store_for``: the local SQLite file, or Redis), so every process of
a host, and every host of a Redis, shares it. A process answers "closed" from memory while its
last view of a route is closed and under :data:`CACHE_SECONDS` old; a failure, and any other
state, goes to the store. A store that fails never stops a call: the breaker fails open (closed),
with one warning per outage. Synchronous: an async caller runs these off its event loop.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from plugin_llm.limits import store_for
from plugin_llm.limits.settings import LimitSettings
from plugin_llm.limits.store import BreakerState, LimitStore, StoreError, check_route

if TYPE_CHECKING:
    from plugin_llm.config.breakers import BreakerPolicy

__all__ = ["acquire", "report", "states", "reset", "BreakerState", "CACHE_SECONDS"]

log = logging.getLogger("plugin_llm.limits")

#: how long this process answers "closed" from its last view of a closed route
CACHE_SECONDS = 0.25
_MAX_VIEWS = 4096


class _View:
    """This process's last view of a route: its state, when (the caller's ``now``), and whether
    this process's last word to the store about it was a success (a further one changes nothing)."""

    __slots__ = ("state", "at", "clean")

    def __init__(self, state: str, at: float, clean: bool) -> None:
        self.state, self.at, self.clean = state, at, clean

    def fresh(self, now: float) -> bool:
        return self.state == "closed" and 0.0 <= now - self.at < CACHE_SECONDS


_views: dict[tuple[LimitStore, str], _View] = {}
_failing = False  # the store failed and this outage was reported
_failing_lock = threading.Lock()


def _remember(key: tuple[LimitStore, str], view: _View) -> None:
    if len(_views) >= _MAX_VIEWS and key not in _views:
        _views.clear()  # bounded: the views are only a shortcut
    _views[key] = view


def _store_failed(exc: Exception) -> None:
    global _failing
    with _failing_lock:
        first, _failing = not _failing, True
    if not first:
        return
    if isinstance(exc, StoreError):
        log.warning("breakers: the limits store failed, so the model routes' circuit breakers are off (every "
                    "route is tried) until it answers again: %s", exc)
    else:
        log.error("breakers: the limits store failed unexpectedly (%s), so the model routes' circuit breakers "
                  "are off until it answers again", type(exc).__name__, exc_info=exc)


def _store_answered() -> None:
    global _failing
    if _failing:
        with _failing_lock:
            _failing = False
        log.warning("breakers: the limits store answers again; the model routes' circuit breakers are back on")


def acquire(settings: LimitSettings, home: Path | str, route: str, policy: "BreakerPolicy", now: float,
            probe_for: float) -> str:
    """``"closed"`` (try the route), ``"probe"`` (try it: the one probe of an open breaker whose
    cooldown passed, held for ``probe_for`` seconds; report its outcome) or ``"open"`` (skip it).
    A policy with ``failures`` 0 is always closed; a failing store answers closed. A ``route`` that
    is not a printable name of 1 to 128 characters raises ValueError (a defect of the caller)."""
    if policy.failures <= 0:
        return "closed"
    check_route(route)
    try:
        store = store_for(settings, home)
        key = (store, route)
        view = _views.get(key)
        if view is not None and view.fresh(now):
            return "closed"
        answer = store.breaker_acquire(route, policy, now, timeout=settings.store_timeout, probe_for=probe_for)
    except Exception as exc:  # noqa: BLE001 - a broken breaker store must never stop a call
        _store_failed(exc)
        return "closed"
    _store_answered()
    # (not clean: another process may have counted a failure since this one's last success)
    _remember(key, _View("closed" if answer == "closed" else "half_open" if answer == "probe" else "open", now, False))
    return answer


def report(settings: LimitSettings, home: Path | str, route: str, ok: bool, policy: "BreakerPolicy",
           now: float) -> None:
    """Record the outcome of a call on ``route`` (one that :func:`acquire` let through). A failure
    always goes to the store; a success too, unless this process already told it one under
    :data:`CACHE_SECONDS` ago and has seen the route closed since. Never raises for the store."""
    if policy.failures <= 0:
        return
    check_route(route)
    try:
        store = store_for(settings, home)
        key = (store, route)
        view = _views.get(key)
        if ok and view is not None and view.clean and view.fresh(now):
            return
        state = store.breaker_report(route, bool(ok), policy, now, timeout=settings.store_timeout)
    except Exception as exc:  # noqa: BLE001 - as in acquire
        _store_failed(exc)
        return
    _store_answered()
    _remember(key, _View(state, now, bool(ok)))


def states(settings: LimitSettings, home: Path | str, now: float) -> dict[str, BreakerState]:
    """Every route the store holds a breaker for, by name (raises StoreError: an operator's read)."""
    return store_for(settings, home).breaker_states(now, timeout=settings.store_timeout)


def reset(settings: LimitSettings, home: Path | str, route: str | None) -> None:
    """Close the breaker of ``route`` (None: of every route) and forget its failures (raises
    StoreError); this process's views are dropped, so its next call asks the store."""
    store = store_for(settings, home)
    store.breaker_reset(route, timeout=settings.store_timeout)
    for key in [k for k in _views if k[0] is store and (route is None or k[1] == route)]:
        _views.pop(key, None)


def _forget_views() -> None:
    """Drop this process's views (tests; a forked child starts with none)."""
    _views.clear()


def _after_fork_in_child() -> None:
    global _failing, _failing_lock
    _views.clear()
    _failing, _failing_lock = False, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
