"""``plugin-llm chat``: an interactive session with the configured model and plugins.

Reads one input per line from standard input: ``/command args`` runs a slash
command (``/help`` lists them, ``/plugins`` shows the plugins, ``/exit``
leaves), anything else is a turn with the model, which may call the plugins'
tools. Messages that plugins inject while the session is idle
(``ctx.inject_message``) run as the next turns. Works with a pipe as well as
a terminal: without a TTY there is no prompt, and the exit status is 1 if any
input failed (an error or an unknown command).

On a terminal the line is read with :mod:`readline` (the standard library's
GNU readline / libedit binding; no extra dependency): arrow keys, Home/End and
Ctrl-R edit and search, and the history is kept in ``<home>/chat_history``
(the last 1000 lines, owner-only). Ctrl-C cancels the line being typed or the
turn in progress and returns to the prompt; Ctrl-D on an empty line leaves.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from plugin_llm.cli._common import dumps_json, printable, printable_text
from plugin_llm.cli.main import CliError, debug_enabled, error_line
from plugin_llm.errors import PluginLlmError
from plugin_llm.host import Session
from plugin_llm.host.bootstrap import home_environment, load_manager, resolve_home

__all__ = ["register", "run"]

_PROMPT = "you> "


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="interactive session with the configured model and plugins",
        description="Chat with the configured model; plugins' tools, hooks and /commands are active. "
        "/help lists commands, /exit leaves.",
    )
    parser.add_argument("--home", metavar="DIR", help="home directory (default: $HERMES_HOME or ~/.hermes)")
    parser.add_argument("--max-tool-iterations", type=int, default=8, metavar="N",
                        help="tool rounds the model may run per turn (default 8)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.max_tool_iterations < 0:
        raise CliError("--max-tool-iterations must be 0 or more")
    from plugin_llm.cli._waiting import preload_provider_layer, provider_layer_notice  # (it loads PyYAML)

    home = resolve_home(args.home)
    stdin, out = sys.stdin, sys.stdout
    interactive = stdin.isatty()
    failures = 0
    history = _History(home / "chat_history") if interactive else None
    with home_environment(home):
        preload_provider_layer(home)  # the first turn calls the model: litellm, if needed, loads while plugins load
        manager = load_manager(home)
        with Session(manager, max_tool_iterations=args.max_tool_iterations, platform="cli") as session:
            plugins = manager.list_plugins()
            loaded = sum(1 for p in plugins if p.get("enabled"))
            provider, model = session.route
            print(f"plugin-llm chat: model {model} (provider {provider}), {loaded} plugin(s) loaded "
                  f"from {home}. /help for commands, /exit to leave.", file=out)
            try:
                while not session.exit_requested:
                    try:
                        failures += _run_pending(session, out)
                        line = _read_line(stdin, interactive)
                        if line is None:  # end of input (Ctrl-D)
                            break
                        if not line.strip():
                            continue
                        with provider_layer_notice():
                            failures += _handle(session, line, out)
                    except KeyboardInterrupt:
                        if not interactive:
                            raise
                        print("\n(cancelled; Ctrl-D or /exit leaves)", file=out)  # Ctrl-C: back to the prompt
                failures += 0 if session.exit_requested else _run_pending(session, out)
            finally:
                if history is not None:
                    history.save()
    return 1 if failures and not interactive else 0


class _History:
    """readline line editing with the history in ``path`` (loaded now, saved by :meth:`save`)."""

    LENGTH = 1000

    def __init__(self, path) -> None:
        self.path = path
        try:
            import readline  # noqa: F401 - importing it gives input() line editing
        except ImportError:  # e.g. a Python built without it: plain input()
            self.readline = None
            return
        self.readline = readline
        readline.set_history_length(self.LENGTH)
        try:
            readline.read_history_file(str(path))
        except (OSError, ValueError):
            pass  # none yet (or unreadable): start empty

    def save(self) -> None:
        if self.readline is None:
            return
        try:
            import os

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.readline.write_history_file(str(self.path))
            os.chmod(self.path, 0o600)  # what the operator typed may be private
        except OSError:
            pass


def _read_line(stdin: TextIO, interactive: bool) -> str | None:
    if interactive:
        try:
            return input(_PROMPT)
        except EOFError:
            print()
            return None
    line = stdin.readline()
    return None if line == "" else line.rstrip("\n")


def _handle(session, line: str, out: TextIO) -> int:
    """Run one input and print its outcome; returns 1 when it failed."""
    try:
        result = session.run_turn(line)
    except PluginLlmError as exc:
        print(f"error: {error_line(exc)}", file=out)
        return 1
    except ValueError as exc:
        print(f"error: {printable_text(exc)}", file=out)
        return 1
    _print_result(result, out)
    return 0 if result.ok else 1


def _run_pending(session, out: TextIO) -> int:
    failures = 0
    for _ in range(8):  # a plugin that injects on every turn cannot loop forever
        items = session.drain_pending()
        if not items:
            break
        for item in items:
            print(f"[injected] {printable_text(item)}", file=out)
            failures += _handle(session, item, out)
            if session.exit_requested:
                return failures
    return failures


def _print_result(result, out: TextIO) -> None:
    if result.kind == "reply":
        for run in result.tool_runs:
            args = dumps_json(run.arguments, indent=None)
            print(f"  [tool] {printable(run.name)}({args}) -> {printable(_one_line(run.result))}", file=out)
        for item in result.injected:
            print(f"  [joined this turn] {printable_text(item)}", file=out)
        print(f"assistant> {printable_text(result.text)}", file=out)
    elif result.text:
        print(printable_text(result.text), file=out)
        if result.kind == "command_error" and result.detail:
            print(printable_text(result.detail) if debug_enabled() else "(--debug shows where in the plugin)", file=out)
    out.flush()


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _safe(exc: BaseException) -> str:
    try:
        from auth import redact
    except ImportError:
        return printable_text(exc)
    return printable_text(redact(str(exc)))
