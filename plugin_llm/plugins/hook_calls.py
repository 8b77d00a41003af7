"""The manager's hook entry points: every callback of a hook, and Hermes's verdicts read from them.

The callbacks run through :class:`.hooks.HookRunner` (isolated, time-limited, their results read
as plain data); a failing one is audited as ``hook_error`` with the plugin's own frames. The
pre_tool_call verdicts are part of :mod:`.tool_dispatch`. A mixin of :class:`.manager.PluginManager`.
"""

from __future__ import annotations

from typing import Any

from .hooks import FAIL_CLOSED_HOOKS, HookEntry, HookOutcome
from .tracebacks import plugin_dir_of, plugin_frames, release_frames
from .untrusted import bounded, exact_str, type_name


#: what a transform_api_error_classification verdict may carry (Hermes's ClassifiedError fields)
_CLASSIFICATION_FIELDS = ("reason", "retryable", "should_compress", "should_rotate_credential", "should_fallback",
                          "message", "error_context")


def _fail_closed_message(hook: str, outcome: HookOutcome) -> str:
    """Hermes's block directive text for a fail-closed hook whose callback gave no decision."""
    if outcome.timed_out:
        return f"{hook} plugin callback timed out or is still running"
    callback = getattr(outcome.entry.callback, "__name__", None)
    name = exact_str(callback) if issubclass(type(callback), str) else type_name(outcome.entry.callback)
    return f"{hook} plugin callback {bounded(name, 100)} raised {bounded(outcome.error_text or '', 240)}"


class HookCallsMixin:
    """Running hooks by name, and Hermes's hook verdicts.

    The state it uses (made by ``PluginManager.__init__``): ``_hooks``.
    """

    def has_hook(self, name: str) -> bool:
        return self._hooks.has_hook(name)

    def invoke_hook(self, name: str, **kwargs: Any) -> list[Any]:
        """Call every callback of ``name`` (keyword arguments only); their non-None
        results in registration order. Each callback is isolated and time-limited; for a
        fail-closed hook (``pre_tool_call``) a callback that timed out, is suppressed or
        raised contributes Hermes's block directive instead."""
        if name not in FAIL_CLOSED_HOOKS:
            return self._hooks.results(name, kwargs)
        results = []
        for outcome in self._hooks.run(name, kwargs):
            if outcome.error is None:
                if outcome.value is not None:
                    results.append(outcome.value)
            else:
                results.append({"action": "block", "message": _fail_closed_message(name, outcome)})
        return results

    async def ainvoke_hook(self, name: str, **kwargs: Any) -> list[Any]:
        """``invoke_hook`` without blocking the event loop."""
        if not self._hooks.has_hook(name):
            return []
        import asyncio

        return await asyncio.to_thread(self._hooks.results, name, kwargs)

    def get_pre_verify_continue_message(self, **kw: Any) -> str | None:
        """Hermes's pre_verify verdict: the first ``{"action": "continue", "message"}`` or
        ``{"decision": "block", "reason"}`` with a non-empty text keeps the turn going (its text)."""
        kw.setdefault("changed_paths", [])
        for value in self._hooks.results("pre_verify", kw):
            if type(value) is not dict:
                continue
            action = value.get("action") or value.get("decision") or ""
            if type(action) is not str or action.strip().lower() not in ("continue", "block"):
                continue
            message = value.get("message") or value.get("reason")
            if type(message) is str and message.strip():
                return message.strip()
        return None

    def get_plugin_error_classification(self, **kw: Any) -> dict[str, Any] | None:
        """transform_api_error_classification: every callback runs, the first dict naming a
        ``reason`` wins (only Hermes's fields are kept)."""
        for value in self._hooks.results("transform_api_error_classification", kw):
            if type(value) is dict and type(value.get("reason")) is str and value["reason"].strip():
                return {k: value[k] for k in _CLASSIFICATION_FIELDS if k in value}
        return None

    def fire_pre_command_hook(self, *, surface: str, command: str, alias_used: str | None = None,
                              args_raw: str = "", session_key: str | None = None,
                              platform: str | None = None) -> None:
        """Hermes's ``pre_command`` observer, before a slash command runs (return values ignored)."""
        self._hooks.run("pre_command", dict(surface=surface, command=command, alias_used=alias_used,
                                            args_raw=args_raw, session_key=session_key, platform=platform))

    def get_pre_llm_call_context(self, **kw: Any) -> str:
        """pre_llm_call contributions (a string or ``{"context": str}``), joined with a blank line."""
        parts = []
        for value in self._hooks.results("pre_llm_call", kw):  # plain data: exact types only
            if type(value) is dict:
                value = value.get("context")
            if type(value) is str and value.strip():
                parts.append(value.strip("\n"))
        return "\n\n".join(parts)

    def _on_hook_error(self, entry: HookEntry, error: BaseException, text: str) -> None:
        release_frames(error)
        name = type_name(error)
        message = text[len(name) + 2:] if text.startswith(name + ": ") else text
        self._audit(
            "hook_error",
            hook=entry.hook,
            plugin=entry.plugin_key,
            plugin_id=entry.plugin_key,
            message=message[:500],
            frames=plugin_frames(error, plugin_dir_of(self, entry.plugin_key)),
            **{"error.type": name},
        )
