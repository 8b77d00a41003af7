"""What a client connection may hold: a request head within ``service.header_timeout``, connection caps per
worker and per client address (the service's protocols, plugin_llm/service/connections.py), the open-file limit
raised at start, and a streamed answer that its client stops reading ended at the call's deadline."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from plugin_llm import limits
from plugin_llm.service.connections import (
    H11_PROTOCOL,
    PROTOCOL,
    ConnectionLimits,
    connection_limits,
    derived_max_connections,
)
from plugin_llm.config.service import ServiceSettings, parse_service_settings
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply
from tests.service_server import ServiceServer
from tests.stream_server import Stream, StreamServer, wait_for

ROOT = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "hello"}]
HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


def _connect(port: int, source: str = "127.0.0.1", timeout: float = 20.0, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes (True) or the socket's timeout passes (False: still held open)."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _held(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server still holds open (a closed one reads EOF or a reset, after any answer)."""
    held = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            while sock.recv(65536):
                pass
        except BlockingIOError:
            held += 1
        except OSError:
            pass
    return held


def _answer(sock: socket.socket) -> bytes:
    """What the server sends before it closes or goes quiet (the socket's timeout)."""
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
            if b"\r\n\r\n" in data and b"content-length" in data.lower():
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    return data
    except (ConnectionResetError, socket.timeout):
        return data


def _healthz(port: int, source: str = "127.0.0.1") -> bytes:
    with _connect(port, source) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return _answer(sock)


@pytest.mark.slow
@pytest.mark.parametrize("http", [PROTOCOL, H11_PROTOCOL], ids=["httptools", "h11"])
def test_a_half_sent_request_head_is_closed_after_the_header_timeout(hermes_home, http):
    guard = ConnectionLimits(header_timeout=0.3, max_connections=50)
    with ServiceServer(hermes_home, http=http, connections=guard, warm=False) as service:
        with _connect(service.port) as fresh:  # a new connection that never finishes its head
            fresh.sendall(HALF_HEAD)
            assert _closed_by_server(fresh)
        with _connect(service.port) as reused:  # between two requests of a keep-alive connection too
            reused.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _answer(reused).startswith(b"HTTP/1.1 200 ")
            reused.sendall(HALF_HEAD)  # uvicorn's own keep-alive timer stops at the first byte
            assert _closed_by_server(reused)
        assert _healthz(service.port).startswith(b"HTTP/1.1 200 ")  # a whole request is answered as before


