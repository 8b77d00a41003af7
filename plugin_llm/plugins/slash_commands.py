"""Running a plugin's slash commands (``ctx.register_command``), sync or async.

An unknown name raises :class:`UnknownCommandError`; a handler's ``Exception`` propagates as it
is, anything else it raises becomes a :class:`PluginCommandError`; either is audited as
``command_error``. A mixin of :class:`.manager.PluginManager`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from .guarded import aguarded, guarded, run_awaitable
from .registry import CommandEntry, normalize_command_name
from .tracebacks import plugin_dir_of
from .untrusted import MAX_TEXT, bounded, error_text, exact_str, opaque_text, plain

__all__ = ["CommandsMixin", "UnknownCommandError", "PluginCommandError"]


class UnknownCommandError(LookupError):
    """``run_command``/``arun_command`` for a name no plugin registered."""


class PluginCommandError(RuntimeError):
    """A command handler raised something that is not an ``Exception`` (``SystemExit``,
    its own ``KeyboardInterrupt``, ...); the message names the command and plugin."""


def _command_text(result: Any) -> str | None:
    """A command handler's return value as text (None stays None)."""
    if result is None:
        return None
    if issubclass(type(result), str):
        return bounded(exact_str(result), MAX_TEXT)
    return opaque_text(plain(result))


def _command_failure(entry: CommandEntry, exc: BaseException) -> Exception:
    """What ``run_command`` raises for a failed handler: its own ``Exception`` unchanged (callers
    format it with ``error_text``), anything else as a :class:`PluginCommandError`."""
    if issubclass(type(exc), Exception):
        return exc  # type: ignore[return-value]
    return PluginCommandError(f"/{entry.name} (plugin {entry.plugin_key}) raised {error_text(exc)}")


class CommandsMixin:
    """Plugin slash commands: the table Hermes reads and running one.

    The state it uses (made by ``PluginManager.__init__``): ``_failures``, ``_registry``.
    """

    def plugin_commands(self) -> dict[str, dict[str, Any]]:
        """Hermes's ``get_plugin_commands()`` shape: ``{name: {handler, description, plugin, args_hint}}``."""
        return {name: {"handler": e.handler, "description": e.description or "Plugin command",
                       "plugin": e.plugin_key, "args_hint": e.args_hint}
                for name, e in self.commands.items()}

    def get_plugin_command_handler(self, name: str) -> Callable[[str], Any] | None:
        entry = self._command(name)
        return entry.handler if entry else None

    def _command(self, name: Any) -> CommandEntry | None:
        try:
            return self._registry.commands.get(normalize_command_name(name))
        except (TypeError, ValueError):
            return None

    def _require_command(self, name: str) -> CommandEntry:
        entry = self._command(name)
        if entry is None:
            known = ", ".join("/" + n for n in sorted(self._registry.commands)) or "none"
            raise UnknownCommandError(f"unknown command /{str(name).strip().lstrip('/')} (plugin commands: {known})")
        return entry

    async def arun_command(self, name: str, raw_args: str = "") -> str | None:
        """Run a plugin slash command; async handlers are awaited on this loop, sync ones
        run in a worker thread so they may block (e.g. call ``ctx.llm.complete``).
        Raises :class:`UnknownCommandError` for an unknown name; a handler's ``Exception``
        propagates, anything else it raises becomes a :class:`PluginCommandError`."""
        import asyncio

        entry = self._require_command(name)
        handler = entry.handler
        try:
            is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None))
        except Exception:
            is_async = False
        if is_async:
            result, failure = await aguarded(handler(raw_args))
        else:
            result, failure = await asyncio.to_thread(guarded, handler, raw_args)
            if failure is None and result is not None and inspect.isawaitable(result):
                result, failure = await aguarded(result)
        if failure is None:
            result, failure = guarded(_command_text, result)
        if failure is not None:
            raise self._command_failed(entry, failure)
        return result

    def run_command(self, name: str, raw_args: str = "") -> str | None:
        """Sync twin of :meth:`arun_command` (usable with or without a running loop)."""
        entry = self._require_command(name)
        result, failure = guarded(self._run_command_handler, entry, raw_args)
        if failure is not None:
            raise self._command_failed(entry, failure)
        return result

    def _command_failed(self, entry: CommandEntry, failure: BaseException) -> Exception:
        """Audit a failed command (``command_error``, with the plugin's frames) and return what to raise.
        Not logged: whoever ran it prints the error (the CLI once, with --debug the frames)."""
        self._failures.report("command_error", entry.plugin_key, f"command /{entry.name}", error_text(failure),
                              error=failure, plugin_dir=plugin_dir_of(self, entry.plugin_key), log=False,
                              command=entry.name)
        return _command_failure(entry, failure)

    @staticmethod
    def _run_command_handler(entry: CommandEntry, raw_args: str) -> str | None:
        result = entry.handler(raw_args)
        if result is not None and inspect.isawaitable(result):
            result = run_awaitable(result)
        return _command_text(result)
