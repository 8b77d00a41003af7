"""Per-plugin and per-model summaries of call records. Pure.

- ``calls``: call records (denials included); operational events are ignored.
- ``denials``: :func:`audit.records.is_denied` (the trust gate's and the limits' refusals);
  ``errors``: the other calls whose status is not ``ok``.
- tokens and ``cost_usd``: sums of the values present; ``unpriced`` counts successful calls with
  no cost. A value no real call can have (negative, not a number, beyond :data:`MAX_TOKENS`,
  :data:`MAX_COST_USD` or :data:`MAX_LATENCY_MS`) is left out and counted in ``ignored_values``.
- latency percentiles are *nearest-rank* over calls that were not denied: rank
  ``ceil(p/100 * n)`` (p50 of 1..10 is 5, p95 is 10); ``None`` when no call has a latency.
- the model is ``gen_ai.response.model``, else ``gen_ai.request.model``, else ``"-"``.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from audit.records import (
    COST_USD,
    INPUT_TOKENS,
    LATENCY_MS,
    OUTPUT_TOKENS,
    PLUGIN_ID,
    REQUEST_MODEL,
    RESPONSE_MODEL,
    STATUS,
    is_call_record,
    is_denied,
)

__all__ = ["StatsRow", "stats", "percentile", "MAX_TOKENS", "MAX_COST_USD", "MAX_LATENCY_MS"]

#: the largest token count, cost and latency one record can plausibly carry
MAX_TOKENS = 10**9
MAX_COST_USD = 1e6
MAX_LATENCY_MS = 1e9


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None for no values)."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = max(1, math.ceil(p / 100.0 * n))
    return sorted_values[min(rank, n) - 1]


@dataclass(frozen=True)
class StatsRow:
    """One line of the summary: ``dimension`` is ``"plugin"`` or ``"model"``."""

    dimension: str
    key: str
    calls: int
    denials: int
    errors: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    unpriced: int
    p50_latency_ms: float | None
    p95_latency_ms: float | None
    ignored_values: int = 0  #: out-of-range tokens/cost/latency left out of the sums

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _Acc:
    __slots__ = ("calls", "denials", "errors", "tin", "tout", "cost", "unpriced", "latencies", "ignored")

    def __init__(self) -> None:
        self.calls = self.denials = self.errors = self.tin = self.tout = self.unpriced = self.ignored = 0
        self.cost = 0.0
        self.latencies = array("d")  # 8 bytes per call, not a Python float object

    def add(self, record: dict[str, Any]) -> None:
        self.calls += 1
        status = record.get(STATUS)
        denied = is_denied(record)
        if denied:
            self.denials += 1
        elif status != "ok":
            self.errors += 1
        tin, tout, cost, latency = record.get(INPUT_TOKENS), record.get(OUTPUT_TOKENS), record.get(COST_USD), record.get(LATENCY_MS)
        if tin is not None:
            value = _in_range(tin, MAX_TOKENS)
            if value is None:
                self.ignored += 1
            else:
                self.tin += int(value)
        if tout is not None:
            value = _in_range(tout, MAX_TOKENS)
            if value is None:
                self.ignored += 1
            else:
                self.tout += int(value)
        value = None if cost is None else _in_range(cost, MAX_COST_USD)
        if value is not None:
            self.cost += float(value)
        else:
            if cost is not None:
                self.ignored += 1
            if status == "ok":
                self.unpriced += 1
        if not denied and latency is not None:
            value = _in_range(latency, MAX_LATENCY_MS)
            if value is None:
                self.ignored += 1
            else:
                self.latencies.append(float(value))

    def row(self, dimension: str, key: str) -> StatsRow:
        ordered = sorted(self.latencies)
        return StatsRow(
            dimension, key, self.calls, self.denials, self.errors, self.tin, self.tout,
            round(self.cost, 10), self.unpriced, percentile(ordered, 50), percentile(ordered, 95), self.ignored,
        )


def _in_range(value: Any, limit: float) -> int | float | None:
    """``value`` if it is a finite number in ``[0, limit]``, else None.

    Ints are compared as ints: ``float()`` of a 401-digit int raises OverflowError.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= limit else None
    if isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= limit:
        return value
    return None


def _model_of(record: dict[str, Any]) -> str:
    for field in (RESPONSE_MODEL, REQUEST_MODEL):
        value = record.get(field)
        if isinstance(value, str) and value:
            return value
    return "-"


def stats(records: Iterable[dict[str, Any]]) -> list[StatsRow]:
    """Rows per plugin (sorted by id) then per model (sorted by name).

    Memory grows only with the number of plugins/models and 8 bytes per
    latency sample (percentiles need every value).
    """
    by_plugin: dict[str, _Acc] = {}
    by_model: dict[str, _Acc] = {}
    for record in records:
        if not is_call_record(record):
            continue
        plugin = record.get(PLUGIN_ID)
        plugin_key = plugin if isinstance(plugin, str) and plugin else "-"
        acc = by_plugin.get(plugin_key)
        if acc is None:
            acc = by_plugin[plugin_key] = _Acc()
        acc.add(record)
        model_key = _model_of(record)
        acc = by_model.get(model_key)
        if acc is None:
            acc = by_model[model_key] = _Acc()
        acc.add(record)
    rows = [acc.row("plugin", key) for key, acc in sorted(by_plugin.items())]
    rows += [acc.row("model", key) for key, acc in sorted(by_model.items())]
    return rows
