"""``POST /v1/chat/completions`` with ``"stream": true``: OpenAI ``chat.completion.chunk`` SSE, as deltas arrive.

The stream is :meth:`PluginLlm.astream` - the same trust gate, limits and one audit record as in
process. It is opened before the response starts, so a refusal or a provider that fails before its
first delta is the ordinary JSON error answer. After the headers, each delta is one event; then a
chunk with the ``finish_reason`` (carrying the gateway's ``plugin_llm`` field, which
``GatewayClient.stream`` reads), a ``usage`` chunk only when ``stream_options.include_usage`` asked
for it, and ``data: [DONE]``. A failure after the headers is an event with the error body and no
``[DONE]``. A client that disconnects, or stops reading until the call's deadline
(``stream.abandoned_by: deadline``), abandons the stream: it is recorded once as ``abandoned``,
its reservation released and its connection dropped. Wire format: docs/reference/http-api.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Callable

from starlette.responses import Response, StreamingResponse

from plugin_llm.service.errors import error_for

__all__ = ["chat_stream"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)
_DONE = b"data: [DONE]\n\n"


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + _ENCODER.encode(doc).encode("utf-8", "surrogatepass") + b"\n\n"


def _usage(usage: Any) -> dict[str, Any]:
    return {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens or usage.input_tokens + usage.output_tokens}


def _full_usage(usage: Any) -> dict[str, Any]:
    """The result's usage with every PluginLlmUsage field (GatewayClient.stream rebuilds it from this)."""
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens, "cache_read_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens, "cost_usd": usage.cost_usd, "estimated": usage.estimated}


async def chat_stream(llm: Any, messages: Any, kwargs: dict[str, Any], stream_options: Any, *, metrics: Any,
                      plugin: str, started: float, refuse: Callable[[BaseException], Response],
                      fields: frozenset[str], model: str = "default") -> Response:
    """The SSE answer of a streamed chat completion, or ``refuse(exc)``'s error answer when it cannot start."""
    include_usage = isinstance(stream_options, dict) and stream_options.get("include_usage") is True
    try:
        stream = await llm.astream(messages, **kwargs)
    except Exception as exc:  # noqa: BLE001 - nothing sent yet: the ordinary error answer
        return refuse(exc)
    response = _SseResponse(_events(stream, include_usage, metrics, plugin, started, fields, model),
                            media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    response.stream = stream
    return response


#: after the deadline, how often a stream still open is checked for an answer blocked on its client
_RECHECK_SECONDS = 0.1


class _SseResponse(StreamingResponse):
    """A StreamingResponse that always closes its event generator (after a client disconnect Starlette
    stops iterating it without closing it, which would leave the stream open until garbage collection),
    and holds the call's deadline against a client that stops reading (:class:`_DeadlineWatch`)."""

    stream: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # the connection, under the service's protocol (connections.SCOPE_KEY): it can be dropped without a flush
        watch = _DeadlineWatch(self.stream, scope.get("plugin_llm.connection"), send)
        try:
            await super().__call__(scope, receive, watch.send)
        except asyncio.CancelledError:
            if not watch.cancelled_it():
                raise
        finally:
            watch.stop()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


class _DeadlineWatch:
    """At the stream's deadline, an answer blocked on a client that does not read (its send buffer full)
    abandons the stream (recorded once, its slot and reservation released) and drops the connection.

    ``send`` only awaits while the transport's buffer is over its limit, so a send still pending when the
    timer fires is one the client holds up. A stream past its deadline that is not sending is reading the
    provider, which ends at the same deadline; the watch checks again shortly, for its error event."""

    __slots__ = ("stream", "connection", "_send", "sending", "timer", "task", "cancelled")

    def __init__(self, stream: Any, connection: Any, send: Any) -> None:
        self.stream = stream
        self.connection = connection
        self._send = send
        self.sending = False
        self.cancelled = False
        self.timer: asyncio.TimerHandle | None = None
        self.task = asyncio.current_task()
        deadline = getattr(stream, "deadline", None)
        if deadline is not None:
            self.timer = asyncio.get_running_loop().call_later(max(deadline - time.monotonic(), 0.0), self._check)

    async def send(self, message: Any) -> None:
        self.sending = True
        try:
            await self._send(message)
        finally:
            self.sending = False
        connection = self.connection
        if connection is not None and connection.closed_by is not None:  # dropped (write timeout): sends are void
            _abandon(self.stream, connection.closed_by)

    def _check(self) -> None:
        if not self.sending:
            self.timer = asyncio.get_running_loop().call_later(_RECHECK_SECONDS, self._check)
            return
        self.timer = None
        _abandon(self.stream, "deadline")  # a no-op for a stream that has ended (its error event is blocked)
        if self.connection is not None:
            self.connection.drop("deadline")  # the blocked send returns; Starlette sees the disconnect
        elif self.task is not None:  # not under the service's protocol: stop waiting on the client
            self.cancelled = True
            self.task.cancel()

    def cancelled_it(self) -> bool:
        """True when the cancellation is this watch's (then taken back: the answer just ends)."""
        if self.cancelled and self.task is not None:
            self.task.uncancel()
            return True
        return False

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


async def _events(stream: Any, include_usage: bool, metrics: Any, plugin: str, started: float,
                  fields: frozenset[str], model: str) -> AsyncIterator[bytes]:
    created = int(time.time())
    base = {"id": f"chatcmpl-{stream.call_id}", "object": "chat.completion.chunk", "created": created,
            "model": stream.model}
    status = "abandoned"
    try:
        yield _event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "logprobs": None, "finish_reason": None}]})
        failure: BaseException | None = None
        try:
            async for delta in stream:
                yield _event({**base, "choices": [{"index": 0, "delta": {"content": delta}, "logprobs": None,
                                                   "finish_reason": None}]})
        except Exception as exc:  # noqa: BLE001 - after the headers: an error event with the usual body
            failure = exc
        if failure is not None:
            error = error_for(failure, fields)
            status = "error" if error.code == "internal_error" else _status(error.code)
            failure = None
            yield _event(error.body())
            return
        result = stream.result
        if result is None:  # abandoned while this generator waited on its client (the call's deadline)
            return
        status = "ok"
        usage = result.usage
        base["model"] = result.model
        yield _event({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                           "finish_reason": stream.finish_reason or "stop"}],
                      "plugin_llm": {"call_id": result.audit["call_id"], "provider": result.provider,
                                     "cost_usd": usage.cost_usd, "agent_id": result.agent_id,
                                     "audit": result.audit, "usage": _full_usage(usage)}})
        if include_usage:
            yield _event({**base, "choices": [], "usage": _usage(usage)})
        yield _DONE
    finally:
        stream.close()  # a client that went away: abandoned (recorded once); a no-op after the end
        result = stream.result
        metrics.observe(plugin, "chat", status, time.perf_counter() - started,
                        result.usage if result is not None else None, model)


def _abandon(stream: Any, why: str) -> None:
    abandon = getattr(stream, "_abandon", None)
    if abandon is not None:
        abandon(why)
    else:
        stream.close()


_STATUSES = {"trust_denied": "denied", "quota_exceeded": "quota", "schema_mismatch": "schema_error",
             "timeout": "timeout", "provider_error": "provider_error", "invalid_request": "bad_request",
             "limits_store_unavailable": "store_error"}


def _status(code: str) -> str:
    return _STATUSES.get(code, "error")
