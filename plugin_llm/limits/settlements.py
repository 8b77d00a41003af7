"""Settlements queued by a store, applied with its next admission or by a background flush.

A store's ``settle_later`` puts a settlement in its :class:`SettlementQueue`: it rides along in
the same transaction (or round trip) as the next admission, or a background thread applies it
after :data:`FLUSH_DELAY`. A forked child starts with empty queues; at exit, what is queued is
applied.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable

from plugin_llm.limits.counts import StoreError

__all__ = ["SettlementQueue", "FLUSH_DELAY"]

_log = logging.getLogger("plugin_llm.limits")

#: how long a queued settlement may wait for the next admission before the background flush
FLUSH_DELAY = 0.005


class SettlementQueue:
    """Settlements waiting to ride along with the next admission (one store operation per call
    instead of two), with a background thread that applies them after :data:`FLUSH_DELAY` when
    no admission comes. ``apply(items, timeout)`` is the store's batch settle; it may raise
    :class:`StoreError`, after which the store decides (``put_back`` when nothing was applied)."""

    def __init__(self, apply: Callable[[list[Any], float], None], name: str, timeout: float) -> None:
        self._apply = apply
        self._name = name
        self._timeout = timeout
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle = True  # the flusher waits for a wake-up (False while it polls)
        self._pid = os.getpid()
        _QUEUES.add(self)

    def _reset_after_fork(self) -> None:
        # the parent's queued settlements are the parent's to apply; this process starts empty
        self._lock = threading.Lock()
        self._items = []
        self._wake = threading.Event()
        self._thread = None
        self._idle = True
        self._pid = os.getpid()

    def add(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"plugin-llm-limits-{self._name}", daemon=True)
                self._thread.start()
            idle = self._idle
        if idle:  # only a waiting flusher needs a wake-up (Event.set is many Python calls and a thread switch)
            self._wake.set()

    def take(self) -> list[Any]:
        if not self._items:  # the common case needs no lock: a racing add is taken next time
            return []
        with self._lock:
            items, self._items = self._items, []
        return items

    def put_back(self, items: list[Any]) -> None:
        """Return settlements a failed operation did not apply (they go first, in order)."""
        if items:
            with self._lock:
                self._items[:0] = items
                idle = self._idle
            if idle:
                self._wake.set()

    def flush(self, timeout: float | None = None) -> None:
        items = self.take()
        if items:
            self._apply(items, self._timeout if timeout is None else timeout)

    def _run(self) -> None:
        logged = -1e9
        while True:
            with self._lock:
                self._idle = not self._items
                if self._idle:
                    self._wake.clear()
            if self._idle:
                self._wake.wait()
                self._idle = False
            time.sleep(FLUSH_DELAY)  # an admission in the meantime takes the items with it
            try:
                self.flush()
            except StoreError as exc:
                if time.monotonic() - logged >= 60.0:  # the store is down: say so once a minute, retry each second
                    logged = time.monotonic()
                    _log.error("limits: %s store: queued settlements not applied yet (retrying): %s", self._name, exc)
                time.sleep(1.0)
            except Exception:  # noqa: BLE001 - the flusher must survive a store defect
                _log.exception("limits: %s store: flushing settlements failed", self._name)


_QUEUES: "weakref.WeakSet[SettlementQueue]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for queue in list(_QUEUES):
        queue._reset_after_fork()


def _flush_at_exit() -> None:
    for queue in list(_QUEUES):
        if queue._pid == os.getpid():
            try:
                queue.flush()
            except Exception:  # noqa: BLE001 - at exit, log and go
                _log.exception("limits: settlements not applied at exit")


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_flush_at_exit)
