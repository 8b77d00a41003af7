"""The pooled clients of the gateway's own OpenAI-compatible path, cheap to start.

Plain ``http://`` endpoints get an httpcore pool built without a TLS context (httpx's,
with its CA bundle, costs a first call ~50 ms and the import of httpx); ``https://`` ones
share the fast path's pool. A proxy is looked up (through aiohttp's helper, as on the fast
path) only when a proxy variable is set. Every socket operation of a sync attempt is
bounded by the call's deadline (``bound_httpcore_io``) as on the fast path.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["sync_pool", "proxy", "session", "reset", "warm_sync", "warm_async"]

_LOCK = threading.Lock()
_plain: Any = None
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "ws_proxy", "wss_proxy")


def sync_pool(url: str) -> Any:
    """The httpcore pool for ``url``'s scheme (no TLS context for ``http://``)."""
    from plugin_llm.transport import _deadline, _fastpath

    if not _deadline.IO_BOUNDED:
        _deadline.bound_httpcore_io()
    if not url.startswith("http://"):
        return _fastpath._sync_pool()
    global _plain
    if _plain is None:
        with _LOCK:
            if _plain is None:
                import httpcore

                _plain = httpcore.ConnectionPool(max_connections=None, max_keepalive_connections=64,
                                                 keepalive_expiry=5.0)
    return _plain


def warm_sync(url: str) -> bool:
    """Build the pool ``url`` takes; whether that was done now (its import: before a call's clock)."""
    from plugin_llm.transport import _fastpath

    before = _plain if url.startswith("http://") else _fastpath._pool
    sync_pool(url)
    return before is None


def warm_async() -> bool:
    """Import what the async session needs; whether that was done now."""
    import sys

    if "aiohttp" in sys.modules and "httpx" in sys.modules:
        return False
    import aiohttp  # noqa: F401
    import httpx  # noqa: F401  (the session's TLS context)

    return True


def proxy(url: str) -> Any:
    """The proxy for ``url`` as the fast path finds it, or None (without aiohttp when no proxy is set)."""
    if not any(name in os.environ or name.upper() in os.environ for name in _PROXY_VARIABLES):
        return None
    from plugin_llm.transport import _fastpath

    return _fastpath._proxy(url)


def session() -> Any:
    """This event loop's pooled aiohttp session (the fast path's)."""
    from plugin_llm.transport import _fastpath

    return _fastpath._session()


def reset() -> None:
    """Forget the pool (after fork: the child must not share the parent's connections)."""
    global _plain
    _plain = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reset)
