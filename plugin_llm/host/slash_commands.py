"""Slash commands in a host session: the built-in ones (``/help``, ``/plugins``, ``/tools``,
``/history``, ``/model``, ``/reset``, ``/clear``, ``/exit``, ``/quit``) and the plugins'.

``pre_command`` fires before each; a plugin command's failure is reported with its own frames.
"""

from __future__ import annotations

from typing import Any

from plugin_llm.host.driving import Blocking, CommandRun, TurnGen
from plugin_llm.host.messages import check_tool
from plugin_llm.host.results import TurnResult
from plugin_llm.plugins.tracebacks import frames_text, plugin_dir_of
from plugin_llm.plugins.untrusted import MAX_TEXT, error_text, safe_str, type_name


#: Built-in slash commands and their one-line help, in the order /help shows them.
BUILTIN_COMMAND_HELP: dict[str, str] = {
    "help": "list the commands",
    "plugins": "list plugins and their status",
    "tools": "list the tools offered to the model",
    "history": "show this conversation",
    "model": "show the model route the session uses",
    "reset": "start a new conversation (fires on_session_reset)",
    "clear": "same as /reset",
    "exit": "leave the session",
    "quit": "same as /exit",
}
#: built-in command aliases -> their canonical name (pre_command's ``command`` / ``alias_used``)
_BUILTIN_ALIASES = {"quit": "exit", "clear": "reset"}


