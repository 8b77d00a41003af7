"""Lifecycle hooks: their names, registration, keyword filtering, isolation and time limits.

Hooks are always called with keyword arguments, and each callback receives only the keywords its
signature accepts (``params`` is an alias of ``args``; :mod:`.hook_entries`). A callback that
raises or exceeds ``plugins.hook_timeout`` is isolated: the others still run, and the error is
logged once per distinct (plugin, hook, type, message). How a callback runs under its limit,
inline under ``SIGALRM`` or on a daemon pool: :mod:`.hook_limits`.
"""

from __future__ import annotations

import logging
import threading
from time import monotonic
from typing import Any, Callable

from .hook_entries import HookEntry, HookOutcome, HookSuppressedError, HookTimeoutError
from .hook_limits import CURRENT_LIMIT, _LIMIT_SETTING, _run_limited, call_limited
from .untrusted import exact_str, shown, type_name

__all__ = ["VALID_HOOKS", "NEVER_FIRED", "CALLBACK_TIMEOUT_HOOKS", "FAIL_CLOSED_HOOKS", "SUPPRESSION_SECONDS",
           "TELEMETRY_SCHEMA_VERSION", "HookEntry", "HookOutcome", "HookTimeoutError", "HookSuppressedError",
           "HookRunner", "call_limited"]

_log = logging.getLogger("plugin_llm.plugins")

#: Hermes 0.21.3's hook names. Unknown names are accepted with a warning. Where this host fires
#: each one: :data:`NEVER_FIRED` (never) and docs/plugin-authors.md.
VALID_HOOKS = frozenset(
    {
        "pre_tool_call", "post_tool_call", "transform_terminal_output", "transform_tool_result",
        "transform_llm_output", "pre_llm_call", "post_llm_call",
        "on_stream_start", "on_stream_delta", "on_stream_end", "on_interim_message",
        "pre_verify", "pre_api_request", "post_api_request", "api_request_error",
        "transform_api_error_classification",
        "on_session_start", "on_session_end", "on_session_finalize", "on_session_reset",
        "on_skill_lifecycle", "subagent_start", "subagent_stop", "pre_gateway_dispatch",
        "agent_loop_stopped", "pre_approval_request", "post_approval_response",
        "on_room_member_activity", "pre_transcription",
        "kanban_task_claimed", "kanban_task_completed", "kanban_task_blocked",
        "on_kanban_worker_spawned", "on_kanban_worker_exited", "on_kanban_worker_stale_claim",
        "on_kanban_task_updated", "on_kanban_dispatch_tick",
        "gateway_platform_event", "pre_command",
    }
)
#: Hooks accepted for compatibility that this host has no point to fire: no subagents, no
#: messaging gateway, no approval prompts, no terminal (shell) tool, no skills lifecycle, no
#: rooms, no transcription, no kanban board.
NEVER_FIRED = frozenset(
    {"subagent_start", "subagent_stop", "pre_gateway_dispatch", "pre_approval_request", "post_approval_response",
     "transform_terminal_output", "on_interim_message", "on_skill_lifecycle", "agent_loop_stopped",
     "on_room_member_activity", "pre_transcription", "kanban_task_claimed", "kanban_task_completed",
     "kanban_task_blocked", "on_kanban_worker_spawned", "on_kanban_worker_exited",
     "on_kanban_worker_stale_claim", "on_kanban_task_updated", "on_kanban_dispatch_tick",
     "gateway_platform_event"}
)
#: Hermes's hot-path hooks bounded by ``plugins.hook_callback_timeout`` (timeout = skipped, fail-open).
CALLBACK_TIMEOUT_HOOKS = frozenset(
    {"post_tool_call", "transform_terminal_output", "transform_tool_result", "transform_llm_output",
     "pre_llm_call", "post_llm_call", "pre_api_request", "post_api_request", "api_request_error",
     "pre_verify", "on_session_start", "on_session_end"}
)
#: Policy hooks: a callback that times out, is suppressed or raises blocks (fail-closed).
FAIL_CLOSED_HOOKS = frozenset({"pre_tool_call"})
#: Seconds a callback that timed out and keeps running is skipped for (a hung hook cannot pile up threads).
SUPPRESSION_SECONDS = 60.0
#: Added to every hook's keywords (Hermes's observer schema) except ``gateway_platform_event``.
TELEMETRY_SCHEMA_VERSION = "hermes.observer.v1"


