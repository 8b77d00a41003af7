"""Streaming provider calls: text deltas as they arrive, on the fast path and through litellm.

:meth:`LitellmTransport.open_stream` / ``aopen_stream`` return an open :class:`TransportStream`
(:class:`AsyncTransportStream`): ``read()`` gives the next text delta (``None`` at the end),
``final()`` the whole reply as a :class:`TransportResponse` (text, model, usage, cost, attempts),
``close()`` drops the connection of a stream the caller abandons.

The call's total deadline covers the whole stream; retries happen only before the first delta
reaches the caller; the SSE body is bounded (:class:`SseParser`); :class:`StreamRedactor` hides
the key and every loaded secret in the deltas, even split across chunks. Usage without a final
usage chunk is estimated and marked ``estimated``. Details: docs/design.md, "Streams".
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

from plugin_llm.errors import PluginLlmError, PluginLlmProviderError, PluginLlmTimeoutError
from plugin_llm.routing import Route
from plugin_llm.transport._deadline import IO, WORKERS, DeadlineExpired, Job, runs_inline
from plugin_llm.transport._errors import map_error, provider_text
from plugin_llm.transport._keys import Key, provider_call
from plugin_llm.transport._reply import field, response_id, usage as reply_usage
from plugin_llm.transport._types import MODEL_NAME_LIMIT, TransportRequest, TransportResponse

__all__ = ["SseParser", "SseError", "StreamRedactor", "TransportStream", "AsyncTransportStream",
           "MAX_LINE_BYTES", "MAX_STREAM_BYTES", "MAX_EVENTS"]

#: the longest SSE line accepted (one event of one chunk is a few hundred bytes)
MAX_LINE_BYTES = 1024 * 1024
#: the most bytes one streamed reply may take
MAX_STREAM_BYTES = 64 * 1024 * 1024
#: the most SSE events one streamed reply may have
MAX_EVENTS = 200_000
_READ_SIZE = 65536


class SseError(ValueError):
    """A server-sent event body the gateway will not read (too long a line, too big, not SSE)."""


class SseParser:
    """Incremental ``text/event-stream`` parser: bytes in, the ``data`` of complete events out.

    Bounded: a line over :data:`MAX_LINE_BYTES`, a body over
    :data:`MAX_STREAM_BYTES` or more than :data:`MAX_EVENTS` events raise
    :class:`SseError`. Comments (``:``) and the ``id``/``retry`` fields are
    skipped; ``event: error`` marks the event as an error.
    """

    __slots__ = ("_buffer", "_data", "_kind", "total", "events", "max_line", "max_bytes", "max_events")

    def __init__(self, *, max_line: int = MAX_LINE_BYTES, max_bytes: int = MAX_STREAM_BYTES,
                 max_events: int = MAX_EVENTS) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._kind = b""
        self.total = 0
        self.events = 0
        self.max_line, self.max_bytes, self.max_events = max_line, max_bytes, max_events

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """The ``(event type, data)`` of every event ``chunk`` completes."""
        self.total += len(chunk)
        if self.total > self.max_bytes:
            raise SseError(f"the stream is over {self.max_bytes:,} bytes")
        buffer = self._buffer + chunk if self._buffer else chunk
        out: list[tuple[str, str]] = []
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            if end - start > self.max_line:
                raise SseError(f"an event line is over {self.max_line:,} bytes")
            line = buffer[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line, out)
        self._buffer = buffer[start:]
        if len(self._buffer) > self.max_line:
            raise SseError(f"an event line is over {self.max_line:,} bytes")
        return out

    def end(self) -> list[tuple[str, str]]:
        """Events the body's end completes (a last event without its blank line)."""
        out: list[tuple[str, str]] = []
        if self._buffer:
            self._line(self._buffer.rstrip(b"\r"), out)
            self._buffer = b""
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[tuple[str, str]]) -> None:
        if not line:  # a blank line dispatches the event
            if self._data:
                self.events += 1
                if self.events > self.max_events:
                    raise SseError(f"the stream has more than {self.max_events:,} events")
                try:
                    data = b"\n".join(self._data).decode("utf-8")
                except UnicodeDecodeError:
                    raise SseError("an event is not UTF-8 text") from None
                out.append((self._kind.decode("ascii", "replace") or "message", data))
            self._data = []
            self._kind = b""
            return
        if line.startswith(b":"):
            return
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._kind = value[:64]
        elif name not in (b"id", b"retry"):
            raise SseError(f"a line is not server-sent events (field {name[:20].decode('ascii', 'replace')!r})")


