"""``ctx.emit`` / ``ctx.subscribe``: the plugins' event bus.

An event is published as ``<plugin key>:<name>`` (a plugin cannot publish in another's namespace) with
a mapping payload, copied as plain data once at ``emit`` and again for each subscriber, so no
subscriber sees another's changes or the publisher's objects. Delivery is fire-and-forget on one
worker thread, each callback run as plugin code (isolated, under ``plugins.hook_timeout``, async ones
awaited). At most :data:`MAX_PENDING` events wait; an event emitted while the worker delivers one is
one level deeper, and past :data:`MAX_DEPTH` levels it is dropped (a subscriber that re-emits forever
stops there). Both drops are logged.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .untrusted import UnusableValue, plain

__all__ = ["EventBus", "MAX_DEPTH", "MAX_PENDING", "MAX_SUBSCRIPTIONS"]

_log = logging.getLogger("plugin_llm.plugins")

MAX_DEPTH = 8
MAX_PENDING = 64
#: subscriptions one plugin may hold
MAX_SUBSCRIPTIONS = 256
_MAX_NAME = 200


@dataclass(frozen=True)
class _Subscription:
    event: str
    callback: Callable[..., Any]
    plugin_key: str


@dataclass(frozen=True)
class _Envelope:
    event: str
    payload: dict[str, Any]
    subscriptions: tuple[_Subscription, ...]
    depth: int


class EventBus:
    """``run(subscription, payload)`` runs one callback (the manager: as plugin code, time-limited)."""

    def __init__(self, run: Callable[[_Subscription, dict[str, Any]], Any]) -> None:
        self._run = run
        self._subscriptions: dict[str, tuple[_Subscription, ...]] = {}  # replaced, never mutated
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Envelope] = queue.Queue(MAX_PENDING)
        self._worker: threading.Thread | None = None
        self._depth = 0  # the depth of the event being delivered (0: none)

    # --- subscriptions --------------------------------------------------------------------

    def subscribe(self, plugin_key: str, event: Any, callback: Any) -> _Subscription:
        who = f"plugin {plugin_key}: subscribe({str(event)[:60]!r})"
        if not isinstance(event, str) or not 0 < len(event.strip()) <= _MAX_NAME:
            raise ValueError(f"{who}: the event must be a non-empty name of at most {_MAX_NAME} characters")
        event = event.strip()
        namespace, sep, name = event.partition(":")
        if not sep or not namespace or not name:
            raise ValueError(f"{who}: subscribe to a fully qualified event, '<plugin>:<event>'")
        if not callable(callback):
            raise TypeError(f"{who}: callback must be callable")
        entry = _Subscription(event, callback, plugin_key)
        with self._lock:
            held = sum(1 for subs in self._subscriptions.values() for s in subs if s.plugin_key == plugin_key)
            if held >= MAX_SUBSCRIPTIONS:
                raise ValueError(f"{who}: a plugin may hold at most {MAX_SUBSCRIPTIONS} subscriptions")
            self._subscriptions = {**self._subscriptions, event: self._subscriptions.get(event, ()) + (entry,)}
        return entry

    def unsubscribe(self, entry: _Subscription) -> None:
        with self._lock:
            subs = tuple(s for s in self._subscriptions.get(entry.event, ()) if s is not entry)
            self._subscriptions = {k: v for k, v in {**self._subscriptions, entry.event: subs}.items() if v}

    def remove_plugin(self, plugin_key: str) -> None:
        with self._lock:
            kept = {k: tuple(s for s in v if s.plugin_key != plugin_key) for k, v in self._subscriptions.items()}
            self._subscriptions = {k: v for k, v in kept.items() if v}

    def clear(self) -> None:
        with self._lock:
            self._subscriptions = {}

    def subscriptions(self) -> dict[str, list[str]]:
        """Event name -> the plugins subscribed to it."""
        return {k: [s.plugin_key for s in v] for k, v in self._subscriptions.items()}

    # --- publishing -----------------------------------------------------------------------

    def emit(self, plugin_key: str, event: Any, payload: Any) -> int:
        """Queue ``<plugin_key>:<event>`` for its subscribers; how many there are (0 when it was dropped)."""
        who = f"plugin {plugin_key}: emit({str(event)[:60]!r})"
        if not isinstance(event, str) or not 0 < len(event.strip()) <= _MAX_NAME:
            raise ValueError(f"{who}: the event must be a non-empty name of at most {_MAX_NAME} characters")
        if ":" in event:
            raise ValueError(f"{who}: the event name cannot contain ':' (it is published as '{plugin_key}:<event>')")
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise TypeError(f"{who}: payload must be a dict or None, got {type(payload).__name__}")
        try:
            copied = plain(payload)
        except UnusableValue as exc:
            raise ValueError(f"{who}: the payload must be plain data: {exc}") from None
        full = f"{plugin_key}:{event.strip()}"
        subscriptions = self._subscriptions.get(full, ())
        if not subscriptions:
            return 0
        depth = self._depth + 1
        if depth > MAX_DEPTH:
            _log.warning("%s dropped: events nested deeper than %d levels (a subscriber re-emitting in a loop?)",
                         full, MAX_DEPTH)
            return 0
        try:
            self._queue.put_nowait(_Envelope(full, copied, subscriptions, depth))
        except queue.Full:
            _log.warning("%s dropped: %d events are already waiting for delivery", full, MAX_PENDING)
            return 0
        self._start()
        return len(subscriptions)

    def _start(self) -> None:
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._deliver, name="plugin-events", daemon=True)
                self._worker.start()

    def _deliver(self) -> None:
        while True:
            envelope = self._queue.get()
            self._depth = envelope.depth
            try:
                for subscription in envelope.subscriptions:
                    if subscription not in self._subscriptions.get(envelope.event, ()):
                        continue  # unsubscribed (or its plugin unloaded) meanwhile
                    try:
                        self._run(subscription, plain(envelope.payload))
                    except Exception as exc:  # the runner isolates plugin code; never let the worker die
                        _log.warning("event %s: delivery to plugin %s failed: %s", envelope.event,
                                     subscription.plugin_key, type(exc).__name__)
            finally:
                self._depth = 0
                self._queue.task_done()

    def join(self) -> None:
        """Wait until every queued event was delivered (tests, shutdown)."""
        self._queue.join()
