"""Session: the host's turn loop over the configured model, tools, hooks and commands.

One :class:`Session` is one conversation. ``run_turn(text)`` (or ``await arun_turn(text)``)
handles one line of input: ``/name args`` runs a built-in slash command (``/help``, ``/plugins``,
``/tools``, ``/history``, ``/model``, ``/reset``, ``/clear``, ``/exit``, ``/quit``) or a plugin's;
anything else is a turn: the model is called through the gateway (audited under the ``host``
identity) with the registered tools, tool calls run through ``PluginManager.dispatch_tool``, until
the model answers in text or the tool-iteration cap is reached.

Hooks, middleware, the context engine (fitting ``context_budget_tokens`` before every request),
memory providers and Hermes's ``MemoryProvider``/``ContextEngine`` interfaces are driven at fixed
points of the turn, every plugin call isolated under ``plugins.hook_timeout``. Injected messages
(:meth:`Session.inject`) join a running turn between model requests, else wait for
:meth:`drain_pending` / :meth:`run_pending`. Sync and async share one generator of effects; the
async driver runs blocking plugin code in a worker thread. Call order: docs/design.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator, Mapping

from plugin_llm.host.compressor import ContextCompressor, DEFAULT_BUDGET_TOKENS, estimate_tokens
from plugin_llm.plugins.context import is_hermes_context_engine, is_hermes_memory_provider
from plugin_llm.plugins.tracebacks import frames_text, plugin_dir_of
from plugin_llm.plugins.untrusted import MAX_TEXT, error_text, plain, safe_str, type_name

if TYPE_CHECKING:  # pragma: no cover
    from plugin_llm.plugins import PluginManager

__all__ = ["Session", "TurnResult", "ToolRun", "BUILTIN_COMMAND_HELP", "DEFAULT_SYSTEM_PROMPT"]

_log = logging.getLogger("plugin_llm.host")

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant running inside plugin-llm. "
    "Use the available tools when they help, and say so when a tool was blocked or failed."
)

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


@dataclass(frozen=True)
class ToolRun:
    """One tool call the model made during a turn and what it returned."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    result: str

    @property
    def blocked(self) -> bool:
        """True when a ``pre_tool_call`` guard stopped the call (the handler never ran)."""
        try:
            error = json.loads(self.result).get("error")
        except (ValueError, AttributeError):
            return False
        return isinstance(error, str) and ("blocked by plugin policy" in error or "(fail-closed)" in error)


@dataclass(frozen=True)
class TurnResult:
    """What one line of input produced.

    ``kind``: ``reply`` (a conversation turn), ``command`` (a slash command ran),
    ``unknown_command``, ``command_error`` (the handler raised) or ``exit``.
    ``stop_reason`` for replies: ``done`` or ``tool_limit``.
    ``injected``: messages that arrived while the turn ran and joined it.
    """

    kind: str
    text: str | None
    stop_reason: str = "done"
    tool_runs: tuple[ToolRun, ...] = ()
    model_requests: int = 0
    injected: tuple[str, ...] = ()
    usage: Any = None
    provider: str | None = None
    model: str | None = None
    command: str | None = None
    #: for ``command_error``: the plugin's own frames of the failure (file:line), "" when none
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.kind in ("reply", "command", "exit")


# --- effects yielded by the turn generator -------------------------------------------------


@dataclass
class _ModelRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    purpose: str


