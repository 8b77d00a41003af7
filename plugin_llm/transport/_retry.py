"""The retry policy: which failures are retried, how long to wait, when to stop (inside the deadline)."""

from __future__ import annotations

import random
import time
from typing import Any

from tenacity import RetryCallState, retry_if_exception

from plugin_llm.errors import PluginLlmError
from plugin_llm.transport._types import BACKOFF_BASE, BACKOFF_CAP, RETRY_AFTER_CAP, TransportRequest

__all__ = ["first_retry_delay", "retry_kwargs"]


def _should_retry(exc: BaseException) -> bool:
    return bool(getattr(exc, "retryable", False))


def _delay(exc: BaseException | None, attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
    if getattr(exc, "pooled_key_failed", False):
        return 0.0  # the failed key cools down (Retry-After included); the next attempt uses another key
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        return min(retry_after, RETRY_AFTER_CAP)
    backoff = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1))
    return backoff * (0.5 + random.random() / 2)  # jitter


def first_retry_delay(exc: PluginLlmError, request: TransportRequest) -> float | None:
    """The wait before a second attempt, or None when the first failure is final."""
    if not _should_retry(exc) or request.route.max_retries < 1:
        return None
    delay = _delay(exc, 1)
    return None if time.monotonic() + delay >= request.deadline else delay


def retry_kwargs(request: TransportRequest) -> dict[str, Any]:
    """tenacity policy for attempts 2..max_retries+1 (attempt 1 ran outside tenacity)."""
    max_more = request.route.max_retries  # attempts left after the first

    def wait(retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        return _delay(exc, retry_state.attempt_number + 1)

    def stop(retry_state: RetryCallState) -> bool:
        if retry_state.attempt_number >= max_more:
            return True
        return time.monotonic() + (retry_state.upcoming_sleep or 0.0) >= request.deadline

    return dict(stop=stop, wait=wait, retry=retry_if_exception(_should_retry), reraise=True)
