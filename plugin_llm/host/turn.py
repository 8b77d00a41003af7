"""One conversation turn of a host session: the model, the tools it calls, the hooks around it.

The turn is a generator of effects (:mod:`.driving`): the context of the turn (``pre_llm_call``,
memory recall), then model requests (compressed to the budget, through ``llm_request``
middleware) and tool calls until the model answers in text or the tool-iteration cap is reached;
``pre_verify`` may keep it going, ``transform_llm_output`` may rewrite the answer. A failed turn
rolls the history back. Every hook runs under the manager's isolation. Call order: docs/design.md.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from plugin_llm.host.driving import Blocking, ModelRequest, ToolDispatch, TurnGen
from plugin_llm.host.messages import (
    add_usage, approx_tokens, assistant_message, char_count, check_tool, copy_messages, tool_message, usage_dict,
)
from plugin_llm.host.results import ToolRun, TurnResult
from plugin_llm.plugins.untrusted import MAX_TEXT, error_text, safe_str, type_name

_log = logging.getLogger("plugin_llm.host")

#: times pre_verify hooks may keep one turn going
MAX_VERIFY_ATTEMPTS = 3


class TurnMixin:
    """A conversation turn and the hooks it fires. A mixin of :class:`~plugin_llm.host.session.Session`.

    The state it uses (made by ``Session.__init__``): ``manager``, ``history``, ``session_id``,
    ``platform``, ``system_prompt``, ``max_tool_iterations``, ``_lock``, ``_turn_active``, ``_turns``,
    ``_started``, ``_pending``, ``_interrupts``, ``_last_route``, ``_memory_block``,
    ``_plugin_sections``, ``_hmemory``, ``_memory_tools``.
    """

    def _turn(self, user_text: str) -> TurnGen:
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

    def _turn_body(self, user_text: str, consumed: list[str]) -> TurnGen:
        first = not self._started
        if first:
            self._started = True
            yield Blocking(self._hook, ("on_session_start",),
                            dict(session_id=self.session_id, model=self.route[1], platform=self.platform))
        self._turns += 1
        ids = dict(task_id=self.session_id, turn_id=f"{self.session_id}:{self._turns}")  # Hermes's turn ids
        user_msg: dict[str, Any] = {"role": "user", "content": user_text}
        self.history.append(user_msg)
        yield Blocking(self._start_hermes_plugins)
        extra = yield Blocking(self._turn_context, (user_text, first, ids))
        tools = yield Blocking(self._offered_tools)
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
            messages = yield Blocking(self._compress, (messages, budget))
            requests += 1
            provider, model = self.route
            request_ids = dict(ids, api_request_id=f"{ids['turn_id']}:{requests}")
            yield Blocking(self._hook, ("pre_api_request",), dict(
                session_id=self.session_id, **request_ids, platform=self.platform, model=model, provider=provider,
                api_call_count=requests, message_count=len(messages), tool_count=len(tools),
                approx_input_tokens=approx_tokens(messages), request_char_count=char_count(messages),
                max_tokens=None))
            if self.manager.has_middleware("llm_request"):
                messages, tools = yield Blocking(self._llm_request, (messages, tools))
            stream = self._observes_stream()
            if stream:
                yield Blocking(self._hook, ("on_stream_start",), dict(
                    session_id=self.session_id, platform=self.platform, model=model, provider=provider,
                    api_call_count=requests))
            try:
                result = yield ModelRequest(messages, tools or None, "host.turn")
            except Exception as exc:
                error = {"type": type_name(exc), "message": error_text(exc)}
                if stream:
                    yield Blocking(self._hook, ("on_stream_end",), dict(
                        session_id=self.session_id, model=model, provider=provider, final_text="",
                        finished=False, error=error))
                classification = yield Blocking(self._classify_error, (exc, provider, model, messages))
                yield Blocking(self._hook, ("api_request_error",), dict(
                    session_id=self.session_id, **request_ids, platform=self.platform, model=model, provider=provider,
                    api_call_count=requests, error=error, reason=type_name(exc),
                    error_classification=classification))
                raise
            if stream:
                yield Blocking(self._stream_observers, (result, model, provider))
            yield Blocking(self._engine_usage, (result.usage,))
            usage = result.usage if usage is None else add_usage(usage, result.usage)
            if getattr(result, "provider", None) or getattr(result, "model", None):
                self._last_route = (result.provider or provider, result.model or model)
            assistant = assistant_message(result)
            yield Blocking(self._hook, ("post_api_request",), dict(
                session_id=self.session_id, **request_ids, platform=self.platform, model=self.route[1],
                provider=self.route[0], api_call_count=requests, message_count=len(messages),
                response_model=getattr(result, "model", None), usage=usage_dict(result.usage),
                assistant_content_chars=len(result.text or ""),
                assistant_tool_call_count=len(result.tool_calls)))
            self.history.append(assistant)

            if result.tool_calls:
                if tool_rounds >= self.max_tool_iterations:
                    names = ", ".join(c.name for c in result.tool_calls)
                    note = (f"[stopped: this turn reached the limit of {self.max_tool_iterations} tool "
                            f"iteration(s); the requested tool call(s) {names} were not run]")
                    for call in result.tool_calls:
                        self.history.append(tool_message(call.id, call.name, json.dumps(
                            {"error": "not run: tool iteration limit reached"})))
                    self.history.append({"role": "assistant", "content": note})
                    final_text = note
                    stop_reason = "tool_limit"
                    break
                tool_rounds += 1
                for call in result.tool_calls:
                    try:
                        out = yield ToolDispatch(call.name, dict(call.arguments or {}), dict(
                            session_id=self.session_id, tool_call_id=call.id, **request_ids))
                    except Exception as exc:  # the dispatcher isolates handlers; this is a last guard
                        _log.warning("tool %s failed: %s", call.name, error_text(exc))
                        out = json.dumps({"error": error_text(exc)})
                    out = out if type(out) is str else (safe_str(out, MAX_TEXT) or f"<{type_name(out)}>")
                    self.history.append(tool_message(call.id, call.name, out))
                    runs.append(ToolRun(call.id, call.name, dict(call.arguments or {}), out))
                continue

            if self._has_interrupts():  # a message arrived during the request: go on with it
                continue
            final_text = result.text or ""
            if verify_attempts < MAX_VERIFY_ATTEMPTS:
                follow_up = yield Blocking(self._pre_verify, (final_text, verify_attempts))
                if follow_up:  # a pre_verify hook keeps the turn going with a message for the model
                    verify_attempts += 1
                    self.history.append({"role": "user", "content": follow_up})
                    continue
            transformed = yield Blocking(self._transform_output, (final_text,))
            if transformed is not None and transformed != final_text:
                final_text = transformed
                assistant["content"] = final_text
            break

        if stop_reason == "done":
            yield Blocking(self._hook, ("post_llm_call",), dict(
                session_id=self.session_id, **ids, user_message=user_text, assistant_response=final_text,
                conversation_history=copy_messages(self.history), model=self.route[1],
                platform=self.platform))
            yield Blocking(self._remember, (user_text, final_text))
        yield Blocking(self._hook, ("on_session_end",), dict(
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

    def _turn_context(self, user_text: str, first: bool, ids: dict[str, Any]) -> str:
        parts: list[str] = []
        try:
            context = self.manager.get_pre_llm_call_context(
                session_id=self.session_id, **ids, user_message=user_text,
                conversation_history=copy_messages(self.history), is_first_turn=first,
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

    def _offered_tools(self) -> list[dict[str, Any]]:
        offered = []
        for name, entry in dict(self.manager.tools).items():
            if not check_tool(entry):
                continue
            try:
                offered.append(entry.openai_tool())
            except Exception as exc:
                _log.warning("tool %s has an unusable schema: %s", name, exc)
        for schema in getattr(self, "_memory_schemas", []):
            if schema["name"] in self._memory_tools:
                offered.append({"type": "function", "function": schema})
        return offered

    def _has_hook(self, name: str) -> bool:
        try:
            return bool(self.manager.has_hook(name))
        except Exception:
            return False

    def _hook(self, name: str, **kwargs: Any) -> list[Any]:
        try:
            return list(self.manager.invoke_hook(name, **kwargs) or [])
        except Exception as exc:  # the manager isolates callbacks; never let a hook end a turn
            _log.warning("hook %s failed: %s", name, error_text(exc))
            return []

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
                approx_tokens=approx_tokens(messages), context_length=self.context_budget_tokens,
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

    def _transform_output(self, text: str) -> str | None:
        results = self._hook("transform_llm_output", response_text=text, session_id=self.session_id,
                             model=self.route[1], platform=self.platform)
        for value in results:  # first string wins, like transform_tool_result (plain data: exact types)
            if type(value) is str:
                return value
        return None
