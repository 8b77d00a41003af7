"""Session: the host's turn loop over the configured model, tools, hooks and commands.

One :class:`Session` is one conversation. ``run_turn(text)`` (or ``await arun_turn(text)``)
handles one line of input: ``/name args`` runs a slash command (:mod:`.slash_commands`); anything
else is a turn (:mod:`.turn`): the model is called through the gateway (audited under the ``host``
identity) with the registered tools, tool calls run through ``PluginManager.dispatch_tool``, until
the model answers in text or the tool-iteration cap is reached. Memory providers and context
engines, Hermes's interfaces among them, are driven by :mod:`.memory`.

Injected messages (:meth:`Session.inject`) join a running turn between model requests, else wait
for :meth:`drain_pending` / :meth:`run_pending`. Sync and async share one generator of effects
(:mod:`.driving`). This module holds the session's state, its lifecycle and its entry points.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, Mapping

from plugin_llm.host.compressor import ContextCompressor, DEFAULT_BUDGET_TOKENS
from plugin_llm.host.driving import DrivingMixin, TurnGen
from plugin_llm.host.memory import MemoryMixin
from plugin_llm.host.results import ToolRun, TurnResult
from plugin_llm.host.slash_commands import BUILTIN_COMMAND_HELP, SlashCommandsMixin, format_plugins
from plugin_llm.host.turn import TurnMixin

if TYPE_CHECKING:  # pragma: no cover
    from plugin_llm.plugins import PluginManager

__all__ = ["Session", "TurnResult", "ToolRun", "BUILTIN_COMMAND_HELP", "DEFAULT_SYSTEM_PROMPT", "format_plugins"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant running inside plugin-llm. "
    "Use the available tools when they help, and say so when a tool was blocked or failed."
)


class Session(SlashCommandsMixin, TurnMixin, MemoryMixin, DrivingMixin):
    """One conversation between a user and the configured model, with plugins.

    ``manager`` supplies tools, hooks, commands, the context engine and the
    memory provider. ``llm`` is the host's model client (default:
    ``HostLlm(manager.home)``, created on first use). Use it as a context
    manager (or ``attach()``/``close()``) so ``ctx.inject_message`` reaches it.
    """

    def __init__(
        self,
        manager: "PluginManager",
        *,
        llm: Any = None,
        session_id: str | None = None,
        max_tool_iterations: int = 8,
        context_budget_tokens: int | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        platform: str = "cli",
    ) -> None:
        if max_tool_iterations < 0:
            raise ValueError("max_tool_iterations must be >= 0")
        self.manager = manager
        self._llm = llm
        self.session_id = session_id or _new_session_id()
        self.max_tool_iterations = max_tool_iterations
        self._budget = context_budget_tokens
        self.system_prompt = system_prompt
        self.platform = platform
        self.history: list[dict[str, Any]] = []
        self.exit_requested = False
        self.compressor = ContextCompressor()
        self._started = False
        self._closed = False
        self._turn_active = False
        self._lock = threading.Lock()
        self._interrupts: deque[str] = deque()
        self._pending: deque[str] = deque()
        self._last_route: tuple[str, str] | None = None
        self._turns = 0
        #: the Hermes memory provider driven by this session: (provider, plugin key), once initialised
        self._hmemory: tuple[Any, str] | None = None
        self._hmemory_checked = False
        self._memory_block = ""
        self._memory_tools: set[str] = set()
        self._plugin_sections: str | None = None  # rendered once per new session (ctx.register_system_prompt_section)
        self._engine_started: Any = None  # the Hermes context engine told on_session_start

    # --- lifecycle --------------------------------------------------------------------------

    def attach(self) -> "Session":
        """Become the manager's active session (target of ``ctx.inject_message``).

        An attached session will call the model: when a configured route needs
        litellm, it starts loading on a background thread now, so that the
        first turn does not wait for it.
        """
        from plugin_llm.config import get_config_source  # on first use: it loads PyYAML
        from plugin_llm.transport import start_background_load_for  # on first use: the transport package

        try:
            config = get_config_source(self.manager.home).current()
        except Exception:  # config unreadable: the first call reports it
            config = None
        if config is not None:
            start_background_load_for(config)
        self.manager.active_session = self
        return self

    def detach(self) -> None:
        if getattr(self.manager, "active_session", None) is self:
            self.manager.active_session = None

    def close(self) -> None:
        """End the session: ``on_session_end`` (reason ``exit``) and ``on_session_finalize``
        if any turn ran, then detach. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._started:
                self._hook("on_session_end", session_id=self.session_id, completed=True,
                           interrupted=False, model=self.route[1], platform=self.platform, reason="exit")
                self._hook("on_session_finalize", session_id=self.session_id, platform=self.platform,
                           reason="exit")
            self._end_hermes_plugins()
        finally:
            self.detach()

    def reset(self) -> str:
        """Forget the conversation and start a new session id."""
        old = self.session_id
        if self._started:
            self._hook("on_session_finalize", session_id=old, platform=self.platform, reason="reset")
        self.history.clear()
        self.session_id = _new_session_id()
        self._plugin_sections = None
        self._started = False
        self._hook("on_session_reset", session_id=self.session_id, previous_session_id=old,
                   platform=self.platform)
        if self._hmemory is not None:  # Hermes: a new conversation under a new id, provider kept
            provider, key = self._hmemory
            self.manager.call_plugin("memory on_session_switch", key, provider.on_session_switch,
                                     self.session_id, parent_session_id=old, reset=True)
        if self._engine_started is not None:
            engine, key = self._engine_started
            self.manager.call_plugin("context engine on_session_reset", key, engine.on_session_reset)
        return f"New conversation started (session {self.session_id})."

    def __enter__(self) -> "Session":
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def turn_active(self) -> bool:
        return self._turn_active

    # --- configuration views ----------------------------------------------------------------

    @property
    def llm(self) -> Any:
        if self._llm is None:
            from plugin_llm.llm import HostLlm  # imported on first model call only

            self._llm = HostLlm(self.manager.home)
        return self._llm

    @property
    def context_budget_tokens(self) -> int:
        if self._budget is not None:
            return self._budget
        context = self._config_raw().get("context")
        value = context.get("budget_tokens") if isinstance(context, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return DEFAULT_BUDGET_TOKENS

    @property
    def route(self) -> tuple[str, str]:
        """(provider, model): the last route actually used, else what config.yaml selects."""
        if self._last_route is not None:
            return self._last_route
        return self.configured_route()

    def configured_route(self) -> tuple[str, str]:
        """(provider, model) that config.yaml selects now (the next request uses it)."""
        try:
            from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

            model = get_config_source(self.manager.home).current().model
            return (model.provider or "", model.model or "")
        except Exception:  # config unreadable: the gateway reports it on the call
            return ("local", "local")

    def _config_raw(self) -> Mapping[str, Any]:
        try:
            from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

            raw = get_config_source(self.manager.home).current().raw
        except Exception:  # no config module yet, unreadable file: defaults apply
            return {}
        return raw if isinstance(raw, Mapping) else {}

    # --- injected messages ------------------------------------------------------------------

    def inject(self, content: str, role: str = "user") -> bool:
        """Queue a message from a plugin. Returns False when it cannot be queued."""
        if not isinstance(content, str) or not content.strip() or self._closed:
            return False
        role = (role or "user").strip() if isinstance(role, str) else "user"
        if role != "user":
            content = f"[{role}] {content}"
        with self._lock:
            (self._interrupts if self._turn_active else self._pending).append(content)
        return True

    def drain_pending(self) -> list[str]:
        """Take every message waiting for the next input (oldest first)."""
        with self._lock:
            items = list(self._pending)
            self._pending.clear()
        return items

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def run_pending(self, *, max_turns: int = 8) -> list[TurnResult]:
        """Run each pending injected message as a turn (at most ``max_turns``)."""
        results: list[TurnResult] = []
        while len(results) < max_turns:
            items = self.drain_pending()
            if not items:
                break
            for i, item in enumerate(items):
                if len(results) >= max_turns:
                    with self._lock:  # put back what we could not run
                        self._pending.extendleft(reversed(items[i:]))
                    break
                results.append(self.run_turn(item))
        return results

    async def arun_pending(self, *, max_turns: int = 8) -> list[TurnResult]:
        results: list[TurnResult] = []
        while len(results) < max_turns:
            items = self.drain_pending()
            if not items:
                break
            for i, item in enumerate(items):
                if len(results) >= max_turns:
                    with self._lock:
                        self._pending.extendleft(reversed(items[i:]))
                    break
                results.append(await self.arun_turn(item))
        return results

    def _take_interrupts(self) -> list[str]:
        with self._lock:
            items = list(self._interrupts)
            self._interrupts.clear()
        return items

    def _has_interrupts(self) -> bool:
        with self._lock:
            return bool(self._interrupts)

    # --- public entry points ----------------------------------------------------------------

    def run_turn(self, user_text: str) -> TurnResult:
        """Handle one line of input: a ``/command`` or a conversation turn."""
        return self._drive_sync(self._input(user_text))

    async def arun_turn(self, user_text: str) -> TurnResult:
        return await self._drive_async(self._input(user_text))

    def run_command(self, name: str, raw_args: str = "") -> TurnResult:
        """Run one slash command by name (leading ``/`` optional)."""
        return self._drive_sync(self._command(name, raw_args))

    async def arun_command(self, name: str, raw_args: str = "") -> TurnResult:
        return await self._drive_async(self._command(name, raw_args))

    def available_commands(self) -> list[str]:
        """Built-in and plugin command names, sorted, without the slash."""
        return sorted(set(BUILTIN_COMMAND_HELP) | set(self._plugin_commands()))

    def _input(self, user_text: str) -> TurnGen:
        if not isinstance(user_text, str):
            raise TypeError("user_text must be a string")
        stripped = user_text.strip()
        if stripped.startswith("/") and len(stripped) > 1:
            name, _, raw = stripped[1:].partition(" ")
            if "\n" in name:  # "/cmd\nmore" keeps the newline in the arguments
                name, _, rest = name.partition("\n")
                raw = rest + (" " + raw if raw else "")
            return (yield from self._command(name, raw.strip()))
        if not stripped:
            raise ValueError("empty input: type a message or /help")
        return (yield from self._turn(user_text))


def _new_session_id() -> str:
    return uuid.uuid4().hex[:16]
