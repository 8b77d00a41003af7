"""The child process of an out-of-process plugin: ``python -m plugin_llm.plugins.isolation.worker``.

Started by :mod:`.remote` through :mod:`.sandbox`. It speaks :mod:`.protocol` on the stdin/stdout
it was given, which it first moves to private descriptors (fd 0 becomes ``/dev/null``, fd 1 a copy
of stderr), so the plugin's ``print()`` can never corrupt the protocol.

The host's first call is ``load``: the plugin is imported as in process and ``register(ctx)`` is
called with a :class:`RemoteContext` (:mod:`.worker_ctx`), whose every call but ``ctx.llm`` is bound
against :mod:`..ctx_api` and applied by the host's own ``PluginContext``. Callables stay here, named
by handle numbers; the host runs them with ``invoke``. ``ctx.llm`` (:mod:`.worker_llm`) is answered
by the host under the identity *it* bound when it started this process. Only light modules are
imported (no litellm, no HTTP client).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ..manifest import EnvRequirement, PluginManifest
from ..untrusted import UnusableValue
from .protocol import PROTOCOL_VERSION, Channel, ChannelClosed, Peer, RemoteError, decode_value, encode_value
from .worker_ctx import RemoteContext, forward_the_rest
from .worker_llm import RemoteLlm
from .worker_outcomes import _host_exception, _resolved, _text, _type_name, describe_error

#: RemoteLlm and forward_the_rest are re-exported: tests import them from here
__all__ = ["RemoteContext", "RemoteLlm", "forward_the_rest", "main"]


class _HostCallable:
    """A callable of the host (``next_call`` of a middleware): calling it is a ``callback`` request."""

    def __init__(self, worker: "_Worker", handle: int) -> None:
        self._worker = worker
        self._handle = handle

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._worker.host("callback", {"h": self._handle, "a": self._worker.encode(list(args)),
                                              "k": self._worker.encode(kwargs)})


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
