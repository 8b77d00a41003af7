"""Streaming provider calls: text deltas as they arrive, on the own path, the fast path and through litellm.

:meth:`LitellmTransport.open_stream` / ``aopen_stream`` return an open :class:`TransportStream`
(:class:`AsyncTransportStream`): ``read()`` gives the next text delta (``None`` at the end),
``final()`` the whole reply as a :class:`TransportResponse` (text, model, usage, cost, attempts),
``close()`` drops the connection of a stream the caller abandons.

The call's total deadline covers the whole stream; retries happen only before the first delta
reaches the caller; the SSE body is bounded (:class:`SseParser`); :class:`StreamRedactor` hides
the key and every loaded secret in the deltas, even split across chunks. Usage without a final
usage chunk is estimated and marked ``estimated``. Here: the streams and their attempts; reading
a body is ``_sse``'s, opening a request ``_stream_open``'s. Details: docs/design.md, "Streams".
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from plugin_llm.errors import PluginLlmError, PluginLlmTimeoutError
from plugin_llm.routing import Route
from plugin_llm.transport._deadline import IO, WORKERS, DeadlineExpired, Job
from plugin_llm.transport._errors import map_error
from plugin_llm.transport._keys import Key
from plugin_llm.transport._reply import field, usage as reply_usage
from plugin_llm.transport._sse import MAX_EVENTS, MAX_LINE_BYTES, MAX_STREAM_BYTES, Chunks, SseError, SseParser, \
    StreamRedactor
from plugin_llm.transport._stream_open import fallback_aopen, fallback_open, fast_aopen, fast_open, own_aopen, own_open
from plugin_llm.transport._types import TransportRequest, TransportResponse

__all__ = ["SseParser", "SseError", "StreamRedactor", "TransportStream", "AsyncTransportStream",
           "MAX_LINE_BYTES", "MAX_STREAM_BYTES", "MAX_EVENTS", "open_stream", "aopen_stream"]


class _NoCredential:
    source = "none"

    @staticmethod
    def reveal() -> None:
        return None


_NO_KEY = Key(_NoCredential(), None)  # a Job reading a stream passes no key


# ------------------------------------------------------------------ the stream
class _Base:
    """What sync and async streams share: the redactor, the reply so far, the final response."""

    def __init__(self, request: TransportRequest, key: Key, attempts: int, provider_seconds: float,
                 cost: Callable[..., Any], estimate: Callable[[list, str], tuple[int, int]]) -> None:
        self.request = request
        self.route = request.route
        self._key = key
        self._redactor = StreamRedactor(key)
        self._chunks = Chunks(request.route, key)
        self._pieces: list[str] = []
        self.delivered = 0  # characters handed to the caller
        self.attempts = attempts
        self.provider_seconds = provider_seconds
        self._cost = cost
        self._estimate = estimate
        self.ended = False
        self.closed = False

    @property
    def model(self) -> str:
        """The model the provider reports (so far), else the route's (the key hidden in it, as in final())."""
        from auth.redaction import redact_secrets

        secret = self._key.secret()
        model = self._chunks.model or self.route.model
        return redact_secrets(model, secret) if secret else redact_secrets(model)

    @property
    def finish_reason(self) -> str | None:
        return self._chunks.finish

    def _deliver(self, raw: str) -> str:
        text = self._redactor.push(raw) if raw else ""
        if text:
            self._pieces.append(text)
            self.delivered += len(text)
        return text

    def _finish(self) -> str:
        self.ended = True
        text = self._redactor.flush()
        if text:
            self._pieces.append(text)
            self.delivered += len(text)
        return text

    def _broken(self, exc: BaseException) -> PluginLlmError:
        """A failure while reading, as the project's error, saying how much was delivered."""
        if isinstance(exc, PluginLlmError):
            error = exc
        else:
            error = map_error(exc, self.route, self._key, self.request.deadline)
        if self.delivered:
            error.args = (f"{error} (the stream broke after {self.delivered:,} characters had been delivered)",)
            error.delivered_chars = self.delivered  # type: ignore[attr-defined] # the service's fixed 5xx text says it
        error.attempts = self.attempts  # type: ignore[attr-defined]
        error.provider_seconds = self.provider_seconds  # type: ignore[attr-defined]
        return error

    def _timeout(self) -> PluginLlmTimeoutError:
        return PluginLlmTimeoutError(
            f"{self.route.provider} did not finish the stream within the call's deadline ({self.route.timeout:g} s, "
            f"model {self.route.model})")

    def final(self) -> TransportResponse:
        """The whole reply (after the last ``read``): text, model, usage (estimated when not reported), cost."""
        from auth.redaction import redact_secrets

        text = "".join(self._pieces)
        chunks = self._chunks
        anomalies = list(chunks.anomalies)
        reported = chunks.usage
        estimated = reported is None or field(reported, "prompt_tokens") is None
        if estimated:
            prompt, completion = self._estimate(self.request.messages, text)
            reported = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        operator = self.request.cost is not None
        usage = reply_usage(self.route, {"usage": reported}, anomalies, self.request.cost or self._cost,
                            operator=operator)
        if estimated:
            import dataclasses

            usage = dataclasses.replace(usage, estimated=True)
        model = chunks.model or self.route.model
        secret = self._key.secret()
        model = redact_secrets(model, secret) if secret else redact_secrets(model)
        reply_id = chunks.response_id
        if reply_id:
            reply_id = redact_secrets(reply_id, secret) if secret else redact_secrets(reply_id)
        return TransportResponse(
            text=text, message={"role": "assistant", "content": text}, model=model, usage=usage,
            attempts=self.attempts, provider_seconds=self.provider_seconds, finish_reason=chunks.finish,
            anomalies=tuple(anomalies), priced=operator, response_id=reply_id,
        )


