"""The child process of an out-of-process plugin: ``python -m plugin_llm.plugins.isolation.worker``.

Started by :mod:`.remote` through :mod:`.sandbox`. It speaks :mod:`.protocol` on the stdin/stdout
it was given, which it first moves to private descriptors (fd 0 becomes ``/dev/null``, fd 1 a copy
of stderr), so the plugin's ``print()`` can never corrupt the protocol.

The host's first call is ``load``: the plugin is imported as in process and ``register(ctx)`` is
called with a :class:`RemoteContext`, whose every call but ``ctx.llm`` is bound against
:mod:`..ctx_api` and applied by the host's own ``PluginContext``. Callables stay here, named by
handle numbers; the host runs them with ``invoke``. ``ctx.llm`` calls are answered by the host
under the identity *it* bound when it started this process. Only light modules are imported (no
litellm, no HTTP client).
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from .. import ctx_api
from ..ctx_api import NOT_ACROSS, PROVIDER_PARAMS, bind, implements, is_registration, missing_attribute, signature_of
from ..engines import ContextEngine, MemoryProvider
from ..manifest import EnvRequirement, PluginManifest
from ..untrusted import UnusableValue
from .protocol import PROTOCOL_VERSION, Channel, ChannelClosed, Peer, RemoteError, decode_value, encode_value

__all__ = ["RemoteContext", "main"]

#: Characters of an error message sent to the host.
_MAX_ERROR = 2000


def _type_name(obj: Any) -> str:
    try:
        name = type.__dict__["__name__"].__get__(type(obj))
        return str.__str__(name)[:100] if isinstance(name, str) else "object"
    except Exception:  # pragma: no cover
        return "object"


def _text(obj: Any, limit: int = _MAX_ERROR) -> str:
    try:
        text = str(obj)
        return str.__str__(text)[:limit] if isinstance(text, str) else ""
    except BaseException:
        return "(its message could not be read)"


def describe_error(exc: BaseException) -> dict[str, Any]:
    """What the host learns of an exception raised here: its class name, message and kind."""
    info: dict[str, Any] = {"type": _type_name(exc), "message": _text(exc),
                            "base": "exception" if isinstance(exc, Exception) else "base"}
    for attr in ("status", "provider", "retryable", "plugin_id", "config_key"):
        value = getattr(exc, attr, None) if isinstance(exc, Exception) else None
        if value is None or type(value) in (str, int, bool):
            if value is not None:
                info.setdefault("attrs", {})[attr] = value
    return info


def _signature(fn: Any) -> list[list[Any]] | None:
    """``[[name, kind, has_default], ...]`` of ``fn``'s parameters; None when it accepts ``**kwargs``
    (or has no readable signature): the host then offers it every keyword, as in process."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    out = []
    for p in parameters:
        if p.kind is p.VAR_KEYWORD:
            return None
        out.append([p.name, int(p.kind), p.default is not p.empty])
    return out


def _resolved(value: Any) -> Any:
    """``value``, or what it resolves to when the plugin's function was async (run on a fresh event loop)."""
    if value is None or not inspect.isawaitable(value):
        return value
    import asyncio

    async def _await() -> Any:
        return await value

    return asyncio.run(_await())


# --- errors coming back from the host ---------------------------------------------------

_EXCEPTIONS: dict[str, type] = {}


def _host_exception(info: dict[str, Any]) -> BaseException:
    """The host's error as the exception class the plugin would see in process (by name)."""
    name = info.get("type") if type(info.get("type")) is str else "RuntimeError"
    message = info.get("message") if type(info.get("message")) is str else ""
    from plugin_llm import errors, wire  # on first use: the isolated child starts light

    if name in errors.__all__:  # a gateway error, with its fields, through the one codec
        return wire.decode_error(info)
    import builtins

    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception) and builtin.__module__ == "builtins":
        try:
            return builtin(message)
        except Exception:
            pass
    cls = _EXCEPTIONS.get(name)
    if cls is None and name.isidentifier():
        cls = _EXCEPTIONS[name] = type(name, (RuntimeError,), {})
    return (cls or RuntimeError)(message)


