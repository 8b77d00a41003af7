"""The host side of an out-of-process plugin (``plugins.entries.<key>.isolation: process``).

:class:`RemotePlugin` starts the plugin's child (``python -m plugin_llm.plugins.isolation.worker``,
confined by :mod:`.sandbox`), loads the plugin in it and keeps it running. The child's ``ctx.register_*``
calls are applied through the host's real ``PluginContext`` with proxies for the callables, so
registries, validation and dispatch are exactly those of an in-process plugin.

Time limits are the in-process ones; a call that times out kills the child. A child that exits,
breaks the protocol or floods its output is killed, audited (``plugin_process_fault``) and
restarted after a backoff, at most :data:`MAX_RESTARTS` times in a row, then marked failed.
``ctx.llm`` in the child is answered by the host's ``PluginLlm`` bound to the plugin's key; fields
naming an identity are refused and audited (``plugin_channel_refused``).

Children are started from one long-lived thread (``PR_SET_PDEATHSIG`` is tied to the thread that
forks) and stopped at host exit (:func:`stop_all`, atexit). Details: docs/design.md.
"""

from __future__ import annotations

import atexit
import collections
import inspect
import itertools
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from auth.redaction import redact
from plugin_llm import wire
from plugin_llm.errors import PluginLlmError, PluginLlmTimeoutError, PluginLlmTrustError
from . import sandbox
from .. import ctx_api
from ..hooks import CURRENT_LIMIT, HookTimeoutError
from ..lifecycle import PluginRegistration
from ..registry import Disposable
from ..settings import ISOLATION_IN_PROCESS, ISOLATION_PROCESS, NETWORK_HOST, NETWORK_NONE
from ..untrusted import bounded, error_text, exact_str, safe_str, type_name
from .protocol import (
    CallTimeout,
    Channel,
    ChannelClosed,
    Peer,
    ProtocolError,
    RemoteError,
    decode_value,
    encode_value,
)
from .sandbox import SandboxUnavailable

__all__ = [
    "ISOLATION_PROCESS",
    "ISOLATION_IN_PROCESS",
    "RemotePlugin",
    "RemoteLoadError",
    "RemotePluginUnavailable",
    "MAX_RESTARTS",
    "stop_all",
    "live_children",
]

_log = logging.getLogger("plugin_llm.plugins")
_output_log = logging.getLogger("plugin_llm.plugins.output")


#: Restarts in a row before the plugin is marked failed (a child that ran RESET_AFTER seconds resets the count).
MAX_RESTARTS = 3
#: Seconds to wait before restart n (1-based): a crash loop backs off.
BACKOFF = (0.05, 0.25, 1.0)
RESET_AFTER = 60.0
#: stderr bytes within FLOOD_WINDOW seconds that count as a flood (the child is stopped).
FLOOD_BYTES = 4 * 1024 * 1024
FLOOD_WINDOW = 10.0
#: Lines of the child's output kept for error messages, and characters of each.
_TAIL_LINES = 12
_TAIL_CHARS = 300
#: Fields that would name an identity in a ctx.llm request: the host binds it, the child cannot.
_IDENTITY_FIELDS = frozenset({"plugin_id", "plugin", "plugin_key", "identity", "home", "config_source", "transport",
                              "audit_log", "audit", "clock", "call_id", "hermes_home"})
_LLM_ENVELOPE = frozenset({"api", "mode", "kw", "op", "h"})
#: streams one isolated plugin may have open at once (each holds a provider connection and its limits)
MAX_OPEN_STREAMS = 32
#: seconds past a stream's own deadline the host waits for the plugin to read it before abandoning it
STREAM_GRACE = 5.0

_LIVE: "weakref.WeakSet[RemotePlugin]" = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


class RemoteLoadError(Exception):
    """Loading an isolated plugin failed; ``message`` is what ``plugins list`` shows."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.timed_out = timed_out


class RemotePluginUnavailable(RuntimeError):
    """The plugin's process is restarting (backoff) or the plugin was marked failed."""


class _RemoteException(Exception):
    """Base of the host-side stand-ins for exceptions raised in a child (same class name)."""

    remote_type = "Exception"


class _RemoteBaseException(BaseException):
    """Stand-in for a child's BaseException that is not an Exception (SystemExit, its own KeyboardInterrupt)."""

    remote_type = "BaseException"


_STAND_INS: dict[tuple[str, bool], type] = {}


def _stand_in(info: dict[str, Any]) -> BaseException:
    """An exception whose ``type_name`` and message are the child's (``error_text`` reads the same)."""
    name = info.get("type") if type(info.get("type")) is str else "Exception"
    name = name if name.isidentifier() and len(name) <= 100 else "Exception"
    message = info.get("message") if type(info.get("message")) is str else ""
    is_exception = info.get("base") != "base"
    cls = _STAND_INS.get((name, is_exception))
    if cls is None:
        base = _RemoteException if is_exception else _RemoteBaseException
        cls = _STAND_INS[(name, is_exception)] = type(name, (base,), {"remote_type": name, "__module__": "plugin"})
    return cls(bounded(message, 4000))


# --- spawning from one long-lived thread -----------------------------------------------------


