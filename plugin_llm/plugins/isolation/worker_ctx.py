"""``ctx`` in an isolated plugin's child: :class:`RemoteContext`, the contract of :mod:`..ctx_api`.

Each call's arguments are bound here, as in process, and sent to the host by name; the host applies
them through its own ``PluginContext`` (its answer, or its error, is what the call returns or raises
here). Callables a registration passes stay here, named by handle numbers; a provider object is
described by its public methods and attributes (:func:`_describe`). Members without a method of
their own are forwarded as they are (:func:`forward_the_rest`).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import ctx_api
from ..ctx_api import NOT_ACROSS, PROVIDER_PARAMS, bind, implements, is_registration, missing_attribute, signature_of
from ..engines import ContextEngine, MemoryProvider
from .protocol import encode_value
from .worker_llm import RemoteLlm
from .worker_outcomes import _resolved, _text, _type_name

if TYPE_CHECKING:  # for annotations only: the worker imports this module
    from .worker import _Worker


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
