"""Small helpers shared by CLI subcommands (home option, audit lookup, printing untrusted text)."""

from __future__ import annotations

import argparse
import difflib
import json
import re
from pathlib import Path
from typing import Any

from plugin_llm.config import hermes_home
from plugin_llm.hardened.terminal_text import escape_unsafe, escape_unsafe_json, escape_unsafe_text

__all__ = ["CliParser", "HOME_HELP", "add_home_argument", "home_from", "find_audit_record", "printable", "printable_text", "dumps_json", "PRINT_LIMIT"]

#: Default bound on one printed piece of plugin-supplied text (a name, a description, an error).
PRINT_LIMIT = 500


#: the help of ``--home``, the same on every command (it is global: before or after the subcommand)
HOME_HELP = "Hermes home (default: $HERMES_HOME, else ~/.hermes)"

#: reST markup of docstrings used as descriptions: ``x`` and :role:`x` print as x
_REST = re.compile(r"``([^`]+?)``|:[a-z]+:`~?([^`]+?)`")


class CliParser(argparse.ArgumentParser):
    """The parser of every ``plugin-llm`` command: a wrong choice gets a "did you mean", and help
    text written as reST (module docstrings) prints without its markup."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(c) for c in choices]
        close = difflib.get_close_matches(str(value)[:100], names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        shown = printable(_redacted(str(value)), 100)
        raise argparse.ArgumentError(action, f"invalid choice: {shown!r}{hint}; choose from {', '.join(names)}")

    def format_help(self) -> str:
        return _plain(super().format_help())

    def format_usage(self) -> str:
        return _plain(super().format_usage())


def _redacted(text: str) -> str:
    try:
        from auth import redact
    except ImportError:  # pragma: no cover - auth is part of the distribution
        return text
    return redact(text)


def _plain(text: str) -> str:
    return _REST.sub(lambda m: m.group(1) or m.group(2).rsplit(".", 1)[-1], text)


def add_home_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", type=Path, default=None, metavar="DIR", help=HOME_HELP)


def home_from(args: argparse.Namespace) -> Path:
    return (args.home or hermes_home()).expanduser()


def find_audit_record(home: Path, call_id: str, *, tail_bytes: int = 256 * 1024) -> dict[str, Any] | None:
    """The audit line of ``call_id``, searched in the last ``tail_bytes`` of agent.log."""
    path = home / "logs" / "agent.log"
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if call_id.encode() in line:
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def printable(text: Any, limit: int | None = PRINT_LIMIT) -> str:
    """Plugin-supplied text as it may be written to a terminal: control characters (C0,
    DEL, C1), bidi overrides and other invisible characters become visible ``\\x1b`` /
    ``\\u202e`` escapes, and more than ``limit`` characters are cut with a count.

    Every human-readable printer of text that came from a plugin (manifest fields,
    error texts, tool and command names) goes through this; ``None`` prints as "".
    """
    return escape_unsafe(text, limit)


def printable_text(text: Any) -> str:
    """Multi-line plugin- or provider-supplied text (command output, model replies) for a
    terminal: escape sequences and invisible characters escaped, tabs and line breaks kept."""
    return escape_unsafe_text(text)


def dumps_json(data: Any, *, indent: int | None = 2) -> str:
    """``--json`` output: UTF-8 kept readable (``ensure_ascii=False``), but the characters
    json leaves raw that a terminal would act on (DEL, C1, bidi overrides) escaped too."""
    return escape_unsafe_json(json.dumps(data, indent=indent, ensure_ascii=False, default=str))
