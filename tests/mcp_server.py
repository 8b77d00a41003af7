"""A small MCP server (the official SDK's ``MCPServer``) for the ``ctx.call_mcp`` tests.

``python tests/mcp_server.py`` serves over stdio; ``python tests/mcp_server.py http PORT`` serves
streamable HTTP on 127.0.0.1:PORT at ``/mcp``.
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

server = MCPServer("plugin-llm-test")


@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return text


@server.tool()
def big(n: int) -> str:
    """Return n characters."""
    return "x" * n


class Point(BaseModel):
    x: int
    y: int


@server.tool()
def point(x: int, y: int) -> Point:
    """A structured result."""
    return Point(x=x, y=y)


@server.tool()
def fail(why: str) -> str:
    """Raise: the result is an error."""
    raise RuntimeError(why)


@server.tool()
def sleep(seconds: float) -> str:
    """Hang for a while."""
    time.sleep(seconds)
    return "woke"


@server.tool()
def environment() -> str:
    """The server's whole environment, one NAME=value a line."""
    return "\n".join(f"{k}={v}" for k, v in sorted(os.environ.items()))


if __name__ == "__main__":
    if os.environ.get("MCP_TEST_PID_FILE"):  # the stop test looks for this process afterwards
        with open(os.environ["MCP_TEST_PID_FILE"], "w", encoding="utf-8") as pid_file:
            pid_file.write(str(os.getpid()))
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
