"""The effects a host turn yields and the drivers that perform them.

A turn is one generator of effects (:data:`TurnGen`): a model request, a tool dispatch, a plugin
command, or blocking plugin code. The sync driver performs each on the caller's thread; the async
driver awaits the model and the manager, and runs blocking plugin code in a worker thread. A model
request goes through the ``llm_execution`` middleware when a plugin registered one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Generator

from plugin_llm.host.messages import copy_messages
from plugin_llm.host.results import TurnResult
from plugin_llm.plugins.untrusted import plain, type_name


@dataclass
class ModelRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    purpose: str


@dataclass
class ToolDispatch:
    name: str
    args: dict[str, Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class CommandRun:
    name: str
    raw_args: str


@dataclass
class Blocking:
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


TurnGen = Generator[Any, Any, "TurnResult"]


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


class DrivingMixin:
    """Performing a turn's effects, sync and async. A mixin of :class:`~plugin_llm.host.session.Session`.

    The state it uses (made by ``Session.__init__``): ``manager``, ``llm``, ``route``, ``session_id``,
    ``platform``, ``_hmemory``, ``_memory_tools``.
    """

    def _drive_sync(self, gen: TurnGen) -> TurnResult:
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

    async def _drive_async(self, gen: TurnGen) -> TurnResult:
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
        if isinstance(effect, Blocking):
            return effect.fn(*effect.args, **effect.kwargs)
        if isinstance(effect, ModelRequest):
            if self.manager.has_middleware("llm_execution"):
                return self._model_via_middleware(effect)
            return self.llm.chat(effect.messages, tools=effect.tools, purpose=effect.purpose)
        if isinstance(effect, ToolDispatch):
            if effect.name in self._memory_tools and self._hmemory is not None:
                return self._memory_tool(effect)
            return self.manager.dispatch_tool(effect.name, effect.args, parent_agent=self, **effect.kwargs)
        if isinstance(effect, CommandRun):
            return self.manager.run_command(effect.name, effect.raw_args)
        raise TypeError(f"unknown effect {effect!r}")  # pragma: no cover

    async def _run_effect_async(self, effect: Any) -> Any:
        if isinstance(effect, Blocking):
            return await asyncio.to_thread(effect.fn, *effect.args, **effect.kwargs)
        if isinstance(effect, ModelRequest):
            if self.manager.has_middleware("llm_execution"):
                return await asyncio.to_thread(self._model_via_middleware, effect)
            return await self.llm.achat(effect.messages, tools=effect.tools, purpose=effect.purpose)
        if isinstance(effect, ToolDispatch):
            if effect.name in self._memory_tools and self._hmemory is not None:
                return await asyncio.to_thread(self._memory_tool, effect)
            return await self.manager.adispatch_tool(effect.name, effect.args, parent_agent=self, **effect.kwargs)
        if isinstance(effect, CommandRun):
            return await self.manager.arun_command(effect.name, effect.raw_args)
        raise TypeError(f"unknown effect {effect!r}")  # pragma: no cover

    def _model_via_middleware(self, effect: "ModelRequest") -> Any:
        """The model request through the ``llm_execution`` middleware (see plugins.middleware)."""
        provider, model = self.route
        request = {"messages": copy_messages(effect.messages), "tools": effect.tools, "provider": provider,
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
        request = {"messages": copy_messages(messages), "tools": list(tools or []), "provider": provider,
                   "model": model}
        out = self.manager.apply_request_middleware(
            "llm_request", request, payload_key="request",
            context={"session_id": self.session_id, "platform": self.platform},
            accept_payload=_llm_request_payload)
        return out["messages"], list(out.get("tools") or [])
