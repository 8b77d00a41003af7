"""Hang guards: a call that must end because a deadline or time limit stops it.

``run_bounded(fn, seconds)`` runs ``fn`` on a daemon thread and fails the test if
it is still running after ``seconds`` (a limit far above the deadline under test:
it catches a hang, it does not measure speed). Returns ``fn``'s result or
re-raises its exception in the test's thread.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

__all__ = ["run_bounded"]


def run_bounded(fn: Callable[[], Any], seconds: float) -> Any:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # re-raised below, in the test's thread
            outcome["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name="bounded-call")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"still running after {seconds:g} s: the deadline or time limit did not stop it")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
