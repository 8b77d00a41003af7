"""Test helper: a scriptable OpenAI-compatible *streaming* server on 127.0.0.1 (real sockets, chunked SSE).

Each request takes the next :class:`Stream` of the script (then ``default``)
and answers it event by event, each event written and flushed on its own:

    with StreamServer([Stream(pieces=["Hel", "lo"])]) as server:
        ...  # point a custom route at server.base_url

Faults: ``status`` (an error body instead of a stream), ``stall_after`` (stop
sending after that many pieces, without closing), ``cut_after`` (drop the
connection after that many pieces), ``trickle`` (after the first piece, one
byte of an SSE comment every 50 ms, forever), ``raw`` (these bytes as the
body), ``usage=None`` (no usage chunk). Requests are recorded (headers, JSON body).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["StreamServer", "Stream"]


@dataclass
class Stream:
    pieces: list[str] = field(default_factory=lambda: ["Hello", ", ", "world"])
    usage: dict | None = field(default_factory=lambda: {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12})
    model: str = "gpt-4o-2024-08-06"
    status: int = 200
    message: str = "server error"
    stall_after: int | None = None
    cut_after: int | None = None
    trickle: bool = False
    raw: bytes | None = None
    finish_reason: str = "stop"


def _event(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def do_POST(self) -> None:  # noqa: N802
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        script = owner._next({k.lower(): v for k, v in self.headers.items()}, body)
        if script.status != 200:
            data = json.dumps({"error": {"message": script.message, "type": "server_error", "param": None,
                                         "code": None}}).encode()
            self.wfile.write(f"HTTP/1.1 {script.status} Error\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
            return
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        if script.raw is not None:
            self._chunk(script.raw)
            self._chunk(b"")
            return
        base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1700000000, "model": script.model}
        self._chunk(_event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "finish_reason": None}]}))
        for i, piece in enumerate(script.pieces):
            if script.stall_after is not None and i == script.stall_after:
                owner._released.wait()
                self.close_connection = True
                return
            if script.cut_after is not None and i == script.cut_after:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._chunk(_event({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}))
            if script.trickle and i == 0:
                while not owner._released.wait(0.05):
                    self._chunk(b":")
                return
        self._chunk(_event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": script.finish_reason}]}))
        if script.usage is not None and (body or {}).get("stream_options", {}).get("include_usage"):
            self._chunk(_event({**base, "choices": [], "usage": script.usage}))
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: "StreamServer") -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-stream is the point of several tests


class StreamServer:
    def __init__(self, script: list[Stream] | None = None, default: Stream | None = None) -> None:
        self._script: deque[Stream] = deque(script or [])
        self.default = default or Stream()
        self.requests: list[tuple[dict, Any]] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._server: _Server | None = None
        self.port = 0

    def _next(self, headers: dict, body: Any) -> Stream:
        with self._lock:
            self.requests.append((headers, body))
            return self._script.popleft() if self._script else self.default

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "StreamServer":
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                         name=f"stream-server:{self.port}").start()
        return self

    def stop(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "StreamServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def wait_for(predicate, seconds: float = 10.0) -> bool:
    """Poll ``predicate`` until true (for records written by another thread); False after ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())
