"""An isolated plugin's ``ctx.llm``, answered on the host by the ``PluginLlm`` bound to its key.

Nothing the child sends can change whose call it is: fields naming an identity are refused and
audited (``plugin_channel_refused``). Sync and async calls run through the host's own pipeline; a
stream stays on the host (:class:`_OpenStreams`), the child pulls it one delta per request, and a
stream the plugin stops reading is abandoned at its deadline. A mixin of :class:`.remote.RemotePlugin`.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import TYPE_CHECKING, Any

from plugin_llm import wire
from plugin_llm.errors import PluginLlmTimeoutError, PluginLlmTrustError
from ..untrusted import bounded, exact_str
from .protocol import decode_value, encode_value

if TYPE_CHECKING:  # for annotations only: host_process imports this module
    from .host_process import _Child

_log = logging.getLogger("plugin_llm.plugins")

#: Fields that would name an identity in a ctx.llm request: the host binds it, the child cannot.
_IDENTITY_FIELDS = frozenset({"plugin_id", "plugin", "plugin_key", "identity", "home", "config_source", "transport",
                              "audit_log", "audit", "clock", "call_id", "hermes_home"})
_LLM_ENVELOPE = frozenset({"api", "mode", "kw", "op", "h"})
#: streams one isolated plugin may have open at once (each holds a provider connection and its limits)
MAX_OPEN_STREAMS = 32
#: seconds past a stream's own deadline the host waits for the plugin to read it before abandoning it
STREAM_GRACE = 5.0


class HostLlmMixin:
    """Answering the child's ``llm`` requests.

    The state it uses (made by ``RemotePlugin.__init__``): ``key``, ``_ctx``, ``_manager``.
    """

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


def _encode_result(result: Any) -> dict[str, Any]:
    out = wire.encode_result(result)
    # what came from the provider (parsed JSON, tool arguments) and the audit fields as plain data only
    for key in ("audit", "tool_calls", "parsed"):
        if key in out:
            out[key] = encode_value(out[key], strict=True)
    return out
