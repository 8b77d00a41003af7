"""What admitting a request works out once: its plan, and counting its input tokens.

A :class:`Plan` holds what does not depend on a request's messages (the plugin's limits, a
refusal that needs no store, the price and output bound, the lease book), once per config,
home, plugin, route and ``max_tokens`` (:func:`plan_for`, bounded caches). :func:`prepare`
adds the request's input tokens and worst-case cost; :func:`recountable` and :func:`recount`
decide whether a refusal counted by the byte bound is worth counting again exactly.
"""

from __future__ import annotations

import json
import math
from typing import Any

from plugin_llm.limits import leases, registry, tokens
from plugin_llm.limits.pricing import find_price, input_token_bound, output_token_bound
from plugin_llm.limits.settings import MAX_CALL_NANO, MAX_CALL_TOKENS, LimitSettings, PluginLimits
from plugin_llm.limits.store import Denial, LimitStore, PluginLlmLimitError

__all__ = ["Plan", "AsyncStep", "plan_for", "request_plan", "output_bound", "prepare", "marked", "recountable",
           "recount", "limit_error"]


def limit_error(plugin_id: str, limit: str, key: str, reason: str) -> PluginLlmLimitError:
    """The refusal of a call that no limit's count decided (broken limits, an unpriced model, the store)."""
    return PluginLlmLimitError(Denial(plugin_id=plugin_id, limit=limit, config_key=key, reason=reason))


class Plan:
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
        self.astep: AsyncStep | None = None  # the store step an async call of this plan is making
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
        return limit_error(self.plugin_id, *self.refusal)

    def lease_book(self, store: LimitStore | None) -> leases.LeaseBook | None:
        """This process's lease book of the plugin in its store (``store``: a test's own), None when
        there is none yet (the store path creates it) or the store does not lease."""
        explicit = store is not None
        if not explicit:
            try:
                store = registry.store_for(self.settings, self.home)
            except Exception:  # noqa: BLE001 - opening is retried, and reported, on the store path
                return None
        if not store.supports_leases:
            return None
        books = store.__dict__.get("_lease_books")
        book = books.get(self.plugin_id) if books else None
        if not explicit:
            self.book = book
        return book


class AsyncStep:
    """A store step an async call is making in a worker thread: the other calls of the same plan on
    the same event loop wait for it (no thread of their own) and then look in memory again; the
    step's slice is sized for them too (``waiting``, changed on that loop only)."""

    __slots__ = ("loop", "done", "waiting")

    def __init__(self, loop: Any) -> None:
        self.loop, self.done, self.waiting = loop, loop.create_future(), 0


_PLANS: dict[tuple[Any, ...], Plan] = {}
_LAST_PLAN: Plan | None = None  # nearly every call repeats the last one: compared field by field, nothing built


def _forget_last_plan() -> None:
    global _LAST_PLAN
    _LAST_PLAN = None


registry.on_close(_forget_last_plan)  # (its lease book is of a store being closed)


def plan_for(settings: LimitSettings, home: Any, plugin_id: str, provider: str, model: str, max_tokens: Any) -> Plan:
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
        plan = Plan(settings, home, plugin_id, provider, model, max_tokens)
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
    plan = plan_for(settings, home, plugin_id, provider, model, max_tokens)
    limits = plan.limits
    if limits.empty or not (limits.has_budget or limits.tokens_per_minute is not None):
        return None
    if type(max_tokens) is int and 0 < max_tokens <= plan.output_tokens:
        return None
    return plan.output_tokens


def prepare(settings: LimitSettings, home: Any, plugin_id: str, messages, provider: str, model: str,
             max_tokens: Any, extra) -> tuple[Plan, int, int | None, bool] | None:
    """The request's plan, input tokens, worst-case cost and whether the input was counted exactly;
    None for a plugin without limits. Raises the refusal that needs no store (broken limits, a
    budget on an unpriced model)."""
    plan = plan_for(settings, home, plugin_id, provider, model, max_tokens)
    if plan.limits.empty:
        return None
    if plan.refusal is not None:
        raise plan.refuse()
    input_tokens, exact = _count(plan, messages, extra)
    return plan, input_tokens, plan.cost(input_tokens), exact


def _count(plan: Plan, messages, extra) -> tuple[int, bool]:
    """The request's input tokens: exact where the plan has a tokenizer (loaded), else the byte bound."""
    if plan.encoding is None:
        return min(MAX_CALL_TOKENS, input_token_bound(messages, extra)), False
    return tokens.count_input(plan.encoding, messages, extra)


def marked(ticket: Any, exact: bool) -> Any:
    """The ticket, saying its input was counted exactly (its audit record's ``limits.input_count``)."""
    if exact and ticket is not None and ticket.metered:
        ticket.input_exact = True
    return ticket


#: the limits a smaller input count can change the decision of
_COUNTED_LIMITS = frozenset({"tokens_per_minute", "budget_usd.day", "budget_usd.month"})


def recountable(plan: Plan, refused: PluginLlmLimitError, exact: bool) -> bool:
    """Whether a refusal may be undone by counting the input exactly: a token or money limit refused
    it, counted by the byte bound while the plan's tokenizer was loading (it may have loaded since)."""
    return (not exact and plan.encoding is not None and refused.denial.limit in _COUNTED_LIMITS
            and (tokens.pending(plan.encoding) or tokens.encoding(plan.encoding) is not None))


def recount(plan: Plan, messages, extra, input_tokens: int) -> tuple[int, int | None] | None:
    """The exact input count and cost once the tokenizer has loaded; None if it did not, or gives no less."""
    counted, exact = _count(plan, messages, extra)
    if not exact or counted >= input_tokens:
        return None
    return counted, plan.cost(counted)


_REQUEST_PLANS: dict[tuple[Any, ...], Plan] = {}


def request_plan(settings: LimitSettings, home: Any, plugin_id: str, counted: PluginLimits) -> Plan:
    """A plan for a request that uses no model: only its count and concurrency are limited."""
    key = (id(settings), id(home), plugin_id)
    plan = _REQUEST_PLANS.get(key)
    if plan is not None and plan.settings is settings and plan.home is home:
        return plan
    plan = object.__new__(Plan)
    plan.settings, plan.home, plan.plugin_id = settings, home, plugin_id
    plan.provider, plan.model, plan.max_tokens = "", "", None
    plan.limits, plan.refusal, plan.price = counted, None, None
    plan.output_tokens, plan.output_nano, plan.grace = 0, None, settings.reservation_grace
    plan.book, plan.astep, plan.encoding = None, None, None
    if len(_REQUEST_PLANS) >= 1024:  # bounded like _PLANS
        _REQUEST_PLANS.clear()
    _REQUEST_PLANS[key] = plan
    return plan
