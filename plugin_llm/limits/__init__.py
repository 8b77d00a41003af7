"""Per-plugin budgets and rate limits: admission before the provider call, settlement after.

One way in for the gateway, once per provider request (a structured call's repairs are requests
of their own)::

    ticket = limits.admit(config.limits, config.home, plugin_id, messages=..., provider=...,
                          model=..., max_tokens=..., deadline=..., extra=(tools, response_format))
    # raises PluginLlmLimitError (a PluginLlmQuotaError) before the request is sent
    ticket.settle(response.usage)   # success: the reservation becomes the actual cost and tokens
    ticket.release()                # failure: the reservation is dropped (still counts per minute)

A plugin without limits costs one dict lookup and gets :data:`UNLIMITED`. :func:`admit_in_memory`
comes first (never waits; ``None`` when the store must decide; see :mod:`.leases`). The store is
opened once per process; nothing here imports litellm or redis at import time. Operator views:
:func:`snapshot`, :func:`reset`, :mod:`.views`, :func:`check_limits`. See docs/design.md.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from audit import records
from plugin_llm.limits import leases, tokens
from plugin_llm.limits.checks import check_limits
from plugin_llm.limits.pricing import (
    Estimate,
    Price,
    actual_cost_nano,
    find_price,
    input_token_bound,
    operator_cost,
    output_token_bound,
    reports_a_cost,
    usage_count,
    worst_case,
)
from plugin_llm.limits.settings import (
    MAX_CALL_NANO,
    MAX_CALL_TOKENS,
    MAX_TOTAL,
    NANO,
    NO_LIMITS,
    LimitIssue,
    LimitSettings,
    OperatorPrice,
    PluginLimits,
    limits_path,
    parse_limit_settings,
)
from plugin_llm.limits.store import (
    LIMIT_NAMES,
    Admission,
    Counters,
    Denial,
    LimitStore,
    PluginLlmLimitError,
    Reservation,
    Snapshot,
    StoreError,
    WindowUsage,
    iso_utc,
)

__all__ = [
    "admit",
    "admit_request",
    "aadmit",
    "admit_in_memory",
    "output_bound",
    "snapshot",
    "reset",
    "store_for",
    "close_stores",
    "Ticket",
    "UNLIMITED",
    "PluginLlmLimitError",
    "Denial",
    "Admission",
    "Reservation",
    "Snapshot",
    "Counters",
    "WindowUsage",
    "LimitStore",
    "StoreError",
    "LimitSettings",
    "PluginLimits",
    "OperatorPrice",
    "LimitIssue",
    "NO_LIMITS",
    "LIMIT_NAMES",
    "NANO",
    "MAX_CALL_TOKENS",
    "MAX_CALL_NANO",
    "MAX_TOTAL",
    "parse_limit_settings",
    "check_limits",
    "limits_path",
    "Estimate",
    "Price",
    "find_price",
    "input_token_bound",
    "worst_case",
    "actual_cost_nano",
    "operator_cost",
    "iso_utc",
]

log = logging.getLogger("plugin_llm.limits")


class Ticket:
    """One admitted request. ``settle`` or ``release`` exactly once; later calls do nothing.

    ``audit_fields()`` are the fields to add to the call's audit record.
    Settlement never raises and costs the caller no store round trip: under
    a lease it is in memory (the lease keeper hands it to the store within
    250 ms); otherwise it is queued and applied with this process's next
    admission (or by a background flush a few ms later); until then the
    reservation, never less than the actual, keeps counting. A store failure is logged, and the
    reservation then counts until it expires (the call's deadline plus the
    grace period).
    """

    __slots__ = ("_store", "_admission", "_price", "_once", "estimate", "store_error", "input_exact")

    def __init__(self, store: LimitStore | None, admission: Admission | None, estimate: Estimate | None,
                 store_error: str | None = None) -> None:
        self._store = store
        self._admission = admission
        self._price = estimate.price if estimate is not None else None
        # settle/release take the admission out of this list: one atomic list.pop, so exactly one
        # of several racing threads gets it (no lock object per ticket, nothing to contend for)
        self._once = [admission] if admission is not None else []
        self.estimate = estimate
        self.store_error = store_error
        self.input_exact = False  # the input counted exactly (limits.tokens), not by the byte bound

    @property
    def metered(self) -> bool:
        return self._admission is not None

    def _finish(self) -> Admission | None:
        once = self._once
        if not once:
            return None
        try:
            return once.pop()
        except IndexError:  # another thread took it between the check and the pop
            return None

    def settle(self, usage: Any = None, *, cost_usd: float | None = None, input_tokens: int | None = None,
               output_tokens: int | None = None) -> None:
        """Replace the reservation by what the request used (a ``PluginLlmUsage`` or the numbers).

        A request that succeeded but reports neither tokens nor a positive cost
        is charged its reservation (the worst case): unknown is never free."""
        once = self._once  # _finish(), inlined: this runs once per limited call
        if not once:
            return
        try:
            admission = once.pop()
        except IndexError:
            return
        if usage is not None:
            cost_usd = usage.cost_usd if cost_usd is None else cost_usd
            input_tokens = usage.input_tokens if input_tokens is None else input_tokens
            output_tokens = usage.output_tokens if output_tokens is None else output_tokens
        ins, outs = usage_count(input_tokens), usage_count(output_tokens)
        if ins == 0 and outs == 0 and not reports_a_cost(cost_usd):
            self._apply(admission, admission.cost_nano, admission.tokens)
            return
        cost_nano = actual_cost_nano(self._price, cost_usd, ins, outs)
        try:  # _apply(), inlined for the common case
            self._store.settle_later(admission, cost_nano, ins + outs)
        except Exception as exc:  # noqa: BLE001 - a finished call never fails because its bookkeeping did
            _settle_failed(admission, exc)

    def release(self) -> None:
        """Drop the reservation (the request failed before using anything known)."""
        admission = self._finish()
        if admission is not None:
            self._apply(admission, 0, 0)

    async def asettle(self, usage: Any = None, **numbers: Any) -> None:
        """:meth:`settle` for async code (it only queues, so it never blocks the event loop)."""
        self.settle(usage, **numbers)

    async def arelease(self) -> None:
        """:meth:`release` for async code."""
        self.release()

    def _apply(self, admission: Admission, cost_nano: int, tokens: int) -> None:
        try:
            self._store.settle_later(admission, cost_nano, tokens)  # rides along with the next admission
        except Exception as exc:  # noqa: BLE001 - a finished call never fails because its bookkeeping did
            _settle_failed(admission, exc)

    def audit_fields(self) -> dict[str, Any]:
        if self._admission is None and self.store_error is None:
            return {}
        fields: dict[str, Any] = {}
        if self._admission is not None:
            fields[records.LIMITS_RESERVED_USD] = self._admission.cost_nano / NANO
            fields[records.LIMITS_RESERVED_TOKENS] = self._admission.tokens
            if self.estimate is not None:
                fields[records.LIMITS_RESERVED_INPUT_TOKENS] = self.estimate.input_tokens
            fields[records.LIMITS_INPUT_COUNT] = "exact" if self.input_exact else "bound"
        if self.store_error is not None:
            fields[records.LIMITS_STORE_ERROR] = self.store_error
        return fields


def _settle_failed(admission: Admission, exc: Exception) -> None:
    """Log a settlement the store did not take (called in its ``except`` block: the traceback of a defect)."""
    if isinstance(exc, StoreError):
        log.error("limits: could not settle call of plugin '%s' (its reservation counts until %s): %s",
                  admission.plugin_id, iso_utc(admission.expires_at), exc)
    else:
        log.exception("limits: settling a call of plugin '%s' failed (its reservation counts until %s)",
                      admission.plugin_id, iso_utc(admission.expires_at))


#: the ticket of a plugin without limits: settling it does nothing
UNLIMITED = Ticket(None, None, None)

_STORES: dict[tuple[Any, ...], LimitStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(settings: LimitSettings, home: Path | str) -> LimitStore:
    """The process-wide store for these settings (one per SQLite file / Redis URL); opened lazily."""
    last = _LAST
    if last is not None and last[0] is settings and last[1] is home:
        return last[2]
    identity = settings.store_identity()
    key = identity + ((os.fspath(home),) if identity[0] == "local" else ())
    store = _STORES.get(key)
    if store is not None:
        _remember(settings, home, store)
        return store
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            if settings.store == "redis":
                from plugin_llm.limits.redis_store import RedisStore

                store = RedisStore(settings.redis_url, prefix=settings.redis_key_prefix, timeout=settings.store_timeout)
            else:
                from plugin_llm.limits.local import DB_NAME, LocalStore

                store = LocalStore(Path(home) / DB_NAME, timeout=settings.store_timeout)
            _STORES[key] = store
    _remember(settings, home, store)
    return store


_LAST: tuple[LimitSettings, Any, LimitStore] | None = None  # the last lookup: nearly every call repeats it


def _remember(settings: LimitSettings, home: Any, store: LimitStore) -> None:
    global _LAST
    _LAST = (settings, home, store)


def close_stores() -> None:
    """Close every open store (tests, shutdown)."""
    global _LAST, _LAST_PLAN
    with _STORES_LOCK:
        stores = list(_STORES.values())
        _STORES.clear()
        _LAST = _LAST_PLAN = None
    for store in stores:
        try:
            store.close()
        except Exception:  # closing is best effort
            pass


_last_unmetered_warning = 0.0


def _warn_unmetered(plugin_id: str, exc: StoreError) -> None:
    """At most one warning a minute while the store is down (every call is in the audit log anyway)."""
    global _last_unmetered_warning
    now = time.monotonic()
    if now - _last_unmetered_warning >= 60.0:
        _last_unmetered_warning = now
        log.warning("limits: the store failed, calls of limited plugins (here '%s') go through unmetered "
                    "(limits.on_store_error: allow): %s", plugin_id, exc)


def _refuse(plugin_id: str, limit: str, key: str, reason: str) -> PluginLlmLimitError:
    return PluginLlmLimitError(Denial(plugin_id=plugin_id, limit=limit, config_key=key, reason=reason))


class _Plan:
    """What admitting a request needs that does not depend on its messages, worked out once per
    config (``settings`` object), home, plugin, route and ``max_tokens``: the plugin's limits, a
    refusal that needs no store (broken limits, a budget on an unpriced model), the price and
    output bound, and this process's lease book once it exists."""

    __slots__ = ("settings", "home", "plugin_id", "provider", "model", "max_tokens", "limits", "refusal", "price",
                 "output_tokens", "output_nano", "grace", "book", "astep", "encoding")

    def __init__(self, settings: LimitSettings, home: Any, plugin_id: str, provider: str, model: str,
                 max_tokens: int | None) -> None:
        self.settings, self.home, self.plugin_id = settings, home, plugin_id
        self.provider, self.model, self.max_tokens = provider, model, max_tokens
        self.limits = limits = settings.for_plugin(plugin_id)
        self.refusal: tuple[str, str, str] | None = None
        # the price carries the model's output limit, which a token limit needs as much as a budget (a call
        # without max_tokens may use all of it); only a budget needs the cost
        counts_input = limits.has_budget or limits.tokens_per_minute is not None
        self.price = price = find_price(provider, model, settings.prices) if counts_input else None
        # the tokenizer that counts the input exactly, when a limit counts it (limits.tokens)
        self.encoding = tokens.encoding_for(provider, model) if counts_input else None
        self.output_tokens = min(MAX_CALL_TOKENS, output_token_bound(price, max_tokens, settings))
        self.output_nano = None if price is None or not limits.has_budget else self.output_tokens * price.output_nano
        self.grace = settings.reservation_grace
        self.book: leases.LeaseBook | None = None
        self.astep: _AsyncStep | None = None  # the store step an async call of this plan is making
        if limits.error is not None:
            self.refusal = ("config", limits.error_key or limits.source, limits.error)
        elif limits.has_budget and price is None:
            name = json.dumps(f"{provider}/{model}"[:100])  # (a model a plugin named: quoted, escaped, bounded)
            key = f"limits.prices.{name}"
            self.refusal = ("price", key, (
                f"plugin '{plugin_id}' has a budget ({limits.source}.budget_usd) but the model {name} has no known "
                f"price, so its cost cannot be counted; set {key}: {{input_per_mtok: ..., output_per_mtok: ...}} "
                "(US dollars per million tokens) in config.yaml to allow it"))

    def cost(self, input_tokens: int) -> int | None:
        """The request's worst-case cost in nano-dollars (None: unpriced, and no budget needs it);
        :func:`worst_case`'s number for the same input tokens."""
        if self.output_nano is None:
            return None
        return min(MAX_CALL_NANO, math.ceil(input_tokens * self.price.input_nano + self.output_nano))

    def refuse(self) -> PluginLlmLimitError:
        return _refuse(self.plugin_id, *self.refusal)

    def lease_book(self, store: LimitStore | None) -> leases.LeaseBook | None:
        """This process's lease book of the plugin in its store (``store``: a test's own), None when
        there is none yet (the store path creates it) or the store does not lease."""
        explicit = store is not None
        if not explicit:
            try:
                store = store_for(self.settings, self.home)
            except Exception:  # noqa: BLE001 - opening is retried, and reported, on the store path
                return None
        if not store.supports_leases:
            return None
        books = store.__dict__.get("_lease_books")
        book = books.get(self.plugin_id) if books else None
        if not explicit:
            self.book = book
        return book


