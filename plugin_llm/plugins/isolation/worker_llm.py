"""``ctx.llm`` in an isolated plugin's child: each call is a request to the host.

The arguments are bound here against the one contract (:mod:`plugin_llm.api`), so a misuse is the
``TypeError`` it is in process; the host answers with its ``PluginLlm`` bound to the plugin's key
(nothing sent from here can change it). A stream runs on the host and is pulled from here one
delta per request (:class:`RemoteStream`, :class:`RemoteAsyncStream`); a dropped one is closed.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for annotations only: the worker imports this module
    from .worker import _Worker


class RemoteLlm:
    """``ctx.llm`` of an isolated plugin: every method is a call to the host's ``PluginLlm``, which
    is bound to the plugin's key by the host (nothing sent from here can change it). The arguments are
    bound here against the one contract (:mod:`plugin_llm.api`), so a misuse is the ``TypeError`` it
    is in process."""

    def __init__(self, worker: "_Worker", plugin_id: str) -> None:
        self._worker = worker
        self._plugin_id = plugin_id

    @property
    def plugin_id(self) -> str:
        return self._plugin_id

    def __repr__(self) -> str:
        return f"PluginLlm(plugin_id={self._plugin_id!r}, out of process)"

    def _call(self, api: str, mode: str, kwargs: dict[str, Any]) -> Any:
        reply = self._worker.host("llm", {"api": api, "mode": mode, "kw": self._worker.encode(kwargs)})
        return _result(reply)

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("complete", "sync", _bound("complete", args, kwargs))

    def complete_structured(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("structured", "sync", _bound("complete_structured", args, kwargs))

    async def acomplete(self, *args: Any, **kwargs: Any) -> Any:
        import asyncio

        return await asyncio.to_thread(self._call, "complete", "async", _bound("acomplete", args, kwargs))

    async def acomplete_structured(self, *args: Any, **kwargs: Any) -> Any:
        import asyncio

        return await asyncio.to_thread(self._call, "structured", "async",
                                       _bound("acomplete_structured", args, kwargs))

    def stream(self, *args: Any, **kwargs: Any) -> "RemoteStream":
        stream = RemoteStream(self._worker)
        stream.open(_bound("stream", args, kwargs))
        return stream

    def astream(self, *args: Any, **kwargs: Any) -> "RemoteAsyncStream":
        return RemoteAsyncStream(self._worker, _bound("astream", args, kwargs))


def _bound(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, checked against the contract's signature of ``method``."""
    from plugin_llm.api import signature_of  # the ctx.llm contract's, not ctx_api's

    try:
        bound = signature_of(method).bind(None, *args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"ctx.llm.{method}() {exc}") from None
    named = {k: v for k, v in bound.arguments.items() if k not in ("self", "options")}
    named.update(bound.arguments.get("options") or {})
    return named


def _contract_signatures() -> None:
    from plugin_llm.api import METHODS, signature_of  # the ctx.llm contract's, not ctx_api's

    for name in METHODS:
        getattr(RemoteLlm, name).__signature__ = signature_of(name)


_contract_signatures()