class TransportStream(_Base):
    """A sync open stream; ``source()`` gives the next raw chunk or None at the end (bounded by the deadline)."""

    def __init__(self, request: TransportRequest, key: Key, attempts: int, provider_seconds: float,
                 cost: Callable[..., Any], estimate: Callable[[list, str], tuple[int, int]],
                 source: Callable[[], Any], close: Callable[[], None], inline: bool) -> None:
        super().__init__(request, key, attempts, provider_seconds, cost, estimate)
        self._source = source
        self._close = close
        self._inline = inline
        self._ahead: list[str] = []

    def _next_chunk(self) -> Any:
        """The next raw chunk, every socket read bounded by the deadline (or on a worker thread)."""
        if self.request.deadline - time.monotonic() <= 0:
            raise self._timeout()
        started = time.perf_counter()
        try:
            if self._inline:
                outer, IO.deadline = getattr(IO, "deadline", None), self.request.deadline
                try:
                    return self._source()
                finally:
                    IO.deadline = outer
            job = Job(lambda: self._source(), {}, _NO_KEY, self.request.deadline)
            if not WORKERS.run(job):
                raise DeadlineExpired("no chunk within the call's deadline")
            if job.failure is not None:
                raise job.failure
            return job.response
        finally:
            self.provider_seconds += time.perf_counter() - started

    def prefetch(self) -> None:
        """Read up to the first text delta (part of the attempt: a failure here may be retried)."""
        while not self.ended:
            text = self._read_raw()
            if text:
                self._ahead.append(text)
                return

    def _read_raw(self) -> str:
        if self.ended:
            return ""
        chunk = self._next_chunk()
        if chunk is None:
            return self._finish()
        return self._deliver(self._chunks.take(chunk))

    def read(self) -> str | None:
        """The next text delta (never empty), or None once the stream has ended."""
        if self._ahead:
            return self._ahead.pop(0)
        failure: BaseException | None = None
        try:
            while not self.ended:
                text = self._read_raw()
                if text:
                    return text
        except BaseException as exc:  # noqa: BLE001 - mapped outside the except block (nothing chained)
            failure = exc
        if failure is not None:
            error = self._broken(failure if not isinstance(failure, TimeoutError) else self._timeout())
            failure = None
            self.close()
            raise error
        return None

    def close(self) -> None:
        """Drop the connection (a stream the caller abandons is not read to its end)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._close()
        except Exception:  # noqa: BLE001 - closing a broken connection must not fail
            pass


class AsyncTransportStream(_Base):
    """An async open stream; ``source()`` is a coroutine giving the next raw chunk or None at the end."""

    def __init__(self, request: TransportRequest, key: Key, attempts: int, provider_seconds: float,
                 cost: Callable[..., Any], estimate: Callable[[list, str], tuple[int, int]],
                 source: Callable[[], Any], close: Callable[[], Any]) -> None:
        super().__init__(request, key, attempts, provider_seconds, cost, estimate)
        self._source = source
        self._close = close
        self._ahead: list[str] = []

    async def _next_chunk(self) -> Any:
        left = self.request.deadline - time.monotonic()
        if left <= 0:
            raise self._timeout()
        started = time.perf_counter()
        try:
            async with asyncio.timeout(left):
                return await self._source()
        finally:
            self.provider_seconds += time.perf_counter() - started

    async def _read_raw(self) -> str:
        if self.ended:
            return ""
        chunk = await self._next_chunk()
        if chunk is None:
            return self._finish()
        return self._deliver(self._chunks.take(chunk))

    async def prefetch(self) -> None:
        while not self.ended:
            text = await self._read_raw()
            if text:
                self._ahead.append(text)
                return

    async def read(self) -> str | None:
        if self._ahead:
            return self._ahead.pop(0)
        failure: BaseException | None = None
        try:
            while not self.ended:
                text = await self._read_raw()
                if text:
                    return text
        except (Exception, asyncio.TimeoutError) as exc:  # noqa: BLE001 - a cancellation is re-raised as it is
            failure = exc
        if failure is not None:
            error = self._broken(failure if not isinstance(failure, TimeoutError) else self._timeout())
            failure = None
            self.close()
            raise error
        return None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._close()
        except Exception:  # noqa: BLE001
            pass


# ------------------------------------------------------------------ attempts and retries
def _fallback_cost(litellm: Any) -> Callable[..., Any]:
    def cost(route: Route, response: Any, prompt: int, completion: int, cache_read: int, cache_write: int) -> Any:
        try:
            inp, out = litellm.cost_per_token(model=route.litellm_model, prompt_tokens=prompt,
                                              completion_tokens=completion)
        except Exception:  # noqa: BLE001 - not in the price map: unpriced
            return None
        return inp + out
    return cost


def _unpriced(*args: Any) -> None:
    return None


def _estimator(litellm: Any, route: Route) -> Callable[[list, str], tuple[int, int]]:
    """Token counts of a stream whose provider reported none (litellm's counter for the model, litellm
    loaded then when the call did not need it)."""
    def estimate(messages: list, text: str) -> tuple[int, int]:
        from plugin_llm.transport._loading import load_litellm

        try:
            counter = (litellm or load_litellm()).token_counter
            prompt = int(counter(model=route.model, messages=messages))
            completion = int(counter(model=route.model, text=text)) if text else 0
        except Exception:  # noqa: BLE001 - a rough count rather than none
            prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4
            completion = len(text) // 4
        return prompt, completion
    return estimate


def _local_async(source: Callable[[], Any]) -> Callable[[], Any]:
    async def next_chunk() -> Any:
        return source()
    return next_chunk


def _noop() -> None:
    return None


def _attempt_sync(transport: Any, litellm: Any, own: Any, request: TransportRequest, state: Any) -> TransportStream:
    """One attempt: connect, check the status, read up to the first text delta."""
    from plugin_llm.transport import _fastpath, _local, _openai
    from plugin_llm.transport._loading import load_litellm
    from plugin_llm.transport._local import LOCAL

    transport._check_deadline(request, state)
    credential = request.keys.acquire()
    attempt = state.attempts
    key = transport._key(request, state, credential)
    path = transport._path_of(litellm, own, request, key)
    started = time.perf_counter()
    failure: BaseException | None = None
    stream: TransportStream | None = None
    try:
        if path is LOCAL:
            source, close, inline, cost = _local.chunks(request.route, request.messages, request.params), _noop, \
                True, _unpriced
        elif isinstance(path, _openai.OwnRoute):
            (source, close), inline, cost = own_open(path, request, key), True, path.cost
        elif isinstance(path, _fastpath.FastRoute):
            (source, close), inline, cost = fast_open(path, request, key), True, path.cost
        else:
            litellm = litellm or load_litellm()
            source, close, inline = fallback_open(litellm, request, key, attempt)
            cost = _fallback_cost(litellm)
        stream = TransportStream(request, key, state.attempts, 0.0, cost, _estimator(litellm, request.route),
                                 source, close, inline)
        stream.prefetch()
    except Exception as exc:  # mapped below, outside the except block: nothing chained
        failure = exc
    state.provider_seconds += time.perf_counter() - started
    if failure is not None:
        if stream is not None:
            stream.close()
        error = failure if isinstance(failure, PluginLlmError) else transport._failed(request, state, credential, key,
                                                                                      failure)
        error.attempts = state.attempts  # type: ignore[attr-defined]
        error.provider_seconds = state.provider_seconds  # type: ignore[attr-defined]
        failure = None
        raise error
    request.keys.report_success(credential)
    assert stream is not None
    stream.provider_seconds = state.provider_seconds
    return stream


async def _attempt_async(transport: Any, litellm: Any, own: Any, request: TransportRequest,
                         state: Any) -> AsyncTransportStream:
    from plugin_llm.transport import _fastpath, _local, _openai
    from plugin_llm.transport._loading import load_litellm, loaded_litellm
    from plugin_llm.transport._local import LOCAL

    transport._check_deadline(request, state)
    credential = await request.keys.aacquire()
    attempt = state.attempts
    key = transport._key(request, state, credential)
    if litellm is None and own is not LOCAL and key.absent:  # litellm's environment lookup decides
        litellm = loaded_litellm() or await asyncio.to_thread(load_litellm)
    path = transport._path_of(litellm, own, request, key)
    started = time.perf_counter()
    failure: BaseException | None = None
    stream: AsyncTransportStream | None = None
    try:
        if path is LOCAL:
            source = _local_async(_local.chunks(request.route, request.messages, request.params))
            close, cost = _noop, _unpriced
        elif isinstance(path, _openai.OwnRoute):
            source, close = await own_aopen(path, request, key)
            cost = path.cost
        elif isinstance(path, _fastpath.FastRoute):
            source, close = await fast_aopen(path, request, key)
            cost = path.cost
        else:
            source, close = await fallback_aopen(litellm, request, key, attempt)
            cost = _fallback_cost(litellm)
        stream = AsyncTransportStream(request, key, state.attempts, 0.0, cost, _estimator(litellm, request.route),
                                      source, close)
        await stream.prefetch()
    except Exception as exc:  # mapped below, outside the except block: nothing chained
        failure = exc
    finally:
        state.provider_seconds += time.perf_counter() - started
    if failure is not None:
        if stream is not None:
            stream.close()
        error = failure if isinstance(failure, PluginLlmError) else transport._failed(request, state, credential, key,
                                                                                      failure)
        error.attempts = state.attempts  # type: ignore[attr-defined]
        error.provider_seconds = state.provider_seconds  # type: ignore[attr-defined]
        failure = None
        raise error
    request.keys.report_success(credential)
    assert stream is not None
    stream.provider_seconds = state.provider_seconds
    return stream


def open_stream(transport: Any, litellm: Any, own: Any, request: TransportRequest) -> TransportStream:
    """The stream, open and up to its first delta; retried (as calls are) until then."""
    from tenacity import Retrying

    from plugin_llm.transport._retry import first_retry_delay, retry_kwargs
    from plugin_llm.transport._types import CallState

    state = CallState()
    try:
        stream: TransportStream | None = _attempt_sync(transport, litellm, own, request, state)
    except PluginLlmError as exc:
        delay = first_retry_delay(exc, request)
        if delay is None:
            raise
        stream = None
    if stream is None:  # retried outside the except block: no chained first failure
        time.sleep(delay)
        stream = Retrying(**retry_kwargs(request))(_attempt_sync, transport, litellm, own, request, state)
    return stream


async def aopen_stream(transport: Any, litellm: Any, own: Any, request: TransportRequest) -> AsyncTransportStream:
    from tenacity import AsyncRetrying

    from plugin_llm.transport._retry import first_retry_delay, retry_kwargs
    from plugin_llm.transport._types import CallState

    state = CallState()
    try:
        stream: AsyncTransportStream | None = await _attempt_async(transport, litellm, own, request, state)
    except PluginLlmError as exc:
        delay = first_retry_delay(exc, request)
        if delay is None:
            raise
        stream = None
    if stream is None:
        await asyncio.sleep(delay)
        stream = await AsyncRetrying(**retry_kwargs(request))(_attempt_async, transport, litellm, own, request, state)
    return stream
