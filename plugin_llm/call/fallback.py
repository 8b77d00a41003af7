"""A call's routes tried in order: a route's circuit breaker, the attempts of the record.

A route with fallbacks is a chain (``Admitted.chain``): the pipeline tries each route in order
within the call's one deadline, skips one whose breaker is open (never the last), and moves on
after a failure another provider can fix. Each attempt is one entry of the record's
``route.attempts``; the breaker hears of each attempt that says something about its route.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from plugin_llm.call.steps import Flow, Run, StoreStep, Tally
from plugin_llm.errors import (
    PluginLlmProviderError,
    PluginLlmQuotaError,
    PluginLlmSchemaError,
    PluginLlmTimeoutError,
)
from plugin_llm.limits import breakers

#: the breakers' clock (wall time: their state is shared between processes and hosts)
wall_clock = time.time

__all__ = ["NextRoute", "route_available", "route_tried", "another_route_can_fix", "attempt_outcome", "status_for"]


def route_available(run: Run) -> Flow:
    """Whether the route's circuit breaker lets a request through (closed, or its one half-open
    probe); a skipped route is one attempt of the record."""
    admitted = run.admitted
    policy = admitted.config.llm.breaker
    if not policy.failures:
        return True
    label = admitted.route.label
    probe_for = max(0.0, admitted.deadline - time.monotonic())
    state = yield StoreStep(functools.partial(breakers.acquire, admitted.config.limits, admitted.config.home,
                                              label, policy, wall_clock(), probe_for))
    if state != "open":
        return True
    attempts_of(run.tally).append({"route": label, "outcome": "skipped", "latency_ms": 0.0})
    return False


def route_tried(run: Run, started: float, outcome: str, ok: bool | None) -> Flow:
    """Record one attempt of the chain, and report it to the route's breaker (``ok`` None: a
    failure of the request itself, which says nothing about the route)."""
    admitted = run.admitted
    label = admitted.route.label
    attempts_of(run.tally).append({"route": label, "outcome": outcome,
                                 "latency_ms": round((time.monotonic() - started) * 1000.0, 3)})
    policy = admitted.config.llm.breaker
    if ok is not None and policy.failures:
        yield StoreStep(functools.partial(breakers.report, admitted.config.limits, admitted.config.home,
                                          label, ok, policy, wall_clock()))


class NextRoute(Exception):
    """A route of a chain failed in a way another route can fix: the chain tries the next one."""


def attempts_of(tally: Tally) -> list[dict[str, Any]]:
    if tally.route_attempts is None:
        tally.route_attempts = []
    return tally.route_attempts


def another_route_can_fix(failure: BaseException, deadline: float) -> bool:
    """A connection error, a 5xx, a 429 after its retries, a 408, or a timeout with time left in the
    call's deadline: another provider may answer. Never an error of the request itself (400, ...)."""
    if isinstance(failure, PluginLlmTimeoutError):
        return time.monotonic() < deadline
    if isinstance(failure, PluginLlmProviderError):
        status = failure.status
        return status is None or status >= 500 or status in (408, 429)
    return False


def attempt_outcome(failure: BaseException) -> str:
    """An attempt's outcome in the record: ``timeout``, ``provider_error:<status>`` or the status."""
    status = status_for(failure) if isinstance(failure, Exception) else "error"
    code = getattr(failure, "status", None)
    if status == "provider_error" and isinstance(code, int):
        return f"provider_error:{code}"
    return status


def status_for(exc: BaseException) -> str:
    if isinstance(exc, PluginLlmTimeoutError):
        return "timeout"
    if isinstance(exc, PluginLlmQuotaError):
        return "quota"
    if isinstance(exc, PluginLlmProviderError):
        return "provider_error"
    if isinstance(exc, PluginLlmSchemaError):
        return "schema_error"
    return "error"
