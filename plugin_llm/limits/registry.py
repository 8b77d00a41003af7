"""The process-wide limits stores: one per SQLite file or Redis URL, opened on first use.

:func:`store_for` finds (or opens) the store of a config's ``limits:`` section and home;
:func:`close_stores` closes them all (tests, shutdown), and tells the caches that remember a
store (:func:`on_close`) to forget it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable

from plugin_llm.limits.settings import LimitSettings
from plugin_llm.limits.store import LimitStore

__all__ = ["store_for", "close_stores", "on_close"]

_STORES: dict[tuple[Any, ...], LimitStore] = {}
_STORES_LOCK = threading.Lock()
#: what :func:`close_stores` calls, under its lock, once the stores are forgotten (caches of them)
_ON_CLOSE: list[Callable[[], None]] = []


def store_for(settings: LimitSettings, home: Path | str) -> LimitStore:
    """The process-wide store for these settings (one per SQLite file / Redis URL); opened lazily."""
    last = _LAST
    if last is not None and last[0] is settings and last[1] is home:
        return last[2]
    identity = settings.store_identity()
    key = identity + ((os.fspath(home),) if identity[0] == "local" else ())
    store = _STORES.get(key)
    if store is not None:
        _remember(settings, home, store)
        return store
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            if settings.store == "redis":
                from plugin_llm.limits.redis_store import RedisStore

                store = RedisStore(settings.redis_url, prefix=settings.redis_key_prefix, timeout=settings.store_timeout)
            else:
                from plugin_llm.limits.local import DB_NAME, LocalStore

                store = LocalStore(Path(home) / DB_NAME, timeout=settings.store_timeout)
            _STORES[key] = store
    _remember(settings, home, store)
    return store


_LAST: tuple[LimitSettings, Any, LimitStore] | None = None  # the last lookup: nearly every call repeats it


def _remember(settings: LimitSettings, home: Any, store: LimitStore) -> None:
    global _LAST
    _LAST = (settings, home, store)


def on_close(forget: Callable[[], None]) -> None:
    """Have :func:`close_stores` call ``forget`` (a cache that remembers a store drops it)."""
    _ON_CLOSE.append(forget)


def close_stores() -> None:
    """Close every open store (tests, shutdown)."""
    global _LAST
    with _STORES_LOCK:
        stores = list(_STORES.values())
        _STORES.clear()
        _LAST = None
        for forget in _ON_CLOSE:
            forget()
    for store in stores:
        try:
            store.close()
        except Exception:  # closing is best effort
            pass
