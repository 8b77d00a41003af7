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

from plugin_llm.limits.admission import aadmit, admit, admit_in_memory, admit_request, reset, snapshot
from plugin_llm.limits.checks import check_limits
from plugin_llm.limits.plans import output_bound
from plugin_llm.limits.pricing import (
    Estimate,
    Price,
    actual_cost_nano,
    find_price,
    input_token_bound,
    operator_cost,
    worst_case,
)
from plugin_llm.limits.registry import close_stores, store_for
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
from plugin_llm.limits.tickets import UNLIMITED, Ticket

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
