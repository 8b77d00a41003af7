"""The host's one tool execution path, and the middleware chains around it.

``dispatch_tool``: tool_request middleware -> pre_tool_call guards (fail closed) -> the handler
(through any tool_execution middleware) -> transform_tool_result -> post_tool_call. Whatever a
handler returns or raises is read through :mod:`.untrusted`; the result is always a string (errors
as a JSON ``{"error": ...}``). A mixin of :class:`.manager.PluginManager`.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Mapping
from typing import Any, Callable

from .guarded import aguarded, guarded, run_awaitable
from .hooks import HookOutcome, call_limited
from .middleware import REQUEST_KINDS, RUN_KINDS, MiddlewareEntry, apply_requests, run_chain
from .registry import ToolEntry
from .tracebacks import plugin_dir_of
from .untrusted import MAX_TEXT, UnusableValue, bounded, error_text, exact_str, opaque_text, plain, shown, type_name

_log = logging.getLogger("plugin_llm.plugins")


def _tool_error(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


def _readable_action(action: Any) -> bool:
    """A guard's ``action`` the host can read: absent/None (no verdict) or a string."""
    return action is None or type(action) is str


def _tool_text(result: Any) -> str:
    """A tool handler's return value as the result string: strings as they are, other values
    JSON-encoded; read as plain data (see :mod:`.untrusted`), bounded to ``MAX_TEXT``."""
    if type(result) is str:
        return bounded(result, MAX_TEXT)
    result = plain(result)
    if type(result) is str:
        return result
    try:
        text = json.dumps(result, ensure_ascii=False, default=opaque_text)
    except (TypeError, ValueError):  # e.g. an int too long to print
        text = opaque_text(result)
    return bounded(text, MAX_TEXT)


def _tool_args_payload(value: Any) -> dict[str, Any]:
    """Arguments a ``tool_execution`` middleware hands to ``next_call``: a JSON object, as plain data."""
    value = plain(value)
    if type(value) is not dict:
        raise ValueError(f"tool arguments must be a dict, got {type_name(value)}")
    return value


def _tool_result_value(value: Any) -> str:
    """A ``tool_execution`` middleware's result as the tool's result string."""
    if value is None:
        raise ValueError("it returned None")
    return _tool_text(value)