class _HostCallable:
    """A callable of the host (``next_call`` of a middleware): calling it is a ``callback`` request."""

    def __init__(self, worker: "_Worker", handle: int) -> None:
        self._worker = worker
        self._handle = handle

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._worker.host("callback", {"h": self._handle, "a": self._worker.encode(list(args)),
                                              "k": self._worker.encode(kwargs)})


# --- ctx.llm ----------------------------------------------------------------------------


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


# --- ctx --------------------------------------------------------------------------------


class _Registered:
    """What a successful ``register_*`` returns here (the host keeps the real entry); a disposable
    one's ``active`` and ``dispose()`` ask the host about its handle."""

    def __init__(self, kind: str, name: str, plugin_key: str, worker: Any = None, handle: int | None = None) -> None:
        self.kind, self.name, self.plugin_key = kind, name, plugin_key
        self._worker, self._handle = worker, handle

    def _ask(self, op: str) -> bool:
        if self._handle is None:
            raise AttributeError(f"this {self.kind} registration has no handle to dispose of")
        reply = self._worker.host("registration", {"h": self._handle, "op": op})
        return bool(reply.get("active")) if type(reply) is dict else False

    @property
    def active(self) -> bool:
        return self._ask("active")

    def dispose(self) -> None:
        self._ask("dispose")

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name!r} of plugin {self.plugin_key} (out of process)>"

    def __bool__(self) -> bool:
        return True


class _CliRunner:
    """Runs an isolated plugin's CLI command in its process: build the parser with ``setup_fn``,
    parse, call the handler; returns the exit code and what was printed."""

    _MAX_OUTPUT = 1 << 20

    def __init__(self, name: str, help: str, setup_fn: Callable[[Any], Any], handler_fn: Any) -> None:
        self.name, self.help, self.setup_fn, self.handler_fn = name, help, setup_fn, handler_fn

    def __call__(self, argv: list) -> dict[str, Any]:
        import argparse
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        code: Any = 0
        exited = False
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                parser = argparse.ArgumentParser(prog=f"plugin-llm {self.name}", description=self.help or None)
                self.setup_fn(parser)
                args = parser.parse_args([str(a) for a in argv])
                handler = self.handler_fn or getattr(args, "func", None)
                if handler is None:
                    print(f"plugin-llm {self.name}: error: the plugin registered no handler (pass handler_fn "
                          "or call parser.set_defaults(func=...) in setup_fn)", file=err)
                    code = 2
                else:
                    result = _resolved(handler(args))
                    code = result if isinstance(result, int) and not isinstance(result, bool) else 0
            except SystemExit as exc:  # argparse's --help and usage errors (the host exits the same way)
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                exited = True
        return {"code": code, "exit": exited, "out": out.getvalue()[: self._MAX_OUTPUT], "err": err.getvalue()[: self._MAX_OUTPUT]}


