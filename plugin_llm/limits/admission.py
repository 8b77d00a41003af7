"""Admission: each provider request of a limited plugin admitted (or refused) before it is sent.

:func:`admit` (and its async twin :func:`aadmit`) first tries this process's lease in memory,
then makes a store step bounded by the call's deadline and ``limits.store_timeout``; a store
that fails follows ``limits.on_store_error``. :func:`admit_in_memory` is the half that never
waits; :func:`admit_request` counts a request that calls no model. :func:`snapshot` and
:func:`reset` are the operator's reads and resets. See docs/design.md, "Limits and leases".
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from plugin_llm.limits import leases, registry, tokens
from plugin_llm.limits.plans import (AsyncStep, Plan, limit_error, marked, plan_for, prepare, recount, recountable,
                                     request_plan)
from plugin_llm.limits.pricing import Estimate, input_token_bound
from plugin_llm.limits.settings import MAX_CALL_NANO, MAX_CALL_TOKENS, LimitSettings
from plugin_llm.limits.store import (Counters, Denial, LimitStore, PluginLlmLimitError, Reservation, Snapshot,
                                     StoreError)
from plugin_llm.limits.tickets import UNLIMITED, Ticket

__all__ = ["admit", "aadmit", "admit_in_memory", "admit_request", "snapshot", "reset"]

log = logging.getLogger("plugin_llm.limits")


_last_unmetered_warning = 0.0


def _warn_unmetered(plugin_id: str, exc: StoreError) -> None:
    """At most one warning a minute while the store is down (every call is in the audit log anyway)."""
    global _last_unmetered_warning
    now = time.monotonic()
    if now - _last_unmetered_warning >= 60.0:
        _last_unmetered_warning = now
        log.warning("limits: the store failed, calls of limited plugins (here '%s') go through unmetered "
                    "(limits.on_store_error: allow): %s", plugin_id, exc)


def _fast(plan: Plan, input_tokens: int, cost: int | None, deadline: float, now: float,
          store: LimitStore | None = None):
    """The call admitted in memory under this process's lease, or None (the store must decide).
    Never waits for the store: safe on an event loop. (Plain arguments, no object built but the
    ticket: this is the path of nearly every call of a busy plugin.)"""
    if not leases.ENABLED:
        return None
    book = plan.book if store is None else None
    if book is None or book.closed:
        book = plan.lease_book(store)
        if book is None:
            return None
    expiry = now + max(0.0, deadline - time.monotonic()) + plan.grace
    return book.try_fast(plan.limits, input_tokens, plan.output_tokens, cost, plan.price, expiry, now)


def _admit_store(plan: Plan, input_tokens: int, cost: int | None, deadline: float, now: float,
                 store: LimitStore | None, also_waiting: "Callable[[], int] | None" = None,
                 wait_until: float = math.inf) -> Ticket:
    """Admission with a store step (a lease step, or one reservation for a store without leases),
    bounded by the deadline, ``limits.store_timeout`` and ``wait_until`` (``time.monotonic()``:
    the end of an async call's whole wait for the store); ``on_store_error`` on failure."""
    settings, plugin_id = plan.settings, plan.plugin_id
    estimate = Estimate(input_tokens, plan.output_tokens, cost, plan.price)
    started = time.monotonic()
    remaining = deadline - started
    timeout = max(0.0, min(settings.store_timeout, remaining, wait_until - started))
    ttl = max(0.0, remaining) + settings.reservation_grace
    try:
        try:
            store = store or registry.store_for(settings, plan.home)
            if store.supports_leases and leases.ENABLED:
                book = leases.book_for(store, plugin_id, settings.reservation_grace, settings.store_timeout)
                result = book.admit(plan.limits, input_tokens, plan.output_tokens, cost, plan.price, now + ttl, now,
                                    timeout=timeout, also_waiting=also_waiting)
                if isinstance(result, Denial):
                    raise PluginLlmLimitError(result)
                return result
            reservation = Reservation(cost_nano=cost or 0, tokens=estimate.tokens, ttl=ttl)
            result = store.admit(plugin_id, reservation, plan.limits, now, timeout=timeout)
        except (StoreError, PluginLlmLimitError):
            raise
        except Exception as exc:  # a defect, not an outage: logged with its traceback and refused, even under
            # on_store_error: allow (which is for a store that is down or slow), so no defect admits a call unmetered
            log.exception("limits: the %s store failed unexpectedly", settings.store)
            raise limit_error(plugin_id, "store", "limits.on_store_error", (
                f"call of plugin '{plugin_id}' refused: the {settings.store} limits store failed unexpectedly "
                f"({type(exc).__name__}, logged with its traceback); such a failure refuses the call whatever "
                "limits.on_store_error says")) from None
    except StoreError as exc:
        if settings.on_store_error == "allow":
            _warn_unmetered(plugin_id, exc)
            return Ticket(None, None, estimate, store_error=str(exc))
        raise limit_error(plugin_id, "store", "limits.on_store_error", (
            f"call of plugin '{plugin_id}' refused: {str(exc).rstrip('.')}; limits.on_store_error is deny (fail "
            "closed), so calls of plugins with limits are refused until the store answers (plugin-llm limits "
            "show tries it)")) from None
    if isinstance(result, Denial):
        raise PluginLlmLimitError(result)
    return Ticket(store, result, estimate)


def admit(
    settings: LimitSettings,
    home: Path | str,
    plugin_id: str,
    *,
    messages: Iterable[Mapping[str, Any]],
    provider: str,
    model: str,
    max_tokens: int | None,
    deadline: float,
    extra: Iterable[Any] = (),
    now: float | None = None,
    store: LimitStore | None = None,
) -> Ticket:
    """Admit one provider request of ``plugin_id`` or raise :class:`PluginLlmLimitError`.

    ``deadline`` is the call's ``time.monotonic()`` deadline: the store may
    wait at most until then (and at most ``limits.store_timeout``), and an
    unsettled reservation stops counting ``limits.reservation_grace`` seconds
    after it. ``extra`` are request parts that cost input tokens besides the
    messages (tools, response_format). ``now`` (Unix seconds) and ``store``
    are for tests. A busy plugin's calls are mostly admitted in memory under
    this process's lease (:mod:`plugin_llm.limits.leases`), with the same
    decisions and guarantees.
    """
    prepared = prepare(settings, home, plugin_id, messages, provider, model, max_tokens, extra)
    if prepared is None:
        return UNLIMITED
    plan, input_tokens, cost, exact = prepared
    now = time.time() if now is None else now
    try:
        return marked(_fast(plan, input_tokens, cost, deadline, now, store)
                       or _admit_store(plan, input_tokens, cost, deadline, now, store), exact)
    except PluginLlmLimitError as refused:
        if not recountable(plan, refused, exact):
            raise
        refusal = refused
    # refused by the byte bound while the tokenizer loads: wait for it (within the deadline), count, ask again
    tokens.wait(plan.encoding, min(tokens.LOAD_WAIT, deadline - time.monotonic()))
    recounted = recount(plan, messages, extra, input_tokens)
    if recounted is None:
        raise refusal
    input_tokens, cost = recounted
    return marked(_fast(plan, input_tokens, cost, deadline, now, store)
                   or _admit_store(plan, input_tokens, cost, deadline, now, store), True)


def admit_request(settings: LimitSettings, home: Path | str, plugin_id: str, *, deadline: float,
                  now: float | None = None, store: LimitStore | None = None) -> Ticket:
    """Admit one request of ``plugin_id`` that calls no model (an MCP tool call) or raise
    :class:`PluginLlmLimitError`: it counts under the plugin's ``requests_per_minute`` and
    ``max_concurrent`` (the same counters as its model calls), costs nothing and no tokens. Broken
    limits refuse it as they refuse a model call. Release the ticket when the request ends."""
    limits = settings.for_plugin(plugin_id)
    if limits.error is not None:
        raise limit_error(plugin_id, "config", limits.error_key or limits.source, limits.error)
    counted = dataclasses.replace(limits, budget_day_nano=None, budget_month_nano=None, tokens_per_minute=None)
    if counted.empty:
        return UNLIMITED
    plan = request_plan(settings, home, plugin_id, counted)
    now = time.time() if now is None else now
    return _fast(plan, 0, None, deadline, now, store) or _admit_store(plan, 0, None, deadline, now, store)


def admit_in_memory(settings: LimitSettings, home: Path | str, plugin_id: str, messages: Iterable[Mapping[str, Any]],
                    provider: str, model: str, max_tokens: int | None, deadline: float,
                    extra: Iterable[Any] = ()) -> Ticket | None:
    """:func:`admit`'s half that never waits (safe anywhere, an event loop included): the ticket
    of an unlimited plugin or of a call this process's lease admits in memory, else ``None`` -- the
    store must decide: call :func:`admit` / :func:`aadmit` with the same arguments. Raises
    :class:`PluginLlmLimitError` for a refusal no store is needed for (broken limits, a budget on an
    unpriced model). Positional arguments: this is the gateway's path for nearly every limited call."""
    plan = plan_for(settings, home, plugin_id, provider, model, max_tokens)  # prepare(), inlined: the path of
    if plan.limits.empty:  # nearly every limited call
        return UNLIMITED
    if plan.refusal is not None:
        raise plan.refuse()
    if not leases.ENABLED:
        return None
    book = plan.book
    if book is None or book.closed:
        book = plan.lease_book(None)
        if book is None:
            return None  # no lease: the store decides (and counts the input then, once)
    if plan.encoding is None:
        input_tokens, exact = min(MAX_CALL_TOKENS, input_token_bound(messages, extra)), False
    else:
        input_tokens, exact = tokens.count_input(plan.encoding, messages, extra)
    output_nano = plan.output_nano
    cost = None if output_nano is None else min(MAX_CALL_NANO, math.ceil(input_tokens * plan.price.input_nano
                                                                         + output_nano))
    now = time.time()
    ticket = book.try_fast(plan.limits, input_tokens, plan.output_tokens, cost, plan.price,
                           now + max(0.0, deadline - time.monotonic()) + plan.grace, now)
    if exact and ticket is not None:
        ticket.input_exact = True
    return ticket


async def aadmit(settings: LimitSettings, home: Path | str, plugin_id: str, *, messages: Iterable[Mapping[str, Any]],
                 provider: str, model: str, max_tokens: int | None, deadline: float, extra: Iterable[Any] = (),
                 now: float | None = None, store: LimitStore | None = None) -> Ticket:
    """Async twin of :func:`admit` (same arguments). A call the lease admits in memory returns at
    once; a store step runs in a worker thread, so a Redis that is slow to answer holds this call
    only, never the event loop. While one call of a plan makes its step, the others on the same
    loop wait for it and look in memory again (within their deadline and, waits included,
    ``limits.store_timeout``): a burst on a cold plugin
    costs one thread hop, not one per call. Unlimited plugins return at once."""
    prepared = prepare(settings, home, plugin_id, messages, provider, model, max_tokens, extra)
    if prepared is None:
        return UNLIMITED
    plan, input_tokens, cost, exact = prepared
    try:
        return marked(await _aadmit(plan, input_tokens, cost, deadline, now, store), exact)
    except PluginLlmLimitError as refused:
        if not recountable(plan, refused, exact):
            raise
        refusal = refused
    # as in admit(): the wait for the tokenizer is in a worker thread, never on the event loop
    await tokens.await_loaded(plan.encoding, min(tokens.LOAD_WAIT, deadline - time.monotonic()))
    recounted = recount(plan, messages, extra, input_tokens)
    if recounted is None:
        raise refusal
    input_tokens, cost = recounted
    return marked(await _aadmit(plan, input_tokens, cost, deadline, now, store), True)


async def _aadmit(plan: Plan, input_tokens: int, cost: int | None, deadline: float, now: float | None,
                  store: LimitStore | None) -> Ticket:
    """:func:`aadmit` for a counted request: in memory, else (waiting for another call's step) a store step."""
    explicit_now, now = now, time.time() if now is None else now
    ticket = _fast(plan, input_tokens, cost, deadline, now, store)
    if ticket is not None:
        return ticket
    import asyncio

    loop = asyncio.get_running_loop()
    wait_until = min(deadline, time.monotonic() + plan.settings.store_timeout)  # all told, waits included
    while store is None:  # another call's step in progress: wait for it, then look in memory again
        pending = plan.astep
        if pending is None or pending.loop is not loop or pending.done.done():
            break
        pending.waiting += 1
        try:  # (asyncio.wait neither raises on a timeout nor cancels the step)
            await asyncio.wait((pending.done,), timeout=max(0.0, wait_until - time.monotonic()))
        finally:
            pending.waiting -= 1
        if not pending.done.done():
            break  # out of time to wait: this call's own step decides (within what is left)
        now = time.time() if explicit_now is None else now
        ticket = _fast(plan, input_tokens, cost, deadline, now, store)
        if ticket is not None:
            return ticket
        book = plan.book
        if book is None or not book.n:  # exact per-call steps (quiet, or near a limit): waiting gains nothing
            break
    step = AsyncStep(loop)
    if store is None:
        plan.astep = step
    try:
        await asyncio.sleep(0)  # the calls ready on this loop look first: the step is sized for the waiters
        work = loop.run_in_executor(None, contextvars.copy_context().run, _admit_store, plan, input_tokens, cost,
                                    deadline, now, store, lambda: step.waiting, wait_until)  # (asyncio.to_thread's)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:  # the thread goes on: the ticket it may still get is released
            work.add_done_callback(_release_unclaimed)
            raise
    finally:
        step.done.set_result(None)
        if plan.astep is step:
            plan.astep = None


def _release_unclaimed(work: Any) -> None:
    """The ticket of a store step whose async call was cancelled meanwhile: nobody will settle it."""
    if not work.cancelled() and work.exception() is None:
        work.result().release()


def snapshot(settings: LimitSettings, home: Path | str, plugin_id: str, *, now: float | None = None,
             store: LimitStore | None = None) -> Snapshot:
    """The plugin's limits with what is spent and in flight in each current window (raises StoreError)."""
    limits = settings.for_plugin(plugin_id)
    store = store or registry.store_for(settings, home)
    return store.snapshot(plugin_id, limits, time.time() if now is None else now, timeout=settings.store_timeout)


def reset(settings: LimitSettings, home: Path | str, plugin_id: str, *, now: float | None = None,
          store: LimitStore | None = None) -> Counters:
    """Forget the plugin's settled usage in the current windows and return what was forgotten
    (raises StoreError); the caller audits it."""
    store = store or registry.store_for(settings, home)
    return store.reset(plugin_id, time.time() if now is None else now, timeout=settings.store_timeout)
