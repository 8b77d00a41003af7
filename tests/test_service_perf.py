"""The service's tail at concurrency: workers share connections evenly.

With one listening socket shared by the workers, whichever worker woke first accepted: 64 keep-alive
connections opened at once could land 63 on one worker and 1 on the other, whose queue was then the p99.
On Linux each worker now listens on a socket of its own on the port (SO_REUSEPORT) and the kernel spreads
connections over them; the supervisor keeps no listening socket (one nobody accepts on would be handed its
share of the connections), also after it replaces a dead worker.
"""

from __future__ import annotations

import pytest

import collections
import http.client
import json
import os
import signal
import time
from pathlib import Path

from tests.bounded import run_bounded
from tests.test_service_serve import Serve

def _listening(port: int) -> dict[int, int | None]:
    """Listening TCP sockets on ``port`` (127.0.0.1): inode -> pid of the process holding it (None: nobody)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], int(fields[9])
        if state == "0A" and int(local.split(":")[1], 16) == port:
            inodes.add(inode)
    owners: dict[int, int | None] = dict.fromkeys(inodes)
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inode = int(target[8:-1])
                    if inode in owners:
                        owners[inode] = int(pid_dir.name)
        except OSError:
            continue
    return owners


def _pids_of_connections(url: str, n: int) -> collections.Counter:
    """``n`` keep-alive connections opened together, each asked /healthz: worker pid -> connections."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    connections = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(n)]
    try:
        for connection in connections:
            connection.connect()
        pids: collections.Counter = collections.Counter()
        for connection in connections:
            connection.request("GET", "/healthz")
            pids[json.loads(connection.getresponse().read())["pid"]] += 1
        return pids
    finally:
        for connection in connections:
            connection.close()


def _workers_ready(serve: Serve, count: int = 2) -> set[int]:
    pids = serve.pids(count)
    assert len(pids) == count, f"the workers did not answer: {pids}"
    return pids


@pytest.mark.slow
def test_each_worker_listens_on_its_own_socket_and_connections_are_spread(hermes_home):
    serve = Serve(hermes_home, "--workers", "2", env={"PLUGIN_LLM_SERVICE_WARM": "0"})
    try:
        workers = _workers_ready(serve)
        port = int(serve.url.rsplit(":", 1)[1])
        owners = _listening(port)
        assert len(owners) == 2 and set(owners.values()) == workers, (owners, workers)  # none in the supervisor
        spread = run_bounded(lambda: _pids_of_connections(serve.url, 64), 120)
        assert set(spread) == workers and min(spread.values()) >= 8, spread  # a shared socket gave 63 and 1
        code, out, err = serve.stop()
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
    assert code == 0 and "2 workers" in out, (code, out, err[-3000:])


@pytest.mark.slow
def test_a_replaced_worker_gets_a_socket_of_its_own_and_no_connection_waits(hermes_home):
    serve = Serve(hermes_home, "--workers", "2", env={"PLUGIN_LLM_SERVICE_WARM": "0"})
    try:
        first = _workers_ready(serve)
        dead = min(first)
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the supervisor starts a replacement
            workers = serve.pids(2, limit=5)
            if len(workers) == 2 and dead not in workers:
                break
            time.sleep(0.2)
        assert len(workers) == 2 and dead not in workers, workers
        port = int(serve.url.rsplit(":", 1)[1])
        owners = _listening(port)
        # the dead worker's socket is gone with it: the supervisor kept no copy that would hold connections
        assert len(owners) == 2 and set(owners.values()) == workers, (owners, workers)
        spread = run_bounded(lambda: _pids_of_connections(serve.url, 64), 120)  # every connection answered
        assert set(spread) == workers and sum(spread.values()) == 64, spread
        code, out, err = serve.stop()
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
    assert code == 0, (code, out, err[-3000:])