class RemoteContext:
    """``ctx`` of an isolated plugin: the contract of :mod:`..ctx_api`. Each call's arguments are bound
    there, as in process, and sent to the host by name; the host applies them through its own
    ``PluginContext`` method (its answer, or its error, is what the call returns or raises here).
    Callables a registration passes stay here, named by handle numbers. Members without a method
    below are forwarded as they are (added after the class)."""

    __slots__ = ("_worker", "_manifest", "_key", "_plugin_dir", "_llm", "_state")

    def __init__(self, worker: "_Worker", manifest: Any, plugin_dir: Path) -> None:
        self._worker = worker
        self._manifest = manifest
        self._key = manifest.key
        self._plugin_dir = plugin_dir
        self._llm: RemoteLlm | None = None
        self._state: Any = None

    def __repr__(self) -> str:
        return f"PluginContext(plugin={self._key!r}, out of process)"

    def __getattr__(self, name: str) -> Any:
        raise missing_attribute(name)

    @property
    def manifest(self) -> Any:
        return self._manifest

    @property
    def plugin_id(self) -> str:
        return self._key

    @property
    def state(self) -> Any:
        """The same file as in process: the data directory is this process's HERMES_HOME (see .sandbox)."""
        if self._state is None:
            from ..state import PluginState  # on first use: the isolated child starts light

            data_dir = os.environ.get("HERMES_HOME")
            if not data_dir:
                raise RuntimeError(f"plugin {self._key}: ctx.state needs the plugin's data directory, which this "
                                   "process was not given")
            self._state = PluginState(Path(data_dir))
        return self._state

    @property
    def llm(self) -> RemoteLlm:
        if self._llm is None:
            self._llm = RemoteLlm(self._worker, self._key)
        return self._llm

    @implements
    def register_cli_command(self, name: str, help: str, setup_fn: Callable[[Any], Any],
                             handler_fn: Callable[[Any], Any] | None = None, description: str = "") -> Any:
        """A parser cannot cross: ``setup_fn`` and ``handler_fn`` run here, in one runner the host calls
        with the raw arguments (what the command prints is sent back and printed by the host)."""
        if callable(setup_fn) and (handler_fn is None or callable(handler_fn)):  # else the host refuses them
            setup_fn = _CliRunner(str(name), help if isinstance(help, str) else "", setup_fn, handler_fn)
            handler_fn = None
        return self._forward("register_cli_command", {"name": name, "help": help, "setup_fn": setup_fn,
                                                      "handler_fn": handler_fn, "description": description})

    @implements
    def on_unload(self, callback: Callable[[], Any]) -> Any:
        """Kept here, with the plugin's code; the host asks this process to run them when it unloads it."""
        if not callable(callback):
            raise TypeError(f"plugin {self._key}: on_unload callback must be callable, got {type(callback).__name__}")
        name = getattr(callback, "__name__", None)

        def release() -> None:
            _resolved(callback())

        return self._holdings().track("on_unload", name if isinstance(name, str) else "callback", release)

    @implements
    def spawn_task(self, coro: Any, *, name: str | None = None) -> Any:
        """A task on this process's running loop (cancelled when the host unloads the plugin)."""
        from ..lifecycle import spawn_task  # on first use: the isolated child starts light

        return spawn_task(self._holdings(), coro, name, f"plugin:{self._key}:task")

    def _holdings(self) -> Any:
        if self._worker.holdings is None:
            from ..lifecycle import Holdings  # on first use: the isolated child starts light

            self._worker.holdings = Holdings(self._key)
        return self._worker.holdings

    @implements
    def set_config(self, key: str, value: Any) -> None:
        """The value is checked here (the channel would turn what YAML cannot hold into something it can)."""
        from ..plugin_config import checked_value  # on first use: the isolated child starts light

        return self._forward("set_config", {"key": key, "value": checked_value(value, f"plugin {self._key}: set_config()")})

    def _forward(self, method: str, named: dict[str, Any]) -> Any:
        """``ctx.<method>`` with its bound arguments, answered by the host."""
        params: dict[str, Any] = {"m": method}
        if method in NOT_ACROSS:
            params["refused"] = _label(named)
        else:
            provider = PROVIDER_PARAMS.get(method)
            if provider is not None:
                named = {**named, provider: _describe(method, named[provider])}
            signatures: dict[str, Any] = {}

            def handle(fn: Callable[..., Any]) -> int:
                number = self._worker.handle(fn)
                signatures[str(number)] = _signature(fn)
                return number

            params["a"] = encode_value(named, handle if is_registration(method) else None)
            if signatures:
                params["sig"] = signatures
        reply = self._worker.host("ctx", params)
        if type(reply) is dict and reply.get("entry") is True:
            handle = reply.get("h") if type(reply.get("h")) is int else None
            return _Registered(method.removeprefix("register_").replace("_", " "), _label(named), self._key,
                               self._worker, handle)
        return reply.get("v") if type(reply) is dict else None


def _label(named: dict[str, Any]) -> str:
    """What a call registers, as the host names it (its first argument: a name, or a provider's class)."""
    first = next(iter(named.values()), None)
    if type(first) is dict and type(first.get("class")) is str:
        return first["class"]
    return first if type(first) is str else _type_name(first)