class StreamRedactor:
    """Hides the key just sent (and every loaded secret) in streamed text, across chunk borders.

    :meth:`push` returns what is safe to hand out now; a tail that could be the
    start of a secret is held back until the next chunk shows whether it is one
    (then it is replaced whole) or not (then it goes out). :meth:`flush` gives the
    rest at the end of the stream.
    """

    __slots__ = ("_key", "_pending")

    def __init__(self, key: Key | None) -> None:
        self._key = key
        self._pending = ""

    def push(self, text: str) -> str:
        from auth.redaction import redact_secrets, secret_prefix_start

        secret = self._key.secret() if self._key is not None else None
        text = redact_secrets(self._pending + text, secret) if secret else redact_secrets(self._pending + text)
        cut = secret_prefix_start(text, secret)
        self._pending = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        """The held-back tail at the end of the stream: the first characters of a secret (8 or more:
        an echo of a key cut off by the end of the reply) are hidden, a shorter tail goes out as it is."""
        text, self._pending = self._pending, ""
        return "[REDACTED]" if len(text) >= _HIDDEN_FRAGMENT else text


#: a held-back tail of this many characters of a secret is hidden at the end (as redact_clipped does for uncut text)
_HIDDEN_FRAGMENT = 8


class _NoCredential:
    source = "none"

    @staticmethod
    def reveal() -> None:
        return None


_NO_KEY = Key(_NoCredential(), None)  # a Job reading a stream passes no key


# ------------------------------------------------------------------ reading chunks
def _chunk_error(route: Route, doc: Any, key: Key | None) -> PluginLlmProviderError:
    error = doc.get("error") if isinstance(doc, dict) else None
    message = field(error, "message") if isinstance(error, dict) else error
    secret = key.secret() if key is not None else None  # hidden even when it was never registered
    text = provider_text(str(message if message is not None else "no message")[:5000], 300, secret)
    status = field(error, "code") if isinstance(error, dict) else None
    return PluginLlmProviderError(
        f"{route.provider} sent an error event in the stream of model {route.model}: {text}",
        status=status if type(status) is int else None, provider=route.provider, retryable=False,
    )


def _malformed_stream(route: Route, reason: str) -> PluginLlmProviderError:
    return PluginLlmProviderError(f"{route.provider} sent a malformed stream (model {route.model}): {reason}",
                                  status=None, provider=route.provider, retryable=False)