@pytest.mark.slow
def test_the_per_address_cap_refuses_one_more_while_another_address_is_served(hermes_home, custom_route):
    guard = ConnectionLimits(header_timeout=30, max_connections=50, max_connections_per_address=3)
    with FakeServer(default=Reply(content="late", delay=3.0)) as upstream:
        custom_route(upstream.base_url)
        with ServiceServer(hermes_home, http=PROTOCOL, connections=guard) as service:
            token = service.token("busy")
            body = json.dumps({"messages": USER}).encode()
            busy = []
            for _ in range(3):  # calls in flight (the provider takes its time): nothing to evict
                sock = _connect(service.port)
                sock.sendall(b"POST /v1/plugin-llm/complete HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                             + token.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % len(body) + body)
                busy.append(sock)
            assert wait_for(lambda: len(upstream.requests) == 3, 20)
            with _connect(service.port) as one_more:
                one_more.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                refused = _answer(one_more)
            assert refused == b"" or refused.startswith(b"HTTP/1.1 503 "), refused[:200]
            if refused:
                assert b"too_many_connections" in refused and b"retry-after: 1" in refused
            assert _healthz(service.port, source="127.0.0.2").startswith(b"HTTP/1.1 200 ")
            assert all(_answer(sock).startswith(b"HTTP/1.1 200 ") for sock in busy)  # the calls were not touched
            for sock in busy:
                sock.close()


@pytest.mark.slow
@pytest.mark.parametrize("http", [PROTOCOL, H11_PROTOCOL], ids=["httptools", "h11"])
def test_a_request_body_sent_too_slowly_is_closed_too(hermes_home, http):
    guard = ConnectionLimits(header_timeout=0.3, max_connections=50)
    with ServiceServer(hermes_home, http=http, connections=guard, warm=False) as service:
        token = service.token("slow-body")
        with _connect(service.port) as sock:
            sock.sendall(b"POST /v1/plugin-llm/complete HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                         + token.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            assert _closed_by_server(sock)


@pytest.mark.slow
def test_at_a_cap_the_connection_waiting_longest_for_a_head_makes_room(hermes_home):
    guard = ConnectionLimits(header_timeout=30, max_connections=4, max_connections_per_address=3)
    with ServiceServer(hermes_home, http=PROTOCOL, connections=guard, warm=False) as service:
        slow = [_connect(service.port, timeout=5) for _ in range(3)]
        for sock in slow:
            sock.sendall(HALF_HEAD)
        time.sleep(0.2)
        assert _healthz(service.port).startswith(b"HTTP/1.1 200 ")  # the same address: its oldest slow one goes
        assert _closed_by_server(slow[0])
        other = [_connect(service.port, source="127.0.0.2", timeout=5) for _ in range(2)]
        for sock in other:
            sock.sendall(HALF_HEAD)
        time.sleep(0.2)
        assert _healthz(service.port, source="127.0.0.3").startswith(b"HTTP/1.1 200 ")  # the total: the oldest
        assert _closed_by_server(slow[1])
        assert service.server.server_state.plugin_llm_guard.counts["evicted"] == 2
        for sock in slow + other:
            sock.close()


def test_connection_settings_are_checked_with_clear_warnings():
    warnings: list[str] = []
    settings = parse_service_settings({"header_timeout": 0, "write_timeout": "x", "max_connections": 1.5,
                                       "max_connections_per_address": -1}, warnings)
    assert settings == ServiceSettings()
    assert len(warnings) == 4 and all(w.startswith("service.") and "using" in w for w in warnings)
    settings = parse_service_settings({"header_timeout": 2, "max_connections": 100,
                                       "max_connections_per_address": 10}, warnings := [])
    assert not warnings and (settings.header_timeout, settings.max_connections) == (2.0, 100)
    # more than the open-file limit allows: the derived cap, said so
    chosen, problems = connection_limits(ServiceSettings(max_connections=5000), 1024, None)
    assert chosen.max_connections == derived_max_connections(1024) < 1024 // 2
    assert "service.max_connections" in problems[0] and "ulimit" in problems[0]
    chosen, problems = connection_limits(ServiceSettings(), 1024, "10.0.0.1, 10.0.0.2")
    assert not problems and chosen.exempt == ("10.0.0.1", "10.0.0.2")
    assert chosen.max_connections_per_address <= chosen.max_connections


def _low_files(soft: int, hard: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return apply


@pytest.mark.slow
def test_serve_raises_the_file_limit_and_answers_a_real_client_under_a_flood(hermes_home):
    """300 connections that send half a head, under a soft limit of 128 (hard 256): the service raises its
    soft limit, holds at most its derived cap, and a real client is still answered."""
    write_config(hermes_home, "service:\n  header_timeout: 60\n")
    env = {**os.environ, "HERMES_HOME": str(hermes_home), "PLUGIN_LLM_SERVICE_WARM": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "plugin_llm", "serve", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env, preexec_fn=_low_files(128, 256))
    flood: list[socket.socket] = []
    try:
        first = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in first, proc.stderr.read()[-2000:]
        second = proc.stdout.readline()
        cap = derived_max_connections(256)
        assert f"at most {cap:,} connections" in second and "raised from 128" in second
        assert "Max open files            256                  256" in Path(f"/proc/{proc.pid}/limits").read_text()
        port = int(first.split("listening on http://127.0.0.1:", 1)[1].split()[0])
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=20).status_code == 200
        for i in range(300):
            sock = _connect(port, source=f"127.0.0.{2 + i % 50}", timeout=0.5)
            sock.sendall(HALF_HEAD)
            flood.append(sock)
        response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=20)  # the hang guard: 20 s
        assert response.status_code == 200
        time.sleep(0.5)  # the refusals and evictions are sent
        assert _held(flood) <= cap
    finally:
        for sock in flood:
            sock.close()
        proc.terminate()
        proc.communicate(timeout=60)


def _stream_request(token: str, timeout: float) -> bytes:

    body = json.dumps({"messages": USER, "stream": True, "timeout": timeout}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["deadline", "write_timeout", "deadline:uvicorn"])
def test_a_stream_its_client_stops_reading_ends_and_frees_its_slot(hermes_home, custom_route, which):
    """A client takes the first bytes of a long stream and stops reading: at the call's deadline (or after the
    write timeout, whichever comes first) the stream is abandoned - one record, its max_concurrent slot free.
    Under uvicorn's own protocol (no write timeout) the deadline still holds for the call."""
    which, _, protocol = which.partition(":")
    long = Stream(pieces=["x" * 4000] * 1500)  # 6 MB: far past every buffer between the service and the client
    with StreamServer(default=long) as upstream:
        custom_route(upstream.base_url, extra="plugins:\n  entries:\n    reader:\n      limits:\n"
                                              "        max_concurrent: 1\n")
        guard = ConnectionLimits(header_timeout=30, write_timeout=1.0 if which == "write_timeout" else 60,
                                 max_connections=50)
        with ServiceServer(hermes_home, http="auto" if protocol else PROTOCOL, connections=guard) as service:
            token = service.token("reader")
            with _connect(service.port, rcvbuf=4096) as slow:
                slow.sendall(_stream_request(token, 2.0 if which == "deadline" else 60))
                assert slow.recv(1024).startswith(b"HTTP/1.1 200 ")  # the first bytes; then it reads no more
                assert wait_for(lambda: len(audit_lines(hermes_home)) == 1, 30)
                [record] = audit_lines(hermes_home)
                assert record["status"] == "abandoned" and record["stream.abandoned_by"] == which
                assert record["plugin_id"] == "reader" and record["stream.partial"] is True
                upstream.default = Stream(pieces=["ok"])
                second = httpx.post(service.url + "/v1/chat/completions", headers=service.auth(token),
                                    json={"messages": USER, "stream": True}, timeout=20)  # admitted: the slot is free
                assert second.status_code == 200 and "data: [DONE]" in second.text, second.text
                if not protocol:
                    assert _closed_by_server(slow)  # and its connection is gone
    assert [r["status"] for r in audit_lines(hermes_home)] == ["abandoned", "ok"]
