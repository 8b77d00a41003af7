"""The shells that perform a pipeline's steps: sync, async, and one step at a time for a stream.

Each shell hands *every* outcome of a step to the flow, which audits it and
raises: the flow, not the shell, decides what the plugin sees. A failure is
thrown outside the ``except`` block (no implicit chaining of the transport's
exception, whose frames may hold a key) and dropped after.
"""

from __future__ import annotations

from typing import Any

from plugin_llm import limits
from plugin_llm.call.protocols import AsyncReadies, AsyncStreams, Readies, Streams, Transport
from plugin_llm.call.steps import READY, Flow, LimitStep, Ready, Step, StoreStep, StreamOpen, StreamRead
from plugin_llm.errors import PluginLlmConfigError

__all__ = ["Shell"]


class Shell:
    """Performs the steps of calls on one transport; its optional capabilities are looked up once."""

    __slots__ = ("transport", "_ready", "_aready", "_open", "_aopen", "_told")

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._ready = transport.ready if isinstance(transport, Readies) else None
        self._aready = transport.aready if isinstance(transport, AsyncReadies) else None
        self._open = transport.open_stream if isinstance(transport, Streams) else None
        self._aopen = transport.aopen_stream if isinstance(transport, AsyncStreams) else None
        self._told = _takes_step(self._ready), _takes_step(self._aready)

    def ready(self, step: Ready = READY) -> bool:
        """The transport's one-time set-up (litellm's import), performed at a flow's :class:`Ready`
        step, just before its first request: whether it was done (or waited for) now. A transport
        whose ``ready`` takes the route and request is told them (it may need no set-up for them)."""
        if self._ready is None:
            return False
        return bool(self._ready(step.route, step.request) if self._told[0] else self._ready())

    async def aready(self, step: Ready = READY) -> bool:
        if self._aready is None:
            return False
        return bool(await (self._aready(step.route, step.request) if self._told[1] else self._aready()))

    def run_sync(self, flow: Flow) -> Any:
        """Run a whole call's flow on this thread; its result."""
        transport = self.transport
        try:
            request = next(flow)
            while True:
                failure: BaseException | None = None
                try:
                    if type(request) is LimitStep:
                        response = limits.admit(request.settings, request.home, request.plugin_id, **request.call)
                    elif type(request) is Ready:
                        response = self.ready(request)
                    elif type(request) is StoreStep:
                        response = request.work()
                    else:
                        response = transport.complete(request)
                except BaseException as exc:  # noqa: BLE001 - audited and re-raised by the flow
                    failure = exc
                if failure is None:
                    request = flow.send(response)
                    continue
                try:
                    request = flow.throw(failure)
                finally:
                    failure = None
        except StopIteration as done:
            return done.value

    async def run_async(self, flow: Flow) -> Any:
        """Run a whole call's flow on the event loop (the store work and litellm's import off it)."""
        transport = self.transport
        try:
            request = next(flow)
            while True:
                failure: BaseException | None = None
                try:
                    if type(request) is LimitStep:
                        response = await limits.aadmit(request.settings, request.home, request.plugin_id,
                                                       **request.call)
                    elif type(request) is Ready:
                        response = await self.aready(request)
                    elif type(request) is StoreStep:
                        response = await _off_loop(request.work)
                    else:
                        response = await transport.acomplete(request)
                except BaseException as exc:  # noqa: BLE001 - incl. CancelledError: audited, then re-raised as is
                    failure = exc
                if failure is None:
                    request = flow.send(response)
                    continue
                try:
                    request = flow.throw(failure)
                finally:
                    failure = None
        except StopIteration as done:
            return done.value

    def stream_step(self, step: Step) -> Any:
        """One step of a stream's flow, sync (the stream driver's counterpart of :meth:`run_sync`)."""
        kind = type(step)
        if kind is StreamRead:
            return step.stream.read()
        if kind is LimitStep:
            return limits.admit(step.settings, step.home, step.plugin_id, **step.call)
        if kind is Ready:
            return self.ready(step)
        if kind is StoreStep:
            return step.work()
        if kind is StreamOpen:
            if self._open is None:
                raise self._cannot_stream("open_stream")
            return self._open(step.request)
        raise TypeError(f"a stream's flow yielded a {kind.__name__}")  # pragma: no cover - a bug in the flow

    async def astream_step(self, step: Step) -> Any:
        kind = type(step)
        if kind is StreamRead:
            return await step.stream.read()
        if kind is LimitStep:
            return await limits.aadmit(step.settings, step.home, step.plugin_id, **step.call)
        if kind is Ready:
            return await self.aready(step)
        if kind is StoreStep:
            return await _off_loop(step.work)
        if kind is StreamOpen:
            if self._aopen is None:
                raise self._cannot_stream("aopen_stream")
            return await self._aopen(step.request)
        raise TypeError(f"a stream's flow yielded a {kind.__name__}")  # pragma: no cover - a bug in the flow

    def _cannot_stream(self, name: str) -> PluginLlmConfigError:
        return PluginLlmConfigError(f"the gateway's transport ({type(self.transport).__name__}) cannot stream: it "
                                    f"has no {name}(); use complete() with it, or the default LitellmTransport")


def _takes_step(ready: Any) -> bool:
    """Whether a transport's ``ready``/``aready`` takes ``(route, request)`` (checked once per transport)."""
    if ready is None:
        return False
    import inspect

    try:
        parameters = inspect.signature(ready).parameters
    except (TypeError, ValueError):
        return False
    return len(parameters) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters.values())


async def _off_loop(work: Any) -> Any:
    """``work()`` in the loop's default executor: a store that is slow to answer holds this call only."""
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, work)
