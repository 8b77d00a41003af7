"""OpenAI-compatible HTTP server for the embedded ``local`` model.

Endpoints: ``POST /v1/chat/completions`` (also ``/chat/completions``; SSE chunks with ``"stream":
true``), ``GET /v1/models`` (also ``/models``), ``GET /v1/models/<id>`` (that model or 404) and
``GET /health``.

It needs no API key: any ``Authorization`` header is accepted and ignored (never read, never
logged). Errors use the OpenAI error body ``{"error": {"message", "type", "param", "code"}}``: bad
JSON -> 400 ``invalid_request_error``, unknown path -> 404, wrong method -> 405. No per-request
logging. Built to add little to benchmarks: docs/design.md.
"""

from __future__ import annotations

import json
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from plugin_llm.local.model import LOCAL_MODEL, SCRIPTED_STREAM, generate, stream_pieces

__all__ = ["LocalModelServer", "serve_forever"]

_JSON = "application/json"
_SSE = "text/event-stream"
_MODEL_OBJ = {"id": LOCAL_MODEL, "object": "model", "created": 0, "owned_by": "plugin-llm-gateway"}
_MODELS_BODY = json.dumps({"object": "list", "data": [_MODEL_OBJ]}).encode()
_MODEL_BODY = json.dumps(_MODEL_OBJ).encode()
_HEALTH_BODY = json.dumps({"status": "ok", "model": LOCAL_MODEL}).encode()
_CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
_MODELS_PATHS = frozenset({"/v1/models", "/models"})
_MAX_BODY = 64 * 1024 * 1024


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _error_body(message: str, type_: str, code: str | None = None) -> bytes:
    return _dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


def _sse(completion: dict, include_usage: bool = True) -> list[bytes]:
    """A completion as OpenAI ``chat.completion.chunk`` SSE events (one bytes per event, ``[DONE]`` last)."""
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"], "system_fingerprint": completion.get("system_fingerprint")}
    choice = completion["choices"][0]
    message = choice["message"]
    events: list[dict] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    ]
    for piece in stream_pieces(message.get("content") or ""):  # several deltas, as a real model sends them
        events.append({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
    for index, call in enumerate(message.get("tool_calls") or []):
        delta = {"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                 "function": {"name": call["function"]["name"],
                                              "arguments": call["function"]["arguments"]}}]}
        events.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    if include_usage:
        events.append({**base, "choices": [], "usage": completion["usage"]})
    return [b"data: " + _dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "plugin-llm-local/1"
    sys_version = ""
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet: no per-request lines
        pass

    def _send(self, status: int, body: bytes, content_type: str = _JSON, extra: dict | None = None) -> None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        head = [f"HTTP/1.1 {status} {phrase}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        if content_type == _SSE:
            head.append("Cache-Control: no-cache")
        if self.close_connection:
            head.append("Connection: close")
        for k, v in (extra or {}).items():
            head.append(f"{k}: {v}")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    def _send_stream(self, events: list[bytes]) -> None:
        """SSE events as a chunked body, each event written (and so sent: TCP_NODELAY) on its own."""
        head = ["HTTP/1.1 200 OK", f"Content-Type: {_SSE}", "Cache-Control: no-cache", "Transfer-Encoding: chunked"]
        if self.close_connection:
            head.append("Connection: close")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        for event in events:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.write(b"0\r\n\r\n")

    def _read_body(self) -> bytes | None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        n = int(length)
        if n < 0 or n > _MAX_BODY:
            return None
        return self.rfile.read(n)

    def _path(self) -> str:
        path = self.path.split("?", 1)[0]
        return path.rstrip("/") if len(path) > 1 else path

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        path = self._path()
        if path in _MODELS_PATHS:
            self._send(200, _MODELS_BODY)
        elif path in ("/v1/models/" + LOCAL_MODEL, "/models/" + LOCAL_MODEL):
            self._send(200, _MODEL_BODY)
        elif path in ("/health", "/v1/health", "/"):
            self._send(200, _HEALTH_BODY)
        elif path in _CHAT_PATHS:
            self._send(405, _error_body("use POST for chat completions", "invalid_request_error"), extra={"Allow": "POST"})
        else:
            self._send(404, _error_body(f"unknown path {path!r}", "invalid_request_error", "not_found"))

    def do_POST(self) -> None:  # noqa: N802
        path = self._path()
        try:
            raw = self._read_body()
        except ValueError:
            raw = None
        if raw is None:
            self.close_connection = True
            self._send(400, _error_body("bad request body length", "invalid_request_error"))
            return
        if path not in _CHAT_PATHS:
            self._send(404, _error_body(f"unknown path {path!r}", "invalid_request_error", "not_found"))
            return
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self._send(400, _error_body(f"request body is not valid JSON: {exc}", "invalid_request_error"))
            return
        if not isinstance(body, dict):
            self._send(400, _error_body("request body must be a JSON object", "invalid_request_error"))
            return
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self._send(400, _error_body("'messages' must be a non-empty list", "invalid_request_error"))
            return
        try:
            completion = generate(
                messages,
                model=body.get("model"),
                response_format=body.get("response_format"),
                tools=body.get("tools"),
                tool_choice=body.get("tool_choice"),
                max_tokens=body.get("max_tokens", body.get("max_completion_tokens")),
            )
            completion.pop(SCRIPTED_STREAM, None)
        except Exception as exc:  # a bug in the local model must not kill the connection
            self._send(500, _error_body(f"local model failed: {type(exc).__name__}: {exc}", "server_error"))
            return
        if body.get("stream"):
            opts = body.get("stream_options")
            include_usage = True if not isinstance(opts, dict) else opts.get("include_usage", True) is not False
            self._send_stream(_sse(completion, include_usage))
        else:
            self._send(200, _dumps(completion))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (or stop() closing it) is not worth a traceback

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Close idle keep-alive connections so their threads end."""
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                conn.close()
            except OSError:
                pass


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class LocalModelServer:
    """The local model on ``http://host:port/v1``, served from a daemon thread.

    ``port=0`` binds a free port; read it from :attr:`port` / :attr:`base_url`
    after :meth:`start`. Use as a context manager to stop it reliably.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("LocalModelServer is not started; call start() first")
        return f"http://{_url_host(self.host)}:{self._port}/v1"

    def start(self) -> "LocalModelServer":
        if self._server is not None:
            return self
        server = _Server((self.host, self._port))
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1},
            name=f"local-model-server:{self._port}", daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "LocalModelServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"listening on {self.base_url}" if self._server is not None else "stopped"
        return f"<LocalModelServer {state}>"


def serve_forever(host: str, port: int) -> None:
    """Serve in the foreground until Ctrl-C (``plugin-llm serve-local``)."""
    server = _Server((host, port))
    print(f"local model listening on http://{_url_host(host)}:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.close_connections()
        server.server_close()
