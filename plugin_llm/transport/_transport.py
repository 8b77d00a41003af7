"""``LitellmTransport``: one request -> one provider answer, on the fast path or through litellm.completion.

The path is chosen per route, once (:func:`plugin_llm.transport._fastpath.fast_route`).
Everything around the provider call is shared by both paths, so it behaves
the same on either: the deadline check before each attempt, one credential
per attempt (a pooled key that failed is reported and the retry takes the
next), the key held masked (:class:`Key`), failures mapped outside their
``except`` block (nothing chained), the retry policy, reading and checking the
reply, hiding the key in it, clamping token counts.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from tenacity import AsyncRetrying, Retrying

from plugin_llm.errors import PluginLlmError, PluginLlmTimeoutError
from plugin_llm.routing import Route
from plugin_llm.transport import _fallback, _fastpath
from plugin_llm.transport._errors import map_error
from plugin_llm.transport._keys import Key
from plugin_llm.transport._loading import load_litellm, loaded_litellm
from plugin_llm.transport._reply import hide_key, read_reply, usage
from plugin_llm.transport._retry import first_retry_delay, retry_kwargs
from plugin_llm.transport._types import (
    KEY_FAILURE_STATUSES,
    NO_KEY,
    CallState,
    Credential,
    TransportRequest,
    TransportResponse,
)

__all__ = ["LitellmTransport"]


class LitellmTransport:
    """Provider calls through litellm's provider layer: the fast path where it serves, else litellm.completion.

    ``fast_path=False`` sends every call through ``litellm.completion`` (as
    ``PLUGIN_LLM_FAST_PATH=0`` does for the whole process). The first attempt
    runs directly; tenacity takes over only after a retryable failure, so the
    common case pays nothing for the retry machinery.
    """

    def __init__(self, *, fast_path: bool = True) -> None:
        self.fast_path = fast_path

    def ready(self) -> bool:
        """Load litellm now (the gateway calls this before a call's first request); whether it loaded it now."""
        if loaded_litellm() is not None:
            return False
        load_litellm()
        return True

    async def aready(self) -> bool:
        """Load litellm in a worker thread: its import takes seconds and must not block the loop."""
        if loaded_litellm() is not None:
            return False
        await asyncio.to_thread(load_litellm)
        return True

    def path(self, route: Route) -> tuple[str, str]:
        """("fast" | "fallback", why) for ``route``."""
        fast = self._fast(load_litellm(), route)
        if isinstance(fast, _fastpath.FastRoute):
            return "fast", _fastpath.decide(route)[1]
        return "fallback", fast if self.fast_path else "the transport was built with fast_path=False"

    def complete(self, request: TransportRequest) -> TransportResponse:
        litellm = load_litellm()
        state = CallState()
        try:
            response = self._attempt_sync(litellm, request, state)
        except PluginLlmError as exc:
            delay = first_retry_delay(exc, request)
            if delay is None:
                raise
            response = None
        if response is None:  # retried outside the except block: no chained first failure
            time.sleep(delay)
            response = Retrying(**retry_kwargs(request))(self._attempt_sync, litellm, request, state)
        return self._response(litellm, request, response, state)

    async def acomplete(self, request: TransportRequest) -> TransportResponse:
        litellm = load_litellm()
        state = CallState()
        try:
            response = await self._attempt_async(litellm, request, state)
        except PluginLlmError as exc:
            delay = first_retry_delay(exc, request)
            if delay is None:
                raise
            response = None
        if response is None:  # retried outside the except block: no chained first failure
            await asyncio.sleep(delay)
            response = await AsyncRetrying(**retry_kwargs(request))(self._attempt_async, litellm, request, state)
        return self._response(litellm, request, response, state)

    def open_stream(self, request: TransportRequest) -> Any:
        """A streaming call, open up to its first text delta (``_stream.TransportStream``)."""
        from plugin_llm.transport._stream import open_stream

        return open_stream(self, load_litellm(), request)

    async def aopen_stream(self, request: TransportRequest) -> Any:
        """Async twin of :meth:`open_stream` (``_stream.AsyncTransportStream``)."""
        from plugin_llm.transport._stream import aopen_stream

        return await aopen_stream(self, load_litellm(), request)

    def supports_json_schema(self, route: Route) -> bool:
        """Whether the route takes ``response_format={"type": "json_schema"}``."""
        if route.supports_json_schema is not None:
            return route.supports_json_schema
        return _supports_schema(route.provider, route.model)

    # -- attempts
    def _fast(self, litellm: Any, route: Route) -> "_fastpath.FastRoute | str":
        if not self.fast_path:
            return "fast_path=False"
        return _fastpath.fast_route(litellm, route)

    @staticmethod
    def _check_deadline(request: TransportRequest, state: CallState) -> None:
        if request.deadline - time.monotonic() <= 0:
            error = PluginLlmTimeoutError(
                f"the call's deadline ({request.route.timeout:g} s) expired after {state.attempts} attempt(s)"
            )
            error.attempts = state.attempts  # type: ignore[attr-defined]
            raise error

    @staticmethod
    def _key(request: TransportRequest, state: CallState, credential: Credential) -> Key:
        route = request.route
        # keyless OpenAI-compatible endpoints get a placeholder, so litellm never takes OPENAI_API_KEY
        # from the environment for them; the real key is revealed only as an argument of the send
        keyless = NO_KEY if route.litellm_model.startswith("openai/") or route.base_url else None
        state.attempts += 1
        return Key(credential, keyless)

    def _failed(self, request: TransportRequest, state: CallState, credential: Credential, key: Key,
                exc: BaseException) -> PluginLlmError:
        error = map_error(exc, request.route, key, request.deadline)
        error.attempts = state.attempts  # type: ignore[attr-defined]  (the last one raised carries the total)
        error.provider_seconds = state.provider_seconds  # type: ignore[attr-defined]
        status = getattr(error, "status", None)
        if status in KEY_FAILURE_STATUSES:
            request.keys.report_failure(credential, status, getattr(error, "retry_after", None))
            if getattr(credential, "source", "") == "pool":
                error.retryable = True  # type: ignore[attr-defined]
                error.pooled_key_failed = True  # type: ignore[attr-defined]
        return error

    def _attempt_sync(self, litellm: Any, request: TransportRequest, state: CallState) -> tuple[Any, Key, Any]:
        self._check_deadline(request, state)
        fast = self._fast(litellm, request.route)
        credential = request.keys.acquire()
        attempt = state.attempts
        key = self._key(request, state, credential)
        if key.absent:  # no key at all: litellm's own environment lookup decides (fallback)
            fast = "no key"
        started = time.perf_counter()
        failure: BaseException | None = None
        try:
            if isinstance(fast, _fastpath.FastRoute):
                response = _fastpath.send(fast, request, key)
            else:
                response = _fallback.send(litellm, request, key, attempt)
        except Exception as exc:  # mapped below, outside the except block: nothing chained
            failure = exc
        state.provider_seconds += time.perf_counter() - started
        if failure is not None:
            error = self._failed(request, state, credential, key, failure)
            failure = None
            raise error
        request.keys.report_success(credential)
        return response, key, fast

    async def _attempt_async(self, litellm: Any, request: TransportRequest, state: CallState) -> tuple[Any, Key, Any]:
        self._check_deadline(request, state)
        fast = self._fast(litellm, request.route)
        # aacquire: a first key_cmd run happens in a thread, not on the event loop
        credential = await request.keys.aacquire()
        attempt = state.attempts
        key = self._key(request, state, credential)
        if key.absent:
            fast = "no key"
        started = time.perf_counter()
        failure: BaseException | None = None
        try:
            if isinstance(fast, _fastpath.FastRoute):
                response = await _fastpath.asend(fast, request, key)
            else:
                response = await _fallback.asend(litellm, request, key, attempt)
        except Exception as exc:  # mapped below, outside the except block: nothing chained
            failure = exc
        finally:
            state.provider_seconds += time.perf_counter() - started
        if failure is not None:
            error = self._failed(request, state, credential, key, failure)
            failure = None
            raise error
        request.keys.report_success(credential)
        return response, key, fast

    # -- result extraction
    @staticmethod
    def _response(litellm: Any, request: TransportRequest, answer: tuple[Any, Key, Any],
                  state: CallState) -> TransportResponse:
        response, key, fast = answer
        route = request.route
        anomalies: list[str] = []
        reply = hide_key(read_reply(route, response, anomalies), key)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                for call_id, name, arguments in reply.tool_calls
            ]
        operator = request.cost is not None
        if operator:
            cost = request.cost
        elif isinstance(fast, _fastpath.FastRoute):
            cost = fast.cost
        else:
            cost = functools.partial(_fallback.cost, litellm)
        return TransportResponse(
            text=reply.text,
            message=message,
            model=reply.model,
            usage=usage(route, response, anomalies, cost, operator=operator),
            attempts=state.attempts,
            provider_seconds=state.provider_seconds,
            finish_reason=reply.finish_reason,
            anomalies=tuple(anomalies),
            priced=operator,
        )


@functools.lru_cache(maxsize=256)
def _supports_schema(provider: str, model: str) -> bool:
    litellm = load_litellm()
    try:
        return bool(litellm.supports_response_schema(model=model, custom_llm_provider=provider))
    except Exception:
        return False
