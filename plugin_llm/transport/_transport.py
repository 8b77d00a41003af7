"""``LitellmTransport``: one request -> one provider answer, on the gateway's own path, the fast path
or through litellm.completion.

The path is chosen per route, once: the embedded ``local`` model in process (``_local``), OpenAI
routes on the gateway's own client without litellm (``_openai.own_route``), the other
OpenAI-compatible ones on litellm's provider config (``_fastpath.fast_route``), the rest through
``litellm.completion``. litellm is imported only for a route (or a request) that needs it.
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
import os
import time
from typing import Any

from tenacity import AsyncRetrying, Retrying

from plugin_llm.config import HostConfig
from plugin_llm.errors import PluginLlmConfigError, PluginLlmError, PluginLlmTimeoutError
from plugin_llm.routing import Route, resolve_chain
from plugin_llm.transport import _fallback, _fastpath, _local, _openai
from plugin_llm.transport._errors import map_error
from plugin_llm.transport._keys import Key
from plugin_llm.transport._local import LOCAL
from plugin_llm.transport._loading import load_litellm, loaded_litellm, start_background_load
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

__all__ = ["LitellmTransport", "needs_litellm", "configured_routes", "start_background_load_for"]


#: ``PLUGIN_LLM_OWN_PATH=0`` sends OpenAI routes (and ``local``) through litellm as well
OWN_PATH_ENV = "PLUGIN_LLM_OWN_PATH"


def _own_path_off() -> bool:
    return os.environ.get(OWN_PATH_ENV, "").strip().lower() in ("0", "off", "false", "no")


class LitellmTransport:
    """Provider calls: the gateway's own path where it serves, else litellm's provider layer.

    ``fast_path=False`` sends every call through ``litellm.completion`` (as
    ``PLUGIN_LLM_FAST_PATH=0`` does for the whole process); ``own_path=False`` sends
    OpenAI routes and ``local`` through litellm too (as ``PLUGIN_LLM_OWN_PATH=0``). The
    first attempt runs directly; tenacity takes over only after a retryable failure, so
    the common case pays nothing for the retry machinery.
    """

    def __init__(self, *, fast_path: bool = True, own_path: bool = True) -> None:
        self.fast_path = fast_path
        self.own_path = own_path

    def _own(self, route: Route) -> "_openai.OwnRoute | str | None":
        """:data:`LOCAL`, the route's :class:`~plugin_llm.transport._openai.OwnRoute`, or None (litellm)."""
        if not (self.fast_path and self.own_path) or _own_path_off() or _fastpath.switched_off():
            return None
        if route.litellm_model.startswith("local/"):
            return LOCAL
        own = _openai.own_route(route)
        return own if isinstance(own, _openai.OwnRoute) else None

    def _needs_litellm(self, route: Route | None, request: TransportRequest | None) -> bool:
        if route is None:
            return True
        own = self._own(route)
        if own is None:
            return True
        return own is not LOCAL and request is not None \
            and own.prepare(request.messages, request.params) is None  # type: ignore[union-attr]

    def ready(self, route: Route | None = None, request: TransportRequest | None = None) -> bool:
        """Set up what a call on ``route`` needs before its first request (litellm's import, or the own
        path's client); whether it was done now."""
        if loaded_litellm() is not None:
            return False
        if self._needs_litellm(route, request):
            load_litellm()
            return True
        own = self._own(route) if route is not None else None
        return isinstance(own, _openai.OwnRoute) and _openai.warm(own)

    async def aready(self, route: Route | None = None, request: TransportRequest | None = None) -> bool:
        """:meth:`ready` off the event loop: imports take long and must not block the loop."""
        if loaded_litellm() is not None:
            return False
        if self._needs_litellm(route, request):
            await asyncio.to_thread(load_litellm)
            return True
        own = self._own(route) if route is not None else None
        return isinstance(own, _openai.OwnRoute) and await asyncio.to_thread(_openai.awarm)

    def path(self, route: Route) -> tuple[str, str]:
        """("own" | "local" | "fast" | "fallback", why) for ``route``."""
        own = self._own(route)
        if own is LOCAL:
            return "local", "the embedded local model, called in process"
        if own is not None:
            what = "an OpenAI" if own.provider == "openai" else f"a {own.provider}"  # type: ignore[union-attr]
            return "own", f"{what} route on the gateway's own client, without litellm"
        fast = self._fast(load_litellm(), route)
        if isinstance(fast, _fastpath.FastRoute):
            return "fast", _fastpath.decide(route)[1]
        return "fallback", fast if self.fast_path else "the transport was built with fast_path=False"

    def complete(self, request: TransportRequest) -> TransportResponse:
        own = self._own(request.route)
        litellm = load_litellm() if own is None else None
        state = CallState()
        try:
            response = self._attempt_sync(litellm, own, request, state)
        except PluginLlmError as exc:
            delay = first_retry_delay(exc, request)
            if delay is None:
                raise
            response = None
        if response is None:  # retried outside the except block: no chained first failure
            time.sleep(delay)
            response = Retrying(**retry_kwargs(request))(self._attempt_sync, litellm, own, request, state)
        return self._response(litellm, request, response, state)

    async def acomplete(self, request: TransportRequest) -> TransportResponse:
        own = self._own(request.route)
        litellm = None if own is not None else loaded_litellm() or await asyncio.to_thread(load_litellm)
        state = CallState()
        try:
            response = await self._attempt_async(litellm, own, request, state)
        except PluginLlmError as exc:
            delay = first_retry_delay(exc, request)
            if delay is None:
                raise
            response = None
        if response is None:  # retried outside the except block: no chained first failure
            await asyncio.sleep(delay)
            response = await AsyncRetrying(**retry_kwargs(request))(self._attempt_async, litellm, own, request, state)
        return self._response(litellm, request, response, state)

    def open_stream(self, request: TransportRequest) -> Any:
        """A streaming call, open up to its first text delta (``_stream.TransportStream``)."""
        from plugin_llm.transport._stream import open_stream

        own = self._own(request.route)
        return open_stream(self, load_litellm() if own is None else None, own, request)

    async def aopen_stream(self, request: TransportRequest) -> Any:
        """Async twin of :meth:`open_stream` (``_stream.AsyncTransportStream``)."""
        from plugin_llm.transport._stream import aopen_stream

        own = self._own(request.route)
        litellm = None if own is not None else loaded_litellm() or await asyncio.to_thread(load_litellm)
        return await aopen_stream(self, litellm, own, request)

    def supports_json_schema(self, route: Route) -> bool:
        """Whether the route takes ``response_format={"type": "json_schema"}``."""
        if route.supports_json_schema is not None:
            return route.supports_json_schema
        if isinstance(self._own(route), _openai.OwnRoute):
            return _openai.supports_schema(route.provider, route.model)
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

    def _attempt_sync(self, litellm: Any, own: Any, request: TransportRequest,
                      state: CallState) -> tuple[Any, Key, Any]:
        self._check_deadline(request, state)
        credential = request.keys.acquire()
        attempt = state.attempts
        key = self._key(request, state, credential)
        path = self._path_of(litellm, own, request, key)
        started = time.perf_counter()
        failure: BaseException | None = None
        try:
            if path is LOCAL:
                response = _local.complete(request.route, request.messages, request.params)
            elif isinstance(path, _openai.OwnRoute):
                response = _openai.send(path, request, key)
            elif isinstance(path, _fastpath.FastRoute):
                response = _fastpath.send(path, request, key)
            else:
                response = _fallback.send(litellm or load_litellm(), request, key, attempt)
        except Exception as exc:  # mapped below, outside the except block: nothing chained
            failure = exc
        state.provider_seconds += time.perf_counter() - started
        if failure is not None:
            error = self._failed(request, state, credential, key, failure)
            failure = None
            raise error
        request.keys.report_success(credential)
        return response, key, path

    async def _attempt_async(self, litellm: Any, own: Any, request: TransportRequest,
                             state: CallState) -> tuple[Any, Key, Any]:
        self._check_deadline(request, state)
        # aacquire: a first key_cmd run happens in a thread, not on the event loop
        credential = await request.keys.aacquire()
        attempt = state.attempts
        key = self._key(request, state, credential)
        if litellm is None and own is not LOCAL and key.absent:  # litellm's environment lookup decides
            litellm = loaded_litellm() or await asyncio.to_thread(load_litellm)
        path = self._path_of(litellm, own, request, key)
        started = time.perf_counter()
        failure: BaseException | None = None
        try:
            if path is LOCAL:
                response = _local.complete(request.route, request.messages, request.params)
            elif isinstance(path, _openai.OwnRoute):
                response = await _openai.asend(path, request, key)
            elif isinstance(path, _fastpath.FastRoute):
                response = await _fastpath.asend(path, request, key)
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
        return response, key, path

    def _path_of(self, litellm: Any, own: Any, request: TransportRequest, key: Key) -> Any:
        """This attempt's path: :data:`LOCAL`, an own route, a fast route, or a reason (the fallback)."""
        if own is LOCAL:
            return LOCAL
        if key.absent:  # no key at all: litellm's own environment lookup decides (fallback)
            return "no key"
        if own is not None:
            return own
        return self._fast(litellm, request.route)

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
        elif isinstance(fast, (_fastpath.FastRoute, _openai.OwnRoute)):
            cost = fast.cost
        elif fast is LOCAL:
            cost = _unpriced  # (usage() prices the local model at 0)
        else:
            cost = functools.partial(_fallback.cost, litellm or load_litellm())
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
            response_id=reply.response_id,
        )


