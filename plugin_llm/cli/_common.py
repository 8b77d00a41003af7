"""Small helpers shared by CLI subcommands (home option, audit lookup)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from plugin_llm.config import hermes_home

__all__ = ["add_home_argument", "home_from", "find_audit_record"]


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
