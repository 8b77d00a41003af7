"""The fallback: ``litellm.completion`` / ``acompletion`` for every route the fast path does not serve."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from plugin_llm.routing import Route
from plugin_llm.transport._deadline import IO, WORKERS, DeadlineExpired, Job, runs_inline
from plugin_llm.transport._keys import Key, provider_call
from plugin_llm.transport._reply import as_cost
from plugin_llm.transport._types import TransportRequest

__all__ = ["send", "asend", "cost"]


def _kwargs(request: TransportRequest, attempt: int) -> tuple[dict[str, Any], float]:
    remaining = max(request.deadline - time.monotonic(), 0.001)
    route = request.route
    kwargs: dict[str, Any] = dict(
        model=route.litellm_model,
        messages=request.messages,
        timeout=_attempt_timeout(route.timeout, remaining, attempt),
        max_retries=0,  # retries are ours, inside the deadline
        **{k: v for k, v in request.params.items() if v is not None},
    )
    if route.base_url:
        kwargs["api_base"] = route.base_url
    return kwargs, remaining


def _attempt_timeout(route_timeout: float, remaining: float, attempt: int) -> float:
    """The timeout handed to litellm for one attempt (0-based ``attempt``).

    litellm caches its HTTP client per timeout value, so an exact float per
    call would cost a new client (and connection) every time. The first
    attempt uses the route's timeout (it starts within milliseconds of the
    deadline being set); retries use the remaining time rounded up to 0.1 s.
    """
    if attempt == 0 and remaining >= route_timeout - 1.0:
        return route_timeout
    return math.ceil(remaining * 10) / 10


def send(litellm: Any, request: TransportRequest, key: Key, attempt: int) -> Any:
    """One sync attempt: inline when every socket operation is bounded, else on a worker thread."""
    kwargs, _ = _kwargs(request, attempt)
    if runs_inline(request.route):  # no thread hop
        outer, IO.deadline = getattr(IO, "deadline", None), request.deadline
        try:
            return provider_call(litellm.completion, kwargs, key)
        finally:
            IO.deadline = outer
    job = Job(litellm.completion, kwargs, key, request.deadline)
    try:
        if not WORKERS.run(job):  # the worker goes on until its own I/O hits the deadline; its answer is discarded
            raise DeadlineExpired(f"no reply within the call's deadline ({request.route.timeout:g} s)")
        if job.failure is not None:
            raise job.failure
        return job.response
    finally:
        job.response = job.failure = None


async def asend(litellm: Any, request: TransportRequest, key: Key, attempt: int) -> Any:
    """One async attempt; ``wait_for``: a hard deadline even if the HTTP stack ignores its timeout."""
    kwargs, remaining = _kwargs(request, attempt)
    return await asyncio.wait_for(provider_call(litellm.acompletion, kwargs, key), timeout=remaining)


def cost(litellm: Any, route: Route, response: Any, *counts: int) -> float | None:
    """Cost from litellm's local price map (computed by litellm during the call), None when unpriced."""
    hidden = getattr(response, "_hidden_params", None)
    if not isinstance(hidden, dict):
        hidden = {}
    value = hidden.get("response_cost")
    if value is None and "response_cost" not in hidden:  # litellm already tried: unpriced
        try:
            value = litellm.completion_cost(completion_response=response)
        except Exception:
            return None
    return as_cost(value)