class RemoteStream:
    """``ctx.llm.stream(...)`` of an isolated plugin: the host runs the stream, this pulls its deltas
    one request at a time (a plugin that stops reading holds nothing past the call's deadline: the
    host abandons it there)."""

    def __init__(self, worker: "_Worker") -> None:
        self._worker = worker
        self._handle: int | None = None
        self._pieces: list[str] = []
        self._result: Any = None
        self._done = False
        self._call_id: str | None = None
        self._model: str | None = None
        self._finish_reason: str | None = None
        self._flag = [False]  # shared with the finalizer: True once the host has nothing left to close

    def _host(self, op: str, kw: dict[str, Any] | None = None) -> Any:
        params: dict[str, Any] = {"api": "stream", "mode": "sync", "op": op}
        if kw is not None:
            params["kw"] = self._worker.encode(kw)
        if self._handle is not None:
            params["h"] = self._handle
        return self._worker.host("llm", params)

    def open(self, kwargs: dict[str, Any]) -> None:
        import weakref

        reply = self._host("open", kwargs)
        if type(reply) is not dict or type(reply.get("h")) is not int:
            raise RuntimeError("the host sent a malformed answer to a ctx.llm stream")
        self._handle = reply["h"]
        self._call_id = reply.get("call_id") if type(reply.get("call_id")) is str else None
        self._model = reply.get("model") if type(reply.get("model")) is str else None
        weakref.finalize(self, _close_later, self._worker, self._handle, self._flag)

    def pull(self) -> str | None:
        """The next delta, or None once the stream has ended (``result`` is then set)."""
        if self._done:
            return None
        try:
            reply = self._host("next")
        except BaseException:
            self._end()
            raise
        if type(reply) is not dict:
            self._end()
            raise RuntimeError("the host sent a malformed answer to a ctx.llm stream")
        if type(reply.get("model")) is str:
            self._model = reply["model"]
        if reply.get("end"):
            self._end()
            self._result = _result(reply.get("result"))
            self._finish_reason = reply.get("finish_reason") if type(reply.get("finish_reason")) is str else None
            return None
        delta = reply.get("d")
        if type(delta) is not str:
            self._end()
            raise RuntimeError("the host sent a malformed answer to a ctx.llm stream")
        self._pieces.append(delta)
        return delta

    def _end(self) -> None:
        self._done = True
        self._flag[0] = True

    def __iter__(self) -> "RemoteStream":
        return self

    def __next__(self) -> str:
        delta = self.pull()
        if delta is None:
            raise StopIteration
        return delta

    def close(self) -> None:
        """End the stream now (the host records it as abandoned if it had not ended)."""
        if self._done:
            return
        self._end()
        try:
            self._host("close")
        except Exception:  # noqa: BLE001 - the host ended it already (deadline, restart): nothing to close
            pass

    def __enter__(self) -> "RemoteStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def result(self) -> Any:
        return self._result

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    @property
    def call_id(self) -> str | None:
        return self._call_id

    @property
    def model(self) -> str | None:
        return self._result.model if self._result is not None else self._model

    @property
    def finish_reason(self) -> str | None:
        return self._finish_reason

    @property
    def finished(self) -> bool:
        return self._done

    def __repr__(self) -> str:
        state = "finished" if self._done else "open"
        return f"<PluginLlmStream call_id={self._call_id} {state}, {len(self.text):,} characters, out of process>"


def _close_later(worker: "_Worker", handle: int, closed: list[bool]) -> None:
    """A dropped, unfinished stream: tell the host (from a thread: never from inside the collector)."""
    if closed[0]:
        return

    def close() -> None:
        try:
            worker.host("llm", {"api": "stream", "mode": "sync", "op": "close", "h": handle})
        except BaseException:  # noqa: BLE001 - the host is gone or ended it already
            pass

    try:
        threading.Thread(target=close, name="plugin-llm-stream-close", daemon=True).start()
    except RuntimeError:  # interpreter exit: the host abandons it when this process ends
        pass


class RemoteAsyncStream:
    """``ctx.llm.astream(...)`` of an isolated plugin: :class:`RemoteStream` with each request made off
    the event loop. ``await``, ``async for`` and ``async with`` open it, as in process."""

    def __init__(self, worker: "_Worker", kwargs: dict[str, Any]) -> None:
        self._stream = RemoteStream(worker)
        self._kwargs: dict[str, Any] | None = kwargs

    async def _open(self) -> None:
        import asyncio

        kwargs, self._kwargs = self._kwargs, None
        if kwargs is not None:
            await asyncio.to_thread(self._stream.open, kwargs)

    def __await__(self):
        return self._opened().__await__()

    async def _opened(self) -> "RemoteAsyncStream":
        await self._open()
        return self

    def __aiter__(self) -> "RemoteAsyncStream":
        return self

    async def __anext__(self) -> str:
        import asyncio

        await self._open()
        delta = await asyncio.to_thread(self._stream.pull)
        if delta is None:
            raise StopAsyncIteration
        return delta

    def close(self) -> None:
        if self._kwargs is not None:  # never opened: nothing runs on the host
            self._kwargs = None
            self._stream._done = True
            return
        self._stream.close()

    async def aclose(self) -> None:
        import asyncio

        if self._kwargs is not None:
            self.close()
            return
        await asyncio.to_thread(self._stream.close)

    async def __aenter__(self) -> "RemoteAsyncStream":
        await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    result = property(lambda self: self._stream.result)
    text = property(lambda self: self._stream.text)
    call_id = property(lambda self: self._stream.call_id)
    model = property(lambda self: self._stream.model)
    finish_reason = property(lambda self: self._stream.finish_reason)
    finished = property(lambda self: self._stream.finished)

    def __repr__(self) -> str:
        return repr(self._stream).replace("PluginLlmStream", "PluginLlmAsyncStream", 1)


def _result(reply: Any) -> Any:
    from plugin_llm import wire  # on first use: the isolated child starts light

    return wire.decode_result(reply)