def _describe(method: str, obj: Any) -> dict[str, Any]:
    """A provider object for the host: its public methods (handles) and public plain attributes; the host
    builds a stand-in of the same base class whose methods call these (a class: a stand-in class)."""
    cls = obj if isinstance(obj, type) else type(obj)
    base = {"register_memory_provider": "host" if issubclass(cls, MemoryProvider) else "hermes",
            "register_context_engine": "host" if issubclass(cls, ContextEngine) else "hermes"}.get(method, "")
    out: dict[str, Any] = {"class": _type_name(obj) if cls is not obj else _text(getattr(obj, "__name__", ""), 100),
                           "base": base, "methods": {}, "attrs": {}}
    if cls is obj:
        out["is_class"] = True
        return out
    for name in dir(cls):
        if name.startswith("_"):
            continue
        declared = getattr(cls, name, None)
        value = getattr(obj, name, None)
        if callable(value) and not isinstance(declared, property):
            out["methods"][name] = value
        elif value is None or type(value) in (str, int, float, bool):
            out["attrs"][name] = value
    for name, value in vars(obj).items() if hasattr(obj, "__dict__") else ():
        if not name.startswith("_") and (value is None or type(value) in (str, int, float, bool)):
            out["attrs"][name] = value
    return out


def _forwarder(method: str) -> Callable[..., Any]:
    def forward(self: RemoteContext, *args: Any, **kwargs: Any) -> Any:
        return self._forward(method, bind(method, args, kwargs))

    forward.__name__ = forward.__qualname__ = method
    forward.__signature__ = signature_of(method)  # type: ignore[attr-defined]
    return forward


def _forwarded_property(name: str) -> property:
    return property(lambda self: self._forward(name, {}), doc=f"ctx.{name}, answered by the host")


def forward_the_rest(cls: type) -> type:
    """Give ``cls`` every member of the contract it lacks: bound here, applied by the host."""
    for name in ctx_api.METHODS:
        if not hasattr(cls, name):
            setattr(cls, name, _forwarder(name))
    for name in ctx_api.PROPERTIES:
        if not hasattr(cls, name):
            setattr(cls, name, _forwarded_property(name))
    return cls


forward_the_rest(RemoteContext)


# --- the worker -------------------------------------------------------------------------