class _Spawner:
    """Runs ``Popen`` on one daemon thread that lives as long as the host (PR_SET_PDEATHSIG)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="plugin-spawner", daemon=True)
                self._thread.start()
        box: dict[str, Any] = {}
        done = threading.Event()
        self._jobs.put((fn, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _loop(self) -> None:
        while True:
            fn, box, done = self._jobs.get()
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc
            done.set()


_SPAWNER = _Spawner()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: setattr(_SPAWNER, "_thread", None))


# --- one child process ---------------------------------------------------------------------


class _OpenStreams:
    """The ``ctx.llm`` streams one child has open on the host: opened, pulled one delta per request,
    closed by the plugin, ended at their deadline when the plugin stops reading (abandoned, as a
    dropped stream is in process), and all abandoned when the child goes."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._lock = threading.Lock()
        self._open: dict[int, tuple[Any, threading.Timer]] = {}
        self._expired: set[int] = set()
        self._ids = itertools.count(1)
        self._closed = False

    def request(self, llm: Any, op: Any, handle: Any, kw: dict[str, Any]) -> Any:
        if op == "open":
            return self._start(llm, kw)
        entry = self._take(handle) if op == "close" else self._get(handle)
        if op == "close":
            if entry is not None:
                entry[1].cancel()
                entry[0].close()
            return {"closed": True}
        if op != "next":
            raise ValueError(f"unknown ctx.llm stream operation {bounded(str(op), 40)!r}")
        if entry is None:
            if handle in self._expired:
                raise PluginLlmTimeoutError(f"plugin '{self._key}' stopped reading its stream until past the call's "
                                            "deadline: the host ended it (recorded as abandoned)")
            raise ValueError("no such ctx.llm stream (it has ended or was closed)")
        stream, timer = entry
        try:
            delta = next(stream, None)
        except BaseException:
            self._forget(handle, timer)
            raise
        if delta is None:
            self._forget(handle, timer)
            return {"end": True, "result": _encode_result(stream.result), "finish_reason": stream.finish_reason}
        return {"d": delta, "model": stream.model}

    def _start(self, llm: Any, kw: dict[str, Any]) -> Any:
        with self._lock:
            if len(self._open) >= MAX_OPEN_STREAMS:
                raise ValueError(f"plugin '{self._key}' has {MAX_OPEN_STREAMS} ctx.llm streams open: close the ones "
                                 "it no longer reads (a with block, or close())")
        messages = kw.pop("messages", None)
        stream = llm.stream(messages, **kw)  # the gate, the limits and the first answer: a refusal raises here
        handle = next(self._ids)
        timer = threading.Timer(_stream_bound(llm, kw.get("timeout")), self._expire, (handle,))
        timer.daemon = True
        with self._lock:
            closed = self._closed
            if not closed:
                self._open[handle] = (stream, timer)
        if closed:  # the child went while the stream opened
            stream.close()
            raise ValueError("the plugin's process stopped")
        timer.start()
        return {"h": handle, "call_id": stream.call_id, "model": stream.model}

    def _get(self, handle: Any) -> tuple[Any, threading.Timer] | None:
        with self._lock:
            return self._open.get(handle) if type(handle) is int else None

    def _take(self, handle: Any) -> tuple[Any, threading.Timer] | None:
        with self._lock:
            return self._open.pop(handle, None) if type(handle) is int else None

    def _forget(self, handle: int, timer: threading.Timer) -> None:
        timer.cancel()
        self._take(handle)

    def _expire(self, handle: int) -> None:
        with self._lock:
            entry = self._open.pop(handle, None)
            if entry is not None:
                self._expired.add(handle)
        if entry is not None:
            _log.warning("plugin %s: a ctx.llm stream was not read until past its deadline; it was abandoned",
                         self._key)
            entry[0].close()

    def abandon_all(self) -> None:
        with self._lock:
            self._closed = True
            entries, self._open = list(self._open.values()), {}
        for stream, timer in entries:
            timer.cancel()
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - recorded by the pipeline; the child is gone either way
                _log.debug("closing an abandoned stream failed", exc_info=True)


def _stream_bound(llm: Any, timeout: Any) -> float:
    """Seconds a stream may stay open on the host: its own deadline (the call's ``timeout``, else the host's
    ``llm.timeout``, at most ``llm.max_timeout``) plus :data:`STREAM_GRACE`."""
    try:
        settings = llm._config.current().llm
        cap, default = float(settings.max_timeout), float(settings.timeout)
    except Exception:  # noqa: BLE001 - no config to read: the documented defaults
        cap, default = 300.0, 30.0
    wanted = float(timeout) if type(timeout) in (int, float) and 0 < timeout < float("inf") else default
    return min(wanted, cap) + STREAM_GRACE


