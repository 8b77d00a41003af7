"""What ``plugin-llm limits show|reset``, ``trust show`` and ``audit stats`` print about limits.

Values and text only; the CLI parses arguments, escapes what it prints and
writes the audit event. Reading a store can fail: each plugin's row then
carries the store's error instead of its usage, so one broken store never
hides the configured limits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from plugin_llm.limits.settings import NANO, LimitSettings, PluginLimits
from plugin_llm.limits.store import (Counters, LimitStore, Snapshot, StoreDataError, StoreError, WindowUsage, iso_utc,
                                     usd_text)

__all__ = ["UsageRow", "usd_text", "describe", "show", "format_rows", "budget_summary", "budgets_for", "reset_target",
           "reset_event"]


def describe(limits: PluginLimits) -> str:
    """One line for ``trust show``: ``budget $1.00/day, $20.00/month; 30 requests/min; 4 in flight``."""
    if limits.error is not None:
        return f"calls refused: {limits.error}"
    if limits.empty:
        return "no limits"
    parts = []
    budgets = [f"{usd_text(v)}/{w}" for w, v in (("day", limits.budget_day_nano), ("month", limits.budget_month_nano)) if v is not None]
    if budgets:
        parts.append("budget " + ", ".join(budgets))
    if limits.requests_per_minute is not None:
        parts.append(f"{limits.requests_per_minute} requests/min")
    if limits.tokens_per_minute is not None:
        parts.append(f"{limits.tokens_per_minute} tokens/min")
    if limits.max_concurrent is not None:
        parts.append(f"{limits.max_concurrent} in flight")
    return "; ".join(parts) + (" (limits.defaults)" if limits.source == "limits.defaults" else "")


@dataclass(frozen=True)
class UsageRow:
    """One plugin in ``limits show``: its limits, and its usage or why the store could not say."""

    plugin_id: str
    limits: PluginLimits
    snapshot: Snapshot | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"plugin_id": self.plugin_id, "limits": self.limits.as_dict(),
                               "summary": describe(self.limits)}
        if self.snapshot is not None:
            out["usage"] = self.snapshot.as_dict()
        if self.error is not None:
            out["error"] = self.error
        return out


def show(settings: LimitSettings, home: Path | str, plugin_ids: Iterable[str], *, now: float | None = None,
         store: LimitStore | None = None) -> list[UsageRow]:
    """A row per plugin (sorted); plugins without limits get a row with no usage and no store access."""
    from plugin_llm.limits import store_for  # the facade's process-wide store cache

    now = time.time() if now is None else now
    rows = []
    failed: str | None = None  # the store's error: the other plugins' reads are not tried (a hung Redis
    # would cost limits.store_timeout per plugin)
    for plugin_id in sorted(set(plugin_ids)):
        limits = settings.for_plugin(plugin_id)
        if limits.empty or limits.error is not None:
            rows.append(UsageRow(plugin_id, limits))
            continue
        if failed is not None:
            rows.append(UsageRow(plugin_id, limits, error=failed))
            continue
        try:
            chosen = store or store_for(settings, home)
            rows.append(UsageRow(plugin_id, limits, chosen.snapshot(plugin_id, limits, now, timeout=settings.store_timeout)))
        except StoreDataError as exc:  # this plugin's counts only
            rows.append(UsageRow(plugin_id, limits, error=str(exc)))
        except StoreError as exc:
            failed = str(exc)
            rows.append(UsageRow(plugin_id, limits, error=failed))
    return rows


def _window_line(w: WindowUsage) -> str:
    money = w.limit.startswith("budget_usd")
    fmt = usd_text if money else str
    used = f"{fmt(w.used)} used" if w.limit != "max_concurrent" else ""
    held = f"{fmt(w.in_flight)} in flight" if w.in_flight or w.limit == "max_concurrent" else ""
    resets = f"resets {iso_utc(w.resets_at)}" if w.resets_at is not None and w.limit != "max_concurrent" else ""
    detail = ", ".join(p for p in (used, held, resets) if p)
    return f"    {w.limit:<20} {fmt(w.cap):>12}   {detail}"


def format_rows(rows: Iterable[UsageRow]) -> list[str]:
    """Text lines for ``limits show`` (the CLI escapes them for the terminal)."""
    lines: list[str] = []
    for row in rows:
        lines.append(f"{row.plugin_id}: {describe(row.limits)}")
        if row.error is not None:
            lines.append(f"    usage unknown: {row.error}")
        elif row.snapshot is not None:
            lines.extend(_window_line(w) for w in row.snapshot.windows)
    return lines


def budget_summary(row: UsageRow) -> dict[str, Any]:
    """Spend against budget for ``audit stats``: per window, spent, in flight, cap (USD) and the share used."""
    out: dict[str, Any] = {}
    if row.snapshot is None:
        return out
    for w in row.snapshot.windows:
        if w.limit.startswith("budget_usd"):
            window = w.limit.split(".", 1)[1]
            out[window] = {
                "spent_usd": w.used / NANO, "in_flight_usd": w.in_flight / NANO, "budget_usd": w.cap / NANO,
                "used_fraction": (w.used + w.in_flight) / w.cap if w.cap else None, "resets_at": iso_utc(w.resets_at),
                "resets_at_unix": w.resets_at,
            }
    return out


def budgets_for(home: Path | str, plugins: Iterable[str]) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """Spend against budget in the current windows (:func:`budget_summary`) per plugin with a budget (those
    of ``plugins`` and those configured with one of their own), from the home's limits store; per plugin
    why the store could not say; and why nothing can be shown (a config that cannot say which plugins have
    budgets is not taken for "no budgets")."""
    from plugin_llm.config import ConfigSource

    config = ConfigSource(Path(home)).current()
    problem = config.closed_reason if config.error is not None else config.limits.error
    if problem is not None:
        return {}, {}, str(problem)
    settings = config.limits
    wanted = [p for p in {*plugins, *settings.plugins} if settings.for_plugin(p).has_budget]
    budgets: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for row in show(settings, config.home, wanted):
        if row.error:
            errors[row.plugin_id] = row.error
        else:
            budgets[row.plugin_id] = budget_summary(row)
    return budgets, errors, None


def reset_target(plugin_id: str, settings: LimitSettings, home: Path | str) -> dict[str, Any]:
    """Which counters ``limits reset PLUGIN`` forgets: the plugin, and the store as configured (the
    Redis URL without its password and the key prefix, or the SQLite file)."""
    target: dict[str, Any] = {"plugin_id": plugin_id, "store": settings.store}
    if settings.store == "redis":
        target["store_url"] = settings.redis_url_display
        target["redis_key_prefix"] = settings.redis_key_prefix
    else:
        from plugin_llm.limits.local import DB_NAME

        target["store_path"] = str(Path(home) / DB_NAME)
    return target


def reset_event(target: dict[str, Any], forgotten: Counters, kept_in_flight: int) -> dict[str, Any]:
    """The fields of the ``limits.reset`` event: the target, and what the store deleted."""
    return {
        **target,
        "forgotten.spent_usd.day": forgotten.day_spent / NANO,
        "forgotten.spent_usd.month": forgotten.month_spent / NANO,
        "forgotten.requests_this_minute": forgotten.minute_requests,
        "forgotten.tokens_this_minute": forgotten.minute_tokens,
        "kept.in_flight": kept_in_flight,
    }
