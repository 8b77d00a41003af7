"""The only module that imports litellm (lazily, on the first call).

``LitellmTransport`` turns one :class:`TransportRequest` into one provider
answer: litellm ``completion``/``acompletion`` with the route's endpoint and
the host-held key, tenacity retries inside the call's total deadline, and
every failure mapped to ``PluginLlmTimeoutError`` or
``PluginLlmProviderError`` with the secret scrubbed from the message.

Hardening (issue 9):

* **The key is never a local variable of a frame a plugin can see.** It is
  revealed only as the last argument of the provider call
  (:func:`_provider_call`); the transport's frames hold a :class:`_Key`
  whose repr is masked. Provider exceptions (whose litellm frames do hold
  the key) are mapped outside their ``except`` block and dropped, so the
  error a plugin gets has no ``__cause__``/``__context__`` leading to them.
* **The total deadline holds on every path**, whatever the server does (a
  server that trickles its body one byte at a time keeps httpx's per-read
  timeout happy for ever). While an attempt runs, every httpcore socket
  operation of its thread (connect, TLS handshake, each read and write) gets
  at most the time left before the deadline (:func:`_bound_httpcore_io`).
  That alone bounds a sync attempt to a provider litellm reaches only
  through httpx (:data:`INLINE_PROVIDERS`), which therefore runs inline, on
  the caller's thread. Any other provider (cloud SDK credential refreshes,
  boto3, polling loops, host-registered handlers) runs on a worker thread
  and the caller stops waiting at the deadline; a late answer is discarded,
  and the abandoned attempt's own httpx I/O stops at the deadline. The
  embedded ``local`` provider runs in process, inline. Async attempts are
  bounded by ``asyncio.wait_for``.
* **Replies are checked**: a reply without choices or with fields of the
  wrong type is a ``PluginLlmProviderError`` ("sent a malformed reply"),
  never an ``IndexError``; token counts are clamped to ``0..MAX_TOKENS`` with
  the anomaly recorded in :attr:`TransportResponse.anomalies`; the key just
  sent (and every loaded secret) is hidden in the reply's text, tool-call
  arguments and model name.
* **Error text is redacted before it is cut** to :data:`MESSAGE_LIMIT`
  characters, and a key cut off at the end is hidden too.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import functools
import json
import math
import os
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception

from plugin_llm.errors import PluginLlmError, PluginLlmProviderError, PluginLlmTimeoutError
from plugin_llm.routing import Route
from plugin_llm.types import PluginLlmUsage

__all__ = [
    "KeySource", "TransportRequest", "TransportResponse", "LitellmTransport", "RETRY_AFTER_CAP", "MAX_TOKENS",
    "INLINE_PROVIDERS",
]

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
#: provider error text kept in an exception message (after redaction)
MESSAGE_LIMIT = 500
#: token counts above this are provider nonsense: clamped, and recorded as an anomaly
MAX_TOKENS = 10**9
#: a reported model name longer than this is cut (it goes into every audit line)
MODEL_NAME_LIMIT = 200
#: litellm providers whose sync calls do all their I/O through httpx with the key
#: we pass (no SDK credentials, no sleeps between polls): with every socket
#: operation bounded by the deadline, an attempt to them runs on the caller's
#: thread. Any provider not listed runs on a worker thread (always safe, a
#: little slower). ``local`` is the embedded model: in process, no I/O.
INLINE_PROVIDERS = frozenset({
    "local", "openai", "openrouter", "anthropic", "gemini", "groq", "mistral", "codestral", "deepseek",
    "together_ai", "perplexity", "fireworks_ai", "deepinfra", "cerebras", "sambanova", "nvidia_nim",
    "moonshot", "nebius", "hyperbolic", "dashscope", "cohere", "cohere_chat", "ollama", "ollama_chat",
    "lm_studio", "llamafile", "hosted_vllm", "litellm_proxy",
})


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
    #: what was wrong with the reply but survivable (a clamped token count, a
    #: non-string model name): short, bounded sentences, never the raw values
    anomalies: tuple[str, ...] = ()


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
            _bound_httpcore_io()
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


# ------------------------------------------------------------ the key and the provider call
class _Key:
    """One attempt's key, as the transport's frames hold it: masked in every repr.

    The secret itself is produced only by :meth:`reveal`, called as the
    argument of the provider call (:func:`_provider_call`) or of a redaction
    call, so it is never the value of a local variable in a frame that a
    traceback (``capture_locals``, ``pytest -l``, an error reporter) could show.
    """

    __slots__ = ("_credential", "_placeholder", "absent")

    def __init__(self, credential: Credential, placeholder: str | None) -> None:
        self._credential = credential
        self._placeholder = placeholder
        self.absent = placeholder is None and not credential.reveal()

    def reveal(self) -> str | None:
        return self._credential.reveal() or self._placeholder

    def secret(self) -> str | None:
        """The real key (never the keyless placeholder), for redaction."""
        return self._credential.reveal()

    def __repr__(self) -> str:
        return "<key>"

    __str__ = __repr__

    def __reduce__(self):  # noqa: D105
        raise TypeError("keys cannot be pickled")


def _provider_call(fn: Any, kwargs: dict[str, Any], key: _Key) -> Any:
    """``fn(**kwargs)`` with the key added as an argument: no frame of ours holds it in a local."""
    if key.absent:
        return fn(**kwargs)
    return fn(**kwargs, api_key=key.reveal())


class _DeadlineExpired(TimeoutError):
    """The caller stopped waiting for a sync attempt at the call's deadline."""


