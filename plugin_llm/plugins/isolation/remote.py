"""The host side of an out-of-process plugin (``plugins.entries.<key>.isolation: process``).

:class:`RemotePlugin` starts the plugin's child (``python -m plugin_llm.plugins.isolation.worker``,
confined by :mod:`.sandbox`), loads the plugin in it and keeps it running; this module holds that
lifecycle. Its parts, one module each: the child process and the thread that starts it
(:mod:`.host_process`), the child's ``ctx`` calls applied through the host's real ``PluginContext``
(:mod:`.host_ctx`), calls of what the plugin registered (:mod:`.host_calls`) and its ``ctx.llm``,
answered by the host's ``PluginLlm`` bound to the plugin's key (:mod:`.host_llm`).

Time limits are the in-process ones; a call that times out kills the child. A child that exits,
breaks the protocol or floods its output is killed, audited (``plugin_process_fault``) and
restarted after a backoff, at most :data:`MAX_RESTARTS` times in a row, then marked failed.
Children are stopped at host exit (:func:`stop_all`, atexit). Details: docs/design.md.
"""

from __future__ import annotations

import atexit
import logging
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from auth.redaction import redact
from plugin_llm import wire
from plugin_llm.errors import PluginLlmError
from . import sandbox
from ..settings import ISOLATION_IN_PROCESS, ISOLATION_PROCESS, NETWORK_HOST, NETWORK_NONE
from ..untrusted import bounded, error_text, exact_str, safe_str, type_name
from .host_calls import HostCallsMixin, RemotePluginUnavailable, _Budget, _stand_in
from .host_ctx import HostCtxMixin, _Slot
from .host_llm import HostLlmMixin
from .host_process import _SPAWNER, _Child
from .protocol import CallTimeout, ChannelClosed
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


#: Restarts in a row before the plugin is marked failed (a child that ran RESET_AFTER seconds resets the count).
MAX_RESTARTS = 3
#: Seconds to wait before restart n (1-based): a crash loop backs off.
BACKOFF = (0.05, 0.25, 1.0)
RESET_AFTER = 60.0

_LIVE: "weakref.WeakSet[RemotePlugin]" = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


class RemoteLoadError(Exception):
    """Loading an isolated plugin failed; ``message`` is what ``plugins list`` shows."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.timed_out = timed_out


class RemotePlugin(HostCtxMixin, HostCallsMixin, HostLlmMixin):
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

    def _describe_host_error(self, exc: BaseException) -> dict[str, Any]:
        """A host error as the child sees it: a gateway error through the one codec (its class and
        fields), anything else as its class name and redacted message."""
        if isinstance(exc, PluginLlmError):
            return wire.encode_error(exc, remote=True)  # the plugin is told what a remote caller is
        return {"type": type_name(exc), "message": redact(safe_str(exc, 4000) or "")}

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
