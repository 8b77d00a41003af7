"""The only module that imports litellm (lazily, on the first call).

``LitellmTransport`` turns one :class:`TransportRequest` into one provider
answer: litellm ``completion``/``acompletion`` with the route's endpoint and
the host-held key, tenacity retries inside the call's total deadline, and
every failure mapped to ``PluginLlmTimeoutError`` or
``PluginLlmProviderError`` with the secret scrubbed from the message.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import math
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception

from plugin_llm.errors import PluginLlmError, PluginLlmProviderError, PluginLlmTimeoutError
from plugin_llm.routing import Route
from plugin_llm.types import PluginLlmUsage

__all__ = ["KeySource", "TransportRequest", "TransportResponse", "LitellmTransport", "RETRY_AFTER_CAP"]

#: statuses retried (with backoff) on the same or, for pools, the next key
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})
#: statuses that cool a pooled key down (the retry uses the next healthy key)
KEY_FAILURE_STATUSES = frozenset({401, 402, 429})
RETRY_AFTER_CAP = 30.0
BACKOFF_BASE = 0.25
BACKOFF_CAP = 8.0
#: placeholder sent to keyless OpenAI-compatible endpoints, so litellm never
#: falls back to OPENAI_API_KEY from the environment for them
NO_KEY = "no-key"


class Credential(Protocol):
    source: str

    def reveal(self) -> str | None: ...


class KeySource(Protocol):
    """Where the transport gets a key for each attempt (see ``auth``)."""

    def acquire(self) -> Credential: ...
    async def aacquire(self) -> Credential: ...
    def report_failure(self, credential: Credential, status: int, retry_after: float | None = None) -> None: ...
    def report_success(self, credential: Credential) -> None: ...


@dataclass(frozen=True)
class TransportRequest:
    route: Route
    messages: list[dict]
    keys: KeySource
    deadline: float  # time.monotonic() value
    params: dict[str, Any] = field(default_factory=dict)  # temperature, max_tokens, response_format, tools


@dataclass(frozen=True)
class TransportResponse:
    text: str | None
    message: dict[str, Any]
    model: str
    usage: PluginLlmUsage
    attempts: int
    provider_seconds: float
    finish_reason: str | None = None


@dataclass
class _CallState:
    attempts: int = 0
    provider_seconds: float = 0.0


# ------------------------------------------------------------ litellm loading
_LOAD_LOCK = threading.Lock()
_litellm: Any = None


def _load_litellm() -> Any:
    """Import litellm once, offline, quiet, with the local provider registered."""
    global _litellm
    if _litellm is not None:
        return _litellm
    with _LOAD_LOCK:
        if _litellm is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm

            litellm.suppress_debug_info = True
            litellm.drop_params = True  # a provider without response_format still gets the JSON directive
            if hasattr(litellm, "telemetry"):
                litellm.telemetry = False
            _register_local_provider(litellm)
            try:
                from auth import install_log_redaction
            except ImportError:  # pragma: no cover - auth is part of the distribution
                pass
            else:
                install_log_redaction()
            _litellm = litellm
    return _litellm


def _register_local_provider(litellm: Any) -> None:
    from litellm import CustomLLM, ModelResponse

    from plugin_llm.local_model import generate

    class LocalModelHandler(CustomLLM):
        """litellm custom provider ``local``: the embedded offline model, in-process."""

        def completion(self, model, messages, *args, optional_params=None, **kwargs):  # noqa: D102
            return ModelResponse(**generate(messages, model=model, **(optional_params or {})))

        async def acompletion(self, model, messages, *args, optional_params=None, **kwargs):  # noqa: D102
            return ModelResponse(**generate(messages, model=model, **(optional_params or {})))

    entries = [e for e in litellm.custom_provider_map if e.get("provider") != "local"]
    litellm.custom_provider_map = entries + [{"provider": "local", "custom_handler": LocalModelHandler()}]


# ------------------------------------------------------------ error mapping
def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _retry_after(exc: BaseException) -> float | None:
    headers: Any = None
    for candidate in (getattr(getattr(exc, "response", None), "headers", None), getattr(exc, "litellm_response_headers", None)):
        if candidate:
            headers = candidate
            break
    if not headers:
        return None
    try:
        value = headers.get("retry-after") or headers.get("Retry-After")
    except Exception:
        return None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def _scrub(text: str, secret: str | None) -> str:
    if secret and len(secret) >= 4:
        text = text.replace(secret, "[REDACTED]")
    try:
        from auth import redact
    except ImportError:  # pragma: no cover
        return text
    return redact(text)


def _clean_message(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    for noise in ("litellm.", "OpenAIException - ", "Error_str: "):
        text = text.replace(noise, "")
    return " ".join(text.split())[:500]


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes (litellm wraps a refused connection in a 500)."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 10:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _map_error(exc: BaseException, route: Route, secret: str | None, deadline: float) -> PluginLlmError:
    chain = _chain(exc)
    names = " ".join(type(e).__name__ for e in chain)
    message = _scrub(_clean_message(exc), secret)
    if "Timeout" in names or any(isinstance(e, TimeoutError) for e in chain):
        err: PluginLlmError = PluginLlmTimeoutError(
            f"{route.provider} did not answer in time (model {route.model}): {message}"
        )
        err.retryable = time.monotonic() < deadline  # type: ignore[attr-defined]
        return err
    if "ConnectError" in names or "APIConnectionError" in names or any(isinstance(e, ConnectionError) for e in chain):
        return PluginLlmProviderError(
            f"cannot reach {route.provider} ({route.base_url or 'default endpoint'}): {message}",
            status=None, provider=route.provider, retryable=True,
        )
    status = _status_of(exc)
    retryable = status in RETRYABLE_STATUSES
    label = f"HTTP {status}" if status else type(exc).__name__
    error = PluginLlmProviderError(
        f"{route.provider} refused the call to model {route.model} ({label}): {message}",
        status=status, provider=route.provider, retryable=retryable,
    )
    error.retry_after = _retry_after(exc) if status in (429, 503) else None  # type: ignore[attr-defined]
    return error


def _attempt_timeout(route_timeout: float, remaining: float, attempt: int) -> float:
    """The timeout handed to litellm for one attempt.

    litellm caches its HTTP client per timeout value, so an exact float per
    call would cost a new client (and connection) every time. The first
    attempt uses the route's timeout (it starts within milliseconds of the
    deadline being set); retries use the remaining time rounded up to 0.1 s.
    """
    if attempt == 0 and remaining >= route_timeout - 1.0:
        return route_timeout
    return math.ceil(remaining * 10) / 10


def _should_retry(exc: BaseException) -> bool:
    return bool(getattr(exc, "retryable", False))


# ------------------------------------------------------------ retry policy
def _delay(exc: BaseException | None, attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
    if getattr(exc, "pooled_key_failed", False):
        return 0.0  # the failed key cools down (Retry-After included); the next attempt uses another key
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        return min(retry_after, RETRY_AFTER_CAP)
    backoff = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1))
    return backoff * (0.5 + random.random() / 2)  # jitter


def _first_retry_delay(exc: PluginLlmError, request: TransportRequest) -> float | None:
    """The wait before a second attempt, or None when the first failure is final."""
    if not _should_retry(exc) or request.route.max_retries < 1:
        return None
    delay = _delay(exc, 1)
    return None if time.monotonic() + delay >= request.deadline else delay


def _retry_kwargs(request: TransportRequest) -> dict[str, Any]:
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


# ------------------------------------------------------------ the transport
class LitellmTransport:
    """Provider calls through litellm; stateless apart from litellm itself.

    The first attempt runs directly; tenacity takes over only after a
    retryable failure, so the common case pays nothing for the retry machinery.
    """

    def ready(self) -> None:
        """Load litellm now (the gateway calls this before a call's clock starts)."""
        _load_litellm()

    async def aready(self) -> None:
        """Load litellm in a worker thread: its import takes seconds and must not block the loop."""
        if _litellm is None:
            await asyncio.to_thread(_load_litellm)

    def complete(self, request: TransportRequest) -> TransportResponse:
        litellm = _load_litellm()
        state = _CallState()
        try:
            response = self._attempt_sync(litellm, request, state)
        except PluginLlmError as exc:
            delay = _first_retry_delay(exc, request)
            if delay is None:
                raise
            response = None
        if response is None:  # retried outside the except block: no chained first failure
            time.sleep(delay)
            response = Retrying(**_retry_kwargs(request))(self._attempt_sync, litellm, request, state)
        return self._response(litellm, request, response, state)

    async def acomplete(self, request: TransportRequest) -> TransportResponse:
        litellm = _load_litellm()
        state = _CallState()
        try:
            response = await self._attempt_async(litellm, request, state)
        except PluginLlmError as exc:
            delay = _first_retry_delay(exc, request)
            if delay is None:
                raise
            response = None
        if response is None:  # retried outside the except block: no chained first failure
            await asyncio.sleep(delay)
            response = await AsyncRetrying(**_retry_kwargs(request))(self._attempt_async, litellm, request, state)
        return self._response(litellm, request, response, state)

    def supports_json_schema(self, route: Route) -> bool:
        """Whether the route takes ``response_format={"type": "json_schema"}``."""
        if route.supports_json_schema is not None:
            return route.supports_json_schema
        return _supports_schema(route.provider, route.model)

    # -- attempts
    @staticmethod
    def _check_deadline(request: TransportRequest, state: _CallState) -> None:
        if request.deadline - time.monotonic() <= 0:
            error = PluginLlmTimeoutError(
                f"the call's deadline ({request.route.timeout:g} s) expired after {state.attempts} attempt(s)"
            )
            error.attempts = state.attempts  # type: ignore[attr-defined]
            raise error

    def _prepare(self, request: TransportRequest, state: _CallState, credential: Credential):
        remaining = max(request.deadline - time.monotonic(), 0.001)
        secret = credential.reveal()
        kwargs: dict[str, Any] = dict(
            model=request.route.litellm_model,
            messages=request.messages,
            timeout=_attempt_timeout(request.route.timeout, remaining, state.attempts),
            max_retries=0,  # retries are ours, inside the deadline
            **{k: v for k, v in request.params.items() if v is not None},
        )
        if request.route.base_url:
            kwargs["api_base"] = request.route.base_url
        if secret:
            kwargs["api_key"] = secret
        elif request.route.litellm_model.startswith("openai/") or request.route.base_url:
            kwargs["api_key"] = NO_KEY
        state.attempts += 1
        return credential, secret, kwargs, remaining

    def _failed(self, request: TransportRequest, state: _CallState, credential: Credential, secret: str | None,
                exc: BaseException) -> PluginLlmError:
        error = _map_error(exc, request.route, secret, request.deadline)
        error.attempts = state.attempts  # type: ignore[attr-defined]  (the last one raised carries the total)
        error.provider_seconds = state.provider_seconds  # type: ignore[attr-defined]
        status = getattr(error, "status", None)
        if status in KEY_FAILURE_STATUSES:
            request.keys.report_failure(credential, status, getattr(error, "retry_after", None))
            if getattr(credential, "source", "") == "pool":
                error.retryable = True  # type: ignore[attr-defined]
                error.pooled_key_failed = True  # type: ignore[attr-defined]
        return error

    def _attempt_sync(self, litellm: Any, request: TransportRequest, state: _CallState) -> Any:
        self._check_deadline(request, state)
        credential, secret, kwargs, _ = self._prepare(request, state, request.keys.acquire())
        started = time.perf_counter()
        failure: BaseException | None = None
        try:
            response = litellm.completion(**kwargs)
        except Exception as exc:  # mapped below, outside the except block: no chained secret
            failure = exc
        finally:
            state.provider_seconds += time.perf_counter() - started
        if failure is not None:
            error = self._failed(request, state, credential, secret, failure)
            failure = None
            raise error
        request.keys.report_success(credential)
        return response

    async def _attempt_async(self, litellm: Any, request: TransportRequest, state: _CallState) -> Any:
        self._check_deadline(request, state)
        # aacquire: a first key_cmd run happens in a thread, not on the event loop
        credential, secret, kwargs, remaining = self._prepare(request, state, await request.keys.aacquire())
        started = time.perf_counter()
        failure: BaseException | None = None
        try:  # wait_for: a hard deadline even if the HTTP stack ignores its timeout
            response = await asyncio.wait_for(litellm.acompletion(**kwargs), timeout=remaining)
        except Exception as exc:
            failure = exc
        finally:
            state.provider_seconds += time.perf_counter() - started
        if failure is not None:
            error = self._failed(request, state, credential, secret, failure)
            failure = None
            raise error
        request.keys.report_success(credential)
        return response

    # -- result extraction
    @staticmethod
    def _response(litellm: Any, request: TransportRequest, response: Any, state: _CallState) -> TransportResponse:
        choice = response.choices[0]
        message = choice.message
        content = message.content
        tool_calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments or "{}"},
            }
            for call in (getattr(message, "tool_calls", None) or [])
        ]
        out_message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            out_message["tool_calls"] = tool_calls
        return TransportResponse(
            text=content,
            message=out_message,
            model=str(getattr(response, "model", None) or request.route.model),
            usage=_usage(litellm, request.route, response),
            attempts=state.attempts,
            provider_seconds=state.provider_seconds,
            finish_reason=getattr(choice, "finish_reason", None),
        )


def _usage(litellm: Any, route: Route, response: Any) -> PluginLlmUsage:
    usage = getattr(response, "usage", None)
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion = int(getattr(usage, "completion_tokens", 0) or 0)
    total = int(getattr(usage, "total_tokens", 0) or prompt + completion)
    details = getattr(usage, "prompt_tokens_details", None)
    cache_read = int(getattr(details, "cached_tokens", 0) or getattr(usage, "cache_read_input_tokens", 0) or 0)
    cache_write = int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
    return PluginLlmUsage(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=total,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        cost_usd=_cost(litellm, route, response),
    )


def _cost(litellm: Any, route: Route, response: Any) -> float | None:
    """Cost from litellm's local price map; 0 for the free local model, None when unpriced."""
    if route.provider == "local":
        return 0.0
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = hidden.get("response_cost")
    if cost is None and "response_cost" not in hidden:  # litellm already tried: unpriced
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:
            return None
    return float(cost) if cost is not None else None


@functools.lru_cache(maxsize=256)
def _supports_schema(provider: str, model: str) -> bool:
    litellm = _load_litellm()
    try:
        return bool(litellm.supports_response_schema(model=model, custom_llm_provider=provider))
    except Exception:
        return False
