"""Slowloris against ``plugin-llm serve``, and a stream whose client stops reading. Loopback only.

``python benchmarks/bench_slowloris.py [--connections 1100] [--baseline REV]``

**Flood.** The service (one worker, 1024 open files) against N connections that each send half a
request head and wait (re-opened when closed), while a real client asks ``/healthz`` and makes an
authenticated call 5 times. Printed: the server's sockets, the flood still open, how often it was
closed and re-opened, and the real client's time to answer ("-" when not answered).

**Slow reader.** A plugin streams 6 MB with ``timeout: 2`` to a client that stops reading.
Printed: the call's end after its deadline, the record's status and ``stream.abandoned_by``, when
the client sees its connection closed, and whether a second call is admitted under
``max_concurrent: 1``. ``--baseline REV`` runs the same against git revision REV. Method:
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
USER = [{"role": "user", "content": "hello"}]
#: bounds: every wait of this benchmark
_ANSWER_SECONDS = 10.0
_FLOOD_SECONDS = 30.0


class Serve:
    """``plugin-llm serve`` with a given open-file limit, from this tree or another (``source``)."""

    def __init__(self, home: Path, soft: int, hard: int, source: Path) -> None:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        env = {**os.environ, "HERMES_HOME": str(home), "PLUGIN_LLM_SERVICE_WARM": "0", "PYTHONPATH": str(source)}
        self.proc = subprocess.Popen([sys.executable, "-m", "plugin_llm", "serve", "--port", "0"], cwd=source,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     preexec_fn=limit)
        first = self.proc.stdout.readline()
        if "listening on http://127.0.0.1:" not in first:
            raise SystemExit(f"serve did not start: {first!r}")
        self.port = int(first.split("listening on http://127.0.0.1:", 1)[1].split()[0])
        self.url = f"http://127.0.0.1:{self.port}"

    def sockets(self) -> int:
        fd_dir = Path(f"/proc/{self.proc.pid}/fd")
        count = 0
        for fd in fd_dir.iterdir():
            try:
                count += os.readlink(fd).startswith("socket:")
            except OSError:
                pass
        return count

    def soft_limit(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
        return -1

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Flood:
    """N half-head connections, re-opened as the server closes them (``pump``)."""

    def __init__(self, port: int, count: int, addresses: list[str]) -> None:
        self.port = port
        self.addresses = addresses
        self.selector = selectors.DefaultSelector()
        self.reopened = 0
        self.failed = 0
        for i in range(count):
            self._open(i)

    def _open(self, i: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self.addresses[i % len(self.addresses)], 0))
            sock.connect(("127.0.0.1", self.port))
            sock.sendall(HALF_HEAD)
        except OSError:
            sock.close()
            self.failed += 1
            return
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, i)

    def pump(self, seconds: float) -> None:
        """For ``seconds``: read what the server sends; a closed connection is opened again."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            for key, _ in self.selector.select(timeout=min(left, 0.05)):
                sock = key.fileobj
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.selector.unregister(sock)
                    sock.close()
                    self.reopened += 1
                    self._open(key.data)

    def open_count(self) -> int:
        return len(self.selector.get_map())

    def close(self) -> None:
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        self.selector.close()


def _timed(fn) -> float | None:
    started = time.perf_counter()
    try:
        ok = fn()
    except Exception:  # noqa: BLE001 - not answered (timeout, reset): reported as such
        return None
    return time.perf_counter() - started if ok else None


def flood_case(source: Path, label: str, hard: int, spread: bool, count: int) -> dict:
    import threading

    import httpx

    from tests.servers import FakeServer, Reply

    home = Path(tempfile.mkdtemp(prefix="bench-slowloris-"))
    with FakeServer(default=Reply(content="answered")) as upstream:
        (home / "config.yaml").write_text(f"model:\n  provider: custom\n  model: m\n  base_url: {upstream.base_url}\n")
        token = _token(home, "real", source)
        serve = Serve(home, 1024, hard, source)
        flood = None
        try:
            auth = {"Authorization": f"Bearer {token}"}
            assert httpx.post(serve.url + "/v1/plugin-llm/complete", headers=auth, json={"messages": USER},
                              timeout=30).status_code == 200  # warm: litellm loaded before the flood
            addresses = [f"127.0.0.{i}" for i in range(2, 22)] if spread else ["127.0.0.1"]
            flood = Flood(serve.port, count, addresses)
            flood.pump(1.0)
            stop = threading.Event()
            pumping = threading.Thread(target=lambda: [flood.pump(0.2) for _ in range(int(_FLOOD_SECONDS / 0.2))
                                                       if not stop.is_set()], daemon=True)
            pumping.start()
            health, calls = [], []
            for _ in range(5):
                health.append(_timed(lambda: httpx.get(serve.url + "/healthz", timeout=_ANSWER_SECONDS,
                                                       headers={"Connection": "close"}).status_code == 200))
                calls.append(_timed(lambda: httpx.post(serve.url + "/v1/plugin-llm/complete", timeout=_ANSWER_SECONDS,
                                                       headers={**auth, "Connection": "close"},
                                                       json={"messages": USER}).status_code == 200))
            held_sockets = serve.sockets()
            stop.set()
            pumping.join(_FLOOD_SECONDS + 5)
            return {"case": label, "soft": serve.soft_limit(), "server_sockets": held_sockets,
                    "flood_open": flood.open_count(), "reopened": flood.reopened, "connect_failed": flood.failed,
                    "healthz": health, "complete": calls}
        finally:
            if flood is not None:
                flood.close()
            serve.stop()


