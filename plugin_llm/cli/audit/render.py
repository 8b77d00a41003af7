"""How ``plugin-llm audit`` shows records on a terminal: one line each, the column titles, the
skipped lines' warning.

Record text is escaped (controls, line separators, bidi and other invisible characters), so a
purpose can never draw a fake line or reorder one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from audit.records import is_call_record
from plugin_llm.cli._common import dumps_json
from plugin_llm.hardened.terminal_text import escape_unsafe

_ENVELOPE = frozenset({"schema", "seq", "prev_hash", "hash", "ts", "event", "kind"})


class BadLines:
    """Counts lines the reader skipped (not JSON, too long or deep, a duplicate key), to say so once at the end."""

    def __init__(self) -> None:
        self.count = 0
        self.first = ""

    def __call__(self, path: Path, line: int, reason: str) -> None:
        if not self.count:
            self.first = f"{path}:{line} ({reason})" if line else f"{path} ({reason})"
        self.count += 1

    def report(self) -> None:
        if self.count:
            print(
                f"plugin-llm: warning: skipped {self.count} unreadable line(s), first at {clean(self.first)}; "
                f"run `plugin-llm audit verify --strict`",
                file=sys.stderr,
            )


class Header:
    """Prints the column titles once, before the first human-readable record (never with --json)."""

    def __init__(self, as_json: bool, out: TextIO, width: int | None = None, replica: bool = False) -> None:
        self.done, self.out, self.width = as_json, out, width
        self.title = f"{'REPLICA':<12} {HEADER}" if replica else HEADER

    def __call__(self) -> None:
        if not self.done:
            self.out.write(cut(self.title, self.width) + "\n")
            self.done = True


def terminal_width(args: argparse.Namespace) -> int | None:
    """The width ``tail`` cuts its lines to: the terminal's (or $COLUMNS); None with -v, --json or no terminal."""
    if args.json or args.verbose:
        return None
    raw = os.environ.get("COLUMNS", "").strip()
    columns = int(raw) if raw.isdigit() and len(raw) < 6 else 0
    if not columns:
        try:
            columns = os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else 0
        except (OSError, ValueError, AttributeError):  # a pipe, a file, a stream without a descriptor
            columns = 0
    return max(columns, 20) if columns > 0 else None


def cut(line: str, width: int | None) -> str:
    return line if width is None or len(line) <= width else line[: width - 3] + "..."


def key_text(text: Any) -> str:
    """A plugin id or model from the log, escaped (as :func:`clean`) and bounded: a table's column."""
    return escape_unsafe(text, 100)


def clean(text: Any) -> str:
    """Record text for the auditor's terminal: controls, line separators, bidi and other invisible
    characters shown escaped, so a purpose can never draw a fake line or reorder one."""
    return escape_unsafe(text)


def _short_ts(value: Any) -> str:
    if not isinstance(value, str):
        return "-".ljust(20)
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return clean(value)[:20].ljust(20)
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _num(value: Any) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "-"


def _cost(value: Any) -> str:
    return f"${value:.6f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


#: the column titles of format_record's call lines
HEADER = (f"{'TIME':<20}  {'PLUGIN':<20} {'STATUS':<14} {'MODEL':<26} {'TOKENS I/O':>11} {'COST USD':>11}  PURPOSE")


def format_record(record: dict[str, Any]) -> str:
    """One human line: time, plugin, status, model, tokens in/out, cost, purpose."""
    when = _short_ts(record.get("ts"))
    if not is_call_record(record):
        details = " ".join(
            f"{clean(k)}={clean(json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v)}"
            for k, v in record.items() if k not in _ENVELOPE
        )
        return f"{when}  [{clean(record.get('event', 'event'))}] {details}".rstrip()
    model = record.get("gen_ai.response.model") or record.get("gen_ai.request.model") or "-"
    tokens = f"{_num(record.get('gen_ai.usage.input_tokens'))}/{_num(record.get('gen_ai.usage.output_tokens'))}"
    return (
        f"{when}  {clean(record.get('plugin_id') or '-'):<20} {clean(record.get('status') or '-'):<14} "
        f"{clean(model):<26} {tokens:>11} {_cost(record.get('cost_usd')):>11}  {clean(record.get('purpose') or '')}"
    ).rstrip()


def print_record(record: dict[str, Any], as_json: bool, out: TextIO, width: int | None = None) -> None:
    out.write((dumps_json(record, indent=None) if as_json else cut(format_record(record), width)) + "\n")