class _AsyncStep:
    """A store step an async call is making in a worker thread: the other calls of the same plan on
    the same event loop wait for it (no thread of their own) and then look in memory again; the
    step's slice is sized for them too (``waiting``, changed on that loop only)."""

    __slots__ = ("loop", "done", "waiting")

    def __init__(self, loop: Any) -> None:
        self.loop, self.done, self.waiting = loop, loop.create_future(), 0


_PLANS: dict[tuple[Any, ...], _Plan] = {}
_LAST_PLAN: _Plan | None = None  # nearly every call repeats the last one: compared field by field, nothing built


def _plan(settings: LimitSettings, home: Any, plugin_id: str, provider: str, model: str, max_tokens: Any) -> _Plan:
    global _LAST_PLAN
    last = _LAST_PLAN
    if (last is not None and last.settings is settings and last.home is home and last.plugin_id == plugin_id
            and last.provider == provider and last.model == model and last.max_tokens == max_tokens
            and type(max_tokens) is type(last.max_tokens)):
        return last
    if type(max_tokens) is not int or max_tokens <= 0:  # what output_token_bound ignores is not part of the key
        max_tokens = (max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool)
                      and max_tokens > 0 else None)
    key = (id(settings), id(home), plugin_id, provider, model, max_tokens)
    plan = _PLANS.get(key)
    if plan is None or plan.settings is not settings or plan.home is not home:  # (the plan keeps both alive)
        plan = _Plan(settings, home, plugin_id, provider, model, max_tokens)
        if len(_PLANS) >= 1024:  # bounded: a config reload leaves the old plans behind
            _PLANS.clear()
        _PLANS[key] = plan
    _LAST_PLAN = plan
    return plan