def _token(home: Path, plugin: str, source: Path) -> str:
    out = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                          "from plugin_llm.service.tokens import TokenStore; "
                          "print(TokenStore(Path(sys.argv[1])).create(sys.argv[2])[1])", str(home), plugin],
                         cwd=source, env={**os.environ, "PYTHONPATH": str(source)}, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def slow_reader_case(source: Path, label: str) -> dict:
    import httpx

    from tests.stream_server import Stream, StreamServer

    timeout = 2.0
    home = Path(tempfile.mkdtemp(prefix="bench-slowreader-"))
    with StreamServer([Stream(pieces=["warm"])], default=Stream(pieces=["x" * 4000] * 1500)) as upstream:
        (home / "config.yaml").write_text(
            f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {upstream.base_url}\n"
            "plugins:\n  entries:\n    reader:\n      limits:\n        max_concurrent: 1\n")
        token = _token(home, "reader", source)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        serve = Serve(home, soft, hard, source)
        try:
            assert httpx.post(serve.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {token}"},
                              json={"messages": USER, "stream": True}, timeout=30).status_code == 200  # warm
            body = json.dumps({"messages": USER, "stream": True, "timeout": timeout}).encode()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", serve.port))
            sent = time.monotonic()
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                         + token.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(body) + body)
            sock.recv(1024)  # the first bytes; then it reads no more
            record = _wait_record(home, sent + timeout + _ANSWER_SECONDS * 2)
            seen_after = time.monotonic() - sent - timeout
            closed_after = _closed_after(sock, sent + timeout + _ANSWER_SECONDS)
            upstream.default = Stream(pieces=["ok"])
            second = httpx.post(serve.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {token}"},
                                json={"messages": USER, "stream": True}, timeout=_ANSWER_SECONDS).status_code
            sock.close()
        finally:
            serve.stop()
    end_after = None if record is None else record["latency_ms"] / 1000 - timeout
    return {"case": label, "record": None if record is None else record["status"],
            "abandoned_by": None if record is None else record.get("stream.abandoned_by"),
            "end_after_deadline_s": end_after, "record_seen_after_deadline_s": seen_after if record else None,
            "client_closed_after_deadline_s": None if closed_after is None else closed_after - timeout,
            "second_call": second}


def _wait_record(home: Path, until: float) -> dict | None:
    """The stream's audit record (``<home>/logs/agent.log``), once written."""
    path = home / "logs" / "agent.log"
    while time.monotonic() < until:
        if path.exists():
            for line in path.read_text(encoding="utf-8").split("\n"):
                if line.strip():
                    record = json.loads(line)
                    if record.get("stream") is True and record.get("status") != "ok":
                        return record
        time.sleep(0.02)
    return None


def _closed_after(sock: socket.socket, until: float) -> float | None:
    """Seconds from the request until the client sees its connection closed (draining what was sent)."""
    started = until - _ANSWER_SECONDS - 2.0
    sock.settimeout(0.2)
    while time.monotonic() < until:
        try:
            if not sock.recv(1 << 20):
                return time.monotonic() - started
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - started
    return None


def _fmt(times: list[float | None]) -> str:
    answered = [t for t in times if t is not None]
    if not answered:
        return f"not answered (0/{len(times)})"
    return (f"median {statistics.median(answered) * 1000:.1f} ms, max {max(answered) * 1000:.1f} ms "
            f"({len(answered)}/{len(times)} answered)")


def _extract(rev: str) -> Path:
    target = Path(tempfile.mkdtemp(prefix="bench-slowloris-base-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "plugin_llm", "audit", "auth"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=1100)
    parser.add_argument("--baseline", metavar="REV", help="also run git revision REV's service")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client holds the flood
    if hard < args.connections + 100:
        raise SystemExit(f"this shell's hard open-file limit ({hard}) is too low for {args.connections} connections")
    trees = [("this tree", ROOT)] + ([(f"baseline {args.baseline}", _extract(args.baseline))] if args.baseline else [])
    for name, source in trees:
        print(f"== {name}: {args.connections} half-head connections; the server's soft open-file limit 1024")
        for label, limit, spread in (("hard 1024, one address", 1024, False),
                                     ("hard 1024, 20 addresses", 1024, True),
                                     (f"hard {hard}, 20 addresses", hard, True)):
            result = flood_case(source, label, limit, spread, args.connections)
            print(f"  {label}: server soft limit {result['soft']}, server sockets {result['server_sockets']}, "
                  f"flood open {result['flood_open']}/{args.connections} (re-opened {result['reopened']}, "
                  f"connect failed {result['connect_failed']})")
            print(f"    real client /healthz: {_fmt(result['healthz'])}; complete: {_fmt(result['complete'])}")
        result = slow_reader_case(source, "slow reader")
        end, seen = result["end_after_deadline_s"], result["record_seen_after_deadline_s"]
        closed = result["client_closed_after_deadline_s"]
        print(f"  slow reader (timeout 2 s): record {result['record']} (abandoned_by {result['abandoned_by']}); "
              + (f"the call's latency minus its timeout {end * 1000:.1f} ms, the record read by the client "
                 f"{seen * 1000:.0f} ms after the deadline (20 ms polls)" if end is not None
                 else f"no record within {_ANSWER_SECONDS * 2:g} s of the deadline"))
        print(f"    the client saw its connection closed "
              f"{'%.0f ms after the deadline' % (closed * 1000) if closed is not None else 'never (bounded wait)'}; "
              f"a second call under max_concurrent 1: HTTP {result['second_call']}")


if __name__ == "__main__":
    main()
