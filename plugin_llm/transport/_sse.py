"""Reading a streamed reply: its server-sent events, its chunks, and the secrets hidden in its text.

:class:`SseParser` turns the body's bytes into events, bounded in line length, total bytes and
number of events (:class:`SseError` past a bound); :func:`sse_chunks` turns events into chunk
dicts; :class:`Chunks` keeps the reply's parts (text, model, finish reason, usage) as chunks
arrive; :class:`StreamRedactor` hides the key and every loaded secret in the deltas, even split
across chunks. Used by ``_stream`` (the streams) and ``_stream_open`` (opening them).
"""

from __future__ import annotations

import json
from typing import Any

from plugin_llm.errors import PluginLlmProviderError
from plugin_llm.routing import Route
from plugin_llm.transport._errors import provider_text
from plugin_llm.transport._keys import Key
from plugin_llm.transport._reply import field, response_id
from plugin_llm.transport._types import MODEL_NAME_LIMIT

__all__ = ["SseParser", "SseError", "StreamRedactor", "Chunks", "sse_chunks", "malformed_stream",
           "MAX_LINE_BYTES", "MAX_STREAM_BYTES", "MAX_EVENTS"]

#: the longest SSE line accepted (one event of one chunk is a few hundred bytes)
MAX_LINE_BYTES = 1024 * 1024
#: the most bytes one streamed reply may take
MAX_STREAM_BYTES = 64 * 1024 * 1024
#: the most SSE events one streamed reply may have
MAX_EVENTS = 200_000


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


def malformed_stream(route: Route, reason: str) -> PluginLlmProviderError:
    return PluginLlmProviderError(f"{route.provider} sent a malformed stream (model {route.model}): {reason}",
                                  status=None, provider=route.provider, retryable=False)


class Chunks:
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
            raise malformed_stream(self.route, f"a chunk is a {type(chunk).__name__}, not a chat completion chunk")
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
            raise malformed_stream(self.route, f"'choices' is a {type(choices).__name__}, not a list")
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
            raise malformed_stream(self.route, f"a delta's content is a {type(content).__name__}, not text")
        return content


def sse_chunks(route: Route, parser: SseParser, events: list[tuple[str, str]], out: list) -> bool:
    """Parse ``events`` into chunk dicts appended to ``out``; True at ``[DONE]``."""
    for kind, data in events:
        if data.strip() == "[DONE]":
            return True
        try:
            doc = json.loads(data)
        except ValueError:
            raise malformed_stream(route, f"event {parser.events} is not JSON") from None
        if kind == "error" and not (isinstance(doc, dict) and doc.get("error")):
            doc = {"error": doc}
        if not isinstance(doc, dict):
            raise malformed_stream(route, f"event {parser.events} is a JSON {type(doc).__name__}, not an object")
        out.append(doc)
    return False
