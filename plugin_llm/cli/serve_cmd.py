"""``plugin-llm serve``: the gateway as an HTTP service for plugins out of process.

Binds 127.0.0.1 unless ``--host`` says otherwise (with a warning when no TLS
is configured), prints the URL, and serves the native and OpenAI-compatible
endpoints to callers holding a plugin token (``plugin-llm tokens create``).
SIGTERM drains the calls in flight within their deadlines.
"""

from __future__ import annotations

import argparse
import os
import sys

from plugin_llm.cli._common import add_home_argument, home_from, printable
from plugin_llm.cli.main import CliError, colour
from plugin_llm.service.server import ServeOptions, serve, tls_warning

__all__ = ["register", "run"]

_MAX_WORKERS = 256


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve the gateway over HTTP to plugins holding a token",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8787, help="port (default 8787; 0 picks a free one)")
    p.add_argument("--workers", type=int, default=1, help="worker processes sharing the socket (default 1)")
    p.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--ssl-keyfile", default=None, help="the certificate's private key (PEM)")
    p.add_argument("--behind-tls-proxy", action="store_true",
                   help="a TLS-terminating proxy or load balancer is in front (silences the clear-text warning)")
    p.add_argument("--forwarded-allow-ips", default=os.environ.get("FORWARDED_ALLOW_IPS") or None, metavar="ADDRS",
                   help="believe X-Forwarded-For from these proxies (comma-separated addresses or networks; "
                        "default $FORWARDED_ALLOW_IPS, else none: the client address is the connection's)")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (default warning)")
    add_home_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be between 0 and 65535, got {args.port}")
    if not 1 <= args.workers <= _MAX_WORKERS:
        raise CliError(f"--workers must be between 1 and {_MAX_WORKERS}, got {args.workers}")
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        raise CliError("--ssl-certfile and --ssl-keyfile go together: pass both, or neither")
    home = home_from(args)
    if not home.is_dir():
        raise CliError(f"the home {home} is not a directory (set $HERMES_HOME or pass --home)")
    options = ServeOptions(home=home.resolve(), host=args.host, port=args.port, workers=args.workers,
                           ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
                           behind_tls_proxy=args.behind_tls_proxy, log_level=args.log_level,
                           forwarded_allow_ips=args.forwarded_allow_ips)
    warning = tls_warning(options)
    if warning is not None:
        print(f"plugin-llm: {colour('warning', '33')}: {warning}", file=sys.stderr, flush=True)
    try:
        return serve(options)
    except OSError as exc:
        raise CliError(f"cannot listen on {printable(args.host)}:{args.port}: {exc.strerror or exc}") from None
