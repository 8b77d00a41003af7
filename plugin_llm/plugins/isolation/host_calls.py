"""Running what an isolated plugin registered, in its process, and its calls back to the host.

:meth:`HostCallsMixin.invoke` is what every proxy (:mod:`.host_ctx`) calls: the plugin's callable
runs in its child under the hook runner's time limit (:class:`_Budget`, which does not count the
time spent in host callables the plugin calls back, such as a middleware's ``next_call``). What the
child raised is raised here as a stand-in with the same class name; a child that is restarting, or
a plugin marked failed, raises :class:`RemotePluginUnavailable`. A mixin of :class:`.remote.RemotePlugin`.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..hooks import CURRENT_LIMIT, HookTimeoutError
from ..untrusted import bounded
from .protocol import CallTimeout, ChannelClosed, RemoteError, decode_value, encode_value


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


class HostCallsMixin:
    """Calling the plugin's callables, and answering its calls of host callables.

    The state it uses (made by ``RemotePlugin.__init__``): ``key``, ``_manager``, ``_slots``,
    ``_host_fns``, ``_host_fn_ids``, ``_state``.
    """

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