def _handler_kwargs(handler: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``offered`` keyword arguments the handler's signature accepts."""
    if not offered:
        return offered
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return {}
    names = set()
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            return offered
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.add(p.name)
    return {k: v for k, v in offered.items() if k in names}


class ToolDispatchMixin:
    """Middleware and tool dispatch.

    The state it uses (made by ``PluginManager.__init__``): ``_failures``, ``_hooks``, ``_middleware``,
    ``_registry``, ``_registry_lock``.
    """

    def _add_middleware(self, entry: MiddlewareEntry) -> None:
        with self._registry_lock:
            self._middleware = {**self._middleware, entry.kind: self._middleware.get(entry.kind, ()) + (entry,)}

    def _remove_middleware(self, entry: MiddlewareEntry) -> None:
        with self._registry_lock:
            kept = tuple(e for e in self._middleware.get(entry.kind, ()) if e is not entry)
            self._middleware = {**{k: v for k, v in self._middleware.items() if k != entry.kind},
                                **({entry.kind: kept} if kept else {})}

    def has_middleware(self, kind: str) -> bool:
        return bool(self._middleware.get(kind))

    def middleware_of(self, key: str) -> list[str]:
        return [kind for kind, entries in self._middleware.items() if any(e.plugin_key == key for e in entries)]

    def run_middleware(self, kind: str, terminal: Callable[[Any], Any], payload: Any, *, payload_key: str,
                       context: dict[str, Any], accept_payload: Callable[[Any], Any],
                       accept_result: Callable[[Any], Any]) -> Any:
        """``terminal(payload)`` wrapped by the ``kind`` middleware (see :mod:`.middleware`)."""
        entries = list(self._middleware.get(kind, ()))
        if not entries or kind not in RUN_KINDS:
            return terminal(payload)
        return run_chain(kind, entries, terminal, payload, payload_key=payload_key, context=context,
                         timeout=self._hook_timeout(), accept_payload=accept_payload,
                         accept_result=accept_result, on_error=self._on_middleware_error)

    def apply_request_middleware(self, kind: str, payload: Any, *, payload_key: str, context: dict[str, Any],
                                 accept_payload: Callable[[Any], Any]) -> Any:
        """``payload`` as the ``kind`` request middleware (``llm_request``/``tool_request``) rewrote it."""
        entries = list(self._middleware.get(kind, ()))
        if not entries or kind not in REQUEST_KINDS:
            return payload
        return apply_requests(kind, entries, payload, payload_key=payload_key, context=context,
                              timeout=self._hook_timeout(), accept_payload=accept_payload,
                              on_error=self._on_middleware_error)

    def _tool_request(self, tool_name: str, args: Any, hook_kw: dict[str, Any]) -> Any:
        if not self._middleware.get("tool_request"):
            return args
        context = {k: v for k, v in hook_kw.items() if k in ("session_id", "tool_call_id")}
        return self.apply_request_middleware("tool_request", plain(args), payload_key="args",
                                             context={**context, "tool_name": tool_name},
                                             accept_payload=_tool_args_payload)

    def invoke_middleware(self, kind: str, **kwargs: Any) -> list[Any]:
        """Hermes's direct call of every ``kind`` middleware callback with keyword arguments (no chain,
        no ``next_call``): their non-None results in registration order, each isolated and under
        ``plugins.hook_timeout``, a failing one reported and skipped."""
        results = []
        for entry in self._middleware.get(kind, ()):
            offered = entry._hook.select_kwargs(kwargs)
            outcome = call_limited(f"middleware {kind}", entry.plugin_key,
                                   lambda e=entry, k=offered: e.callback(**k), self._hook_timeout())
            if outcome.error is not None:
                self._on_middleware_error(entry, outcome.error_text or "", outcome.error)
            elif outcome.value is not None:
                results.append(outcome.value)
        return results

    def _on_middleware_error(self, entry: MiddlewareEntry, what: str, error: BaseException | None = None) -> None:
        self._failures.report("hook_error", entry.plugin_key, f"middleware {entry.kind}", what, error=error,
                              plugin_dir=plugin_dir_of(self, entry.plugin_key), hook=f"middleware:{entry.kind}")

    def dispatch_tool(self, tool_name: str, args: Any, *, parent_agent: Any = None, **kw: Any) -> str:
        """Run a tool call and return its result string (errors as a JSON ``{"error": ...}``).

        pre_tool_call guards (a block or a failing guard stops the call) ->
        the handler (sync, or async run to completion; it gets ``args`` plus the
        keyword arguments its signature accepts, ``parent_agent`` only when given) ->
        transform_tool_result (first string wins) -> post_tool_call. Always returns a
        ``str``: whatever the handler returns or raises is read through :mod:`.untrusted`.
        """
        entry, args, error = self._tool_for(tool_name, args)
        if entry is None:
            return error  # type: ignore[return-value]
        tool_name = entry.name
        hook_kw = self._hook_kwargs(kw, parent_agent)
        args = self._tool_request(tool_name, args, hook_kw)
        block, args = self._tool_verdict(tool_name, args, hook_kw)
        if block is not None:
            return block
        result = self._execute_tool(entry, tool_name, args, parent_agent, kw, hook_kw)
        return self._after_tool(tool_name, args, result, hook_kw)

    async def adispatch_tool(self, tool_name: str, args: Any, *, parent_agent: Any = None, **kw: Any) -> str:
        """:meth:`dispatch_tool` for async hosts: async handlers run on this loop; sync
        handlers and hooks run in worker threads so the loop never blocks."""
        import asyncio

        entry, args, error = self._tool_for(tool_name, args)
        if entry is None:
            return error  # type: ignore[return-value]
        tool_name = entry.name
        hook_kw = self._hook_kwargs(kw, parent_agent)
        if self._middleware.get("tool_request"):
            args = await asyncio.to_thread(self._tool_request, tool_name, args, hook_kw)
        if self._hooks.has_hook("pre_tool_call"):
            block, args = await asyncio.to_thread(self._tool_verdict, tool_name, args, hook_kw)
            if block is not None:
                return block
        if self._middleware.get("tool_execution"):
            result, failure = await asyncio.to_thread(
                guarded, self._execute_tool, entry, tool_name, args, parent_agent, kw, hook_kw)
        elif entry.is_async or inspect.iscoroutinefunction(entry.handler):
            result, failure = await aguarded(self._arun_handler(entry, args, parent_agent, kw))
        else:
            result, failure = await asyncio.to_thread(guarded, self._run_handler, entry, args, parent_agent, kw)
        if failure is not None:
            result = self._tool_failed(entry, failure)
        if self._hooks.has_hook("transform_tool_result") or self._hooks.has_hook("post_tool_call"):
            return await asyncio.to_thread(self._after_tool, tool_name, args, result, hook_kw)
        return result

    def _tool_for(self, tool_name: str, args: Any) -> tuple[ToolEntry | None, Any, str | None]:
        name = exact_str(tool_name) if issubclass(type(tool_name), str) else None  # no subclass __hash__/__eq__
        entry = self._registry.tools.get(name) if name is not None else None
        if entry is None:
            return None, args, _tool_error(f"Unknown tool: {shown(tool_name)}")
        if issubclass(type(args), str):  # raw JSON arguments as the model sent them
            args = exact_str(args)
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as exc:
                return None, args, _tool_error(f"Tool '{tool_name}': arguments are not valid JSON: {exc}")
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            return None, args, _tool_error(f"Tool '{tool_name}': arguments must be a JSON object")
        missing = entry.missing_env()
        if missing:
            return None, args, _tool_error(f"Tool '{tool_name}' is unavailable: missing environment variable(s) {', '.join(missing)}")
        if entry.check_fn is not None:
            ok, failure = guarded(lambda: bool(entry.check_fn()))
            if failure is not None:
                _log.warning("tool %s: check_fn raised %s", entry.name, error_text(failure))
            if not ok:
                return None, args, _tool_error(f"Tool '{tool_name}' is unavailable right now (its availability check failed)")
        return entry, args, None

    @staticmethod
    def _hook_kwargs(kw: dict[str, Any], parent_agent: Any) -> dict[str, Any]:
        if parent_agent is not None and "session_id" not in kw:
            session_id = getattr(parent_agent, "session_id", None)
            if session_id is not None:
                return {**kw, "session_id": session_id}
        return kw

    def _tool_verdict(self, tool_name: str, args: Any, hook_kw: dict[str, Any]) -> tuple[str | None, Any]:
        """(the tool error when the guards block it, the arguments after their ``modify`` directives).
        ``approve`` blocks too: this host has no human-approval prompt (fail-closed)."""
        if not self._hooks.has_hook("pre_tool_call"):
            return None, args
        action, message, args = self._pre_tool_call(tool_name, args, hook_kw)
        if action == "approve":
            message = (f"plugin approval required for {tool_name}" + (f" ({message})" if message else "")
                       + "; this host has no approval prompt, so the call is refused (fail-closed)")
        if action is None:
            return None, args
        _log.info("tool %s blocked: %s", tool_name, message)
        return _tool_error(f"Tool '{tool_name}' was blocked by plugin policy: {message}"), args

    def get_pre_tool_call_block_message(self, tool_name: str, args: Any, **kw: Any) -> str | None:
        """The first valid block message of the pre_tool_call guards, or None.

        Valid: a dict with ``action == "block"`` and a non-empty string ``message``;
        other return values are ignored. A guard that raises, times out or returns a
        verdict that cannot be read (reading it raised, too large or deep, an ``action``
        that is not a string) blocks (fail-closed) with a message naming its plugin.
        """
        action, message, _ = self._pre_tool_call(tool_name, args, kw)
        return message if action == "block" else None

    def get_pre_tool_call_directive(self, tool_name: str, args: Any, **kw: Any) -> tuple[str | None, str | None]:
        """Hermes's ``(directive, message)``: ``("block", message)``, ``("approve", message or None)``
        (the first of the two wins) or ``(None, None)``."""
        action, message, _ = self._pre_tool_call(tool_name, args, kw)
        return action, message

    def _pre_tool_call(self, tool_name: str, args: Any, kw: dict[str, Any]) -> tuple[str | None, str | None, Any]:
        """(directive, message, args): the first block/approve directive (a failing guard blocks), and
        ``args`` with every ``{"action": "modify", "args": {...}}`` shallow-merged in order (later wins)."""
        modified: dict[str, Any] = {}
        for outcome in self._hooks.run("pre_tool_call", {**kw, "tool_name": tool_name, "args": args}):
            value = outcome.value  # plain data: exact types only (see hooks.HookOutcome)
            if outcome.error is None and type(value) is dict and not _readable_action(value.get("action")):
                outcome = HookOutcome(outcome.entry, None, UnusableValue(
                    f"its 'action' is a {type_name(value.get('action'))}, not a string such as 'block'"))
                self._hooks.report(outcome)  # audited as a failing guard is
            if outcome.error is not None:
                what = ("timed out" if outcome.timed_out else
                        "returned a verdict that could not be read" if outcome.unreadable else "failed")
                name = bounded(exact_str(tool_name), 100) if issubclass(type(tool_name), str) else type_name(tool_name)
                return "block", (
                    f"the pre_tool_call guard of plugin '{outcome.entry.plugin_key}' {what} "
                    f"({outcome.error_text}); '{name}' is blocked (fail-closed)"
                ), args
            if type(value) is not dict:
                continue
            action, message = value.get("action"), value.get("message")
            message = message.strip() if type(message) is str and message.strip() else None
            if action == "block" and message:
                return "block", message, args
            if action == "approve":
                return "approve", message, args
            if action == "modify" and type(value.get("args")) is dict:
                modified.update(value["args"])
        if modified and isinstance(args, Mapping):
            args = {**args, **modified}
        return None, None, args

    def _execute_tool(self, entry: ToolEntry, tool_name: str, args: Any, parent_agent: Any, kw: dict[str, Any],
                      hook_kw: dict[str, Any]) -> str:
        """The handler's result string, through the ``tool_execution`` middleware when there is any."""
        if not self._middleware.get("tool_execution"):
            return self._run_tool_terminal(entry, args, parent_agent, kw)
        context = {k: v for k, v in hook_kw.items() if k in ("session_id", "tool_call_id")}
        context["tool_name"] = tool_name
        return self.run_middleware(
            "tool_execution", lambda a: self._run_tool_terminal(entry, a, parent_agent, kw), plain(args),
            payload_key="args", context=context, accept_payload=_tool_args_payload, accept_result=_tool_result_value,
        )

    def _run_tool_terminal(self, entry: ToolEntry, args: Any, parent_agent: Any, kw: dict[str, Any]) -> str:
        result, failure = guarded(self._run_handler, entry, args, parent_agent, kw)
        return self._tool_failed(entry, failure) if failure is not None else result

    def _handler_call(self, entry: ToolEntry, args: Any, parent_agent: Any, kw: dict[str, Any]) -> Any:
        offered = dict(kw)
        if parent_agent is not None:
            offered["parent_agent"] = parent_agent
        return entry.handler(args, **_handler_kwargs(entry.handler, offered))

    def _run_handler(self, entry: ToolEntry, args: Any, parent_agent: Any, kw: dict[str, Any]) -> str:
        value = self._handler_call(entry, args, parent_agent, kw)
        if value is not None and inspect.isawaitable(value):
            value = run_awaitable(value)
        return _tool_text(value)

    async def _arun_handler(self, entry: ToolEntry, args: Any, parent_agent: Any, kw: dict[str, Any]) -> str:
        value = self._handler_call(entry, args, parent_agent, kw)
        if value is not None and inspect.isawaitable(value):
            value = await value
        return _tool_text(value)

    def _tool_failed(self, entry: ToolEntry, exc: BaseException) -> str:
        text = error_text(exc)
        self._failures.report("tool_error", entry.plugin_key, f"tool {entry.name}", text, error=exc,
                              plugin_dir=plugin_dir_of(self, entry.plugin_key), tool=entry.name)
        return _tool_error(f"Tool '{entry.name}' failed: {text}")

    def _after_tool(self, tool_name: str, args: Any, result: str, hook_kw: dict[str, Any]) -> str:
        payload = {**hook_kw, "tool_name": tool_name, "args": args, "result": result}
        for value in self._hooks.results("transform_tool_result", payload):
            if type(value) is str:  # plain data: a str subclass arrives as an exact str
                result = value
                payload["result"] = result
                break
        self._hooks.run("post_tool_call", payload)
        return result

    def dispatch_provider_tool(self, tool_name: str, args: Any, handler: Callable[[str, Any], Any], plugin_key: str,
                               **kw: Any) -> str:
        """A tool a provider plugin answers (a memory provider's ``handle_tool_call``) through the
        same path as registered tools: pre_tool_call guards -> tool_execution middleware -> the
        handler (isolated, time-limited) -> transform_tool_result -> post_tool_call."""
        if issubclass(type(args), str):
            try:
                args = json.loads(exact_str(args)) if exact_str(args).strip() else {}
            except ValueError as exc:
                return _tool_error(f"Tool '{shown(tool_name)}': arguments are not valid JSON: {exc}")
        args = plain(args) if args is not None else {}
        if type(args) is not dict:
            return _tool_error(f"Tool '{shown(tool_name)}': arguments must be a JSON object")
        args = self._tool_request(tool_name, args, kw)
        block = self.get_pre_tool_call_block_message(tool_name, args, **kw)
        if block is not None:
            return _tool_error(f"Tool '{tool_name}' was blocked by plugin policy: {block}")

        def terminal(a: Any) -> str:
            value = self.call_plugin(f"tool {tool_name}", plugin_key, handler, tool_name, a)
            return _tool_text(value) if value is not None else _tool_error(f"Tool '{tool_name}' failed")

        if self._middleware.get("tool_execution"):
            context = {k: v for k, v in kw.items() if k in ("session_id", "tool_call_id")}
            result = self.run_middleware("tool_execution", terminal, args, payload_key="args",
                                         context={**context, "tool_name": tool_name},
                                         accept_payload=_tool_args_payload, accept_result=_tool_result_value)
        else:
            result = terminal(args)
        return self._after_tool(tool_name, args, result, kw)
