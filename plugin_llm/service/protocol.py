"""uvicorn's httptools protocol with a response's head and body in one socket write.

uvicorn writes a response in two ``transport.write`` calls - the status line and
headers on ``http.response.start``, then the body - so every answer of the
service cost two ``send`` system calls (and, with TCP_NODELAY, two segments the
client wakes for). :class:`CoalescingHttpToolsProtocol` hands uvicorn a thin
transport that holds a write beginning a response (``HTTP/1.x ...``) and sends
it together with the next write: the body, written by the same ``send`` step
of the app. Nothing else changes: bytes and their order on the wire are the
same; a held head is flushed at the latest on the event loop's next iteration
(a streaming response, or a body that waits on flow control), and before
``close``/``write_eof``; every other transport call goes to the real transport.

Used by ``plugin-llm serve`` as ``uvicorn.Config(http="plugin_llm.service.protocol:CoalescingHttpToolsProtocol")``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["CoalescingHttpToolsProtocol", "PROTOCOL"]

#: the import string uvicorn's Config takes (workers import it by name)
PROTOCOL = "plugin_llm.service.protocol:CoalescingHttpToolsProtocol"


#: a body up to this size is sent in the head's write (a larger one is copied for nothing: it fills segments anyway)
_JOIN_AT_MOST = 256 * 1024


class _CoalescingTransport:
    """A transport whose write of a response head waits for the next write (or the loop's next turn)."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= _JOIN_AT_MOST:
                self._transport.write(held + data)
            else:  # a large body: two writes cost less than copying it behind the head
                self._transport.write(held)
                self._transport.write(data)
        elif data[:7] == b"HTTP/1." and data[8:13] != b" 100 " and not self._transport.is_closing():
            self._held = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def is_closing(self) -> bool:  # asked once per response: not through __getattr__
        return self._transport.is_closing()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, pause_reading, get_extra_info, ...
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol writing each buffered response's head and body at once."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # flow control keeps the real transport (pause/resume reading); the cycles write through this one
        self.transport = _CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
