"""Entry point of ``plugin-llm``.

Subcommands live in their own modules and are imported only when used, so
commands that do not call a model never import litellm and start fast. Each
module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (``func(args) -> int``) as a default.

Operator mistakes raise :class:`CliError` (or a ``PluginLlmError``) and are
printed as one line on stderr with exit code 2 (1 for gateway errors);
``--debug`` shows the traceback. Ctrl-C anywhere prints ``plugin-llm: interrupted``
and exits 130, without a traceback.

As the process's entry point (``main()`` without ``argv``: the console script,
``python -m plugin_llm``), the process ends when the command is done, even if a
plugin left a non-daemon thread running: output is flushed, the audit logs are
closed (no write is cut short), logging is shut down and the process exits with
``os._exit`` (``atexit`` handlers do not run in that case).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
import threading
from typing import Sequence

__all__ = ["CliError", "main", "SUBCOMMANDS"]

#: subcommand -> (module, one-line help). Order is the order shown in --help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("plugin_llm.cli.demo_cmd", "run the example plugins end to end on the configured route"),
    "try": ("plugin_llm.cli.try_cmd", "make one call as a plugin through the trust gate"),
    "serve-local": ("plugin_llm.cli.serve_local_cmd", "serve the embedded local model over OpenAI-compatible HTTP"),
    "plugins": ("plugin_llm.cli.plugins_cmd", "list and manage plugins"),
    "run": ("plugin_llm.cli.run_cmd", "run one plugin slash command"),
    "chat": ("plugin_llm.cli.chat_cmd", "interactive session with the configured model and plugins"),
    "trust": ("plugin_llm.cli.trust_cmd", "show, check and explain the per-plugin trust policy"),
    "auth": ("plugin_llm.cli.auth_cmd", "manage credentials in auth.json"),
    "audit": ("plugin_llm.cli.audit_cmd", "tail, query, summarise and verify the audit log"),
    "doctor": ("plugin_llm.cli.doctor_cmd", "check the home, config, credentials, audit log and plugins"),
}


class CliError(Exception):
    """An operator mistake: printed as ``plugin-llm: error: <message>``, exit 2."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _available() -> dict[str, tuple[str, str]]:
    return {name: spec for name, spec in SUBCOMMANDS.items() if importlib.util.find_spec(spec[0]) is not None}


def _build_parser(selected: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plugin-llm",
        description="LLM gateway for plugins: trust gate, host-held credentials, tamper-evident audit log.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in _available().items():
        if name == selected:
            importlib.import_module(module_name).register(sub)
        else:  # listed in --help without importing the module
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _selected_command(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``plugin-llm`` command; its exit code. Without ``argv`` (the process's entry
    point) it also ends the process once the command is done (see the module docstring)."""
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # the operator's Ctrl-C, wherever it arrived
        print("plugin-llm: interrupted", file=sys.stderr)
        code = 130
    if argv is None:
        _exit_if_threads_remain(code)
    return code


def _main(argv: list[str]) -> int:
    _install_terminal_logging()
    selected = _selected_command(argv)
    known = _available()
    if selected is not None and selected not in known:
        plugin_cli = _plugin_cli_command(selected)
        if plugin_cli is not None:
            return plugin_cli(argv)
    parser = _build_parser(selected if selected in known else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if selected is None else 2
    from plugin_llm.errors import PluginLlmError

    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        if args.debug:
            raise
        print(f"plugin-llm: error: {_safe(exc)}", file=sys.stderr)
        return exc.exit_code
    except PluginLlmError as exc:
        if args.debug:
            raise
        print(f"plugin-llm: {type(exc).__name__}: {_safe(exc)}", file=sys.stderr)
        return 1


def _exit_if_threads_remain(code: int) -> None:
    """End the process now when a non-daemon thread (a plugin's) would keep it alive."""
    main_thread = threading.main_thread()
    stray = [t for t in threading.enumerate() if t is not main_thread and not t.daemon and t.is_alive()]
    if not stray:
        return  # the normal exit: atexit handlers run
    logging.getLogger("plugin_llm").debug(
        "exiting with %d non-daemon thread(s) still running: %s", len(stray), ", ".join(t.name[:60] for t in stray[:5]))
    _flush_streams()
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


def _close_audit_logs() -> None:
    """Close every audit log this process opened (each waits for a write in progress)."""
    writer = sys.modules.get("audit.writer")  # not imported: nothing was written
    if writer is not None:
        writer.close_all()


def _safe(exc: BaseException) -> str:
    """Exception text as the terminal may show it: redacted, bounded, and with the
    control characters of plugin- or file-supplied text escaped (line breaks kept)."""
    from plugin_llm.plugins.isolation import safe_str
    from plugin_llm.terminal_text import escape_unsafe

    text = safe_str(exc, 8000)
    if text is None:
        text = f"{type(exc).__name__} (its message could not be read)"
    try:
        from auth import redact
    except ImportError:
        pass
    else:
        text = redact(text)
    return "\n".join(escape_unsafe(line, 4000) for line in text.split("\n")[:200])


class _TerminalFormatter(logging.Formatter):
    """Log lines on stderr: plugin-supplied text (names, error texts) escaped, line breaks kept."""

    def format(self, record: logging.LogRecord) -> str:
        from plugin_llm.terminal_text import escape_unsafe

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