class _Child:
    """A running worker process: its Popen, protocol peer, output drain and fault state."""

    def __init__(self, owner: "RemotePlugin", proc: subprocess.Popen, spec: Any) -> None:
        self.owner = owner
        self.proc = proc
        self.spec = spec
        self.started = time.monotonic()
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.dead = False
        self.reason = ""
        self.settled = threading.Event()  # set once whoever stopped it has recorded why
        self.streams = _OpenStreams(owner.key)
        write_fd = os.dup(proc.stdin.fileno())  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
        self.peer = Peer(Channel(proc.stdout, write_fd, bounded_writes=True), self._answer, owner._describe_host_error,  # type: ignore[arg-type]
                         on_fault=self._on_channel_fault, name=f"plugin-host-{owner.key[:40]}")
        self._reader = threading.Thread(target=self.peer.serve, name=f"plugin-reader-{owner.key[:40]}", daemon=True)
        self._drain = threading.Thread(target=self._drain_stderr, name=f"plugin-stderr-{owner.key[:40]}", daemon=True)
        self._reader.start()
        self._drain.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _answer(self, method: str, params: Any) -> Any:
        return self.owner._answer(self, method, params)

    def _on_channel_fault(self, exc: BaseException) -> None:
        if self.dead:  # stopped by the host: wake the waiting calls once the fault is recorded
            self.settled.wait(10)
            return
        if isinstance(exc, ChannelClosed):
            code = self._exit_code(2.0)
            how = f"exit status {code}" if code is not None and code >= 0 else (
                f"killed by signal {-code}" if code is not None else "it closed its channel")
            self.owner._fault(self, "exited", f"its process exited unexpectedly ({how}){self.tail_text()}")
        elif isinstance(exc, ProtocolError):
            self.owner._fault(self, "protocol", f"its process sent an invalid message ({exc}); it was stopped")
        else:
            self.owner._fault(self, "protocol", f"reading its process failed ({type(exc).__name__}); it was stopped")

    def _exit_code(self, wait: float) -> int | None:
        try:
            return self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None

    def _drain_stderr(self) -> None:
        stream = self.proc.stderr
        assert stream is not None
        window_start, window_bytes, partial = time.monotonic(), 0, b""
        key = self.owner.key
        try:
            while True:
                chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
                if not chunk:
                    break
                now = time.monotonic()
                if now - window_start > FLOOD_WINDOW:
                    window_start, window_bytes = now, 0
                window_bytes += len(chunk)
                if window_bytes > FLOOD_BYTES and not self.dead:
                    self.owner._fault(self, "flood", f"its process flooded its output (over {FLOOD_BYTES // (1024 * 1024)} MiB "
                                                      f"within {FLOOD_WINDOW:g} s); it was stopped")
                    continue  # keep draining until the pipe closes: the child never blocks on a full pipe
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()[-_TAIL_CHARS * 4:]
                for raw in lines[-_TAIL_LINES:]:
                    text = raw.decode("utf-8", "replace")[:_TAIL_CHARS]
                    self.tail.append(text)
                    if _output_log.isEnabledFor(logging.INFO):
                        _output_log.info("[%s] %s", key, text)
        except (OSError, ValueError):
            pass

    def join_output(self, wait: float) -> None:
        self._drain.join(wait)

    def tail_text(self) -> str:
        lines = [line for line in list(self.tail) if line.strip()]
        if not lines:
            return ""
        return "; its last output: " + " | ".join(lines[-3:])

    def kill(self) -> None:
        """Stop the process group now, reap it (no zombie), then wake the calls waiting on it."""
        self.terminate()
        self.settled.set()
        self.peer.fail(ChannelClosed(self.reason or "the host stopped the plugin's process"))

    def terminate(self) -> None:
        """SIGKILL the process group and reap it; the channel stays as it is."""
        self.dead = True
        self.streams.abandon_all()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            try:
                self.proc.kill()
            except OSError:
                pass
        self._reap()

    def close(self, grace: float = 1.0) -> None:
        """Ask the child to exit (close its input), then kill it if it does not."""
        self.dead = True
        self.streams.abandon_all()
        self.settled.set()
        self.peer.channel.close()
        if self._exit_code(grace) is None:
            self.kill()
        else:
            self.peer.fail(ChannelClosed("stopped"))
            self._reap()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL of our own child
            _log.warning("plugin %s: process %d did not exit after SIGKILL", self.owner.key, self.proc.pid)
        for stream in (self.proc.stdout, self.proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self.spec.cleanup()
        except Exception:  # pragma: no cover
            _log.debug("scratch cleanup failed", exc_info=True)


class _Budget:
    """Time left for one call under a limit, not counting time spent in host callbacks (next_call)."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.started = time.monotonic()
        self.paused = 0.0
        self.pausing = 0
        self.pause_since = 0.0
        self._lock = threading.Lock()

    def remaining(self) -> float:
        with self._lock:
            if self.pausing:
                return 3600.0  # waiting for our own downstream call: re-read when it returns
            return self.limit - (time.monotonic() - self.started - self.paused)

    def pause(self) -> None:
        with self._lock:
            if not self.pausing:
                self.pause_since = time.monotonic()
            self.pausing += 1

    def resume(self) -> None:
        with self._lock:
            self.pausing -= 1
            if not self.pausing:
                self.paused += time.monotonic() - self.pause_since


class _Slot:
    """One registered callable of the plugin: what it is and the current child's handle for it."""

    __slots__ = ("kind", "name", "what", "limited", "handle")

    def __init__(self, kind: str, name: str, what: str, limited: bool, handle: int) -> None:
        self.kind, self.name, self.what, self.limited, self.handle = kind, name, what, limited, handle


def _proxy_signature(sig: Any) -> inspect.Signature:
    if sig is None:
        return inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                                  inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    if type(sig) is not list or len(sig) > 100:
        raise ValueError("malformed signature")
    params = []
    for item in sig:
        if type(item) is not list or len(item) != 3 or type(item[0]) is not str or type(item[1]) is not int:
            raise ValueError("malformed signature")
        kind = inspect._ParameterKind(item[1])
        default = None if item[2] is True else inspect.Parameter.empty
        params.append(inspect.Parameter(item[0], kind, default=default))
    return inspect.Signature(params, __validate_parameters__=False)


class RemotePlugin:
    """One isolated plugin: its child process, its proxies, restarts and faults (see the module docstring)."""

    def __init__(self, manager: Any, record: Any, limits: Any) -> None:
        self._manager = manager
        self._record = record
        candidate = record.candidate
        self.key: str = record.key
        self.plugin_dir: Path = Path(candidate.path)
        self.manifest = candidate.manifest
        self.limits = limits
        self._ctx: Any = None
        self._child: _Child | None = None
        self._slots: list[_Slot] = []
        self._answers: list[tuple[str, str, Any]] = []  # (method, label, answer or its error) of each registration
        self._registrations: list[Any] = []  # the handles (.lifecycle) registrations returned, by number
        self._replay: list[tuple[str, str, Any]] | None = None  # during a restart: what the first load registered
        self._loading: _Child | None = None
        self._restart_slot = 0
        self._host_fns: dict[int, tuple[Callable[..., Any], _Budget | None]] = {}
        self._host_fn_ids = 0
        self._lock = threading.RLock()  # held while (re)starting the child
        self._state = threading.Lock()  # faults and host callables: never held while waiting for the child
        self.restarts = 0
        self.total_restarts = 0
        self._next_start = 0.0
        self.failed: str | None = None
        self.stopped = False
        self.confinement: str | None = None
        self.confinement_reason = ""
        self.last_fault: str | None = None
        self.network: str | None = None  # host | none as its process has it (isolation_network, at each start)
        self._network_setting: str | None = None  # plugins.entries.<key>.isolation_network (None: unset)
        self.data_dir: Path | None = None  # <home>/plugin-data/<key>/: its HOME and HERMES_HOME
        with _LIVE_LOCK:
            _LIVE.add(self)

    def __repr__(self) -> str:
        return f"RemotePlugin(key={self.key!r}, pid={self.pid}, restarts={self.total_restarts})"

    # --- description ------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The child's PID while it runs (None once it was stopped or has exited, even before it is reaped)."""
        child = self._child
        if child is None or child.dead or self.stopped:
            return None
        return child.pid if child.proc.poll() is None else None

    def describe(self) -> dict[str, Any]:
        pid = self.pid
        state = "failed" if self.failed else "stopped" if self.stopped else (
            "running" if pid is not None else "restarting")
        return {"state": state, "pid": pid, "confinement": self.confinement,
                "confinement_reason": self.confinement_reason, "restarts": self.total_restarts,
                "last_fault": self.last_fault, "network": self.network,
                "data_dir": str(self.data_dir) if self.data_dir is not None else None,
                "limits": dict(vars(self.limits)) if hasattr(self.limits, "__dict__") else None}

    # --- starting and loading ---------------------------------------------------------

    def _spawn(self) -> _Child:
        try:  # limits and network as config.yaml says now: an edit applies at the next (re)start
            settings = self._manager._settings.current()
            self.limits = settings.limits_for(self.key)
            self._network_setting = settings.entry(self.key).isolation_network
        except Exception:  # pragma: no cover - settings never raise; keep the last values
            pass
        self.data_dir = sandbox.plugin_data_dir(self._manager.home, self.key)

        def start() -> _Child:
            spec = sandbox.child_spec(plugin_key=self.key, plugin_dir=self.plugin_dir,
                                      requires_env=list(self.manifest.required_env_names),
                                      hermes_home=self._manager.home, limits=self.limits,
                                      python_args=["-m", "plugin_llm.plugins.isolation.worker"],
                                      share_network=None if self._network_setting is None
                                      else self._network_setting != NETWORK_NONE, data_dir=self.data_dir)
            try:
                proc = subprocess.Popen(spec.argv, env=spec.env, cwd=spec.cwd, preexec_fn=spec.preexec_fn,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        close_fds=True)
            except BaseException:
                spec.cleanup()
                raise
            return _Child(self, proc, spec)

        child = _SPAWNER.run(start)
        self.confinement, self.confinement_reason = child.spec.confinement, child.spec.reason
        self.network = NETWORK_HOST if child.spec.share_network else NETWORK_NONE
        return child

    def _load_params(self) -> dict[str, Any]:
        m = self.manifest
        record = self._record
        roots = [str(self._manager.home / "plugins")]
        if self._manager.project_dir is not None:
            roots.append(str(self._manager.project_dir / ".hermes" / "plugins"))
        return {
            "key": self.key, "path": str(self.plugin_dir), "module": record.module_name, "roots": roots,
            "manifest": {"name": m.name, "version": m.version, "description": m.description, "author": m.author,
                         "requires_env": [[r.name, r.description] for r in m.requires_env],
                         "provides_tools": list(m.provides_tools), "provides_hooks": list(m.provides_hooks),
                         "kind": m.kind, "declared_kind": m.declared_kind, "capabilities": list(m.capabilities)},
        }

    def load(self, ctx: Any, timeout: float) -> None:
        """Start the child and load the plugin in it; registrations go through ``ctx``.
        Raises :class:`RemoteLoadError` (the plugin then fails to load, as in process)."""
        self._ctx = ctx
        with self._lock:
            self._start(timeout, first=True)

    def _start(self, timeout: float, *, first: bool) -> None:
        saved = self._answers
        if not first:
            self._replay, self._answers = saved, []
            self._restart_slot = 0
        try:
            self._start_child(timeout, first)
        except BaseException:
            self._answers = saved
            raise
        finally:
            self._replay = None

    def _start_child(self, timeout: float, first: bool) -> None:
        started = time.monotonic()
        try:
            child = self._spawn()
        except SandboxUnavailable as exc:  # its message names the setting and the fix
            raise RemoteLoadError(bounded(str(exc), 1000)) from None
        except Exception as exc:
            raise RemoteLoadError(f"its process could not be started: {type(exc).__name__}: "
                                  f"{bounded(str(exc), 300)}") from None
        self._loading = child
        try:
            left = timeout - (time.monotonic() - started)
            reply = child.peer.call("load", self._load_params(), timeout=max(left, 0.001))
        except CallTimeout:
            child.reason = "loading timed out"
            child.kill()
            raise RemoteLoadError(f"loading it (import + register()) did not finish within {timeout:g}s "
                                  "(plugins.hook_timeout); its process was stopped", timed_out=True) from None
        except ChannelClosed:
            code = child._exit_code(2.0)
            child.join_output(1.0)
            reason = child.reason
            child.reason = child.reason or "exited while loading"
            child.kill()
            if not reason or reason.startswith("its process exited unexpectedly"):
                how = f" (exit status {code})" if code is not None and code >= 0 else (
                    f" (killed by signal {-code})" if code is not None else "")
                reason = f"its process exited while loading{how}{child.tail_text()}"
            raise RemoteLoadError(reason) from None
        except BaseException:
            child.reason = "loading was interrupted"
            child.kill()
            raise
        finally:
            self._loading = None
        if type(reply) is not dict or reply.get("phase") != "done":
            child.reason = "loading failed"
            try:  # what register() set up before it failed is released, as in process
                child.peer.call("unload", {}, timeout=max(0.1, timeout - (time.monotonic() - started)))
            except Exception:
                pass
            child.kill()
            raise RemoteLoadError(self._load_failure(reply))
        if not first and len(self._answers) != len(self._replay or []):
            child.reason = "registered something different"
            child.kill()
            raise RemoteLoadError("after a restart it registered something different from its first start")
        self._child = child

    def _load_failure(self, reply: Any) -> str:
        if type(reply) is not dict:
            return "its process answered the load with something malformed"
        where = self.plugin_dir / "__init__.py"
        if reply.get("missing_register"):
            return f"no register() function (expected register(ctx) in {where})"
        if reply.get("not_callable"):
            return f"register is not callable ({bounded(str(reply['not_callable']), 100)})"
        info = reply.get("error") if type(reply.get("error")) is dict else {}
        text = self._error_text(info)
        phase = "register() raised" if reply.get("phase") == "register" else "import failed"
        return f"{phase}: {text}"

    @staticmethod
    def _error_text(info: dict[str, Any]) -> str:
        return error_text(_stand_in(info))

    # --- what the child asks -----------------------------------------------------------

    def _answer(self, child: _Child, method: str, params: Any) -> Any:
        if type(params) is not dict:
            raise ValueError("params must be an object")
        if method == "callback":
            return self._on_callback(params)
        if method == "llm":
            return self._on_llm(child, params)
        if method == "ctx":
            return self._on_ctx(child, params)
        if method == "registration":
            return self._on_registration(params)
        # An unknown request: the child does not speak our protocol (or was taken over): stop it.
        self._fault(child, "protocol", f"its process sent an unknown request ({bounded(exact_str(method), 60)!r}); it was stopped")
        raise ValueError("unknown method")

    def _on_ctx(self, child: _Child, params: dict[str, Any]) -> Any:
        """A ``ctx`` call of the plugin, its arguments bound by name in its process (:mod:`..ctx_api`),
        applied through the host's own ``PluginContext`` method, which binds and checks them again."""
        method = params.get("m")
        if type(method) is not str or method in ctx_api.LOCAL or (
                method not in ctx_api.METHODS and method not in ctx_api.PROPERTIES):
            raise ValueError(f"unknown ctx operation {bounded(str(method), 40)!r}")
        if method in ctx_api.PROPERTIES:
            return {"v": encode_value(getattr(self._ctx, method), strict=True)}
        encoded = params.get("a") if type(params.get("a")) is dict else {}
        if not ctx_api.is_registration(method):
            result = getattr(self._ctx, method)(**ctx_api.spread(method, decode_value(encoded)))
            return {"v": encode_value(result, strict=True)}
        if child is not self._loading:
            raise RuntimeError(f"plugin {self.key}: registering after register(ctx) returned is not supported "
                               "out of process")
        label = _label(params.get("refused") if method in ctx_api.NOT_ACROSS else next(iter(encoded.values()), None))
        if self._replay is not None:  # a restart: the registrations exist; map the new handles onto them
            return self._replay_register(method, label, encoded)
        before = len(self._slots)
        try:
            answer = self._register(method, label, encoded, params.get("sig"))
        except Exception as exc:  # refused by the host's checks: no proxy kept; a restart raises it again
            del self._slots[before:]
            self._answers.append((method, label, exc))
            raise
        self._answers.append((method, label, answer))
        return answer

    def _on_registration(self, params: dict[str, Any]) -> Any:
        """``handle.active`` / ``handle.dispose()`` of a registration's handle in the plugin's process."""
        number, op = params.get("h"), params.get("op")
        if type(number) is not int or not 0 <= number < len(self._registrations) or op not in ("active", "dispose"):
            raise ValueError("unknown registration handle")
        handle = self._registrations[number]
        if op == "dispose":
            handle.dispose()
        return {"active": bool(handle.active)}

    def _replay_register(self, method: str, label: str, encoded: dict[str, Any]) -> Any:
        index = len(self._answers)
        replay = self._replay or []
        if index >= len(replay) or replay[index][:2] != (method, label):
            raise RuntimeError(f"plugin {self.key}: after a restart it called ctx.{method}({label!r}), "
                               "which its first start did not (in this order)")
        self._answers.append(replay[index])
        answer = replay[index][2]
        if isinstance(answer, Exception):
            raise answer.with_traceback(None)
        handles: list[int] = []
        decode_value(encoded, handles.append)  # in the order the first start made proxies of them
        if self._restart_slot + len(handles) > len(self._slots):
            raise RuntimeError(f"plugin {self.key}: after a restart ctx.{method}({label!r}) passed other callables "
                               "than at its first start")
        for handle in handles:
            slot = self._slots[self._restart_slot]
            slot.handle = handle
            self._restart_slot += 1
        return answer

    def _proxy(self, spec: Any, kind: str, name: str, what: str, limited: bool) -> Callable[..., Any]:
        if type(spec) is not dict or type(spec.get("h")) is not int:
            raise TypeError(f"plugin {self.key}: {what}: a callable was expected")
        index = len(self._slots)
        slot = _Slot(kind, name, what, limited, spec["h"])
        self._slots.append(slot)

        def proxy(*args: Any, **kwargs: Any) -> Any:
            return self.invoke(index, args, kwargs)

        proxy.__signature__ = _proxy_signature(spec.get("sig"))  # type: ignore[attr-defined]
        proxy.__name__ = proxy.__qualname__ = f"{what} (out of process)"
        return proxy

    def _register(self, method: str, label: str, encoded: dict[str, Any], signatures: Any) -> Any:
        """Apply one registration: the plugin's callables become proxies, a provider a stand-in."""
        ctx = self._ctx
        if method in ctx_api.NOT_ACROSS:
            ctx._refuse(f"ctx.{method}({bounded(label, 60)!r}) is not available to a plugin running out of process "
                        f"({ctx_api.NOT_ACROSS[method]}; plugins.entries.{self.key}.isolation: process): ignored; "
                        "run the plugin in process to use it")
            return {"v": None}
        signatures = signatures if type(signatures) is dict else {}
        noun = method.removeprefix("register_").replace("_", " ")
        provider = ctx_api.PROVIDER_PARAMS.get(method)
        made: list[int] = []
        named: dict[str, Any] = {}
        for param, value in encoded.items():
            if param == provider:
                named[param] = self._stand_in(method, value, signatures)
                continue
            timed = (method, param) not in ctx_api.UNTIMED

            def proxy(handle: int, param: str = param, timed: bool = timed) -> Callable[..., Any]:
                what = f"{noun} {label}" if not made else f"{noun} {label} {param}"
                made.append(handle)
                return self._proxy({"h": handle, "sig": signatures.get(str(handle))}, method, label, what, timed)

            named[param] = decode_value(value, proxy)
        named.update(ctx_api.SET_ON_HOST.get(method, {}))
        if method == "register_cli_command":
            named["setup_fn"] = self._cli_setup(label, named.get("setup_fn"))
        answer = _reply(getattr(ctx, method)(**ctx_api.spread(method, named)))
        if answer.get("entry") is True and answer.get("handle") is not None:  # the plugin may dispose of it
            self._registrations.append(answer.pop("handle"))
            answer["h"] = len(self._registrations) - 1
        return answer

    def _stand_in(self, method: str, f: Any, signatures: dict[str, Any]) -> Any:
        """A memory provider, context engine or image generator: a stand-in of the same base class
        whose public methods run the plugin's in its process (each under ``plugins.hook_timeout``)."""
        bases: dict[tuple[str, str], Callable[[], type]] = {
            ("register_memory_provider", "host"): lambda: __import__(
                "plugin_llm.plugins.engines", fromlist=["x"]).MemoryProvider,
            ("register_context_engine", "host"): lambda: __import__(
                "plugin_llm.plugins.engines", fromlist=["x"]).ContextEngine,
            ("register_memory_provider", "hermes"): lambda: __import__(
                "plugin_llm.compat.hermes.agent.memory_provider", fromlist=["x"]).MemoryProvider,
            ("register_context_engine", "hermes"): lambda: __import__(
                "plugin_llm.compat.hermes.agent.context_engine", fromlist=["x"]).ContextEngine,
        }
        f = f if type(f) is dict else {}
        make_base = bases.get((method, f.get("base") or ""), lambda: object)
        methods = f.get("methods") if type(f.get("methods")) is dict else {}
        attrs = f.get("attrs") if type(f.get("attrs")) is dict else {}
        if len(methods) > 200 or len(attrs) > 200:
            raise ValueError(f"plugin {self.key}: malformed {bounded(method, 40)} registration")
        namespace: dict[str, Any] = {k: v for k, v in attrs.items()
                                     if type(k) is str and k.isidentifier() and not k.startswith("_")
                                     and (v is None or type(v) in (str, int, float, bool))}
        kind = method.removeprefix("register_")
        for mname, spec in methods.items():
            if type(mname) is not str or not mname.isidentifier() or mname.startswith("_"):
                raise ValueError(f"plugin {self.key}: malformed {kind} method name")
            handle = spec.get("id") if type(spec) is dict and spec.get("$t") == "fn" else None
            if type(handle) is not int:
                raise ValueError(f"plugin {self.key}: malformed {kind} method {bounded(mname, 60)!r}")
            proxy = self._proxy({"h": handle, "sig": signatures.get(str(handle))}, method, mname,
                                f"{kind.replace('_', ' ')} {mname}", limited=True)
            namespace[mname] = _method(proxy)
        class_name = f.get("class") if type(f.get("class")) is str and f["class"].isidentifier() else "Provider"
        namespace["__module__"] = f"plugin (out of process: {self.key})"
        cls = type(class_name[:100], (make_base(),), namespace)
        return cls if f.get("is_class") is True else cls()

    def _cli_setup(self, shown: str, runner: Any) -> Any:
        """``plugin-llm <name>``: the host hands the raw arguments to the plugin's process, which parses
        them with the plugin's own ``setup_fn`` (a parser cannot cross the channel) and runs it."""
        if not callable(runner):  # not a callable: register_cli_command refuses it, as in process
            return runner
        key = self.key

        def run_raw(argv: list[str], debug: bool = False) -> int:
            try:
                reply = runner(list(argv))
            except Exception as exc:
                if debug:
                    raise
                print(f"plugin-llm {shown}: error: {redact(error_text(exc))} (plugin {key})", file=sys.stderr)
                return 1
            reply = reply if type(reply) is dict else {}
            for stream, text in ((sys.stdout, reply.get("out")), (sys.stderr, reply.get("err"))):
                if type(text) is str and text:
                    stream.write(text)
                    stream.flush()
            code = reply.get("code")
            code = code if type(code) is int else 1
            if reply.get("exit") is True:  # argparse exited (--help, a usage error): as it does in process
                raise SystemExit(code)
            return code

        def setup(parser: Any) -> None:  # the plugin's setup_fn runs in its process (see run_raw)
            return None

        setup.plugin_llm_raw_argv = run_raw  # type: ignore[attr-defined]
        return setup

    def _on_callback(self, params: dict[str, Any]) -> Any:
        handle = params.get("h")
        with self._state:
            found = self._host_fns.get(handle) if type(handle) is int else None
        if found is None:
            raise RuntimeError("this host callable is no longer valid (its call has returned)")
        fn, budget = found
        args = decode_value(params.get("a") or [])
        kwargs = decode_value(params.get("k") or {})
        if type(args) is not list or type(kwargs) is not dict:
            raise ValueError("malformed callback arguments")
        if budget is not None:
            budget.pause()
        try:
            return encode_value(fn(*args, **kwargs), strict=True)
        finally:
            if budget is not None:
                budget.resume()

    def _on_llm(self, child: _Child, params: dict[str, Any]) -> Any:
        kw = decode_value(params.get("kw") or {})
        if type(kw) is not dict:
            raise ValueError("ctx.llm arguments must be an object")
        claimed = sorted((set(params) - _LLM_ENVELOPE) | (set(kw) & _IDENTITY_FIELDS))
        if claimed:
            shown = [bounded(exact_str(str(c)), 40) for c in claimed[:10]]
            claimed_id = kw.get("plugin_id") if type(kw.get("plugin_id")) is str else params.get("plugin_id")
            self._manager._audit("plugin_channel_refused", plugin_id=self.key, decision="denied", status="denied",
                                 fields=shown, **({"claimed_plugin_id": bounded(claimed_id, 100)}
                                                  if type(claimed_id) is str else {}))
            _log.warning("plugin %s: ctx.llm request with %s refused (its identity is bound by the host)",
                         self.key, ", ".join(shown))
            raise PluginLlmTrustError(
                f"plugin '{self.key}' sent {', '.join(shown)} with a ctx.llm call: an isolated plugin's identity "
                "is bound by the host when it starts the plugin; nothing the plugin sends can change it",
                plugin_id=self.key, config_key="")
        api, mode = params.get("api"), params.get("mode")
        llm = self._ctx.llm  # PluginLlm(plugin_id=<this key>), created by the host's PluginContext
        if api == "stream":
            return child.streams.request(llm, params.get("op"), params.get("h"), kw)
        if api not in ("complete", "structured"):
            raise ValueError(f"unknown ctx.llm api {bounded(str(api), 40)!r}")
        args = (kw.pop("messages", None),) if api == "complete" else ()
        if mode == "async":  # the plugin awaited it: the host's async path, on this worker thread's own loop
            import asyncio

            method = llm.acomplete if api == "complete" else llm.acomplete_structured
            result = asyncio.run(method(*args, **kw))
        else:
            result = (llm.complete if api == "complete" else llm.complete_structured)(*args, **kw)
        return _encode_result(result)

    def _describe_host_error(self, exc: BaseException) -> dict[str, Any]:
        """A host error as the child sees it: a gateway error through the one codec (its class and
        fields), anything else as its class name and redacted message."""
        if isinstance(exc, PluginLlmError):
            return wire.encode_error(exc, remote=True)  # the plugin is told what a remote caller is
        return {"type": type_name(exc), "message": redact(safe_str(exc, 4000) or "")}

    # --- invoking what the plugin registered ----------------------------------------------

    def invoke(self, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the plugin's callable ``index`` in its process: its (decoded) result, or what it raised."""
        slot = self._slots[index]
        child = self._ready_child()
        # A little under the hook runner's own limit: this call times out first, with its own message.
        limit = CURRENT_LIMIT.get() or self._manager._hook_timeout()
        budget = _Budget(limit - min(0.05, limit / 10)) if slot.limited else None
        ids: list[int] = []

        def host_fn(fn: Callable[..., Any]) -> int:
            with self._state:
                self._host_fn_ids += 1
                self._host_fns[self._host_fn_ids] = (fn, budget)
                ids.append(self._host_fn_ids)
                return self._host_fn_ids

        try:
            params = {"h": slot.handle, "a": encode_value(list(args), host_fn, strict=True),
                      "k": encode_value(kwargs, host_fn, strict=True)}
            reply = child.peer.call("invoke", params, remaining=budget.remaining if budget is not None else None)
        except CallTimeout:
            self._fault(child, "timeout", f"{slot.what} did not return within {limit:g}s (plugins.hook_timeout); "
                                          "its process was stopped")
            raise HookTimeoutError(f"did not return within {limit:g}s (plugins.hook_timeout); "
                                   "its process was stopped and is restarted") from None
        except RemoteError as exc:
            raise _stand_in(exc.info) from None
        except ChannelClosed:
            raise RemotePluginUnavailable(f"plugin {self.key}: {child.reason or 'its process stopped'}") from None
        except ValueError as exc:  # the arguments cannot be sent (too big, too deep): nothing was sent
            raise ValueError(f"plugin {self.key}: {slot.what}: its arguments cannot be sent to its process "
                             f"({bounded(str(exc), 200)})") from None
        except BaseException:  # the host's time limit (SIGALRM) or Ctrl-C while waiting: the call is abandoned
            self._fault(child, "interrupted", f"{slot.what} was interrupted while running; its process was stopped")
            raise
        finally:
            if ids:
                with self._state:
                    for i in ids:
                        self._host_fns.pop(i, None)
        return decode_value(reply)

    def _ready_child(self) -> _Child:
        child = self._child
        if child is not None and not child.dead:
            return child
        with self._lock:
            child = self._child
            if child is not None and not child.dead:
                return child
            if self.failed:
                raise RemotePluginUnavailable(f"plugin {self.key} failed: {self.failed}")
            if self.stopped:
                raise RemotePluginUnavailable(f"plugin {self.key} was stopped")
            wait = self._next_start - time.monotonic()
            if wait > 0:
                # a stable message: hook errors are reported once per distinct text
                raise RemotePluginUnavailable(f"plugin {self.key}: its process is restarting after a fault "
                                              f"({self.last_fault})")
            try:
                self._start(self._manager._hook_timeout(), first=False)
            except RemoteLoadError as exc:
                self._after_fault("restart", f"restarting it failed: {exc.message}")
                raise RemotePluginUnavailable(f"plugin {self.key}: {exc.message}") from None
            _log.warning("plugin %s: its process was restarted (restart %d of %d)", self.key, self.restarts, MAX_RESTARTS)
            return self._child  # type: ignore[return-value]

    # --- faults -------------------------------------------------------------------------

    def _fault(self, child: _Child, kind: str, message: str) -> None:
        """Stop ``child`` (once), log and audit why, and schedule a restart (or fail the plugin)."""
        with self._state:
            if child.dead or child.reason:
                return
            child.reason = message
        child.terminate()
        try:
            if child is not self._child:  # still loading: the load reports it
                self.last_fault = message
                return
            if time.monotonic() - child.started > RESET_AFTER:
                self.restarts = 0
            self._after_fault(kind, message)
        finally:  # the calls waiting on it wake up once the fault is recorded
            child.settled.set()
            child.peer.fail(ChannelClosed(message))

    def _after_fault(self, kind: str, message: str) -> None:
        with self._state:
            self.last_fault = message
            self._child = None
            self.restarts += 1
            action = "restart"
            if self.restarts > MAX_RESTARTS:
                action = "failed"
                self.failed = f"{message} (stopped after {MAX_RESTARTS} restarts)"
            else:
                self.total_restarts += 1
                self._next_start = time.monotonic() + BACKOFF[min(self.restarts, len(BACKOFF)) - 1]
        _log.warning("plugin %s: %s (%s)", self.key, message,
                     "it is restarted" if action == "restart" else "the plugin is marked failed")
        self._manager._audit("plugin_process_fault", plugin_id=self.key, fault=kind, message=bounded(message, 500),
                             action=action, restarts=self.restarts - (1 if action == "restart" else 0),
                             confinement=self.confinement)
        if action == "failed":
            self._manager._remote_failed(self.key, self.failed)

    # --- stopping -----------------------------------------------------------------------

    def unload(self, timeout: float) -> None:
        """Ask the child to run the plugin's on_unload callbacks and cancel its tasks (within ``timeout``);
        whatever happens, the caller stops it next."""
        child = self._child
        if child is None or child.dead or self.stopped:
            return
        try:
            child.peer.call("unload", {}, timeout=max(0.1, timeout))
        except Exception as exc:
            _log.warning("plugin %s: its unload callbacks did not complete: %s", self.key, type(exc).__name__)

    def stop(self) -> None:
        """Stop the child (close its channel, then kill it); the plugin stays registered but unusable."""
        with self._lock:
            self.stopped = True
            child, self._child = self._child, None
        if child is not None and not child.dead:
            child.close()
        with _LIVE_LOCK:
            _LIVE.discard(self)


def _reply(result: Any) -> dict[str, Any]:
    """A registration's answer for the plugin: plain values as they are, a registry entry as "registered"
    (a disposable handle is kept: the plugin's process refers to it by number)."""
    if result is None or type(result) in (bool, int, float, str):
        return {"v": result}

    return {"entry": True, "handle": result if isinstance(result, (PluginRegistration, Disposable)) else None}


def _label(value: Any) -> str:
    """What a registration registers, as its first argument names it (a provider: its class name)."""
    if type(value) is dict and type(value.get("class")) is str:
        value = value["class"]
    return bounded(value, 100) if type(value) is str else type(value).__name__


def _method(proxy: Callable[..., Any]) -> Callable[..., Any]:
    """``proxy`` as a method of a stand-in class (``self`` dropped; the signature is the remote one)."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return proxy(*args, **kwargs)

    signature = inspect.signature(proxy)
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *signature.parameters.values()]
    method.__signature__ = inspect.Signature(params, __validate_parameters__=False)  # type: ignore[attr-defined]
    method.__name__ = method.__qualname__ = proxy.__name__
    return method


def _encode_result(result: Any) -> dict[str, Any]:
    out = wire.encode_result(result)
    # what came from the provider (parsed JSON, tool arguments) and the audit fields as plain data only
    for key in ("audit", "tool_calls", "parsed"):
        if key in out:
            out[key] = encode_value(out[key], strict=True)
    return out


def live_children() -> list[int]:
    """PIDs of the isolated plugins' processes running now (doctor, tests)."""
    with _LIVE_LOCK:
        plugins = list(_LIVE)
    return [pid for pid in (p.pid for p in plugins) if pid is not None]


def stop_all() -> None:
    """Stop every isolated plugin's process (host exit)."""
    with _LIVE_LOCK:
        plugins = list(_LIVE)
    for plugin in plugins:
        try:
            plugin.stop()
        except Exception:  # pragma: no cover - shutting down
            pass


atexit.register(stop_all)
