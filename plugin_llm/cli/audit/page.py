"""``plugin-llm audit serve``: the auditor's page, a read-only web view of the log(s) and budgets.

Starlette and uvicorn load on first use; any address but loopback needs the admin token.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from audit.replicas import Replica
from plugin_llm.auditpage.data import Source
from plugin_llm.cli.audit.keys import key_paths
from plugin_llm.cli.audit.locations import find_log, find_replicas, home_of
from plugin_llm.cli.audit.options import quoted
from plugin_llm.cli.main import CliError


def run_serve(args: argparse.Namespace) -> int:
    import ipaddress
    import secrets
    import socket

    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be between 0 and 65535, got {args.port}")
    if args.log:
        source = Source(tuple(find_replicas(args)))
    else:
        if args.pubkey and len(args.pubkey) > 1:
            raise CliError("--pubkey: one public keys file for the home's log (several go with several --log)")
        home = home_of(args)
        log = find_log(args)
        _settings, _key, pub = key_paths(home)
        chosen = Path(args.pubkey[0]).expanduser() if args.pubkey else (pub if pub.is_file() else None)
        source = Source((Replica(home.resolve().name or "home", log, chosen),), home)
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    token = None
    if args.token or not loopback:
        if not args.token:
            raise CliError(f"--host {quoted(args.host)} lets other machines read the audit log: add --token "
                           f"(the page then needs the admin token), or keep the default 127.0.0.1")
        from plugin_llm.auditpage.app import ADMIN_TOKEN_ENV, MIN_TOKEN_CHARS  # on first use: it loads Starlette

        token = os.environ.get(ADMIN_TOKEN_ENV, "").strip() or None
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            raise CliError(f"${ADMIN_TOKEN_ENV} is {len(token)} characters; use at least {MIN_TOKEN_CHARS} random "
                           f"ones (e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
        if token is None:
            token = secrets.token_urlsafe(32)
            print(f"admin token (sign in with it; not stored anywhere): {token}", file=sys.stderr)
    try:
        infos = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
        sock = socket.socket(infos[0][0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(64)
    except OSError as exc:
        raise CliError(f"cannot listen on {quoted(args.host)}:{args.port}: {exc.strerror or exc}") from None
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    print(f"audit page: http://{shown_host}:{port}/  (read-only; "
          + ("the admin token is required)" if token else "no token: anyone on this machine can open it; --token "
             "requires one)") + "; Ctrl-C stops it", file=sys.stderr, flush=True)
    return _run_page(source, token, sock)


def _run_page(source: Any, token: str | None, sock: Any) -> int:
    import uvicorn

    from plugin_llm.auditpage.app import create_audit_app  # on first use: it loads Starlette

    app = create_audit_app(source, token=token)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                           server_header=False))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0
