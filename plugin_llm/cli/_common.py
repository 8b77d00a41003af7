"""Small helpers shared by CLI subcommands (home option, audit lookup, printing untrusted text)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from plugin_llm.config import hermes_home

__all__ = ["add_home_argument", "home_from", "find_audit_record", "printable", "printable_text", "dumps_json", "PRINT_LIMIT"]

#: Default bound on one printed piece of plugin-supplied text (a name, a description, an error).
PRINT_LIMIT = 500


def add_home_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", type=Path, default=None, help="Hermes home (default: $HERMES_HOME or ~/.hermes)")


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
    from plugin_llm.terminal_text import escape_unsafe

    return escape_unsafe(text, limit)


def printable_text(text: Any) -> str:
    """Multi-line plugin- or provider-supplied text (command output, model replies) for a
    terminal: escape sequences and invisible characters escaped, tabs and line breaks kept."""
    from plugin_llm.terminal_text import escape_unsafe_text

    return escape_unsafe_text(text)


def dumps_json(data: Any, *, indent: int | None = 2) -> str:
    """``--json`` output: UTF-8 kept readable (``ensure_ascii=False``), but the characters
    json leaves raw that a terminal would act on (DEL, C1, bidi overrides) escaped too."""
    from plugin_llm.terminal_text import escape_unsafe_json

    return escape_unsafe_json(json.dumps(data, indent=indent, ensure_ascii=False, default=str))