def output_bound(settings: LimitSettings, home: Any, plugin_id: str, provider: str, model: str,
                 max_tokens: Any) -> int | None:
    """The ``max_tokens`` a request must be sent with so that what admission reserved for its
    output is a ceiling the provider keeps: the reserved output bound when a limit counts output
    (a budget, a token limit) and the request has no ``max_tokens`` or a larger one; else None
    (send the request as it is). The same plan as the admission's: the same number."""
    plan = _plan(settings, home, plugin_id, provider, model, max_tokens)
    limits = plan.limits
    if limits.empty or not (limits.has_budget or limits.tokens_per_minute is not None):
        return None
    if type(max_tokens) is int and 0 < max_tokens <= plan.output_tokens:
        return None
    return plan.output_tokens


def _prepare(settings: LimitSettings, home: Any, plugin_id: str, messages, provider: str, model: str,
             max_tokens: Any, extra) -> tuple[_Plan, int, int | None, bool] | None:
    """The request's plan, input tokens, worst-case cost and whether the input was counted exactly;
    None for a plugin without limits. Raises the refusal that needs no store (broken limits, a
    budget on an unpriced model)."""
    plan = _plan(settings, home, plugin_id, provider, model, max_tokens)
    if plan.limits.empty:
        return None
    if plan.refusal is not None:
        raise plan.refuse()
    input_tokens, exact = _count(plan, messages, extra)
    return plan, input_tokens, plan.cost(input_tokens), exact


