"""``plugin-llm serve-local``: the embedded offline model as an OpenAI-compatible server."""

from __future__ import annotations

import argparse

from plugin_llm.cli.main import CliError
from plugin_llm.local.server import serve_forever


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve-local",
        help="serve the embedded local model over OpenAI-compatible HTTP",
        description="Serve the embedded offline model (deterministic, no key, no network) at http://HOST:PORT/v1. "
        "Point a route at it with model.provider: custom and model.base_url.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be between 0 and 65535, got {args.port}")
    try:
        serve_forever(args.host, args.port)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0
