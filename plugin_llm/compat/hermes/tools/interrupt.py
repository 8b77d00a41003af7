"""``tools.interrupt``: per-thread interrupt flags long-running tools poll."""

from __future__ import annotations

import threading

__all__ = ["set_interrupt", "is_interrupted", "clear_current_thread_interrupt", "clear_interrupt"]

_lock = threading.Lock()
_interrupted: set[int] = set()


def set_interrupt(active: bool, thread_id: int | None = None) -> None:
    """Mark ``thread_id`` (default: this thread) interrupted, or clear it."""
    tid = threading.get_ident() if thread_id is None else thread_id
    with _lock:
        if active:
            _interrupted.add(tid)
        else:
            _interrupted.discard(tid)


def clear_interrupt(thread_id: int | None = None) -> None:
    set_interrupt(False, thread_id)


def is_interrupted() -> bool:
    """True when the calling thread was asked to stop."""
    with _lock:
        return threading.get_ident() in _interrupted


def clear_current_thread_interrupt() -> None:
    set_interrupt(False)