class _Chunks:
    """The parts of one streamed reply read so far: text pieces, model, finish reason, usage, the reply's id."""

    __slots__ = ("route", "key", "model", "finish", "usage", "anomalies", "response_id")

    def __init__(self, route: Route, key: Key | None = None) -> None:
        self.route = route
        self.key = key
        self.model: str | None = None
        self.finish: str | None = None
        self.usage: Any = None
        self.anomalies: list[str] = []
        self.response_id: str | None = None

    def take(self, chunk: Any) -> str:
        """The text delta of one chunk (a dict of the SSE JSON, or litellm's ModelResponseStream)."""
        if isinstance(chunk, dict) and "error" in chunk and chunk.get("error"):
            raise _chunk_error(self.route, chunk, self.key)
        if not isinstance(chunk, dict) and field(chunk, "choices") is None and field(chunk, "usage") is None:
            raise _malformed_stream(self.route, f"a chunk is a {type(chunk).__name__}, not a chat completion chunk")
        model = field(chunk, "model")
        if model and self.model is None:
            if isinstance(model, str):
                self.model = model[:MODEL_NAME_LIMIT]
            else:
                self.anomalies.append(f"the reported model was a {type(model).__name__}, not a string")
        if self.response_id is None:  # every chunk of a stream carries the reply's id: the first one says it
            self.response_id = response_id(field(chunk, "id"))
        reported = field(chunk, "usage")
        if reported is not None:
            self.usage = reported
        choices = field(chunk, "choices")
        if not choices:
            return ""
        if not isinstance(choices, (list, tuple)):
            raise _malformed_stream(self.route, f"'choices' is a {type(choices).__name__}, not a list")
        choice = choices[0]
        finish = field(choice, "finish_reason")
        if isinstance(finish, str) and finish:
            self.finish = finish
        delta = field(choice, "delta")
        if delta is None:
            return ""
        content = field(delta, "content")
        if content is None:
            return ""
        if not isinstance(content, str):
            raise _malformed_stream(self.route, f"a delta's content is a {type(content).__name__}, not text")
        return content


def _sse_chunks(route: Route, parser: SseParser, events: list[tuple[str, str]], out: list) -> bool:
    """Parse ``events`` into chunk dicts appended to ``out``; True at ``[DONE]``."""
    for kind, data in events:
        if data.strip() == "[DONE]":
            return True
        try:
            doc = json.loads(data)
        except ValueError:
            raise _malformed_stream(route, f"event {parser.events} is not JSON") from None
        if kind == "error" and not (isinstance(doc, dict) and doc.get("error")):
            doc = {"error": doc}
        if not isinstance(doc, dict):
            raise _malformed_stream(route, f"event {parser.events} is a JSON {type(doc).__name__}, not an object")
        out.append(doc)
    return False


# ------------------------------------------------------------------ the stream
class _Base:
    """What sync and async streams share: the redactor, the reply so far, the final response."""

    def __init__(self, request: TransportRequest, key: Key, attempts: int, provider_seconds: float,
                 cost: Callable[..., Any], estimate: Callable[[list, str], tuple[int, int]]) -> None:
        self.request = request
        self.route = request.route
        self._key = key
        self._redactor = StreamRedactor(key)
        self._chunks = _Chunks(request.route, key)
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


# ------------------------------------------------------------------ opening: fast path and own path
def fast_open(fast: Any, request: TransportRequest, key: Key) -> tuple[Callable[[], Any], Callable[[], None]]:
    """Send the streaming request on the fast path's sync pool; ``(next chunk, close)``.

    The status is checked here (an error status raises litellm's exception, as
    for a call that does not stream); the body is read by the returned source.
    """
    optional = fast.optional_params(request.params)
    url, headers, body = _stream_request(fast, request.messages, optional, key.reveal())
    return _open_prepared(request, url, headers, body, fast.http_error)


def own_open(own: Any, request: TransportRequest, key: Key) -> tuple[Callable[[], Any], Callable[[], None]]:
    """:func:`fast_open` on the gateway's own OpenAI path (litellm's fast path for what it cannot send)."""
    from plugin_llm.transport import _openai

    prepared = own.prepare(request.messages, request.params)
    if prepared is None:
        return fast_open(_openai._deferred(request.route), request, key)
    body = {**prepared[0], "stream": True, "stream_options": {"include_usage": True}}

    def error(status: int, headers: Any, content: bytes) -> BaseException:
        found = own.error(status, headers, content)
        return found if found is not None else _openai._deferred(request.route).http_error(status, headers, content)

    return _open_prepared(request, own.url, own.headers(key.reveal()), body, error)