def _count(plan: _Plan, messages, extra) -> tuple[int, bool]:
    """The request's input tokens: exact where the plan has a tokenizer (loaded), else the byte bound."""
    if plan.encoding is None:
        return min(MAX_CALL_TOKENS, input_token_bound(messages, extra)), False
    return tokens.count_input(plan.encoding, messages, extra)


def _marked(ticket: Any, exact: bool) -> Any:
    """The ticket, saying its input was counted exactly (its audit record's ``limits.input_count``)."""
    if exact and ticket is not None and ticket.metered:
        ticket.input_exact = True
    return ticket


#: the limits a smaller input count can change the decision of
_COUNTED_LIMITS = frozenset({"tokens_per_minute", "budget_usd.day", "budget_usd.month"})


def _recountable(plan: _Plan, refused: PluginLlmLimitError, exact: bool) -> bool:
    """Whether a refusal may be undone by counting the input exactly: a token or money limit refused
    it, counted by the byte bound while the plan's tokenizer was loading (it may have loaded since)."""
    return (not exact and plan.encoding is not None and refused.denial.limit in _COUNTED_LIMITS
            and (tokens.pending(plan.encoding) or tokens.encoding(plan.encoding) is not None))


def _recounted(plan: _Plan, messages, extra, input_tokens: int) -> tuple[int, int | None] | None:
    """The exact input count and cost once the tokenizer has loaded; None if it did not, or gives no less."""
    counted, exact = _count(plan, messages, extra)
    if not exact or counted >= input_tokens:
        return None
    return counted, plan.cost(counted)