class HookRunner:
    """Registered callbacks per hook and their isolated, time-limited invocation.

    ``timeout`` is called on every invocation (it reads ``plugins.hook_timeout``
    from the current config); ``callback_timeout`` (``plugins.hook_callback_timeout``,
    None when unset or disabled) replaces it for :data:`CALLBACK_TIMEOUT_HOOKS` and
    :data:`FAIL_CLOSED_HOOKS`. A callback that timed out and was left running is
    skipped for :data:`SUPPRESSION_SECONDS`. ``on_error(entry, error, text)`` is called once per
    distinct error with its safe ``Type: message`` text (the manager writes the
    audit ``hook_error`` event).
    """

    _MAX_REPORTED = 1024

    def __init__(
        self,
        timeout: Callable[[], float],
        on_error: Callable[[HookEntry, BaseException, str], None] | None = None,
        callback_timeout: Callable[[], float | None] | None = None,
    ) -> None:
        self._timeout = timeout
        self._callback_timeout = callback_timeout
        self._on_error = on_error
        self._hooks: dict[str, tuple[HookEntry, ...]] = {}  # replaced, never mutated: lock-free reads
        self._lock = threading.Lock()
        self._reported: set[tuple[str, str, str, str]] = set()
        self._suppressed: dict[int, tuple[HookEntry, float]] = {}  # id(entry) -> (entry, until)

    # registration ---------------------------------------------------------------------

    def register(self, hook: str, plugin_key: str, callback: Callable[..., Any]) -> HookEntry:
        if not issubclass(type(hook), str) or not exact_str(hook).strip():
            raise ValueError(f"hook name must be a non-empty string, got {shown(hook)}")
        hook = exact_str(hook).strip()
        if not callable(callback):
            raise TypeError(f"hook {shown(hook)}: callback must be callable, got {type_name(callback)}")
        if hook not in VALID_HOOKS:
            _log.warning(
                "plugin %s registered unknown hook %s (kept; the host fires: %s)",
                plugin_key, shown(hook), ", ".join(sorted(VALID_HOOKS)),
            )
        entry = HookEntry.create(hook, plugin_key, callback)
        with self._lock:
            self._hooks[hook] = self._hooks.get(hook, ()) + (entry,)
        return entry

    def unregister(self, entry: HookEntry) -> None:
        """Drop this one registration (a disposed handle); the plugin's other callbacks stay."""
        with self._lock:
            kept = tuple(e for e in self._hooks.get(entry.hook, ()) if e is not entry)
            self._hooks = {**self._hooks, entry.hook: kept} if kept else {
                h: e for h, e in self._hooks.items() if h != entry.hook}
            self._suppressed.pop(id(entry), None)

    def remove_plugin(self, plugin_key: str) -> None:
        with self._lock:
            self._hooks = {
                hook: kept
                for hook, entries in self._hooks.items()
                if (kept := tuple(e for e in entries if e.plugin_key != plugin_key))
            }
            self._suppressed = {k: v for k, v in self._suppressed.items() if v[0].plugin_key != plugin_key}

    def clear(self) -> None:
        with self._lock:
            self._hooks = {}
            self._suppressed = {}

    def entries(self, hook: str) -> tuple[HookEntry, ...]:
        return self._hooks.get(hook, ())

    def has_hook(self, hook: str) -> bool:
        return bool(self._hooks.get(hook))

    def hooks_of(self, plugin_key: str) -> list[str]:
        return [e.hook for entries in self._hooks.values() for e in entries if e.plugin_key == plugin_key]

    # invocation -----------------------------------------------------------------------

    def limit(self, hook: str) -> tuple[float, str]:
        """(seconds, config key) bounding one callback of ``hook``."""
        if self._callback_timeout is not None and (hook in CALLBACK_TIMEOUT_HOOKS or hook in FAIL_CLOSED_HOOKS):
            seconds = self._callback_timeout()
            if seconds is not None:
                return min(float(seconds), threading.TIMEOUT_MAX), "plugins.hook_callback_timeout"
        return min(float(self._timeout()), threading.TIMEOUT_MAX), "plugins.hook_timeout"

    def run(self, hook: str, kwargs: dict[str, Any]) -> list[HookOutcome]:
        """Every callback's outcome, in registration order (errors, timeouts and skips included)."""
        entries = self._hooks.get(hook)
        if not entries:
            return []
        if hook != "gateway_platform_event" and "telemetry_schema_version" not in kwargs:
            kwargs = {**kwargs, "telemetry_schema_version": TELEMETRY_SCHEMA_VERSION}
        timeout, setting = self.limit(hook)
        outcomes: list[Any] = [None] * len(entries)
        calls, slots = [], []
        now = monotonic()
        for index, entry in enumerate(entries):
            held = self._suppressed.get(id(entry))
            if held is not None and held[0] is entry and held[1] > now:
                error = HookSuppressedError(
                    f"skipped: it timed out less than {SUPPRESSION_SECONDS:g}s ago ({setting})")
                outcomes[index] = HookOutcome(entry, None, error, f"HookSuppressedError: {error}")
                continue
            calls.append((entry, entry.select_kwargs(kwargs)))
            slots.append(index)
        if calls:
            tokens = CURRENT_LIMIT.set(timeout), _LIMIT_SETTING.set(setting)
            try:
                ran = _run_limited(calls, timeout)
            finally:
                _LIMIT_SETTING.reset(tokens[1])
                CURRENT_LIMIT.reset(tokens[0])
            for index, outcome in zip(slots, ran):
                outcomes[index] = outcome
                if outcome.timed_out and getattr(outcome.error, "abandoned", False):
                    self._suppress(outcome.entry)  # an interrupted callback or a stopped process is not
        for outcome in outcomes:
            if outcome.error is not None:
                self.report(outcome)
        return outcomes

    def _suppress(self, entry: HookEntry) -> None:
        with self._lock:
            now = monotonic()
            if len(self._suppressed) >= self._MAX_REPORTED:
                self._suppressed = {k: v for k, v in self._suppressed.items() if v[1] > now}
            self._suppressed[id(entry)] = (entry, now + SUPPRESSION_SECONDS)

    def results(self, hook: str, kwargs: dict[str, Any]) -> list[Any]:
        """Non-None return values of the callbacks that succeeded, in registration order."""
        return [o.value for o in self.run(hook, kwargs) if o.error is None and o.value is not None]

    def report(self, outcome: HookOutcome) -> None:
        """Log and audit (once per distinct text) a failed outcome, or one its caller could not use."""
        entry, error, text = outcome.entry, outcome.error, outcome.error_text or ""
        signature = (entry.plugin_key, entry.hook, text)
        with self._lock:
            if signature in self._reported:
                return
            if len(self._reported) >= self._MAX_REPORTED:
                self._reported.clear()
            self._reported.add(signature)
        _log.warning(
            "hook %s of plugin %s failed: %s (further identical errors are not logged)",
            entry.hook, entry.plugin_key, text,
        )
        if not outcome.timed_out and _log.isEnabledFor(logging.DEBUG):
            _log.debug("hook %s of plugin %s failed:%s", entry.hook, entry.plugin_key, _frames_text(error))
        if self._on_error is not None:
            try:
                self._on_error(entry, error, text)
            except Exception:  # reporting must never break the host
                _log.debug("hook error reporter failed", exc_info=True)


def _frames_text(error: BaseException | None) -> str:
    from .tracebacks import frames_text  # the plugin's own frames, not the host's internals

    return frames_text(error)