class _Job:
    """One sync attempt handed to a worker thread."""

    __slots__ = ("fn", "kwargs", "key", "deadline", "context", "done", "response", "failure")

    def __init__(self, fn: Any, kwargs: dict[str, Any], key: _Key, deadline: float) -> None:
        self.fn, self.kwargs, self.key, self.deadline = fn, kwargs, key, deadline
        self.context = contextvars.copy_context()
        self.done = threading.Lock()
        self.done.acquire()
        self.response: Any = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        _IO.deadline = self.deadline  # a worker thread runs one attempt at a time
        try:
            if time.monotonic() >= self.deadline:  # a job that waited past its deadline is not started
                self.failure = _DeadlineExpired("the call's deadline passed before the attempt could start")
            else:
                self.response = self.context.run(_provider_call, self.fn, self.kwargs, self.key)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which maps it
            self.failure = exc
        finally:
            _IO.deadline = None
            self.fn = self.kwargs = self.context = None  # an abandoned job keeps nothing alive
            self.done.release()


class _Workers:
    """Daemon threads that run sync attempts, so that the caller can stop waiting at the deadline.

    Threads are reused (a thread start costs more than a hand-over), started
    when none is idle (an attempt never queues behind a stuck one) and leave
    after :attr:`idle_seconds` without work. Daemon threads: an attempt
    abandoned at its deadline never holds up interpreter exit.
    """

    idle_seconds = 30.0

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work that no submitter has claimed yet

    def run(self, job: _Job) -> bool:
        """Run ``job`` on a worker; True when it finished before its deadline."""
        with self._lock:
            claimed = self._idle > 0
            if claimed:
                self._idle -= 1
        self._queue.put(job)
        if not claimed:
            threading.Thread(target=self._loop, name="plugin-llm-attempt", daemon=True).start()
        return job.done.acquire(timeout=max(job.deadline - time.monotonic(), 0.0))

    def _loop(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # no submitter counts on this thread: leave
                        self._idle -= 1
                        return
                continue  # a submitter claimed an idle thread: its job is on the way
            job.run()
            job = None  # type: ignore[assignment]
            with self._lock:
                self._idle += 1


_WORKERS = _Workers()

#: ``_IO.deadline``: the monotonic deadline of the attempt running on this thread, if any
_IO = threading.local()
_IO_BOUNDED = False  # whether _bound_httpcore_io found httpcore's sync backend


def _bound_httpcore_io() -> None:
    """Bound every httpcore sync socket operation of a thread running an attempt by its deadline.

    httpx's timeouts are per operation: a server that sends one byte every
    0.2 s never trips a read timeout. On a thread running an attempt
    (``_IO.deadline`` set) each read, write, connect and TLS handshake gets
    at most the time left, and fails with httpcore's own timeout error once
    the deadline has passed, which litellm maps to a Timeout for every
    provider it reaches through httpx. Other threads, and the process's
    other httpx users, are not affected. If httpcore's layout differs from
    the one known here, nothing is patched and every network attempt runs on
    a worker thread: the caller's deadline still holds, only an abandoned
    attempt may then run on until the provider's stack gives up.
    """
    global _IO_BOUNDED
    try:
        import httpcore
        from httpcore._backends import sync as backend
    except ImportError:  # pragma: no cover - litellm always brings httpx/httpcore
        return
    targets = (
        (getattr(backend, "SyncStream", None), "read", 1, httpcore.ReadTimeout),
        (getattr(backend, "SyncStream", None), "write", 1, httpcore.WriteTimeout),
        (getattr(backend, "SyncStream", None), "start_tls", 2, httpcore.ConnectTimeout),
        (getattr(backend, "TLSinTLSStream", None), "read", 1, httpcore.ReadTimeout),
        (getattr(backend, "TLSinTLSStream", None), "write", 1, httpcore.WriteTimeout),
        (getattr(backend, "SyncBackend", None), "connect_tcp", 2, httpcore.ConnectTimeout),
    )
    if any(cls is None or not callable(getattr(cls, name, None)) for cls, name, _, _ in targets):
        return
    for cls, name, position, expired in targets:
        original = getattr(cls, name)
        if not getattr(original, "_plugin_llm_bounded", False):
            setattr(cls, name, _bounded(original, position, expired))
    _IO_BOUNDED = True


def _bounded(original: Any, position: int, expired: type[Exception]) -> Any:
    """``original`` with its ``timeout`` argument (keyword, or positional at ``position``) capped."""

    @functools.wraps(original)
    def bounded(self: Any, *args: Any, **kwargs: Any) -> Any:
        deadline = getattr(_IO, "deadline", None)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise expired("the call's total deadline passed")
            if len(args) > position:
                timeout = args[position]
                if timeout is None or timeout > left:
                    args = (*args[:position], left, *args[position + 1:])
            else:
                timeout = kwargs.get("timeout")
                if timeout is None or timeout > left:
                    kwargs["timeout"] = left
        return original(self, *args, **kwargs)

    bounded._plugin_llm_bounded = True  # type: ignore[attr-defined]
    return bounded


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


def _clean_message(exc: BaseException, key: _Key | None) -> str:
    """The provider's error text for a message: redacted (the key just sent included), *then* cut."""
    from auth.redaction import redact_clipped

    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    for noise in ("litellm.", "OpenAIException - ", "Error_str: "):
        text = text.replace(noise, "")
    return redact_clipped(" ".join(text.split()), MESSAGE_LIMIT, key.secret() if key is not None else None)


#: litellm's words for a 2xx reply it could not turn into a chat completion -> what was wrong
_MALFORMED_MARKERS = (
    ("provider returned a response with no 'choices'", "no choices"),
    ("provider returned 'choices' that is not a list", "'choices' is not a list"),
    ("Empty or invalid response from LLM endpoint", "the body is not a chat completion"),
    ("Invalid response object", "the reply does not have the chat-completion shape"),
)


def _malformed_reason(exc: BaseException, chain: list[BaseException]) -> str | None:
    """Why a reply that arrived could not be read, or None when ``exc`` is not about that.

    litellm reports an unreadable 2xx reply as an HTTP 500 of its own; a real
    HTTP error response always has an ``httpx.HTTPStatusError`` in the chain.
    """
    names = {type(e).__name__ for e in chain}
    if "HTTPStatusError" in names or "APIConnectionError" in names:
        return None
    text = str(getattr(exc, "message", None) or exc)
    for marker, reason in _MALFORMED_MARKERS:
        if marker in text:
            return reason
    if "JSONDecodeError" in names:
        return "the body is not valid JSON"
    return None


def _malformed(route: Route, reason: str) -> PluginLlmProviderError:
    return PluginLlmProviderError(
        f"{route.provider} sent a malformed reply (model {route.model}): {reason}",
        status=None, provider=route.provider, retryable=False,
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes (litellm wraps a refused connection in a 500)."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 10:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _map_error(exc: BaseException, route: Route, key: _Key | None, deadline: float) -> PluginLlmError:
    chain = _chain(exc)
    reason = _malformed_reason(exc, chain)
    if reason is not None:
        return _malformed(route, reason)
    names = " ".join(type(e).__name__ for e in chain)
    message = _clean_message(exc, key)
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
        route = request.route
        kwargs: dict[str, Any] = dict(
            model=route.litellm_model,
            messages=request.messages,
            timeout=_attempt_timeout(route.timeout, remaining, state.attempts),
            max_retries=0,  # retries are ours, inside the deadline
            **{k: v for k, v in request.params.items() if v is not None},
        )
        if route.base_url:
            kwargs["api_base"] = route.base_url
        # keyless OpenAI-compatible endpoints get a placeholder; the real key is added by _provider_call
        keyless = NO_KEY if route.litellm_model.startswith("openai/") or route.base_url else None
        state.attempts += 1
        return _Key(credential, keyless), kwargs, remaining

    def _failed(self, request: TransportRequest, state: _CallState, credential: Credential, key: _Key,
                exc: BaseException) -> PluginLlmError:
        error = _map_error(exc, request.route, key, request.deadline)
        error.attempts = state.attempts  # type: ignore[attr-defined]  (the last one raised carries the total)
        error.provider_seconds = state.provider_seconds  # type: ignore[attr-defined]
        status = getattr(error, "status", None)
        if status in KEY_FAILURE_STATUSES:
            request.keys.report_failure(credential, status, getattr(error, "retry_after", None))
            if getattr(credential, "source", "") == "pool":
                error.retryable = True  # type: ignore[attr-defined]
                error.pooled_key_failed = True  # type: ignore[attr-defined]
        return error

    def _attempt_sync(self, litellm: Any, request: TransportRequest, state: _CallState) -> tuple[Any, _Key]:
        self._check_deadline(request, state)
        credential = request.keys.acquire()
        key, kwargs, _ = self._prepare(request, state, credential)
        started = time.perf_counter()
        if _runs_inline(request.route):  # every socket operation bounded by the deadline: no thread hop
            job = None
            failure: BaseException | None = None
            outer, _IO.deadline = getattr(_IO, "deadline", None), request.deadline
            try:
                response = _provider_call(litellm.completion, kwargs, key)
            except Exception as exc:  # mapped below, outside the except block: nothing chained
                failure = exc
            finally:
                _IO.deadline = outer
        else:
            job = _Job(litellm.completion, kwargs, key, request.deadline)
            if _WORKERS.run(job):
                response, failure = job.response, job.failure
            else:  # the worker goes on until its own I/O hits the deadline; its answer is discarded
                response, failure = None, _DeadlineExpired(
                    f"no reply within the call's deadline ({request.route.timeout:g} s)"
                )
            job.response = job.failure = None
        state.provider_seconds += time.perf_counter() - started
        if failure is not None:
            error = self._failed(request, state, credential, key, failure)
            failure = job = None
            raise error
        request.keys.report_success(credential)
        return response, key

    async def _attempt_async(self, litellm: Any, request: TransportRequest, state: _CallState) -> tuple[Any, _Key]:
        self._check_deadline(request, state)
        # aacquire: a first key_cmd run happens in a thread, not on the event loop
        credential = await request.keys.aacquire()
        key, kwargs, remaining = self._prepare(request, state, credential)
        started = time.perf_counter()
        failure: BaseException | None = None
        try:  # wait_for: a hard deadline even if the HTTP stack ignores its timeout
            response = await asyncio.wait_for(_provider_call(litellm.acompletion, kwargs, key), timeout=remaining)
        except Exception as exc:  # mapped below, outside the except block: nothing chained
            failure = exc
        finally:
            state.provider_seconds += time.perf_counter() - started
        if failure is not None:
            error = self._failed(request, state, credential, key, failure)
            failure = None
            raise error
        request.keys.report_success(credential)
        return response, key

    # -- result extraction
    @staticmethod
    def _response(litellm: Any, request: TransportRequest, answer: tuple[Any, _Key], state: _CallState) -> TransportResponse:
        response, key = answer
        route = request.route
        anomalies: list[str] = []
        reply = _read_reply(route, response, anomalies)
        reply = _hide_key(reply, key)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                for call_id, name, arguments in reply.tool_calls
            ]
        usage = _usage(litellm, route, response, anomalies)
        return TransportResponse(
            text=reply.text,
            message=message,
            model=reply.model,
            usage=usage,
            attempts=state.attempts,
            provider_seconds=state.provider_seconds,
            finish_reason=reply.finish_reason,
            anomalies=tuple(anomalies),
        )


def _runs_inline(route: Route) -> bool:
    """Whether a sync attempt on ``route`` runs on the caller's thread (see :data:`INLINE_PROVIDERS`)."""
    provider = route.litellm_model.split("/", 1)[0]
    return provider == "local" or (_IO_BOUNDED and provider in INLINE_PROVIDERS)


# ------------------------------------------------------------ reading a reply
@dataclass(frozen=True)
class _Reply:
    """The parts of a chat completion the gateway uses, type-checked."""

    text: str | None
    tool_calls: tuple[tuple[str, str, str], ...]  # (id, name, arguments JSON text)
    model: str
    finish_reason: str | None

    def map(self, fn: Any) -> "_Reply":
        """Apply ``fn`` to every provider-written string."""
        return _Reply(
            text=fn(self.text) if self.text else self.text,
            tool_calls=tuple((fn(i), fn(n), fn(a)) for i, n, a in self.tool_calls),
            model=fn(self.model),
            finish_reason=self.finish_reason,
        )


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]`` (litellm objects are both), None when absent."""
    if isinstance(obj, dict):
        return obj.get(name)
    try:
        return getattr(obj, name, None)
    except Exception:  # a property that fails on nonsense input
        return None


def _read_reply(route: Route, response: Any, anomalies: list[str]) -> _Reply:
    """Check the reply's shape; :class:`PluginLlmProviderError` ("malformed reply") when unusable."""
    choices = _field(response, "choices")
    if choices is None or (isinstance(choices, (list, tuple)) and not choices):
        raise _malformed(route, "no choices")
    if not isinstance(choices, (list, tuple)):
        raise _malformed(route, f"'choices' is a {type(choices).__name__}, not a list")
    choice = choices[0]
    message = _field(choice, "message")
    if message is None:
        raise _malformed(route, "the first choice has no message")
    content = _field(message, "content")
    if content is not None and not isinstance(content, str):
        raise _malformed(route, f"the message content is a {type(content).__name__}, not text")
    raw_calls = _field(message, "tool_calls")
    if raw_calls is not None and not isinstance(raw_calls, (list, tuple)):
        raise _malformed(route, f"'tool_calls' is a {type(raw_calls).__name__}, not a list")
    calls = []
    for i, call in enumerate(raw_calls or ()):
        function = _field(call, "function")
        name = _field(function, "name") if function is not None else None
        if not isinstance(name, str) or not name:
            raise _malformed(route, f"tool call {i} has no function name")
        arguments = _field(function, "arguments")
        if arguments is None or arguments == "":
            arguments = "{}"
        elif isinstance(arguments, dict):
            arguments = json.dumps(arguments)
        elif not isinstance(arguments, str):
            raise _malformed(route, f"tool call {i} has arguments of type {type(arguments).__name__}, not JSON text")
        call_id = _field(call, "id")
        if call_id is None:
            call_id = f"call_{i}"
        elif not isinstance(call_id, str):
            raise _malformed(route, f"tool call {i} has an id of type {type(call_id).__name__}, not a string")
        calls.append((call_id, name, arguments))
    finish = _field(choice, "finish_reason")
    if finish is not None and not isinstance(finish, str):
        anomalies.append(f"finish_reason was a {type(finish).__name__}, not a string; recorded as none")
        finish = None
    model = _field(response, "model")
    if not model:
        model = route.model
    elif not isinstance(model, str):
        anomalies.append(f"the reported model was a {type(model).__name__}, not a string; recorded as {route.model}")
        model = route.model
    elif len(model) > MODEL_NAME_LIMIT:
        anomalies.append(f"the reported model name had {len(model)} characters; cut to {MODEL_NAME_LIMIT}")
        model = model[:MODEL_NAME_LIMIT]
    return _Reply(content, tuple(calls), model, finish)


