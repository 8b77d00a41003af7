"""``plugin-llm <name> ...`` for commands plugins registered with ``ctx.register_cli_command``.

``plugin_llm.cli.main`` asks :func:`find_cli_command` only for names that are not
built-in subcommands, so plugins are discovered just for such dispatches.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import re
import sys
from typing import Callable, Sequence

from . import get_plugin_manager
from .guarded import run_awaitable
from .untrusted import error_text

__all__ = ["find_cli_command"]

_log = logging.getLogger("plugin_llm.plugins")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def find_cli_command(name: str) -> Callable[[list[str]], int] | None:
    """A runner for the plugin CLI command ``name`` of the default home, or None.

    The runner takes the full ``plugin-llm`` argv (global flags and the command
    name included), builds the parser ``plugin-llm <name>`` with the plugin's
    ``setup_fn``, and calls ``handler_fn(args)`` (or ``args.func(args)``). It
    returns the handler's integer result (0 for anything else); a handler error
    is printed as one line naming the plugin and returns 1.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        return None
    try:
        manager = get_plugin_manager()
        manager.discover_plugins()
        entry = manager.cli_commands.get(name)
    except Exception as exc:  # a broken home must not turn a typo into a traceback
        _log.warning("cannot look up plugin CLI commands: %s: %s", type(exc).__name__, exc)
        return None
    if entry is None:
        return None

    def run(argv: Sequence[str]) -> int:
        argv = list(argv)
        rest = argv[argv.index(name) + 1:] if name in argv else []
        debug = "--debug" in argv[: argv.index(name)] if name in argv else False
        raw = getattr(entry.setup_fn, "plugin_llm_raw_argv", None)
        if raw is not None:  # an out-of-process plugin parses its arguments in its own process (.remote)
            return raw(rest, debug)
        parser = argparse.ArgumentParser(prog=f"plugin-llm {name}", description=entry.help or None)
        try:
            entry.setup_fn(parser)
        except Exception as exc:
            if debug:
                raise
            print(f"plugin-llm {name}: error: plugin {entry.plugin_key} failed to set up its arguments: "
                  f"{_redact(error_text(exc))}", file=sys.stderr)
            return 1
        args = parser.parse_args(rest)
        handler = entry.handler_fn or getattr(args, "func", None)
        if handler is None:
            print(f"plugin-llm {name}: error: plugin {entry.plugin_key} registered no handler "
                  "(pass handler_fn or call parser.set_defaults(func=...) in setup_fn)", file=sys.stderr)
            return 2
        try:
            result = handler(args)
            if inspect.isawaitable(result):
                result = run_awaitable(result)
        except KeyboardInterrupt:
            print(f"plugin-llm {name}: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:
            if debug:
                raise
            print(f"plugin-llm {name}: error: {_redact(error_text(exc))} (plugin {entry.plugin_key})",
                  file=sys.stderr)
            return 1
        return result if isinstance(result, int) and not isinstance(result, bool) else 0

    return run


def _redact(text: str) -> str:
    """Exception text through the host's secret redactor (plugins may echo what they saw)."""
    try:
        from auth import redact
    except ImportError:
        return text
    return redact(text)
