"""Unloading plugins: their ``on_unload`` callbacks and tasks, registrations, processes and modules.

What a plugin holds until its unload (:mod:`.lifecycle`) is released the last registered first,
each release under ``plugins.hook_timeout``; then every registration of it is removed, its process
stopped and its modules forgotten. A mixin of :class:`.manager.PluginManager`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

from .guarded import run_awaitable
from .hooks import call_limited
from .loading import STATUS_ENABLED, STATUS_NOT_ENABLED, PluginRecord, purge_modules

_log = logging.getLogger("plugin_llm.plugins")


class UnloadingMixin:
    """Unloading plugins and releasing what they hold.

    The state it uses (made by ``PluginManager.__init__``): ``_discover_lock``, ``_event_bus``, ``_holdings``,
    ``_hooks``, ``_middleware``, ``_prompt_sections``, ``_records``, ``_registry``, ``_registry_lock``.
    """

    def _unload_all(self) -> None:
        from plugin_llm.compat.hermes import finder  # on first use: the isolated child starts light

        for record in reversed(list(self._records.values())):  # the last loaded first, as Hermes does
            self._release(record)
        for record in self._records.values():
            if record.remote is not None:
                record.remote.stop()
            finder.unregister_plugin(record.key, record.candidate.path)
            if record.module_name:
                purge_modules(record.module_name)
        self._records.clear()
        with self._registry_lock:
            self._registry.clear()
            self._middleware = {}
            self._prompt_sections = {}
        if self._event_bus is not None:
            self._event_bus.clear()
        self._hooks.clear()

    def unload(self, plugin: str | None = None) -> list[str]:
        """Unload one plugin (by key or manifest name) or every loaded one: its ``on_unload`` callbacks run
        (the last registered first), its tasks are cancelled, every registration of it is removed and its
        process stopped. It is listed as not enabled until the next (forced) discovery. The keys unloaded."""
        with self._discover_lock:
            records = [r for r in self._records.values() if r.status == STATUS_ENABLED and (
                plugin is None or plugin in (r.key, r.candidate.manifest.name if r.candidate.manifest else None))]
            for record in reversed(records):
                self._unload_one(record)
            return [r.key for r in records]

    def _unload_one(self, record: PluginRecord) -> None:
        from plugin_llm.compat.hermes import finder  # on first use: the isolated child starts light

        record.status, record.note = STATUS_NOT_ENABLED, "unloaded (plugins are loaded again at the next discovery)"
        self._release(record)
        self._unregister(record.key)
        if record.remote is not None:
            record.remote.stop()
        finder.unregister_plugin(record.key, record.candidate.path)
        if record.module_name:
            purge_modules(record.module_name)
            record.module_name = None

    def _holdings_of(self, key: str) -> Any:
        """Plugin ``key``'s on_unload callbacks and tasks (created on first use)."""
        from .lifecycle import Holdings  # on first use: the isolated child starts light

        with self._registry_lock:
            holdings = self._holdings.get(key)
            if holdings is None:
                holdings = self._holdings[key] = Holdings(key, lambda what, fn: self._run_release(key, what, fn))
            return holdings

    def _run_release(self, key: str, what: str, fn: Callable[[], Any]) -> None:
        """One of a plugin's releases (its on_unload callback), under ``plugins.hook_timeout``; failures logged."""
        def release() -> None:
            result = fn()
            if result is not None and inspect.isawaitable(result):
                run_awaitable(result)

        outcome = call_limited("on_unload", key, release, self._hook_timeout())
        if outcome.error is not None:
            _log.warning("plugin %s: %s %s", key, what,
                         "did not finish in time (plugins.hook_timeout)" if outcome.timed_out
                         else f"raised while it was released: {outcome.error_text}")

    def _release(self, record: PluginRecord) -> None:
        """Run what the plugin holds until its unload: in its own process too when it runs isolated."""
        if record.remote is not None:
            record.remote.unload(self._hook_timeout())
        with self._registry_lock:
            holdings = self._holdings.pop(record.key, None)
        if holdings is not None:
            holdings.release_all()

    def _unregister(self, key: str) -> None:
        with self._registry_lock:
            holdings = self._holdings.pop(key, None)
        if holdings is not None:  # a failed register(), a failed process: its callbacks still run
            holdings.release_all()
        with self._registry_lock:
            self._registry.remove_plugin(key)
            self._middleware = {k: tuple(e for e in v if e.plugin_key != key) for k, v in self._middleware.items()}
            self._prompt_sections = {k: v for k, v in self._prompt_sections.items() if v.plugin_key != key}
        if self._event_bus is not None:
            self._event_bus.remove_plugin(key)
        self._hooks.remove_plugin(key)