def _unpriced(*args: Any) -> None:
    return None


def needs_litellm(route: Route) -> bool:
    """Whether calls on ``route`` load litellm (its translation needs it), decided without importing it:
    not for the ``local`` model or a route the own path serves (a request the own path hands on may still)."""
    return LitellmTransport()._needs_litellm(route, None)


def configured_routes(config: HostConfig) -> tuple[Route, ...]:
    """The routes ``config`` sends a host's calls to: the default route and its fallbacks, and each
    auxiliary task's (a route that cannot be resolved is left out: its call reports why)."""
    routes: list[Route] = []
    for task in (None, *sorted(config.auxiliary)):
        try:
            routes.extend(resolve_chain(config, task=task))
        except PluginLlmConfigError:
            continue
    return tuple(routes)


def start_background_load_for(config: HostConfig) -> bool:
    """Start litellm's import on a daemon thread when a route ``config`` selects needs it
    (:func:`configured_routes`, :func:`needs_litellm`); whether one does."""
    if not any(needs_litellm(route) for route in configured_routes(config)):
        return False
    start_background_load()
    return True


@functools.lru_cache(maxsize=256)
def _supports_schema(provider: str, model: str) -> bool:
    litellm = load_litellm()
    try:
        return bool(litellm.supports_response_schema(model=model, custom_llm_provider=provider))
    except Exception:
        return False
