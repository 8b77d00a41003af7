"""A real ``redis-server`` on 127.0.0.1 for tests: free port, no persistence, stopped afterwards.

Tests that need it fail (never skip) when redis-server is not installed, with
the command that installs it. Import the fixtures into a test module::

    from tests.redis_server import redis_server  # noqa: F401
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

INSTALL_HINT = (
    "redis-server is not installed; the Redis limit-store tests need a real one: "
    "`apt-get install -y redis-server` (Debian/Ubuntu), `brew install redis` (macOS), or see "
    "https://redis.io/docs/latest/operate/oss_and_stack/install/"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    """One redis-server process: ``url``, and ``kill()`` / ``stop()`` / ``cont()`` / ``start()`` for faults."""

    port: int
    workdir: Path
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(INSTALL_HINT, pytrace=False)
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.kill()
        pytest.fail(f"redis-server did not answer on 127.0.0.1:{self.port} within 10 s", pytrace=False)

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-run (connections reset, port closed)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server stays connected but never answers (a hung Redis)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"FLUSHALL\r\n")
            s.recv(16)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A redis-server shared by the session; each test should use its own key prefix or flush."""
    server = RedisServer(_free_port(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.resume()
    server.kill()


@pytest.fixture
def own_redis_server(tmp_path: Path):
    """A redis-server for one test that kills or pauses it."""
    server = RedisServer(_free_port(), tmp_path)
    server.start()
    yield server
    server.resume()
    server.kill()