@dataclass
class _ToolDispatch:
    name: str
    args: dict[str, Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _CommandRun:
    name: str
    raw_args: str


@dataclass
class _Blocking:
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


_Gen = Generator[Any, Any, "TurnResult"]
#: built-in command aliases -> their canonical name (pre_command's ``command`` / ``alias_used``)
_BUILTIN_ALIASES = {"quit": "exit", "clear": "reset"}
#: times pre_verify hooks may keep one turn going
MAX_VERIFY_ATTEMPTS = 3


class Session:
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

    # --- lifecycle -----------------------------------------------------------------------

    def attach(self) -> "Session":
        """Become the manager's active session (target of ``ctx.inject_message``).

        An attached session will call the model: litellm starts loading on a
        background thread now, so that the first turn does not wait for it.
        """
        from plugin_llm.transport import start_background_load  # on first use: it loads the provider layer

        start_background_load()
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

    def _end_hermes_plugins(self) -> None:
        """Session end for the Hermes memory provider and context engine this session used."""
        messages = _copy_messages(self.history)
        if self._hmemory is not None:
            provider, key = self._hmemory
            self.manager.call_plugin("memory on_session_end", key, provider.on_session_end, messages)
            self.manager.call_plugin("memory shutdown", key, provider.shutdown)
            self._hmemory = None
        if self._engine_started is not None:
            engine, key = self._engine_started
            self.manager.call_plugin("context engine on_session_end", key, engine.on_session_end,
                                     self.session_id, messages)
            self._engine_started = None

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

    # --- configuration views -------------------------------------------------------------

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

    # --- injected messages ---------------------------------------------------------------

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

    # --- public entry points -------------------------------------------------------------

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

    # --- drivers -------------------------------------------------------------------------

    def _drive_sync(self, gen: _Gen) -> TurnResult:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = self._run_effect_sync(effect)
            except BaseException as exc:  # handed to the turn, which rolls back and re-raises
                error = exc

    async def _drive_async(self, gen: _Gen) -> TurnResult:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = await self._run_effect_async(effect)
            except BaseException as exc:
                error = exc

    def _run_effect_sync(self, effect: Any) -> Any:
        if isinstance(effect, _Blocking):
            return effect.fn(*effect.args, **effect.kwargs)
        if isinstance(effect, _ModelRequest):
            if self.manager.has_middleware("llm_execution"):
                return self._model_via_middleware(effect)
            return self.llm.chat(effect.messages, tools=effect.tools, purpose=effect.purpose)
        if isinstance(effect, _ToolDispatch):
            if effect.name in self._memory_tools and self._hmemory is not None:
                return self._memory_tool(effect)
            return self.manager.dispatch_tool(effect.name, effect.args, parent_agent=self, **effect.kwargs)
        if isinstance(effect, _CommandRun):
            return self.manager.run_command(effect.name, effect.raw_args)
        raise TypeError(f"unknown effect {effect!r}")  # pragma: no cover

    async def _run_effect_async(self, effect: Any) -> Any:
        if isinstance(effect, _Blocking):
            return await asyncio.to_thread(effect.fn, *effect.args, **effect.kwargs)
        if isinstance(effect, _ModelRequest):
            if self.manager.has_middleware("llm_execution"):
                return await asyncio.to_thread(self._model_via_middleware, effect)
            return await self.llm.achat(effect.messages, tools=effect.tools, purpose=effect.purpose)
        if isinstance(effect, _ToolDispatch):
            if effect.name in self._memory_tools and self._hmemory is not None:
                return await asyncio.to_thread(self._memory_tool, effect)
            return await self.manager.adispatch_tool(effect.name, effect.args, parent_agent=self, **effect.kwargs)
        if isinstance(effect, _CommandRun):
            return await self.manager.arun_command(effect.name, effect.raw_args)
        raise TypeError(f"unknown effect {effect!r}")  # pragma: no cover

    def _model_via_middleware(self, effect: "_ModelRequest") -> Any:
        """The model request through the ``llm_execution`` middleware (see plugins.middleware)."""
        provider, model = self.route
        request = {"messages": _copy_messages(effect.messages), "tools": effect.tools, "provider": provider,
                   "model": model}
        produced: list[Any] = []

        def terminal(req: dict[str, Any]) -> Any:
            result = self.llm.chat(req["messages"], tools=req.get("tools"), purpose=effect.purpose)
            produced.append(result)
            return result

        def accept_result(value: Any) -> Any:
            from plugin_llm.llm import HostChatResult  # on first use: it loads the provider layer

            if type(value) is HostChatResult or any(value is r for r in produced) or (
                    produced and type(value) is type(produced[0])):
                return value
            raise ValueError(f"a {type_name(value)} is not a model result")

        return self.manager.run_middleware(
            "llm_execution", terminal, request, payload_key="request",
            context={"session_id": self.session_id, "platform": self.platform, "purpose": effect.purpose},
            accept_payload=_llm_request_payload, accept_result=accept_result)

    def _llm_request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[list, list]:
        """The request as the ``llm_request`` middleware rewrote it (messages and tools)."""
        provider, model = self.route
        request = {"messages": _copy_messages(messages), "tools": list(tools or []), "provider": provider,
                   "model": model}
        out = self.manager.apply_request_middleware(
            "llm_request", request, payload_key="request",
            context={"session_id": self.session_id, "platform": self.platform},
            accept_payload=_llm_request_payload)
        return out["messages"], list(out.get("tools") or [])

    def _memory_tool(self, effect: "_ToolDispatch") -> str:
        provider, key = self._hmemory  # type: ignore[misc]
        return self.manager.dispatch_provider_tool(effect.name, effect.args, provider.handle_tool_call, key,
                                                   **effect.kwargs)

    # --- input -------------------------------------------------------------------------

    def _input(self, user_text: str) -> _Gen:
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

    # --- slash commands ------------------------------------------------------------------

    def _plugin_commands(self) -> dict[str, Any]:
        try:
            return dict(self.manager.commands)
        except Exception:
            return {}

    def _command(self, name: str, raw_args: str) -> _Gen:
        key = name.strip().lstrip("/").strip().lower()
        if key in BUILTIN_COMMAND_HELP:
            canonical = _BUILTIN_ALIASES.get(key, key)
            yield _Blocking(self._hook, ("pre_command",), dict(
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
        yield _Blocking(self._hook, ("pre_command",), dict(
            surface="cli", command=key, alias_used=None, args_raw=raw_args, session_key=self.session_id,
            platform=self.platform))
        try:
            out = yield _CommandRun(key, raw_args)
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
            ok = _check_tool(entry)
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

    # --- conversation turn ---------------------------------------------------------------

    def _turn(self, user_text: str) -> _Gen:
        with self._lock:
            if self._turn_active:
                raise RuntimeError("a turn is already running in this session")
            self._turn_active = True
        mark = len(self.history)
        consumed: list[str] = []
        try:
            return (yield from self._turn_body(user_text, consumed))
        except BaseException:
            # Roll back so a retry does not duplicate the message; injected messages
            # that had joined the failed turn go back to the pending queue.
            del self.history[mark:]
            with self._lock:
                self._pending.extendleft(reversed(consumed))
            self._hook("on_session_end", session_id=self.session_id, completed=False, interrupted=False,
                       model=self.route[1], platform=self.platform, reason="turn")
            raise
        finally:
            with self._lock:
                self._turn_active = False
                # Anything that arrived after the last check waits for the next input.
                self._pending.extend(self._interrupts)
                self._interrupts.clear()

    def _turn_body(self, user_text: str, consumed: list[str]) -> _Gen:
        first = not self._started
        if first:
            self._started = True
            yield _Blocking(self._hook, ("on_session_start",),
                            dict(session_id=self.session_id, model=self.route[1], platform=self.platform))
        self._turns += 1
        ids = dict(task_id=self.session_id, turn_id=f"{self.session_id}:{self._turns}")  # Hermes's turn ids
        user_msg: dict[str, Any] = {"role": "user", "content": user_text}
        self.history.append(user_msg)
        yield _Blocking(self._start_hermes_plugins)
        extra = yield _Blocking(self._turn_context, (user_text, first, ids))
        tools = yield _Blocking(self._offered_tools)
        budget = self.context_budget_tokens

        runs: list[ToolRun] = []
        usage = None
        requests = 0
        tool_rounds = 0
        verify_attempts = 0
        stop_reason = "done"
        while True:
            for content in self._take_interrupts():
                consumed.append(content)
                self.history.append({"role": "user", "content": content})
            messages = self._api_messages(user_msg, extra)
            messages = yield _Blocking(self._compress, (messages, budget))
            requests += 1
            provider, model = self.route
            request_ids = dict(ids, api_request_id=f"{ids['turn_id']}:{requests}")
            yield _Blocking(self._hook, ("pre_api_request",), dict(
                session_id=self.session_id, **request_ids, platform=self.platform, model=model, provider=provider,
                api_call_count=requests, message_count=len(messages), tool_count=len(tools),
                approx_input_tokens=_approx_tokens(messages), request_char_count=_char_count(messages),
                max_tokens=None))
            if self.manager.has_middleware("llm_request"):
                messages, tools = yield _Blocking(self._llm_request, (messages, tools))
            stream = self._observes_stream()
            if stream:
                yield _Blocking(self._hook, ("on_stream_start",), dict(
                    session_id=self.session_id, platform=self.platform, model=model, provider=provider,
                    api_call_count=requests))
            try:
                result = yield _ModelRequest(messages, tools or None, "host.turn")
            except Exception as exc:
                error = {"type": type_name(exc), "message": error_text(exc)}
                if stream:
                    yield _Blocking(self._hook, ("on_stream_end",), dict(
                        session_id=self.session_id, model=model, provider=provider, final_text="",
                        finished=False, error=error))
                classification = yield _Blocking(self._classify_error, (exc, provider, model, messages))
                yield _Blocking(self._hook, ("api_request_error",), dict(
                    session_id=self.session_id, **request_ids, platform=self.platform, model=model, provider=provider,
                    api_call_count=requests, error=error, reason=type_name(exc),
                    error_classification=classification))
                raise
            if stream:
                yield _Blocking(self._stream_observers, (result, model, provider))
            yield _Blocking(self._engine_usage, (result.usage,))
            usage = result.usage if usage is None else _add_usage(usage, result.usage)
            if getattr(result, "provider", None) or getattr(result, "model", None):
                self._last_route = (result.provider or provider, result.model or model)
            assistant = _assistant_message(result)
            yield _Blocking(self._hook, ("post_api_request",), dict(
                session_id=self.session_id, **request_ids, platform=self.platform, model=self.route[1],
                provider=self.route[0], api_call_count=requests, message_count=len(messages),
                response_model=getattr(result, "model", None), usage=_usage_dict(result.usage),
                assistant_content_chars=len(result.text or ""),
                assistant_tool_call_count=len(result.tool_calls)))
            self.history.append(assistant)

            if result.tool_calls:
                if tool_rounds >= self.max_tool_iterations:
                    names = ", ".join(c.name for c in result.tool_calls)
                    note = (f"[stopped: this turn reached the limit of {self.max_tool_iterations} tool "
                            f"iteration(s); the requested tool call(s) {names} were not run]")
                    for call in result.tool_calls:
                        self.history.append(_tool_message(call.id, call.name, json.dumps(
                            {"error": "not run: tool iteration limit reached"})))
                    self.history.append({"role": "assistant", "content": note})
                    final_text = note
                    stop_reason = "tool_limit"
                    break
                tool_rounds += 1
                for call in result.tool_calls:
                    try:
                        out = yield _ToolDispatch(call.name, dict(call.arguments or {}), dict(
                            session_id=self.session_id, tool_call_id=call.id, **request_ids))
                    except Exception as exc:  # the dispatcher isolates handlers; this is a last guard
                        _log.warning("tool %s failed: %s", call.name, error_text(exc))
                        out = json.dumps({"error": error_text(exc)})
                    out = out if type(out) is str else (safe_str(out, MAX_TEXT) or f"<{type_name(out)}>")
                    self.history.append(_tool_message(call.id, call.name, out))
                    runs.append(ToolRun(call.id, call.name, dict(call.arguments or {}), out))
                continue

            if self._has_interrupts():  # a message arrived during the request: go on with it
                continue
            final_text = result.text or ""
            if verify_attempts < MAX_VERIFY_ATTEMPTS:
                follow_up = yield _Blocking(self._pre_verify, (final_text, verify_attempts))
                if follow_up:  # a pre_verify hook keeps the turn going with a message for the model
                    verify_attempts += 1
                    self.history.append({"role": "user", "content": follow_up})
                    continue
            transformed = yield _Blocking(self._transform_output, (final_text,))
            if transformed is not None and transformed != final_text:
                final_text = transformed
                assistant["content"] = final_text
            break

        if stop_reason == "done":
            yield _Blocking(self._hook, ("post_llm_call",), dict(
                session_id=self.session_id, **ids, user_message=user_text, assistant_response=final_text,
                conversation_history=_copy_messages(self.history), model=self.route[1],
                platform=self.platform))
            yield _Blocking(self._remember, (user_text, final_text))
        yield _Blocking(self._hook, ("on_session_end",), dict(
            session_id=self.session_id, **ids, completed=stop_reason == "done", interrupted=bool(consumed),
            model=self.route[1], platform=self.platform, reason="turn"))
        provider, model = self.route
        return TurnResult(kind="reply", text=final_text, stop_reason=stop_reason, tool_runs=tuple(runs),
                          model_requests=requests, injected=tuple(consumed), usage=usage,
                          provider=provider, model=model)

    def _api_messages(self, user_msg: dict[str, Any], extra: str) -> list[dict[str, Any]]:
        """System prompt + history; the turn's context rides on its user message only here."""
        out: list[dict[str, Any]] = []
        system = "\n\n".join(p for p in (self.system_prompt, self._memory_block, self._prompt_sections()) if p)
        if system:
            out.append({"role": "system", "content": system})
        for msg in self.history:
            if msg is user_msg and extra:
                out.append({**msg, "content": f"{msg['content']}\n\n{extra}"})
            else:
                out.append(dict(msg))
        return out

    def _prompt_sections(self) -> str:
        if self._plugin_sections is None:
            render = getattr(self.manager, "render_system_prompt_sections", None)
            try:
                self._plugin_sections = render({"session_id": self.session_id, "platform": self.platform,
                                                "model": self.route[1]}) if render is not None else ""
            except Exception as exc:  # plugin code is isolated by the manager; never let a section end a turn
                _log.warning("system prompt sections failed: %s", error_text(exc))
                self._plugin_sections = ""
        return self._plugin_sections

    # --- blocking helpers (run in a worker thread on the async path) ---------------------

    def _has_hook(self, name: str) -> bool:
        try:
            return bool(self.manager.has_hook(name))
        except Exception:
            return False

    def _observes_stream(self) -> bool:
        return any(self._has_hook(n) for n in ("on_stream_start", "on_stream_delta", "on_stream_end"))

    def _stream_observers(self, result: Any, model: str, provider: str) -> None:
        """The stream observers after a request: this host does not stream a turn, so the reply's
        text arrives as one ``text`` delta (reasoning is not sent)."""
        text = result.text or ""
        route = dict(session_id=self.session_id, model=getattr(result, "model", None) or model,
                     provider=getattr(result, "provider", None) or provider)
        if text:
            self._hook("on_stream_delta", delta=text, kind="text", **route)
        self._hook("on_stream_end", final_text=text, finished=True, error=None, **route)

    def _classify_error(self, exc: BaseException, provider: str, model: str,
                        messages: list[dict[str, Any]]) -> dict[str, Any] | None:
        """transform_api_error_classification's verdict on a failed request (reported, not acted on)."""
        if not self._has_hook("transform_api_error_classification"):
            return None
        status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
        try:
            return self.manager.get_plugin_error_classification(
                provider=provider, model=model, status_code=status if type(status) is int else None,
                error_type=type_name(exc), error_code=None, error_message=error_text(exc), error_body=None,
                error={"type": type_name(exc), "message": error_text(exc)},
                approx_tokens=_approx_tokens(messages), context_length=self.context_budget_tokens,
                num_messages=len(messages))
        except Exception as exc2:
            _log.warning("hook transform_api_error_classification failed: %s", error_text(exc2))
            return None

    def _pre_verify(self, final_text: str, attempt: int) -> str | None:
        if not self._has_hook("pre_verify"):
            return None
        try:
            message = self.manager.get_pre_verify_continue_message(
                session_id=self.session_id, platform=self.platform, model=self.route[1], coding=False,
                attempt=attempt, final_response=final_text, changed_paths=[])
        except Exception as exc:
            _log.warning("hook pre_verify failed: %s", error_text(exc))
            return None
        return message[:MAX_TEXT] if type(message) is str and message.strip() else None

    def _hook(self, name: str, **kwargs: Any) -> list[Any]:
        try:
            return list(self.manager.invoke_hook(name, **kwargs) or [])
        except Exception as exc:  # the manager isolates callbacks; never let a hook end a turn
            _log.warning("hook %s failed: %s", name, error_text(exc))
            return []

    def _turn_context(self, user_text: str, first: bool, ids: dict[str, Any]) -> str:
        parts: list[str] = []
        try:
            context = self.manager.get_pre_llm_call_context(
                session_id=self.session_id, **ids, user_message=user_text,
                conversation_history=_copy_messages(self.history), is_first_turn=first,
                model=self.route[1], platform=self.platform)
        except Exception as exc:
            _log.warning("pre_llm_call context failed: %s", error_text(exc))
            context = ""
        if type(context) is str and context.strip():
            parts.append(context.strip())
        if self._hmemory is not None:
            recalled = self._hermes_prefetch(user_text)
            if recalled:
                parts.append(recalled)
        provider = self._memory_provider()
        if provider is not None:
            try:
                recalled = provider.recall(user_text, session_id=self.session_id)
            except Exception as exc:
                _log.warning("memory provider %s recall failed: %s: %s",
                             getattr(provider, "name", "?"), type(exc).__name__, exc)
                recalled = None
            if isinstance(recalled, str) and recalled.strip():
                parts.append(f"Relevant memory:\n{recalled.strip()}")
        return "\n\n".join(parts)

    # --- Hermes memory provider and context engine --------------------------------------

    def _start_hermes_plugins(self) -> None:
        """First turn: initialise the Hermes memory provider (when one is active and available)."""
        if self._hmemory_checked:
            return
        self._hmemory_checked = True

        try:
            active = self.manager.active_memory()
        except Exception as exc:
            _log.warning("memory provider unavailable: %s", error_text(exc))
            return
        if active is None or not is_hermes_memory_provider(active[0]):
            return
        provider, key = active
        call = self.manager.call_plugin
        if call("memory is_available", key, provider.is_available) is not True:
            return
        outcome = _ran_ok(call, "memory initialize", key, provider.initialize, self.session_id,
                                  hermes_home=str(self.manager.home), platform=self.platform,
                                  agent_context="primary")
        if not outcome:
            return
        self._hmemory = (provider, key)
        block = call("memory system_prompt_block", key, provider.system_prompt_block)
        self._memory_block = block.strip() if type(block) is str else ""
        schemas = call("memory get_tool_schemas", key, provider.get_tool_schemas)
        self._memory_schemas = [s for s in schemas if type(s) is dict and type(s.get("name")) is str] \
            if type(schemas) is list else []
        self._memory_tools = {s["name"] for s in self._memory_schemas if s["name"] not in self.manager.tools}

    def _hermes_prefetch(self, user_text: str) -> str:
        # only with a Hermes memory provider: the shims stay unloaded otherwise
        from plugin_llm.compat.hermes.agent.memory_manager import build_memory_context_block

        provider, key = self._hmemory  # type: ignore[misc]
        self.manager.call_plugin("memory on_turn_start", key, provider.on_turn_start, self._turns, user_text,
                                 platform=self.platform, model=self.route[1])
        recalled = self.manager.call_plugin("memory prefetch", key, provider.prefetch, user_text,
                                            session_id=self.session_id)
        return build_memory_context_block(recalled) if type(recalled) is str else ""

    def _hermes_sync(self, user_text: str, assistant_text: str) -> None:
        provider, key = self._hmemory  # type: ignore[misc]
        self.manager.call_plugin("memory sync_turn", key, provider.sync_turn, user_text, assistant_text,
                                 session_id=self.session_id, messages=_copy_messages(self.history))
        self.manager.call_plugin("memory queue_prefetch", key, provider.queue_prefetch, user_text,
                                 session_id=self.session_id)

    def _hermes_engine(self) -> tuple[Any, str] | None:
        try:
            active = self.manager.active_context_engine()
        except Exception:
            return None
        return active if active is not None and is_hermes_context_engine(active[0]) else None

    def _hermes_compress(self, engine: Any, key: str, messages: list[dict[str, Any]], budget: int) -> Any:
        call = self.manager.call_plugin
        if self._engine_started is None or self._engine_started[0] is not engine:
            self._engine_started = (engine, key)
            call("context engine on_session_start", key, engine.on_session_start, self.session_id,
                 hermes_home=str(self.manager.home), platform=self.platform, model=self.route[1])
            call("context engine update_model", key, engine.update_model, self.route[1], budget,
                 provider=self.route[0])
        tokens = _approx_tokens(messages)
        if call("context engine should_compress", key, engine.should_compress, tokens) is not True:
            return messages
        return call("context engine compress", key, engine.compress, _copy_messages(messages),
                    current_tokens=tokens, focus_topic=None, force=False, memory_context="")

    def _engine_usage(self, usage: Any) -> None:
        hermes = self._hermes_engine()
        if hermes is None or usage is None:
            return
        engine, key = hermes
        u = _usage_dict(usage) or {}
        prompt, completion = int(u.get("input_tokens") or 0), int(u.get("output_tokens") or 0)
        payload = {"prompt_tokens": prompt, "completion_tokens": completion,
                   "total_tokens": int(u.get("total_tokens") or prompt + completion),
                   "input_tokens": prompt, "output_tokens": completion,
                   "cache_read_tokens": int(u.get("cache_read_tokens") or 0),
                   "cache_write_tokens": int(u.get("cache_write_tokens") or 0), "reasoning_tokens": 0}
        self.manager.call_plugin("context engine update_from_response", key, engine.update_from_response, payload)

    def _memory_provider(self) -> Any:
        try:
            provider = self.manager.memory_provider
            if provider is None or is_hermes_memory_provider(provider) or not provider.is_available():
                return None
        except Exception as exc:
            _log.warning("memory provider unavailable: %s: %s", type(exc).__name__, exc)
            return None
        return provider

    def _remember(self, user_text: str, assistant_text: str) -> None:
        if self._hmemory is not None:
            self._hermes_sync(user_text, assistant_text)
        provider = self._memory_provider()
        if provider is None:
            return
        try:
            provider.remember(user_text, assistant_text, session_id=self.session_id)
        except Exception as exc:
            _log.warning("memory provider %s remember failed: %s: %s",
                         getattr(provider, "name", "?"), type(exc).__name__, exc)

    def _offered_tools(self) -> list[dict[str, Any]]:
        offered = []
        for name, entry in dict(self.manager.tools).items():
            if not _check_tool(entry):
                continue
            try:
                offered.append(entry.openai_tool())
            except Exception as exc:
                _log.warning("tool %s has an unusable schema: %s", name, exc)
        for schema in getattr(self, "_memory_schemas", []):
            if schema["name"] in self._memory_tools:
                offered.append({"type": "function", "function": schema})
        return offered

    def _compress(self, messages: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
        hermes = self._hermes_engine()
        if hermes is not None:
            out = self._hermes_compress(hermes[0], hermes[1], messages, budget)
            if type(out) is list and out and all(type(m) is dict for m in out):
                return out
            _log.warning("context engine %s returned no usable messages; using the built-in compressor",
                         hermes[1])
            return self.compressor.compress(messages, budget_tokens=budget)
        engine = None
        try:
            engine = self.manager.context_engine
        except Exception:
            engine = None
        if engine is not None:
            try:
                out = engine.compress(_copy_messages(messages), budget_tokens=budget)
                if isinstance(out, list) and out and all(isinstance(m, dict) for m in out):
                    return out
                _log.warning("context engine %s returned no usable messages; using the built-in compressor",
                             getattr(engine, "name", "?"))
            except Exception as exc:
                _log.warning("context engine %s failed (%s: %s); using the built-in compressor",
                             getattr(engine, "name", "?"), type(exc).__name__, exc)
        return self.compressor.compress(messages, budget_tokens=budget)

    def _transform_output(self, text: str) -> str | None:
        results = self._hook("transform_llm_output", response_text=text, session_id=self.session_id,
                             model=self.route[1], platform=self.platform)
        for value in results:  # first string wins, like transform_tool_result (plain data: exact types)
            if type(value) is str:
                return value
        return None


# --- module helpers ----------------------------------------------------------------------


def _ran_ok(call: Callable[..., Any], what: str, key: str, fn: Callable[..., Any], *args: Any,
                    **kwargs: Any) -> bool:
    """True when ``call(what, key, fn, ...)`` ran without failing (a None result is fine)."""
    import functools

    def wrapped(*a: Any, **k: Any) -> bool:
        fn(*a, **k)
        return True

    functools.update_wrapper(wrapped, fn)  # keyword filtering follows fn's signature
    return call(what, key, wrapped, *args, **kwargs) is True


def _llm_request_payload(value: Any) -> dict[str, Any]:
    """A request an ``llm_execution`` middleware hands to ``next_call``: plain data of the right shape."""
    value = plain(value)
    if type(value) is not dict or type(value.get("messages")) is not list or not all(
            type(m) is dict for m in value["messages"]):
        raise ValueError("the request must be a dict with a 'messages' list of message dicts")
    tools = value.get("tools")
    if tools is not None and (type(tools) is not list or not all(type(t) is dict for t in tools)):
        raise ValueError("request['tools'] must be a list of tool dicts or None")
    return value


def _new_session_id() -> str:
    return uuid.uuid4().hex[:16]


def _check_tool(entry: Any) -> bool:
    """Whether a tool is offered now: ``is_available()`` (env + check_fn) when the entry has it."""
    available = getattr(entry, "is_available", None)
    if callable(available):
        try:
            return bool(available())
        except Exception:
            return False
    check = getattr(entry, "check_fn", None)
    if check is None:
        return True
    try:
        return bool(check())
    except Exception as exc:
        _log.debug("check_fn of tool %s raised %s; tool not offered", getattr(entry, "name", "?"), exc)
        return False


def _copy_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(m) for m in messages]


def _char_count(messages: list[dict[str, Any]]) -> int:
    """Characters of the messages' text content (Hermes's ``request_char_count``)."""
    return sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))


def _approx_tokens(messages: list[dict[str, Any]]) -> int:
    return estimate_tokens(messages)


def _tool_message(call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def _assistant_message(result: Any) -> dict[str, Any]:
    """The assistant message to store, always with role and tool_calls when there are any."""
    msg = dict(getattr(result, "message", None) or {})
    msg["role"] = "assistant"
    if result.tool_calls and not msg.get("tool_calls"):
        msg["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.raw_arguments or json.dumps(c.arguments)}}
            for c in result.tool_calls
        ]
    if "content" not in msg:
        msg["content"] = result.text
    return msg


def _usage_dict(usage: Any) -> dict[str, Any] | None:
    if usage is None:
        return None
    if isinstance(usage, dict):
        return dict(usage)
    fields = ("input_tokens", "output_tokens", "total_tokens", "cache_read_tokens", "cache_write_tokens",
              "cost_usd")
    return {f: getattr(usage, f, None) for f in fields}


def _add_usage(a: Any, b: Any) -> Any:
    if b is None:
        return a
    try:
        return a + b
    except TypeError:
        return a


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
