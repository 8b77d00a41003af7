"""``plugin-llm run COMMAND [ARGS...]``: run one slash command and print what it returns.

Built-in commands (``plugins``, ``tools``, ``help``, ...) and plugin commands
(sync or async handlers) alike; the leading ``/`` is optional. ``-`` as the
only argument reads the arguments from standard input (for long pastes).
No session is attached while it runs, so ``ctx.inject_message`` returns
False: there is no conversation to receive the message. An unknown command
exits with status 2 and lists the available ones; a handler that raises exits
with status 1, and ``--debug`` (before or after ``run``) shows the plugin's frames
(file:line in the plugin's own code).
"""

from __future__ import annotations

import argparse
import sys

from plugin_llm.cli._common import printable_text
from plugin_llm.cli.main import CliError, colour, debug_enabled
from plugin_llm.config import get_config_source
from plugin_llm.host import Session
from plugin_llm.host.bootstrap import home_environment, load_manager, resolve_home
from plugin_llm.plugins import PluginManager

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run one plugin slash command",
        description="Run one slash command (built-in or from a plugin) and print what it returns.",
        epilog="Options (--home, --debug) go before COMMAND; everything after it is passed to the command. "
        "Example: plugin-llm run tldr 'a long text to summarise'",
    )
    parser.add_argument("--home", metavar="DIR", help="home directory (default: $HERMES_HOME or ~/.hermes)")
    parser.add_argument("command_name", metavar="COMMAND", help="command name, e.g. tldr or /tldr")
    parser.add_argument("command_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments passed to the command as one string ('-' reads standard input)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    name = args.command_name.strip().lstrip("/")
    if not name:
        raise CliError("no command given; try: plugin-llm run help")
    raw = " ".join(args.command_args)
    if args.command_args == ["-"]:
        raw = sys.stdin.read().strip()
    home = resolve_home(args.home)
    with home_environment(home):
        if name == "help":  # read-only: listing the commands appends no load events to the audit log

            manager = PluginManager(home=home, audit_events=False)
            manager.discover_plugins()
        else:
            manager = load_manager(home)
        from plugin_llm.cli._waiting import preload_provider_layer, provider_layer_notice  # (the provider layer)

        if name in manager.commands:  # a plugin command may call the model: litellm, if needed, loads meanwhile
            preload_provider_layer(home)
        session = Session(manager, platform="cli")  # not attached: no conversation to inject into

        try:
            with provider_layer_notice():
                result = session.run_command(name, raw)
        finally:
            session.close()
    if result.kind == "unknown_command":
        closed = get_config_source(home).current().closed_reason
        if closed is not None:  # no plugin is enabled while config.yaml does not parse
            raise CliError(f"{result.text}\n({closed}; until then no plugin is enabled)")
        raise CliError(f"{result.text}\n(plugin commands come from enabled plugins in {home}/config.yaml; "
                       "see: plugin-llm plugins list)")
    if result.kind == "command_error":
        detail = result.detail if debug_enabled() else ""  # the plugin's frames: with --debug
        hint = "" if debug_enabled() or not result.detail else " (--debug shows where in the plugin)"
        print(f"plugin-llm: {colour('error', '31')}: {printable_text(result.text)}{hint}{printable_text(detail)}",
              file=sys.stderr)
        return 1
    if result.text:
        print(printable_text(result.text))
    return 0