def _open_prepared(request: TransportRequest, url: str, headers: dict, body: dict,
                   error: Callable[[int, Any, bytes], BaseException]) -> tuple[Callable[[], Any], Callable[[], None]]:
    response_status, reply_headers, stream, close = _send_sync(request, url, headers, body)
    headers = {}  # the key is in them
    if not 200 <= response_status < 300:
        outer, IO.deadline = getattr(IO, "deadline", None), request.deadline  # a trickled error body too
        try:
            content = _read_bounded(stream, 1024 * 1024)
        finally:
            IO.deadline = outer
            close()
        raise error(response_status, reply_headers, content)
    parser = SseParser()
    chunks = iter(stream)
    ready: list = []
    done = [False]

    def source() -> Any:
        while not ready:
            if done[0]:
                return None
            try:
                data = next(chunks)
            except StopIteration:
                done[0] = True
                _sse_chunks(request.route, parser, parser.end(), ready)
                continue
            try:
                if _sse_chunks(request.route, parser, parser.feed(data), ready):
                    done[0] = True
            except SseError as exc:
                raise _malformed_stream(request.route, str(exc)) from None
        return ready.pop(0)

    return source, close


def _read_bounded(stream: Any, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    for part in stream:
        parts.append(part)
        size += len(part)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


def _send_sync(request: TransportRequest, url: str, headers: dict, body: dict):
    """POST the streaming request; the response's status, headers and unread body stream."""
    from plugin_llm.transport import _fastpath, _http

    content = json.dumps(body).encode()
    left = max(request.deadline - time.monotonic(), 0.001)
    outer, IO.deadline = getattr(IO, "deadline", None), request.deadline
    try:
        if _http.proxy(url) is None:
            # httpcore's own stream(): it adds Host and Content-Length; entered here, exited by close()
            opened = _http.sync_pool(url).stream(
                "POST", url, content=content,
                headers=[(b"Accept", b"text/event-stream"), (b"User-Agent", b"plugin-llm-gateway"),
                         *((name.encode("ascii"), value.encode("ascii")) for name, value in headers.items())],
                extensions={"timeout": {"connect": left, "read": left, "write": left, "pool": left}})
            response = opened.__enter__()
            return response.status, response.headers, response.stream, lambda: opened.__exit__(None, None, None)
        client = _fastpath._sync_client()
        built = client.build_request("POST", url, content=content, headers=headers, timeout=left)
        response = client.send(built, stream=True)
        return response.status_code, response.headers, response.iter_raw(), response.close
    finally:
        IO.deadline = outer


def _stream_request(fast: Any, messages: list, optional: dict, secret: str | None) -> tuple[str, dict, dict]:
    """(url, headers, body) of one streaming attempt: the fast path's request with ``stream`` on."""
    from plugin_llm.transport._fastpath import _request

    url, headers, body = _request(fast, messages, optional, secret)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return url, headers, body


async def fast_aopen(fast: Any, request: TransportRequest, key: Key) -> tuple[Callable[[], Any], Callable[[], None]]:
    """The async twin of :func:`fast_open` (the event loop's pooled aiohttp session)."""
    optional = fast.optional_params(request.params)
    url, headers, body = _stream_request(fast, request.messages, optional, key.reveal())

    async def error(status: int, headers: Any, content: bytes) -> BaseException:
        return fast.http_error(status, headers, content)

    return await _aopen_prepared(request, url, headers, body, error)


async def own_aopen(own: Any, request: TransportRequest, key: Key) -> tuple[Callable[[], Any], Callable[[], None]]:
    """The async twin of :func:`own_open`."""
    from plugin_llm.transport import _openai

    prepared = own.prepare(request.messages, request.params)
    if prepared is None:
        await _openai._aload()
        return await fast_aopen(_openai._deferred(request.route), request, key)
    body = {**prepared[0], "stream": True, "stream_options": {"include_usage": True}}

    async def error(status: int, headers: Any, content: bytes) -> BaseException:
        found = own.error(status, headers, content)
        if found is not None:
            return found
        await _openai._aload()
        return _openai._deferred(request.route).http_error(status, headers, content)

    return await _aopen_prepared(request, own.url, own.headers(key.reveal()), body, error)


async def _aopen_prepared(request: TransportRequest, url: str, headers: dict, body: dict,
                          error: Callable[..., Any]) -> tuple[Callable[[], Any], Callable[[], None]]:
    from plugin_llm.transport import _http

    left = max(request.deadline - time.monotonic(), 0.0)
    async with asyncio.timeout(left):
        response = await _http.session().post(
            url, data=json.dumps(body).encode(),
            headers={**headers, "Accept": "text/event-stream", "User-Agent": "plugin-llm-gateway"},
            proxy=_http.proxy(url), allow_redirects=False)
        headers = {}  # the key is in them
        failed = not 200 <= response.status < 300
        if failed:
            try:
                content = await response.content.read(1024 * 1024)
            finally:
                response.close()
    if failed:  # (outside the deadline's block: the error may need litellm's import, off the loop)
        raise await error(response.status, response.headers, content)
    parser = SseParser()
    ready: list = []
    done = [False]

    async def source() -> Any:
        while not ready:
            if done[0]:
                return None
            data = await response.content.readany()
            if not data:
                done[0] = True
                _sse_chunks(request.route, parser, parser.end(), ready)
                continue
            try:
                if _sse_chunks(request.route, parser, parser.feed(data), ready):
                    done[0] = True
            except SseError as exc:
                raise _malformed_stream(request.route, str(exc)) from None
        return ready.pop(0)

    return source, response.close


# ------------------------------------------------------------------ opening: fallback
def _fallback_kwargs(request: TransportRequest, attempt: int) -> tuple[dict[str, Any], float]:
    from plugin_llm.transport._fallback import _kwargs

    kwargs, remaining = _kwargs(request, attempt)
    kwargs["stream"] = True
    kwargs["stream_options"] = {"include_usage": True}
    return kwargs, remaining


def fallback_open(litellm: Any, request: TransportRequest, key: Key, attempt: int):
    """``litellm.completion(stream=True)``: ``(next chunk, close, inline)``."""
    kwargs, _ = _fallback_kwargs(request, attempt)
    inline = runs_inline(request.route)
    if inline:
        outer, IO.deadline = getattr(IO, "deadline", None), request.deadline
        try:
            wrapper = provider_call(litellm.completion, kwargs, key)
        finally:
            IO.deadline = outer
    else:
        job = Job(litellm.completion, kwargs, key, request.deadline)
        try:
            if not WORKERS.run(job):
                raise DeadlineExpired(f"no reply within the call's deadline ({request.route.timeout:g} s)")
            if job.failure is not None:
                raise job.failure
            wrapper = job.response
        finally:
            job.response = job.failure = None
    chunks = iter(wrapper)

    def source() -> Any:
        return next(chunks, None)

    return source, lambda: _close_wrapper(wrapper), inline


async def fallback_aopen(litellm: Any, request: TransportRequest, key: Key, attempt: int):
    """``litellm.acompletion(stream=True)``: ``(next chunk coroutine, close)``."""
    kwargs, remaining = _fallback_kwargs(request, attempt)
    wrapper = await asyncio.wait_for(provider_call(litellm.acompletion, kwargs, key), timeout=remaining)
    chunks = wrapper.__aiter__()

    async def source() -> Any:
        try:
            return await chunks.__anext__()
        except StopAsyncIteration:
            return None

    return source, lambda: _close_wrapper(wrapper)


def _close_wrapper(wrapper: Any) -> None:
    """Close the HTTP response under litellm's stream wrapper (best effort: the SDK's stream object)."""
    inner = getattr(wrapper, "completion_stream", None)
    for target in (inner, getattr(inner, "response", None)):
        close = getattr(target, "close", None)
        if callable(close) and not asyncio.iscoroutinefunction(close):
            try:
                close()
            except Exception:  # noqa: BLE001
                pass
            return


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
