"""``plugin-llm audit stats``: calls, denials, errors, tokens, cost and latency per plugin and
model, with the spend against each budget from the home's limits store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterable, TextIO

from audit.reader import iter_records
from audit.summary import stats
from plugin_llm.cli._common import dumps_json, printable
from plugin_llm.cli.audit.locations import home_of
from plugin_llm.cli.audit.options import record_filters
from plugin_llm.cli.audit.reading import merged_records
from plugin_llm.cli.audit.render import BadLines, key_text
from plugin_llm.limits import views
from plugin_llm.limits.settings import NANO
from plugin_llm.limits.views import usd_text


def run_stats(args: argparse.Namespace, log_path: Path) -> int:
    bad = BadLines()
    rows = stats(iter_records(log_path, on_bad_line=bad, **record_filters(args)))
    budgets, budget_errors = _budgets(args, [r.key for r in rows if r.dimension == "plugin"])
    if args.json:
        doc = {
            "by_plugin": [r.as_dict() for r in rows if r.dimension == "plugin"],
            "by_model": [r.as_dict() for r in rows if r.dimension == "model"],
            "percentiles": "nearest-rank, over calls that were not denied",
            "budgets": budgets,  # plugin -> window -> spent, in flight, budget
            "budget_errors": budget_errors,  # plugin -> why the store could not say
        }
        print(dumps_json(doc))
    elif not rows:
        print("no call records match")
        _print_budgets(budgets, budget_errors, sys.stdout)
    else:
        print_stats(rows, sys.stdout)
        _print_budgets(budgets, budget_errors, sys.stdout)
    ignored = sum(r.ignored_values for r in rows if r.dimension == "plugin")
    if ignored:
        print(f"note: {ignored} token/cost/latency value(s) no real call can have (negative, not a number or "
              "absurdly large) were left out of the sums", file=sys.stderr)
    bad.report()
    return 0


def run_stats_many(args: argparse.Namespace, found: list[Any]) -> int:
    bad = BadLines()
    per_replica: dict[str, int] = {r.name: 0 for r in found}

    def counted(records: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        for record in records:
            per_replica[record["replica"]] += 1
            yield record

    rows = stats(counted(merged_records(args, found, bad)))
    if args.json:
        print(dumps_json({
            "by_plugin": [r.as_dict() for r in rows if r.dimension == "plugin"],
            "by_model": [r.as_dict() for r in rows if r.dimension == "model"],
            "by_replica": per_replica,
            "percentiles": "nearest-rank, over calls that were not denied",
        }))
    elif not rows:
        print("no call records match")
    else:
        print_stats(rows, sys.stdout)
        print("calls per replica: " + ", ".join(f"{key_text(k)} {v}" for k, v in per_replica.items()))
    bad.report()
    return 0


def print_stats(rows: list[Any], out: TextIO) -> None:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    for dimension, title in (("plugin", "PLUGIN"), ("model", "MODEL")):
        selected = [r for r in rows if r.dimension == dimension]
        if not selected:
            continue
        width = max(len(title), *(len(key_text(r.key)) for r in selected))
        out.write(
            f"{title:<{width}}  {'CALLS':>7} {'DENIED':>7} {'ERRORS':>7} {'TOKENS IN':>10} {'TOKENS OUT':>10} "
            f"{'COST USD':>12} {'UNPRICED':>8} {'P50 MS':>9} {'P95 MS':>9}\n"
        )
        for r in selected:  # the words of the query filters: DENIED is --decision denied
            priced = r.calls - r.denials - r.errors - r.unpriced
            cost = "-" if r.unpriced and priced <= 0 and not r.cost_usd else f"{r.cost_usd:.6f}"
            out.write(
                f"{key_text(r.key):<{width}}  {r.calls:>7} {r.denials:>7} {r.errors:>7} {r.input_tokens:>10} "
                f"{r.output_tokens:>10} {cost:>12} {r.unpriced:>8} {ms(r.p50_latency_ms):>9} {ms(r.p95_latency_ms):>9}\n"
            )
        unpriced = sum(r.unpriced for r in selected)
        if dimension == "plugin" and any(r.denials or r.errors for r in selected):
            out.write("(DENIED: refused by the trust gate or a limit, as `audit query --decision denied` lists them; "
                      "ERRORS: the other calls whose status is not ok, among `audit query --decision allowed`)\n")
        if unpriced and dimension == "plugin":
            out.write(f"({unpriced} successful call{'s' if unpriced != 1 else ''} had no price (an unpriced model): "
                      f"COST USD leaves them out, '-' when no call of the row was priced)\n")
        out.write("\n")


def _budgets(args: argparse.Namespace, plugins: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Spend against budget in the current windows, per plugin with a budget (the log's plugins and
    those configured with one of their own), from the home's limits store, and per plugin why the
    store could not say (a log copy read with --log has no home to ask: nothing). A config that
    cannot say which plugins have budgets is said on stderr, not taken for "no budgets"."""
    if args.log:
        return {}, {}
    try:
        budgets, errors, problem = views.budgets_for(home_of(args), plugins)
        if problem is not None:
            print(f"note: spend against budget not shown: {printable(problem, 300)}", file=sys.stderr)
        return budgets, errors
    except Exception as exc:  # noqa: BLE001 - the log's own stats never fail for the budget view
        print(f"note: spend against budget unavailable ({printable(type(exc).__name__)}: {printable(exc, 300)})",
              file=sys.stderr)
        return {}, {}


def _print_budgets(budgets: dict[str, Any], errors: dict[str, str], out: Any) -> None:
    if not budgets and not errors:
        return
    print("\nspend against budget (current windows, from the limits store):", file=out)
    for plugin in sorted({*budgets, *errors}):
        if plugin in errors:
            print(f"  {key_text(plugin)}: unknown ({printable(errors[plugin])})", file=out)
            continue
        for window, w in budgets[plugin].items():
            share = f"{w['used_fraction']:.0%}" if w.get("used_fraction") is not None else "-"
            print(f"  {key_text(plugin)}  {window:<5}  spent ${w['spent_usd']:.6f}  in flight ${w['in_flight_usd']:.6f}  "
                  f"of {usd_text(round(w['budget_usd'] * NANO))} ({share}), resets {w['resets_at']}", file=out)
