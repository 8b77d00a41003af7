"""What ``plugin-llm plugins`` prints and asks: ``--json`` or escaped text, yes/no questions.

Everything a plugin supplies is printed through :func:`plugin_llm.cli._common.printable` (control
characters and bidi overrides escaped, lengths bounded); ``--json`` goes through
:func:`~plugin_llm.cli._common.dumps_json`. The actions call :func:`interactive` through this module
(``terminal.interactive()``), so one replacement of it reaches them all.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from plugin_llm.cli._common import dumps_json, printable

PLUGINS_LOGGER = "plugin_llm.plugins"


def interactive() -> bool:
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def emit(args: argparse.Namespace, data: dict[str, Any], lines: list[str]) -> None:
    if args.json:
        print(dumps_json(data))
    else:
        for line in lines:  # a line may hold a diff: each of its lines is escaped on its own
            print("\n".join(printable(part, limit=4000) for part in line.split("\n")))


def os_error(exc: OSError) -> str:
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return f"{exc.strerror or exc}{where}"


def ask_yes_no(question: str, input_fn: Callable[[str], str] | None = None) -> bool:
    input_fn = input_fn or input  # looked up at call time (tests replace builtins.input)
    try:
        answer = input_fn(f"{question} [y/N] ").strip().lower()
    except EOFError:
        return False
    return answer in ("y", "yes")
