"""The values of ``plugin-llm audit``'s options, checked: counts, seconds, times and the record filters.

A rejected value is echoed back quoted and cut short (:func:`quoted`); each error says what was
expected, with an example.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from audit.reader import parse_time
from audit.records import DECISIONS, STATUSES
from plugin_llm.cli.main import CliError

_SHOWN = 40  # characters of a rejected value echoed back in an error


def quoted(text: str) -> str:
    """A user's value, quoted and cut short, for an error message."""
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def parse_count(text: str | None, option: str) -> int | None:
    """A whole number >= 1 from ``option``'s text; a huge one is capped (it means "all")."""
    if text is None:
        return None
    value = text.strip().lstrip("0") or "0"
    if not value.isascii() or not value.isdigit():
        raise CliError(f"{option} {quoted(text)}: expected a whole number >= 1, e.g. {option} 20")
    number = int(value) if len(value) <= 19 else sys.maxsize  # no int() of a 5000-digit string
    if number < 1:
        raise CliError(f"{option} {quoted(text)}: expected a whole number >= 1, e.g. {option} 20")
    return min(number, sys.maxsize)


def parse_seconds(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text) if len(text) <= 100 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise CliError(f"{option} {quoted(text)}: expected a number of seconds >= 0, e.g. {option} 30")
    return value


def _time(text: str | None, option: str) -> Any:
    if text is None:
        return None

    try:
        return parse_time(text)
    except ValueError as exc:
        raise CliError(f"{option}: {exc}") from None


def _statuses(text: str | None) -> str | None:
    """``--status`` checked against the statuses the gateway writes."""
    if text is None:
        return None

    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in STATUSES]
    if unknown or not values:
        import difflib

        shown = unknown[0] if unknown else text
        hint = difflib.get_close_matches(shown, STATUSES, n=1)
        raise CliError(f"--status {quoted(shown)}: not a status" + (f" (did you mean {hint[0]}?)" if hint else "")
                       + f"; valid: {', '.join(STATUSES)}")
    return ",".join(values)


def _decisions(text: str | None) -> str | None:
    """``--decision`` checked against the decisions the gateway writes."""
    if text is None:
        return None

    values = [v.strip().lower() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in DECISIONS]
    if unknown or not values:
        raise CliError(f"--decision {quoted(unknown[0] if unknown else text)}: expected {' or '.join(DECISIONS)}")
    return ",".join(values)


def record_filters(args: argparse.Namespace) -> dict[str, Any]:
    since, until = _time(args.since, "--since"), _time(args.until, "--until")
    if since is not None and until is not None and since > until:
        raise CliError(f"--since {quoted(args.since)} is after --until {quoted(args.until)}: nothing can match")
    return {
        "plugin": args.plugin,
        "status": _statuses(args.status),
        "decision": _decisions(getattr(args, "decision", None)),
        "model": args.model,
        "since": since,
        "until": until,
        "purpose": args.purpose,
    }
