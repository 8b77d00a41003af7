"""Entry point of ``plugin-llm``.

Subcommands live in their own modules and are imported only when used, so commands that do not
call a model never import litellm and start fast. Each module exposes ``register(subparsers)``,
which adds its parser and sets ``func`` (``func(args) -> int``) as a default.

Exit codes, the same for every subcommand (see :data:`EXIT_CODES`): 0 ok; 1 a check found problems
or a call failed; 2 a usage or configuration error; 130 interrupted. Operator mistakes raise
:class:`CliError` (or a ``PluginLlmError``) and are printed once, as one line on stderr.
``--debug`` (before or after the subcommand) shows the plugin's own frames, debug logging and, for
the host's errors, the traceback. Colour only on a terminal, never with ``NO_COLOR`` set.

As the process's entry point (``main()`` without ``argv``) it closes the limits stores and audit
logs and ends the process with ``os._exit`` even if a plugin left a thread running; ``atexit``
handlers do not run then (docs/design.md, "The CLI process").
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Sequence

from plugin_llm import __version__
from plugin_llm.commands import SUBCOMMANDS
from plugin_llm.errors import PluginLlmError

__all__ = ["CliError", "main", "SUBCOMMANDS", "EXIT_CODES", "debug_enabled", "colour"]

#: The exit codes of every ``plugin-llm`` command.
EXIT_CODES: dict[int, str] = {
    0: "ok",
    1: "a check found problems, or a call or plugin command failed",
    2: "usage or configuration error (bad flag, unknown name, unreadable config)",
    130: "interrupted (Ctrl-C)",
}

_DEBUG = [False]

#: Commands that read config.yaml (``plugins``: every action but ``new``). When it does not
#: parse, each says so once, in the words every denial uses (``HostConfig.closed_reason``:
#: "config.yaml does not parse (<file>:<line>:<col>: ...): the trust gate is closed until it is
#: fixed"), and exits 2 (EXIT_CODES: a configuration error). These still report what they can
#: (where the problem is, what is refused meanwhile) first:
_REPORT_ON_BROKEN_CONFIG = frozenset({"trust", "doctor", "plugins"})
#: ... and these are refused before they start: a fresh process has no last good config, so
#: they would run on the defaults (the local model, no plugin, the local stores) instead of
#: the operator's route, plugins, limits and token store.
_REFUSE_ON_BROKEN_CONFIG = frozenset({"run", "try", "chat", "limits", "tokens", "serve"})


def debug_enabled() -> bool:
    """Whether this ``plugin-llm`` run was given ``--debug`` (show plugin frames, debug logs)."""
    return _DEBUG[0]


def colour(text: str, code: str, stream=None) -> str:
    """``text`` in SGR colour ``code`` when ``stream`` (stderr) is a terminal and ``NO_COLOR``
    is unset (https://no-color.org) and ``TERM`` is not ``dumb``; else ``text`` unchanged."""
    stream = sys.stderr if stream is None else stream
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return text
    try:
        tty = stream.isatty()
    except Exception:
        tty = False
    return f"\033[{code}m{text}\033[0m" if tty else text

class CliError(Exception):
    """An operator mistake: printed as ``plugin-llm: error: <message>``, exit 2."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _available() -> dict[str, tuple[str, str]]:
    return {name: spec for name, spec in SUBCOMMANDS.items() if importlib.util.find_spec(spec[0]) is not None}


#: commands that read no home (``--home`` before them is refused, not silently ignored)
_NO_HOME = frozenset({"demo", "serve-local", "completion"})


def _build_parser(selected: str | None) -> argparse.ArgumentParser:
    """The command table's parser; ``selected`` (a name, or ``"*"`` for all) has its full parser."""
    from plugin_llm.cli._common import HOME_HELP, CliParser  # on first use: it loads PyYAML

    parser = CliParser(
        prog="plugin-llm",
        description="LLM gateway for plugins: trust gate, host-held credentials, tamper-evident audit log.",
    )
    parser.add_argument("--home", type=Path, default=None, metavar="DIR",
                        help=HOME_HELP + "; also accepted after the subcommand")
    parser.add_argument("--debug", action="store_true",
                        help="show plugin frames of plugin failures, debug logs and host tracebacks "
                        "(also accepted after the subcommand)")
    parser.add_argument("--log-format", choices=("console", "json"), default=None,
                        help="the process's own log lines (warnings, errors; not the audit log) as readable "
                        "console lines or JSON lines (default: $PLUGIN_LLM_LOG_FORMAT, else plain lines)")
    parser.add_argument("--version", action="version", version=f"plugin-llm {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in _available().items():
        if name == selected or selected == "*":
            importlib.import_module(module_name).register(sub)
        else:  # listed in --help without importing the module
            sub.add_parser(name, help=help_text, add_help=False)
    _accept_debug(sub)
    _accept_home(sub)
    codes = "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items())
    parser.epilog = f"Exit codes: {codes}."
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def _accept_debug(sub: argparse._SubParsersAction) -> None:
    """``--debug`` after the subcommand too (at every level: ``plugins info --debug``); its
    default is suppressed so an absent flag never overrides one given before the subcommand."""
    for child in set(sub.choices.values()):
        if not any("--debug" in a.option_strings for a in child._actions):
            child.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        for action in child._actions:
            if isinstance(action, argparse._SubParsersAction):
                _accept_debug(action)


def _accept_home(sub: argparse._SubParsersAction) -> None:
    """``--home`` after the subcommand too, at every level, with one help; its default is suppressed
    so that an absent flag never overrides one given before the subcommand."""
    from plugin_llm.cli._common import HOME_HELP  # on first use: it loads PyYAML

    for name, child in sub.choices.items():
        if name in _NO_HOME or not child.add_help:  # a stub of --help's listing has no options
            continue
        own = next((a for a in child._actions if "--home" in a.option_strings), None)
        if own is None:
            child.add_argument("--home", type=Path, default=argparse.SUPPRESS, metavar="DIR", help=HOME_HELP)
        else:
            own.default, own.help, own.metavar = argparse.SUPPRESS, HOME_HELP, "DIR"
        for action in child._actions:
            if isinstance(action, argparse._SubParsersAction):
                _accept_home(action)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("plugin-llm-gateway")
    except Exception:
        return __version__


def _help_epilog_plugins(parser: argparse.ArgumentParser) -> None:
    """Add the plugin CLI commands (``ctx.register_cli_command``) of the home to ``--help``."""
    try:
        from plugin_llm.plugins import PluginManager  # on first use: the CLI's start stays light

        manager = PluginManager(audit_events=False)  # read-only: no load events in the audit log
        manager.discover_plugins()
        commands = dict(manager.cli_commands)
    except Exception:  # a broken home never breaks --help
        return
    if not commands:
        return
    from plugin_llm.cli._common import printable  # on first use: it loads PyYAML

    lines = [f"  {printable(name, 40):<14}{printable(getattr(e, 'help', '') or '', 200)} "
             f"(plugin {printable(getattr(e, 'plugin_key', ''), 80)})" for name, e in sorted(commands.items())]
    parser.epilog = "plugin commands:\n" + "\n".join(lines) + "\n\n" + (parser.epilog or "")


def _selected_command(argv: Sequence[str]) -> str | None:
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _VALUED_GLOBALS:  # a global option's value is not the command
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


#: global options that take a value (given before the subcommand)
_VALUED_GLOBALS = ("--home", "--log-format")


def _global_value(argv: Sequence[str], selected: str | None, option: str) -> str | None:
    """The value of ``option`` given before the subcommand (the last one), or None."""
    end = argv.index(selected) if selected is not None else len(argv)
    value = None
    for i, arg in enumerate(argv[:end]):
        if arg == option and i + 1 < end:
            value = argv[i + 1]
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
    return value


def _global_home(argv: Sequence[str], selected: str | None) -> str | None:
    """The value of ``--home`` given before the subcommand (the last one), or None."""
    return _global_value(argv, selected, "--home")


def _install_log_format(argv: Sequence[str], selected: str | None) -> bool:
    """``--log-format json|console`` (or ``$PLUGIN_LLM_LOG_FORMAT``): the process's own log lines as JSON
    lines or console lines (:mod:`plugin_llm.oplog`); False for a value that is no format (said)."""
    from plugin_llm import oplog  # on first use: the CLI's start stays light

    fmt = _global_value(argv, selected, "--log-format") or os.environ.get("PLUGIN_LLM_LOG_FORMAT")
    if not fmt:
        return True
    if fmt not in oplog.FORMATS:
        near = difflib.get_close_matches(fmt, oplog.FORMATS, n=1)
        _error(f"--log-format: {_printable(fmt)!r} is not a log format; use {' or '.join(oplog.FORMATS)}"
               + (f" (did you mean {near[0]!r}?)" if near else ""))
        return False
    handler = oplog.install(fmt)
    handler._plugin_llm_terminal = True  # type: ignore[attr-defined]  # --debug lowers its level
    os.environ["PLUGIN_LLM_LOG_FORMAT"] = fmt  # worker processes (serve --workers) log the same way
    return True


def _wants_help(argv: Sequence[str], selected: str | None) -> bool:
    return selected is None and (not argv or "-h" in argv or "--help" in argv)


def _set_debug(on: bool) -> None:
    _DEBUG[0] = on
    if not on:
        return
    logging.getLogger("plugin_llm").setLevel(logging.DEBUG)
    for handler in logging.getLogger().handlers:
        if getattr(handler, "_plugin_llm_terminal", False):
            handler.setLevel(logging.DEBUG)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``plugin-llm`` command; its exit code. Without ``argv`` (the process's entry
    point) it also ends the process once the command is done (see the module docstring)."""
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # the operator's Ctrl-C, wherever it arrived
        print("plugin-llm: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:  # `plugin-llm ... | head`: the reader left; no traceback, no flush error at exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        code = 141  # 128 + SIGPIPE, as a shell reports it
    if argv is None:
        _exit_if_threads_remain(code)
    return code


def _main(argv: list[str]) -> int:
    _install_terminal_logging()
    selected = _selected_command(argv)
    if not _install_log_format(argv, selected):
        return 2
    home = _global_home(argv, selected)
    if home is None:
        return _command(argv, selected)
    if selected in _NO_HOME:
        _error(f"--home: {selected} reads no home; leave --home out")
        return 2
    # every part of the command (a plugin's CLI command, the config check, plugins it loads) sees that home
    previous = os.environ.get("HERMES_HOME")
    os.environ["HERMES_HOME"] = str(Path(home).expanduser())
    try:
        return _command(argv, selected)
    finally:
        if previous is None:
            os.environ.pop("HERMES_HOME", None)
        else:
            os.environ["HERMES_HOME"] = previous


def _command(argv: list[str], selected: str | None) -> int:
    known = _available()
    if selected is not None and selected not in known:
        closed = _closed_reason(None)  # first: finding plugin commands loads the config
        plugin_cli = _plugin_cli_command(selected)
        if plugin_cli is not None:
            _set_debug("--debug" in argv[: argv.index(selected)])
            return plugin_cli(argv)
        # it may be a plugin's command: say why none is there (a typo of a built-in one goes to argparse)
        if closed is not None and not difflib.get_close_matches(selected, list(known), n=1):
            _error(_clean(f"unknown command {_printable(selected)!r}: {closed}; until then no plugin is "
                          "enabled, so no plugin command is available"))
            return 2
    parser = _build_parser(selected if selected in known else None)
    if _wants_help(argv, selected):
        _help_epilog_plugins(parser)
    args, extras = parser.parse_known_args(argv)
    if extras:  # said by the parser of the (sub)command they were given to, with its usage line
        _parser_of(parser, args).error(f"unrecognized arguments: {' '.join(extras)}")
    _set_debug(bool(getattr(args, "debug", False)))
    if not getattr(args, "func", None):  # `plugin-llm`, or a command without its action: `plugin-llm limits`
        _parser_of(parser, args).print_help()
        return 0 if selected is None else 2
    closed = _config_closed(args)
    if closed is not None and args.command in _REFUSE_ON_BROKEN_CONFIG:
        _error(_clean(closed))
        return 2
    code, said = _run(args)
    if closed is None:
        return code
    if not said:  # once: unless the command's own error already said it
        _error(_clean(closed))
    return 2 if code in (0, 1) else code


def _parser_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The deepest parser ``args`` went through: ``limits show``'s for ``plugin-llm limits show ...``."""
    while True:
        chosen = None
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(args, action.dest, None) or "")
                break
        if chosen is None:
            return parser
        parser = chosen


def _run(args: argparse.Namespace) -> tuple[int, bool]:
    """The command's exit code, and whether its error (if any) said config.yaml does not parse."""
    try:
        return int(args.func(args) or 0), False
    except CliError as exc:
        if args.debug:
            raise
        text = _safe(exc)
        _error(text)
        return exc.exit_code, _CLOSED_WORDS in text
    except PluginLlmError as exc:
        if args.debug:
            raise
        text = error_line(exc)
        _error(text)
        return 1, _CLOSED_WORDS in text


_CLOSED_WORDS = "config.yaml does not parse"


def _error(text: str) -> None:
    print(f"plugin-llm: {colour('error', '31')}: {text}", file=sys.stderr)


def _printable(text: str) -> str:
    from plugin_llm.hardened.terminal_text import escape_unsafe  # on first use: the CLI's start stays light

    return escape_unsafe(text, 100)


def _config_closed(args: argparse.Namespace) -> str | None:
    """``HostConfig.closed_reason`` of the home a config-reading command uses (None otherwise)."""
    command = getattr(args, "command", None)
    if command not in _REPORT_ON_BROKEN_CONFIG and command not in _REFUSE_ON_BROKEN_CONFIG:
        return None
    if command == "plugins" and getattr(args, "plugins_action", None) == "new":
        return None  # scaffolding a plugin reads no config
    return _closed_reason(getattr(args, "home", None))


def _below_error(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR


def _closed_reason(home: object) -> str | None:
    from pathlib import Path

    from plugin_llm.config import get_config_source, hermes_home  # on first use: it loads PyYAML

    try:
        path = Path(home).expanduser() if home else hermes_home()  # type: ignore[arg-type]
        if not path.is_dir():
            return None  # the command says what is wrong with the home itself
        # The first load logs an unusable file (ERROR) in other words; the CLI says it itself, once,
        # in these. Its warnings (unknown keys, did-you-mean) still show.
        logger = logging.getLogger("plugin_llm.config")
        logger.addFilter(_below_error)
        try:
            config = get_config_source(path).current()
        finally:
            logger.removeFilter(_below_error)
    except Exception:  # a home the command cannot use: it reports that itself
        return None
    return config.closed_reason


def error_line(exc: BaseException) -> str:
    """``Type: message`` of an error for the terminal, without stuttering: a message that
    already starts with its type's name (``APIConnectionError: APIConnectionError: ...``,
    from a wrapped provider error) is not prefixed again."""
    name = type(exc).__name__
    text = _safe(exc)
    while text.startswith(name + ": " + name + ":"):
        text = text[len(name) + 2:]
    return text if text.startswith(name + ":") else f"{name}: {text}"


def _exit_if_threads_remain(code: int) -> None:
    """End the process now when a non-daemon thread (a plugin's) would keep it alive."""
    main_thread = threading.main_thread()
    stray = [t for t in threading.enumerate() if t is not main_thread and not t.daemon and t.is_alive()]
    if not stray:
        return  # the normal exit: atexit handlers run
    logging.getLogger("plugin_llm").debug(
        "exiting with %d non-daemon thread(s) still running: %s", len(stray), ", ".join(t.name[:60] for t in stray[:5]))
    _flush_streams()
    _close_limit_stores()
    _close_audit_logs()
    try:
        logging.shutdown()
    except Exception:  # pragma: no cover - a broken handler must not keep the process alive
        pass
    _flush_streams()
    os._exit(code)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # e.g. a closed pipe
            pass


def _close_limit_stores() -> None:
    """What the limits layer does at exit: give leases back and apply queued settlements
    (a few seconds at most); what a store cannot take expires by the crash rule."""
    limits = sys.modules.get("plugin_llm.limits")  # not imported: no call was metered
    if limits is not None:
        limits.close_stores()


def _close_audit_logs() -> None:
    """Close every audit log this process opened (each waits for a write in progress)."""
    writer = sys.modules.get("audit.writer")  # not imported: nothing was written
    if writer is not None:
        writer.close_all()


def _safe(exc: BaseException) -> str:
    """Exception text as the terminal may show it: redacted, bounded, and with the
    control characters of plugin- or file-supplied text escaped (line breaks kept)."""
    from plugin_llm.plugins.untrusted import safe_str  # on first use: the CLI's start stays light

    text = safe_str(exc, 8000)
    if text is None:
        text = f"{type(exc).__name__} (its message could not be read)"
    return _clean(text)


def _clean(text: str) -> str:
    """Text for the terminal: redacted, bounded, control characters escaped (line breaks kept)."""
    from plugin_llm.hardened.terminal_text import escape_unsafe  # on first use: the CLI's start stays light

    try:
        from auth import redact
    except ImportError:
        pass
    else:
        text = redact(text)
    return "\n".join(escape_unsafe(line, 4000) for line in text[:8000].split("\n")[:200])


class _TerminalFormatter(logging.Formatter):
    """Log lines on stderr: plugin-supplied text (names, error texts) escaped, line breaks kept."""

    def format(self, record: logging.LogRecord) -> str:
        from plugin_llm.hardened.terminal_text import escape_unsafe  # on first use: the CLI's start stays light

        return "\n".join(escape_unsafe(line, 4000) for line in super().format(record).split("\n"))


def _install_terminal_logging() -> None:
    """Replace logging's last-resort handler (WARNING+ to stderr) by one that escapes."""
    root = logging.getLogger()
    if root.handlers:
        return  # an embedding host or a test configured logging: leave it alone
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_TerminalFormatter("%(message)s"))
    handler._plugin_llm_terminal = True  # type: ignore[attr-defined]
    root.addHandler(handler)


def _plugin_cli_command(name: str):
    """A command registered by a plugin with ``ctx.register_cli_command``, or None."""
    try:
        from plugin_llm.plugins.cli_commands import find_cli_command
    except ImportError:
        return None
    return find_cli_command(name)


if __name__ == "__main__":  # pragma: no cover - `python -m plugin_llm.cli.main`
    # Re-import so CliError raised by subcommands is the same class we catch.
    from plugin_llm.cli.main import main as _main

    sys.exit(_main())
