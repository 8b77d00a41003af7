"""Test helpers: a scriptable OpenAI-compatible fault server on 127.0.0.1.

``FakeServer`` answers every request (any method, any path) with the next
:class:`Reply` from its script, then with ``default``. It records every
request it received. Replies can be normal completions, OpenAI error bodies
with headers (429 + ``Retry-After``), malformed bodies, slow replies, replies
computed from the request (echo tests), or hangs that never answer until the
server stops.

    with FakeServer([Reply.error(429, "slow down", headers={"Retry-After": "0"}),
                     Reply(content="hello")]) as server:
        ...  # point the client at server.base_url
        assert len(server.requests) == 2
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Union

__all__ = ["FakeServer", "Reply", "RecordedRequest"]

BodyFn = Callable[[Any, dict, str], tuple]


@dataclass
class Reply:
    """One scripted answer.

    ``body=None`` means a normal ``chat.completion`` whose message content is
    ``content`` (or ``tool_calls``), reporting ``model`` and ``usage``; with
    ``"stream": true`` in the request it is sent as SSE chunks. A dict body is
    sent as JSON, a str/bytes body verbatim. ``body`` may also be a callable
    ``(request_json, headers, path) -> (status, dict | str[, headers])``.
    ``delay`` waits before answering; ``hang`` never answers (until stop()).
    """

    status: int = 200
    body: Union[dict, str, bytes, BodyFn, None] = None
    content: str | None = "ok"
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    hang: bool = False
    model: str = "fake-model-2024-01-01"
    usage: dict = field(default_factory=lambda: {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
    tool_calls: list | None = None
    finish_reason: str | None = None

    @classmethod
    def error(cls, status: int, message: str = "error", headers: dict | None = None, *,
              type: str | None = None, code: str | None = None) -> "Reply":
        """An OpenAI-style error body ``{"error": {"message", "type", "param", "code"}}``."""
        default_type = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                        404: "not_found_error", 429: "rate_limit_error"}.get(status, "server_error")
        body = {"error": {"message": message, "type": type or default_type, "param": None, "code": code}}
        return cls(status=status, body=body, headers=dict(headers or {}))

    @classmethod
    def json(cls, content: str, **kw: Any) -> "Reply":
        """A normal completion whose message content is ``content`` (JSON text or not)."""
        return cls(content=content, **kw)

    @classmethod
    def malformed(cls, body: bytes = b'{"id": "chatcmpl-broken", "choices": [', status: int = 200,
                  content_type: str = "application/json") -> "Reply":
        """A 200 whose body is not JSON although it claims to be."""
        return cls(status=status, body=body, headers={"Content-Type": content_type})

    @classmethod
    def tool_call(cls, name: str, arguments: dict | str, call_id: str = "call_fake_1", **kw: Any) -> "Reply":
        """A completion asking for one tool call."""
        args = arguments if isinstance(arguments, str) else json.dumps(arguments)
        calls = [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]
        return cls(content=None, tool_calls=calls, **kw)

    @classmethod
    def hanging(cls) -> "Reply":
        return cls(hang=True)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict
    json: Any  # the parsed body, or None when it was empty or not JSON
    body: bytes = b""


def _completion(reply: Reply, n: int) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    return {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": 1700000000,
        "model": reply.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": reply.usage,
    }


def _sse(completion: dict) -> bytes:
    base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = completion["choices"][0]
    msg = choice["message"]
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    if msg.get("content"):
        events.append({**base, "choices": [{"index": 0, "delta": {"content": msg["content"]}, "finish_reason": None}]})
    for i, call in enumerate(msg.get("tool_calls") or []):
        events.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [{**call, "index": i}]},
                                            "finish_reason": None}]})
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    events.append({**base, "choices": [], "usage": completion["usage"]})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        headers = dict(self.headers.items())
        path = self.path
        n = fake._record(RecordedRequest(self.command, path, headers, parsed, raw))
        reply = fake._next()
        if reply.hang:
            fake._released.wait()
            self.close_connection = True
            return
        if reply.delay and fake._released.wait(reply.delay):
            self.close_connection = True
            return
        status, extra = reply.status, dict(reply.headers)
        body: Any = reply.body
        if callable(body):
            result = body(parsed, headers, path)
            status, body = result[0], result[1]
            if len(result) > 2:
                extra.update(result[2])
        content_type = "application/json"
        if body is None:
            completion = _completion(reply, n)
            if isinstance(parsed, dict) and parsed.get("stream"):
                data, content_type = _sse(completion), "text/event-stream"
            else:
                data = json.dumps(completion).encode()
        elif isinstance(body, (dict, list)):
            data = json.dumps(body).encode()
        elif isinstance(body, str):
            data = body.encode()
            content_type = "text/plain; charset=utf-8"
        else:
            data = bytes(body)
            content_type = "application/octet-stream"
        names = {k.lower() for k in extra}
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        head = [f"HTTP/1.1 {status} {phrase}", f"Content-Length: {len(data)}"]
        if "content-type" not in names:
            head.append(f"Content-Type: {content_type}")
        head += [f"{k}: {v}" for k, v in extra.items() if k.lower() != "content-length"]
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, fake: "FakeServer") -> None:
        self.fake = fake
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conns_lock:
            self.conns.add(request)
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (or stop() closing it) is not worth a traceback

    def shutdown_request(self, request: Any) -> None:
        with self.conns_lock:
            self.conns.discard(request)
        super().shutdown_request(request)


class FakeServer:
    """Scriptable OpenAI-compatible server on 127.0.0.1 (free port), HTTP/1.1."""

    def __init__(self, script: list[Reply] | None = None, default: Reply | None = None) -> None:
        self.default = default if default is not None else Reply()
        self._script: deque[Reply] = deque(script or [])
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- script and record

    def push(self, *replies: Reply) -> None:
        """Append replies to the script (each request takes the next one)."""
        with self._lock:
            self._script.extend(replies)

    def _next(self) -> Reply:
        with self._lock:
            return self._script.popleft() if self._script else self.default

    def _record(self, request: RecordedRequest) -> int:
        with self._lock:
            self._requests.append(request)
            return len(self._requests)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the requests received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def last_reply_id(self) -> str:
        """The ``id`` of the completion (or of every chunk of the stream) answering the last request."""
        with self._lock:
            return f"chatcmpl-fake-{len(self._requests)}"

    # -- lifecycle

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeServer":
        if self._server is None:
            self._released.clear()
            self._server = _Server(self)
            self.port = self._server.server_address[1]
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"fake-server:{self.port}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, release hanging/delayed handlers and drop connections."""
        server, self._server = self._server, None
        if server is None:
            return
        self._released.set()
        server.shutdown()
        with server.conns_lock:
            conns = list(server.conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
