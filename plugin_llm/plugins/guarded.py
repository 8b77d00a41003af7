"""Running plugin code from host code: guarded on this thread or this loop, awaitables from sync code.

:func:`guarded` and :func:`aguarded` return ``(value, what it raised)`` and let nothing escape but
the operator's Ctrl-C (see :data:`.untrusted.SIGINT_WATCH`); :func:`run_awaitable` runs a plugin's
coroutine to completion even when this thread already runs an event loop.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .untrusted import SIGINT_WATCH

__all__ = ["guarded", "aguarded", "run_awaitable"]


def run_awaitable(awaitable: Any) -> Any:
    """Run an awaitable to completion from sync code, even if this thread runs an event loop."""

    import asyncio  # deferred: listing plugins never needs an event loop

    async def _await() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await())
    box: dict[str, Any] = {}

    def _in_thread() -> None:
        try:
            box["value"] = asyncio.run(_await())
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=_in_thread, name="plugin-await", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def guarded(fn: Callable[..., Any], *args: Any) -> tuple[Any, BaseException | None]:
    """``fn(*args)`` (plugin code, on this thread): ``(value, None)`` or ``(None, what it raised)``.

    Nothing escapes but the operator's Ctrl-C, which is re-raised even when the
    plugin swallowed it; a ``KeyboardInterrupt`` the plugin raises itself is returned.
    """
    sigint = SIGINT_WATCH.enter()
    try:
        value, error = fn(*args), None
    except BaseException as exc:
        value, error = None, exc
    finally:
        interrupted = SIGINT_WATCH.leave(sigint)
    if interrupted:
        raise KeyboardInterrupt
    return value, error


async def aguarded(awaitable: Any) -> tuple[Any, BaseException | None]:
    """:func:`guarded` for an awaitable run on this loop; the host cancelling this task propagates."""
    import asyncio

    sigint = SIGINT_WATCH.enter()
    try:
        value, error = await awaitable, None
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # a real cancellation of the host's task
            raise
        value, error = None, exc  # raised by the plugin itself
    except BaseException as exc:
        value, error = None, exc
    finally:
        interrupted = SIGINT_WATCH.leave(sigint)
    if interrupted:
        raise KeyboardInterrupt
    return value, error