def _fast(plan: _Plan, input_tokens: int, cost: int | None, deadline: float, now: float,
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


def _admit_store(plan: _Plan, input_tokens: int, cost: int | None, deadline: float, now: float,
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
            store = store or store_for(settings, plan.home)
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
            raise _refuse(plugin_id, "store", "limits.on_store_error", (
                f"call of plugin '{plugin_id}' refused: the {settings.store} limits store failed unexpectedly "
                f"({type(exc).__name__}, logged with its traceback); such a failure refuses the call whatever "
                "limits.on_store_error says")) from None
    except StoreError as exc:
        if settings.on_store_error == "allow":
            _warn_unmetered(plugin_id, exc)
            return Ticket(None, None, estimate, store_error=str(exc))
        raise _refuse(plugin_id, "store", "limits.on_store_error", (
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
    prepared = _prepare(settings, home, plugin_id, messages, provider, model, max_tokens, extra)
    if prepared is None:
        return UNLIMITED
    plan, input_tokens, cost, exact = prepared
    now = time.time() if now is None else now
    try:
        return _marked(_fast(plan, input_tokens, cost, deadline, now, store)
                       or _admit_store(plan, input_tokens, cost, deadline, now, store), exact)
    except PluginLlmLimitError as refused:
        if not _recountable(plan, refused, exact):
            raise
        refusal = refused
    # refused by the byte bound while the tokenizer loads: wait for it (within the deadline), count, ask again
    tokens.wait(plan.encoding, min(tokens.LOAD_WAIT, deadline - time.monotonic()))
    recounted = _recounted(plan, messages, extra, input_tokens)
    if recounted is None:
        raise refusal
    input_tokens, cost = recounted
    return _marked(_fast(plan, input_tokens, cost, deadline, now, store)
                   or _admit_store(plan, input_tokens, cost, deadline, now, store), True)


_REQUEST_PLANS: dict[tuple[Any, ...], _Plan] = {}


def _request_plan(settings: LimitSettings, home: Any, plugin_id: str, counted: PluginLimits) -> _Plan:
    """A plan for a request that uses no model: only its count and concurrency are limited."""
    key = (id(settings), id(home), plugin_id)
    plan = _REQUEST_PLANS.get(key)
    if plan is not None and plan.settings is settings and plan.home is home:
        return plan
    plan = object.__new__(_Plan)
    plan.settings, plan.home, plan.plugin_id = settings, home, plugin_id
    plan.provider, plan.model, plan.max_tokens = "", "", None
    plan.limits, plan.refusal, plan.price = counted, None, None
    plan.output_tokens, plan.output_nano, plan.grace = 0, None, settings.reservation_grace
    plan.book, plan.astep, plan.encoding = None, None, None
    if len(_REQUEST_PLANS) >= 1024:  # bounded like _PLANS
        _REQUEST_PLANS.clear()
    _REQUEST_PLANS[key] = plan
    return plan


def admit_request(settings: LimitSettings, home: Path | str, plugin_id: str, *, deadline: float,
                  now: float | None = None, store: LimitStore | None = None) -> Ticket:
    """Admit one request of ``plugin_id`` that calls no model (an MCP tool call) or raise
    :class:`PluginLlmLimitError`: it counts under the plugin's ``requests_per_minute`` and
    ``max_concurrent`` (the same counters as its model calls), costs nothing and no tokens. Broken
    limits refuse it as they refuse a model call. Release the ticket when the request ends."""
    limits = settings.for_plugin(plugin_id)
    if limits.error is not None:
        raise _refuse(plugin_id, "config", limits.error_key or limits.source, limits.error)
    counted = dataclasses.replace(limits, budget_day_nano=None, budget_month_nano=None, tokens_per_minute=None)
    if counted.empty:
        return UNLIMITED
    plan = _request_plan(settings, home, plugin_id, counted)
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
    plan = _plan(settings, home, plugin_id, provider, model, max_tokens)  # _prepare(), inlined: the path of
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
    prepared = _prepare(settings, home, plugin_id, messages, provider, model, max_tokens, extra)
    if prepared is None:
        return UNLIMITED
    plan, input_tokens, cost, exact = prepared
    try:
        return _marked(await _aadmit(plan, input_tokens, cost, deadline, now, store), exact)
    except PluginLlmLimitError as refused:
        if not _recountable(plan, refused, exact):
            raise
        refusal = refused
    # as in admit(): the wait for the tokenizer is in a worker thread, never on the event loop
    await tokens.await_loaded(plan.encoding, min(tokens.LOAD_WAIT, deadline - time.monotonic()))
    recounted = _recounted(plan, messages, extra, input_tokens)
    if recounted is None:
        raise refusal
    input_tokens, cost = recounted
    return _marked(await _aadmit(plan, input_tokens, cost, deadline, now, store), True)


async def _aadmit(plan: _Plan, input_tokens: int, cost: int | None, deadline: float, now: float | None,
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
    step = _AsyncStep(loop)
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
    store = store or store_for(settings, home)
    return store.snapshot(plugin_id, limits, time.time() if now is None else now, timeout=settings.store_timeout)


def reset(settings: LimitSettings, home: Path | str, plugin_id: str, *, now: float | None = None,
          store: LimitStore | None = None) -> Counters:
    """Forget the plugin's settled usage in the current windows and return what was forgotten
    (raises StoreError); the caller audits it."""
    store = store or store_for(settings, home)
    return store.reset(plugin_id, time.time() if now is None else now, timeout=settings.store_timeout)