def format_plugins(plugins: list[dict[str, Any]]) -> str:
    """A human listing of ``PluginManager.list_plugins()`` for ``/plugins``."""
    if not plugins:
        return "No plugins found. Put one in $HERMES_HOME/plugins/<name>/ and enable it in config.yaml."
    counts: dict[str, int] = {}
    for p in plugins:
        counts[p.get("status", "?")] = counts.get(p.get("status", "?"), 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    lines = [f"Plugins ({summary}):"]
    marks = {"enabled": "+", "disabled": "-", "not enabled": ".", "failed": "!"}
    for p in sorted(plugins, key=lambda p: str(p.get("key", p.get("name", "")))):
        key = p.get("key") or p.get("name")
        status = p.get("status", "?")
        version = p.get("version") or ""
        line = f"  {marks.get(status, '?')} {key:<24} {status:<12} {version:<8} {p.get('description') or ''}"
        lines.append(line.rstrip())
        provided = []
        for label in ("tools", "hooks", "commands"):
            items = p.get(label) or []
            if items:
                provided.append(f"{label}: {', '.join(map(str, items))}")
        if provided:
            lines.append("      " + "; ".join(provided))
        if p.get("error"):
            lines.append(f"      error: {p['error']}")
        if p.get("missing_env"):
            lines.append(f"      missing env: {', '.join(map(str, p['missing_env']))}")
    return "\n".join(lines)


def _command_frames(manager: Any, key: str, exc: BaseException) -> str:
    """The failing command's plugin frames (see :mod:`plugin_llm.plugins.tracebacks`)."""
    try:
        entry = manager._command(key)
        plugin_dir = plugin_dir_of(manager, entry.plugin_key) if entry is not None else None
    except Exception:
        plugin_dir = None
    return frames_text(exc, plugin_dir)


class SlashCommandsMixin:
    """Running ``/name args``. A mixin of :class:`~plugin_llm.host.session.Session`.

    The state it uses (made by ``Session.__init__``): ``manager``, ``history``, ``session_id``,
    ``platform``, ``exit_requested``, ``_last_route``.
    """

    def _plugin_commands(self) -> dict[str, Any]:
        try:
            return dict(self.manager.commands)
        except Exception:
            return {}

    def _command(self, name: str, raw_args: str) -> TurnGen:
        key = name.strip().lstrip("/").strip().lower()
        if key in BUILTIN_COMMAND_HELP:
            canonical = _BUILTIN_ALIASES.get(key, key)
            yield Blocking(self._hook, ("pre_command",), dict(
                surface="cli", command=canonical, alias_used=key if canonical != key else None,
                args_raw=raw_args, session_key=self.session_id, platform=self.platform))
            return self._builtin(key, raw_args)
        handler = None
        try:
            handler = self.manager.get_plugin_command_handler(key)
        except Exception:
            handler = None
        if handler is None:
            known = ", ".join("/" + c for c in self.available_commands())
            return TurnResult(
                kind="unknown_command", text=f"Unknown command /{key}. Available commands: {known}",
                stop_reason="unknown_command", command=key,
            )
        yield Blocking(self._hook, ("pre_command",), dict(
            surface="cli", command=key, alias_used=None, args_raw=raw_args, session_key=self.session_id,
            platform=self.platform))
        try:
            out = yield CommandRun(key, raw_args)
        except Exception as exc:  # the manager turns every other plugin BaseException into one
            text = error_text(exc)  # the handler's exception: formatted without trusting it
            detail = _command_frames(self.manager, key, exc)
            # not logged: the caller prints the result (and its detail), so the failure shows once
            return TurnResult(kind="command_error", text=f"/{key} failed: {text}",
                              stop_reason="command_error", command=key, detail=detail)
        text = out if out is None or type(out) is str else (safe_str(out, MAX_TEXT) or f"<{type_name(out)}>")
        return TurnResult(kind="command", text=text, stop_reason="command", command=key)

    def _builtin(self, key: str, raw_args: str) -> TurnResult:
        if key in ("exit", "quit"):
            self.exit_requested = True
            return TurnResult(kind="exit", text="Bye.", stop_reason="exit", command=key)
        if key in ("reset", "clear"):
            text = self.reset()
        elif key == "help":
            text = self._help_text()
        elif key == "plugins":
            text = format_plugins(self.manager.list_plugins())
        elif key == "tools":
            text = self._tools_text()
        elif key == "history":
            text = self._history_text()
        else:  # model
            provider, model = self.configured_route()
            text = f"model: {model} (provider: {provider or 'inferred'}), from {self.manager.home}/config.yaml"
            if self._last_route is not None and self._last_route != (provider, model):
                text += f"\nlast request answered by: {self._last_route[1]} (provider: {self._last_route[0]})"
            text += "\nChange it with model: in config.yaml; the next turn uses the new route."
        return TurnResult(kind="command", text=text, stop_reason="command", command=key)

    def _help_text(self) -> str:
        lines = ["Built-in commands:"]
        lines += [f"  /{name:<10} {desc}" for name, desc in BUILTIN_COMMAND_HELP.items()]
        commands = self._plugin_commands()
        if commands:
            lines.append("Plugin commands:")
            for name in sorted(commands):
                entry = commands[name]
                hint = getattr(entry, "args_hint", "") or ""
                desc = getattr(entry, "description", "") or ""
                plugin = getattr(entry, "plugin_key", "") or ""
                usage = f"/{name} {hint}".strip()
                lines.append(f"  {usage:<24} {desc}" + (f"  [{plugin}]" if plugin else ""))
        lines.append("Anything else is sent to the model.")
        return "\n".join(lines)

    def _tools_text(self) -> str:
        tools = dict(self.manager.tools)
        if not tools:
            return "No tools registered."
        lines = [f"Tools ({len(tools)}):"]
        for name in sorted(tools):
            entry = tools[name]
            ok = check_tool(entry)
            mark = "ok " if ok else "off"
            desc = getattr(entry, "description", "") or ""
            plugin = getattr(entry, "plugin_key", "") or ""
            lines.append(f"  [{mark}] {name:<20} {desc}" + (f"  [{plugin}]" if plugin else ""))
        return "\n".join(lines)

    def _history_text(self) -> str:
        if not self.history:
            return "No messages yet."
        lines = []
        for i, msg in enumerate(self.history, 1):
            role = msg.get("role", "?")
            content = msg.get("content")
            if msg.get("tool_calls"):
                calls = ", ".join(c.get("function", {}).get("name", "?") for c in msg["tool_calls"])
                content = (content or "") + f" [tool calls: {calls}]"
            text = " ".join(str(content or "").split())
            lines.append(f"{i:>3}. {role:<9} {text[:160]}{'...' if len(text) > 160 else ''}")
        return "\n".join(lines)
