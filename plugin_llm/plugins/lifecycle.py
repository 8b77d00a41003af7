"""What a plugin holds until it is unloaded: ``ctx.on_unload`` callbacks, ``ctx.spawn_task`` tasks.

Each is a :class:`PluginRegistration` in its plugin's :class:`Holdings`; unloading releases them in
reverse order of acquisition (the last acquired first). ``dispose()`` releases one early, once. A
release that raises is logged and the others still run. Imports nothing heavy: an isolated plugin's
process keeps its own ``Holdings`` (its callbacks and tasks live there).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["PluginRegistration", "Holdings", "spawn_task"]

_log = logging.getLogger("plugin_llm.plugins")


class PluginRegistration:
    """A handle on one thing a plugin acquired: ``active`` until ``dispose()`` (or the unload) releases it."""

    __slots__ = ("kind", "key", "plugin_key", "_release", "_owner", "_lock")

    def __init__(self, kind: str, key: str, plugin_key: str, release: Callable[[], Any], owner: "Holdings") -> None:
        self.kind, self.key, self.plugin_key = kind, key, plugin_key
        self._release: Callable[[], Any] | None = release
        self._owner: Holdings | None = owner
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "active" if self.active else "disposed"
        return f"PluginRegistration({self.kind} {self.key!r} of plugin {self.plugin_key!r}, {state})"

    @property
    def active(self) -> bool:
        return self._release is not None

    def discard(self) -> None:
        """No longer held, without running its release (a task that has finished)."""
        with self._lock:
            owner = self._owner
            self._release = self._owner = None
        if owner is not None:
            owner._forget(self)

    def dispose(self) -> None:
        """Release it now (idempotent); what the release raises is logged, never raised."""
        with self._lock:
            release, owner = self._release, self._owner
            self._release = self._owner = None
        if owner is not None:
            owner._forget(self)
        if release is not None:
            _run_release(self, release, owner._runner if owner is not None else None)


def _run_release(handle: PluginRegistration, release: Callable[[], Any],
                 runner: Callable[[str, Callable[[], Any]], None] | None) -> None:
    what = f"{handle.kind} {handle.key!r}"
    if runner is not None:
        runner(what, release)
        return
    try:
        release()
    except Exception as exc:
        _log.warning("plugin %s: %s raised while it was released: %s: %s", handle.plugin_key, what,
                     type(exc).__name__, str(exc)[:500])


class Holdings:
    """One plugin's registrations, in order of acquisition. ``runner(what, fn)`` runs a release (the host
    runs the plugin's code under its time limit); without one it is called and its exception logged."""

    #: the most one plugin may hold at once (each is a callback or a task kept alive)
    MAX = 4096

    def __init__(self, plugin_key: str, runner: Callable[[str, Callable[[], Any]], None] | None = None) -> None:
        self.plugin_key = plugin_key
        self._runner = runner
        self._held: list[PluginRegistration] = []
        self._lock = threading.Lock()
        self._closed = False

    def __len__(self) -> int:
        return len(self._held)

    def track(self, kind: str, key: str, release: Callable[[], Any]) -> PluginRegistration:
        handle = PluginRegistration(kind, key, self.plugin_key, release, self)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"plugin {self.plugin_key}: it is being unloaded; nothing more can be registered")
            if len(self._held) >= self.MAX:
                raise RuntimeError(f"plugin {self.plugin_key}: it holds {self.MAX} unload callbacks and tasks already; "
                                   "dispose of some first")
            self._held.append(handle)
        return handle

    def _forget(self, handle: PluginRegistration) -> None:
        with self._lock:
            try:
                self._held.remove(handle)
            except ValueError:
                pass

    def release_all(self) -> None:
        """Release everything, the last acquired first; nothing can be added afterwards."""
        with self._lock:
            self._closed = True
        while True:
            with self._lock:
                if not self._held:
                    return
                handle = self._held[-1]
            handle.dispose()


def spawn_task(holdings: Holdings, coro: Any, name: Any, default_name: str) -> Any:
    """``ctx.spawn_task``: ``coro`` as a task on the running loop, cancelled when the plugin is unloaded."""
    import asyncio  # deferred: most plugins never spawn a task

    if not asyncio.iscoroutine(coro):
        raise TypeError(f"plugin {holdings.plugin_key}: spawn_task() expects a coroutine, got {type(coro).__name__}")
    if name is not None and not isinstance(name, str):
        coro.close()
        raise TypeError(f"plugin {holdings.plugin_key}: spawn_task() name must be a string or None")
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        coro.close()
        raise RuntimeError(f"plugin {holdings.plugin_key}: spawn_task() needs a running event loop (call it from "
                           "async code)") from None
    task_name = (name or default_name)[:200]
    task = loop.create_task(coro, name=task_name)

    def cancel() -> None:
        if not task.done():
            loop.call_soon_threadsafe(task.cancel)

    try:
        handle = holdings.track("task", task_name, cancel)
    except RuntimeError:
        task.cancel()
        raise
    task.add_done_callback(lambda _t: handle.discard())
    return task