class _Worker:
    def __init__(self) -> None:
        self.peer: Peer | None = None
        self._handles: dict[int, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._loaded = False
        self.holdings: Any = None  # the plugin's on_unload callbacks and tasks (.lifecycle)

    # handles and values
    def handle(self, fn: Callable[..., Any]) -> int:
        with self._lock:
            number = len(self._handles) + 1
            self._handles[number] = fn
        return number

    def encode(self, value: Any) -> Any:
        return encode_value(value)

    def host(self, method: str, params: Any) -> Any:
        assert self.peer is not None
        try:
            return self.peer.call(method, params)
        except RemoteError as exc:
            raise _host_exception(exc.info) from None
        except ChannelClosed:
            os._exit(0)  # the host is gone: nothing is left to do

    # the host's calls
    def answer(self, method: str, params: Any) -> Any:
        if type(params) is not dict:
            raise ValueError("params must be an object")
        if method == "invoke":
            return self._invoke(params)
        if method == "load":
            return self._load(params)
        if method == "ping":
            return {"pid": os.getpid()}
        if method == "unload":  # the host unloads the plugin: its callbacks run, its tasks are cancelled
            holdings = self.holdings
            if holdings is not None:
                holdings.release_all()
            return {"ok": True}
        raise ValueError(f"unknown method {method[:60]!r}")

    def _invoke(self, params: dict[str, Any]) -> Any:
        fn = self._handles.get(params.get("h"))  # type: ignore[arg-type]
        if fn is None:
            raise ValueError("unknown handle")
        make = lambda n: _HostCallable(self, n)  # noqa: E731
        args = decode_value(params.get("a") or [], make)
        kwargs = decode_value(params.get("k") or {}, make)
        value = _resolved(fn(*args, **kwargs))
        try:
            return encode_value(value)
        except Exception as exc:  # its own mapping raised, or it is too deep: the host must not guess

            raise UnusableValue(f"it returned a {_type_name(value)} that cannot be used: "
                                f"reading it raised {_type_name(exc)}: {_text(exc, 300)}") from None

    def _load(self, params: dict[str, Any]) -> Any:
        if self._loaded:
            raise RuntimeError("the plugin is already loaded in this process")
        self._loaded = True
        from importlib.util import module_from_spec, spec_from_file_location

        from plugin_llm.compat.hermes import _home, finder  # on first use: the isolated child starts light

        key, path, module_name = str(params["key"]), Path(str(params["path"])), str(params["module"])
        fields = params.get("manifest") if type(params.get("manifest")) is dict else {}
        manifest = PluginManifest(
            name=str(fields.get("name") or path.name), key=key, version=str(fields.get("version") or ""),
            description=str(fields.get("description") or ""), author=str(fields.get("author") or ""),
            requires_env=tuple(EnvRequirement(str(n), str(d)) for n, d in fields.get("requires_env") or ()),
            provides_tools=tuple(map(str, fields.get("provides_tools") or ())),
            provides_hooks=tuple(map(str, fields.get("provides_hooks") or ())),
            kind=str(fields.get("kind") or "standalone"), declared_kind=str(fields.get("declared_kind") or ""),
            capabilities=tuple(map(str, fields.get("capabilities") or ())),
        )
        # The plugin's own persistent home (<host home>/plugin-data/<key>/, see .sandbox): what
        # get_hermes_home() returns here; the host's home is never passed.
        home = Path(os.environ.get("HERMES_HOME") or Path(os.environ.get("HOME") or path) / ".hermes")
        _home.set_active_home(home)
        roots = [Path(r) for r in params.get("roots") or [] if isinstance(r, str)]
        finder.set_plugin_roots(roots, [key])
        finder.install()
        namespace, _, _ = module_name.rpartition(".")
        if namespace and namespace not in sys.modules:
            import types

            ns = types.ModuleType(namespace, "Namespace of directory plugins loaded by plugin_llm.")
            ns.__path__ = []
            sys.modules[namespace] = ns
        init = path / "__init__.py"
        if not init.is_file():
            raise FileNotFoundError(f"{path}: no __init__.py (a directory plugin is a Python package with register(ctx))")
        spec = spec_from_file_location(module_name, init, submodule_search_locations=[str(path)])
        if spec is None or spec.loader is None:  # pragma: no cover
            raise ImportError(f"cannot import {init}")
        module = module_from_spec(spec)
        sys.modules[module_name] = module
        finder.register_plugin(key, path, module_name, home)
        phase = "import"
        try:
            spec.loader.exec_module(module)
            register = getattr(module, "register", None)
            if register is None:
                return {"phase": "import", "missing_register": True}
            if not callable(register):
                return {"phase": "import", "not_callable": _type_name(register)}
            phase = "register"
            _resolved(register(RemoteContext(self, manifest, path)))
        except BaseException as exc:
            return {"phase": phase, "error": describe_error(exc)}
        return {"phase": "done", "pid": os.getpid(), "protocol": PROTOCOL_VERSION}


def _protocol_fds() -> tuple[int, int]:
    """Move the protocol off fds 0 and 1: the plugin's prints (fd 1) go to stderr, reads of fd 0 see EOF."""
    read_fd, write_fd = os.dup(0), os.dup(1)  # dup()ed descriptors are not inherited by subprocesses
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return read_fd, write_fd


def main() -> int:
    read_fd, write_fd = _protocol_fds()
    sys.stdin = open(os.devnull, "r", encoding="utf-8")
    sys.stdout = sys.stderr  # print() lands on stderr, which the host drains (bounded)
    worker = _Worker()
    channel = Channel(os.fdopen(read_fd, "rb", buffering=1 << 16), write_fd)
    worker.peer = Peer(channel, worker.answer, describe_error, name="plugin-worker")
    worker.peer.serve()  # until the host closes the channel (or sends garbage)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
