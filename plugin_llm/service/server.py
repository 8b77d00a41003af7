"""Running the service: uvicorn on a socket we bind, one process or N workers.

The socket is bound here (before uvicorn starts), so the URL printed at
start-up has the real port even for ``--port 0``, and every worker accepts on
the same port. SIGTERM (or Ctrl-C) stops accepting, lets every call in flight
finish - each within its own deadline, at most ``llm.max_timeout`` - then
flushes the limits stores and the audit log and exits 0. With several
workers, the parent forwards SIGTERM to each and waits for them.

On Linux each worker listens on a socket of its own bound to the same port
(``SO_REUSEPORT``), so the kernel spreads new connections evenly over the
workers. With one shared socket, whichever worker wakes first accepts: a
client pool opening 64 keep-alive connections at once could leave 63 on one
worker and 1 on the other, and that worker's queue became the tail latency.
Elsewhere (no load-balancing ``SO_REUSEPORT``) the workers share one socket.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = ["ServeOptions", "serve", "LOOPBACK_HOSTS", "tls_warning"]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
#: seconds added to llm.max_timeout for a call's answer to be written before the process exits
_DRAIN_MARGIN = 5.0


@dataclass(frozen=True)
class ServeOptions:
    home: Path
    host: str = "127.0.0.1"
    port: int = 8787
    workers: int = 1
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: the operator says a TLS-terminating proxy or load balancer is in front
    behind_tls_proxy: bool = False
    log_level: str = "warning"
    #: proxies whose X-Forwarded-For/-Proto are believed (comma-separated addresses/networks, or "*");
    #: None: no proxy headers are read, so a client cannot pick the address the auth brake counts
    forwarded_allow_ips: str | None = None


def tls_warning(options: ServeOptions) -> str | None:
    """The warning printed when the service listens beyond loopback with no TLS anywhere."""
    if options.host in LOOPBACK_HOSTS or options.ssl_certfile or options.behind_tls_proxy:
        return None
    return (f"listening on {options.host}, beyond this machine, without TLS: tokens and prompts cross the network "
            "in clear text. Put a TLS-terminating proxy or load balancer in front (and pass --behind-tls-proxy), "
            "or pass --ssl-certfile/--ssl-keyfile")


#: the kernel balances connections over the sockets of one port (Linux); elsewhere SO_REUSEPORT does not
REUSEPORT_BALANCES = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def _bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _balanced_multiprocess(config, first: socket.socket, host: str):
    """uvicorn's supervisor, each worker (and each replacement of a dead one) given its own SO_REUSEPORT socket.

    The parent closes its copy of a worker's socket once the worker is started (the child has it): a socket of
    the port's group that nobody accepts on would still be handed its share of the connections.
    """
    from uvicorn.supervisors import Multiprocess

    port = first.getsockname()[1]

    class Balanced(Multiprocess):
        def __init__(self) -> None:
            self._unused = [first]  # listening, not yet given to a worker
            self._given: list[socket.socket] = []
            super().__init__(config, sockets=[])

        @property  # uvicorn builds every worker as Process(self.config, self.sockets)
        def sockets(self) -> list[socket.socket]:
            sock = self._unused.pop(0) if self._unused else _bind(host, port, reuse_port=True)
            self._given.append(sock)
            return [sock]

        @sockets.setter
        def sockets(self, value: list[socket.socket]) -> None:
            pass

        def _close_given(self) -> None:
            while self._given:
                self._given.pop().close()

        def init_processes(self) -> None:
            # every worker's socket listens before the first starts: early connections wait, none is refused
            self._unused += [_bind(host, port, reuse_port=True) for _ in range(self.processes_num - 1)]
            try:
                super().init_processes()
            finally:
                self._close_given()
                while self._unused:
                    self._unused.pop().close()

        def keep_subprocess_alive(self) -> None:
            try:
                super().keep_subprocess_alive()
            finally:
                self._close_given()

        def restart_all(self) -> None:
            try:
                super().restart_all()
            finally:
                self._close_given()

    return Balanced()


def _url(options: ServeOptions, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    host = f"[{options.host}]" if ":" in options.host else options.host
    scheme = "https" if options.ssl_certfile else "http"
    return f"{scheme}://{host}:{port}"


def serve(options: ServeOptions, out: TextIO = sys.stdout) -> int:
    """Serve until SIGTERM/SIGINT; 0 after a clean drain. Raises OSError when the address cannot be bound."""
    import uvicorn

    from plugin_llm.config import get_config_source
    from plugin_llm.service.connections import (
        H11_PROTOCOL,
        PROTOCOL,
        GuardedHttpToolsProtocol,
        connection_limits,
        raise_file_limit,
    )

    os.environ["HERMES_HOME"] = str(options.home)  # the workers' app factory reads it
    host_config = get_config_source(options.home).current()
    max_timeout = host_config.llm.max_timeout
    files = raise_file_limit()  # before any worker starts: they inherit it
    connections, problems = connection_limits(host_config.service, files[1] if files else None,
                                              options.forwarded_allow_ips)
    for problem in problems:  # the config's own warnings are printed as it is read
        print(f"plugin-llm serve: warning: {problem}", file=sys.stderr, flush=True)
    metrics_dir = None
    if options.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        metrics_dir = tempfile.mkdtemp(prefix="plugin-llm-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # /metrics sums every worker's counts
    balanced = options.workers > 1 and REUSEPORT_BALANCES
    sock = _bind(options.host, options.port, reuse_port=balanced)
    config = uvicorn.Config(
        "plugin_llm.service.app:app_from_env",
        factory=True,
        # a response's head and body in one write; header and write timeouts, connection caps (connections.py)
        http=PROTOCOL if GuardedHttpToolsProtocol is not None else H11_PROTOCOL,
        ws="none",  # no WebSocket routes: an upgrade would leave the guard's protocol
        workers=options.workers,
        log_level=options.log_level,
        # with --log-format, uvicorn's own loggers reach the process's one handler instead of their own
        log_config=None if os.environ.get("PLUGIN_LLM_LOG_FORMAT") else uvicorn.config.LOGGING_CONFIG,
        access_log=False,  # request lines carry nothing an operator needs that the audit log lacks
        server_header=False,
        timeout_graceful_shutdown=int(max_timeout + _DRAIN_MARGIN),
        ssl_certfile=options.ssl_certfile,
        ssl_keyfile=options.ssl_keyfile,
        lifespan="on",
        # uvicorn believes X-Forwarded-For from 127.0.0.1 by default: every local client could then name any
        # address (dodging the failed-auth brake, or blocking someone else's); only a configured proxy may
        proxy_headers=options.forwarded_allow_ips is not None,
        forwarded_allow_ips=options.forwarded_allow_ips,
    )
    config.plugin_llm_connections = connections  # read by each worker's protocol (pickled with the config)
    stopped_by: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        # uvicorn re-raises the signal that stopped it once it has drained; this handler takes it, so a
        # drained service exits 0 instead of dying of the signal (the supervisor of --workers has its own)
        signal.signal(signum, lambda number, frame: stopped_by.append(number))
    url = _url(options, sock)
    print(f"plugin-llm serve: listening on {url} ({options.workers} worker{'s' if options.workers != 1 else ''}, "
          f"home {options.home}); SIGTERM drains calls in flight (up to {max_timeout + _DRAIN_MARGIN:g}s)",
          file=out, flush=True)
    print(f"plugin-llm serve: per worker at most {connections.max_connections:,} connections, "
          f"{connections.max_connections_per_address:,} per client address; a request head within "
          f"{connections.header_timeout:g}s, a stalled answer dropped after {connections.write_timeout:g}s"
          + (f"; open-file limit {files[1]:,}" + (f" (raised from {files[0]:,})" if files[0] != files[1] else "")
             if files else ""), file=out, flush=True)
    try:
        if balanced:
            _balanced_multiprocess(config, sock, options.host).run()
        elif options.workers > 1:
            from uvicorn.supervisors import Multiprocess

            Multiprocess(config, sockets=[sock]).run()
        else:
            server = uvicorn.Server(config)
            server.run(sockets=[sock])
            if not server.started:
                return 1
    finally:
        sock.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    why = f" by {signal.Signals(stopped_by[0]).name}" if stopped_by else ""
    print(f"plugin-llm serve: stopped{why}", file=out, flush=True)
    return 0