def _hide_key(reply: _Reply, key: _Key) -> _Reply:
    """The reply with the key just sent (and every loaded secret) hidden: a reply may echo the request."""
    from auth.redaction import redact_secrets

    return reply.map(lambda text: redact_secrets(text, key.secret()))


def _count(value: Any, name: str, anomalies: list[str]) -> int:
    """A token count as a bounded non-negative int; anything else is recorded and counted as 0 or the cap."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        anomalies.append(f"usage.{name} was a {type(value).__name__}, not a number; counted as 0")
        return 0
    if isinstance(value, float):
        if not math.isfinite(value):
            anomalies.append(f"usage.{name} was not a finite number; counted as 0")
            return 0
        value = int(value)
    if value < 0:
        anomalies.append(f"usage.{name} was negative; counted as 0")
        return 0
    if value > MAX_TOKENS:
        digits = int(value.bit_length() * 0.30103) + 1  # str() of a huge int is slow, or refused
        anomalies.append(f"usage.{name} was out of range (about {digits} digits); counted as {MAX_TOKENS}")
        return MAX_TOKENS
    return value


def _usage(litellm: Any, route: Route, response: Any, anomalies: list[str] | None = None) -> PluginLlmUsage:
    anomalies = [] if anomalies is None else anomalies
    usage = _field(response, "usage")
    prompt = _count(_field(usage, "prompt_tokens"), "prompt_tokens", anomalies)
    completion = _count(_field(usage, "completion_tokens"), "completion_tokens", anomalies)
    total = _count(_field(usage, "total_tokens"), "total_tokens", anomalies) or min(prompt + completion, MAX_TOKENS)
    details = _field(usage, "prompt_tokens_details")
    cache_read = _count(_field(details, "cached_tokens"), "prompt_tokens_details.cached_tokens", anomalies) \
        or _count(_field(usage, "cache_read_input_tokens"), "cache_read_input_tokens", anomalies)
    cache_write = _count(_field(usage, "cache_creation_input_tokens"), "cache_creation_input_tokens", anomalies)
    cost = _cost(litellm, route, response)
    if cost is not None and not (math.isfinite(cost) and 0 <= cost < 1e9):
        anomalies.append("the computed cost was out of range; recorded as unknown")
        cost = None
    return PluginLlmUsage(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=total,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        cost_usd=cost,
    )


def _cost(litellm: Any, route: Route, response: Any) -> float | None:
    """Cost from litellm's local price map; 0 for the free local model, None when unpriced."""
    if route.provider == "local":
        return 0.0
    hidden = getattr(response, "_hidden_params", None)
    if not isinstance(hidden, dict):
        hidden = {}
    cost = hidden.get("response_cost")
    if cost is None and "response_cost" not in hidden:  # litellm already tried: unpriced
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:
            return None
    try:
        return float(cost) if cost is not None else None
    except (TypeError, ValueError, OverflowError):
        return None


@functools.lru_cache(maxsize=256)
def _supports_schema(provider: str, model: str) -> bool:
    litellm = _load_litellm()
    try:
        return bool(litellm.supports_response_schema(model=model, custom_llm_provider=provider))
    except Exception:
        return False
