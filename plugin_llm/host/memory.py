"""Memory providers and context engines in a host session, Hermes's interfaces and the gateway's.

A Hermes ``MemoryProvider`` is initialised on the first turn, prefetches before each turn, syncs
after it, may add tools and a system prompt block, and ends with the session. A Hermes
``ContextEngine`` is told of the session and the usage, and compresses when it says it should;
the gateway's own providers ``recall``/``remember`` and its engines ``compress``. Without an
engine, or when one fails, the built-in :class:`~plugin_llm.host.compressor.ContextCompressor` fits
the budget. Every plugin call runs through ``manager.call_plugin``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from plugin_llm.host.driving import ToolDispatch
from plugin_llm.host.messages import approx_tokens, copy_messages, usage_dict
from plugin_llm.plugins.context import is_hermes_context_engine, is_hermes_memory_provider
from plugin_llm.plugins.untrusted import error_text

_log = logging.getLogger("plugin_llm.host")


def _ran_ok(call: Callable[..., Any], what: str, key: str, fn: Callable[..., Any], *args: Any,
                    **kwargs: Any) -> bool:
    """True when ``call(what, key, fn, ...)`` ran without failing (a None result is fine)."""
    def wrapped(*a: Any, **k: Any) -> bool:
        fn(*a, **k)
        return True

    functools.update_wrapper(wrapped, fn)  # keyword filtering follows fn's signature
    return call(what, key, wrapped, *args, **kwargs) is True


class MemoryMixin:
    """Memory and context for a session. A mixin of :class:`~plugin_llm.host.session.Session`.

    The state it uses (made by ``Session.__init__``): ``manager``, ``history``, ``session_id``,
    ``platform``, ``compressor``, ``route``, ``_turns``, ``_hmemory``, ``_hmemory_checked``,
    ``_memory_block``, ``_memory_tools``, ``_engine_started``.
    """

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

    def _end_hermes_plugins(self) -> None:
        """Session end for the Hermes memory provider and context engine this session used."""
        messages = copy_messages(self.history)
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
                                 session_id=self.session_id, messages=copy_messages(self.history))
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
        tokens = approx_tokens(messages)
        if call("context engine should_compress", key, engine.should_compress, tokens) is not True:
            return messages
        return call("context engine compress", key, engine.compress, copy_messages(messages),
                    current_tokens=tokens, focus_topic=None, force=False, memory_context="")

    def _engine_usage(self, usage: Any) -> None:
        hermes = self._hermes_engine()
        if hermes is None or usage is None:
            return
        engine, key = hermes
        u = usage_dict(usage) or {}
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

    def _memory_tool(self, effect: "ToolDispatch") -> str:
        provider, key = self._hmemory  # type: ignore[misc]
        return self.manager.dispatch_provider_tool(effect.name, effect.args, provider.handle_tool_call, key,
                                                   **effect.kwargs)

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
                out = engine.compress(copy_messages(messages), budget_tokens=budget)
                if isinstance(out, list) and out and all(isinstance(m, dict) for m in out):
                    return out
                _log.warning("context engine %s returned no usable messages; using the built-in compressor",
                             getattr(engine, "name", "?"))
            except Exception as exc:
                _log.warning("context engine %s failed (%s: %s); using the built-in compressor",
                             getattr(engine, "name", "?"), type(exc).__name__, exc)
        return self.compressor.compress(messages, budget_tokens=budget)
