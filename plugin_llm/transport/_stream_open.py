"""Opening a streaming call: the request sent, its status checked, its body handed to a chunk source.

On the fast path and the own path (:func:`fast_open`, :func:`own_open` and their async twins) the
request is the path's own with ``stream`` on, sent on the pooled clients; the body's SSE events
become chunk dicts as they are read (``_sse``). Through litellm (:func:`fallback_open`,
:func:`fallback_aopen`): ``litellm.completion(stream=True)``. Each returns ``(next chunk, close)``
(and, for the sync fallback, whether it reads inline); an error status raises the error litellm
raises for it, as for a call that does not stream. Used by ``_stream``'s attempts.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

from plugin_llm.transport._deadline import IO, WORKERS, DeadlineExpired, Job, runs_inline
from plugin_llm.transport._keys import Key, provider_call
from plugin_llm.transport._sse import SseError, SseParser, malformed_stream, sse_chunks
from plugin_llm.transport._types import TransportRequest

__all__ = ["fast_open", "own_open", "fast_aopen", "own_aopen", "fallback_open", "fallback_aopen"]


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
                sse_chunks(request.route, parser, parser.end(), ready)
                continue
            try:
                if sse_chunks(request.route, parser, parser.feed(data), ready):
                    done[0] = True
            except SseError as exc:
                raise malformed_stream(request.route, str(exc)) from None
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
                sse_chunks(request.route, parser, parser.end(), ready)
                continue
            try:
                if sse_chunks(request.route, parser, parser.feed(data), ready):
                    done[0] = True
            except SseError as exc:
                raise malformed_stream(request.route, str(exc)) from None
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
