"""The wire protocol between the host and an out-of-process plugin (:mod:`.worker`, :mod:`.remote`).

Newline-delimited ASCII JSON over a pipe pair, each message at most :data:`MAX_MESSAGE` bytes.
Both sides send requests and answer them, possibly nested: ``{"t": "call", "id": N, "m": METHOD,
"p": PARAMS}``, answered by ``{"t": "ok", "id": N, "r": RESULT}`` or ``{"t": "err", "id": N, "e":
{...}}``. Non-JSON values travel tagged (``{"$t": "bytes" | "fn" | "map", ...}``).

Anything malformed (not JSON, not an object, too big, an unknown type, an answer nobody asked
for) is a :class:`ProtocolError`: the channel cannot be trusted any more, and the host stops the
child. This module imports nothing heavy. Tags in full: docs/design.md.
"""

from __future__ import annotations

import base64
import json
import os
import select
import threading
import time
from collections.abc import Mapping
from typing import Any, BinaryIO, Callable

__all__ = ["MAX_MESSAGE", "PROTOCOL_VERSION", "ProtocolError", "ChannelClosed", "Channel", "encode_value",
           "decode_value"]

#: Bytes one message may have (a tool result is at most 4 Mi characters; JSON escaping may double it).
MAX_MESSAGE = 16 * 1024 * 1024
PROTOCOL_VERSION = 1
_KINDS = frozenset({"call", "ok", "err"})


class ProtocolError(Exception):
    """The peer sent something that is not a valid message; the channel is unusable from now on."""


class ChannelClosed(ProtocolError):
    """The peer closed its end (it exited, or was stopped)."""


def encode_value(value: Any, callables: Callable[[Callable[..., Any]], int] | None = None, depth: int = 0,
                 strict: bool = False) -> Any:
    """``value`` as JSON-ready data; callables become ``fn`` handles when ``callables`` registers them,
    other non-JSON objects their ``str`` (bounded). ``strict`` (the host sending to a plugin): an
    object that is not plain data is sent as ``<TypeName>`` only, and only the gateway's own value
    types (``plugin_llm.types``) are sent field by field: nothing of a host object's state leaves."""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if depth > 60:
        raise ValueError("value nested deeper than 60 levels")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$t": "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict) or (not strict and isinstance(value, Mapping)):
        # a dict subclass by its real items (as untrusted.plain reads it), any other mapping (a
        # plugin's) by its own: what it raises propagates, so an unreadable value is an error
        pairs = dict.items(value) if isinstance(value, dict) else value.items()
        items = [(k if type(k) is str else str(k), encode_value(v, callables, depth + 1, strict))
                 for k, v in pairs]
        if any(k == "$t" for k, _ in items):
            return {"$t": "map", "v": [[k, v] for k, v in items]}
        return dict(items)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [encode_value(v, callables, depth + 1, strict) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return encode_value(float(value))
    if callables is not None and callable(value):
        return {"$t": "fn", "id": callables(value)}
    fields = getattr(value, "__dataclass_fields__", None)
    if isinstance(fields, dict) and (not strict or type(value).__module__ == "plugin_llm.types"):
        # PluginLlmTextInput / ImageInput, results and usage: their fields
        return {name: encode_value(getattr(value, name, None), callables, depth + 1, strict) for name in fields}
    if strict:
        return f"<{type(value).__name__[:100]}>"
    try:
        text = str(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text[:4096]


def decode_value(value: Any, make_fn: Callable[[int], Any] | None = None, depth: int = 0) -> Any:
    """The inverse of :func:`encode_value` (``fn`` handles through ``make_fn``; without it they are refused)."""
    kind = type(value)
    if kind is list:
        return [decode_value(v, make_fn, depth + 1) for v in value]
    if kind is not dict:
        return value
    if depth > 64:
        raise ProtocolError("value nested too deeply")
    tag = value.get("$t")
    if tag is None:
        return {k: decode_value(v, make_fn, depth + 1) for k, v in value.items()}
    if tag == "bytes" and type(value.get("v")) is str:
        try:
            return base64.b64decode(value["v"], validate=True)
        except ValueError:
            raise ProtocolError("bad base64 in a bytes value") from None
    if tag == "map" and type(value.get("v")) is list:
        out = {}
        for pair in value["v"]:
            if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str:
                raise ProtocolError("bad map entry")
            out[pair[0]] = decode_value(pair[1], make_fn, depth + 1)
        return out
    if tag == "fn" and type(value.get("id")) is int and make_fn is not None:
        return make_fn(value["id"])
    raise ProtocolError(f"unknown or malformed tagged value ({str(tag)[:40]})")


class Channel:
    """One end of the pipe pair: ``send`` (thread-safe) and ``receive`` (one reader thread).

    ``bounded_writes`` (the host's end) makes the write end non-blocking: a peer
    that stops reading (stopped, or busy on purpose) fills the pipe, and a
    ``send`` with a ``deadline`` then gives up at the deadline
    (:class:`CallTimeout`) instead of waiting for it forever. Without it (the
    child's end) a write waits as long as it takes.
    """

    def __init__(self, reader: BinaryIO, write_fd: int, *, bounded_writes: bool = False) -> None:
        self._reader = reader
        self._write_fd = write_fd
        self._write_lock = threading.Lock()
        self.closed = False
        if bounded_writes:
            os.set_blocking(write_fd, False)

    def send(self, message: dict[str, Any], deadline: float | None = None) -> None:
        """Write one message; ``deadline`` (``time.monotonic()``) bounds the wait for a full pipe and
        for the other senders (:class:`CallTimeout`). A message cut short by its deadline leaves
        the stream unusable: the channel is closed then (the host stops the child anyway)."""
        data = json.dumps(message, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"
        if len(data) > MAX_MESSAGE:
            raise ValueError(f"message of {len(data):,} bytes is over the {MAX_MESSAGE:,}-byte limit")
        if not self._write_lock.acquire(timeout=_left(deadline)):
            raise CallTimeout("the channel stayed busy until the deadline (the peer is not reading)")
        try:
            if self.closed:
                raise ChannelClosed("the channel is closed")
            view = memoryview(data)
            try:
                while view:
                    try:
                        written = os.write(self._write_fd, view)
                    except BlockingIOError:  # the pipe is full: wait until the peer reads, or the deadline
                        if not _writable(self._write_fd, deadline):
                            if len(view) < len(data):
                                self._close_locked()
                            raise CallTimeout("the peer did not read its input until the deadline") from None
                        continue
                    view = view[written:]
            except OSError as exc:  # EPIPE: the peer is gone
                self.closed = True
                raise ChannelClosed(f"the peer is gone ({exc.strerror or exc})") from None
        finally:
            self._write_lock.release()

    def receive(self) -> dict[str, Any]:
        """The next message; raises :class:`ChannelClosed` at EOF, :class:`ProtocolError` for garbage."""
        try:
            line = self._reader.readline(MAX_MESSAGE + 1)
        except (OSError, ValueError) as exc:
            raise ChannelClosed(f"reading failed ({exc})") from None
        if not line:
            raise ChannelClosed("end of stream")
        if not line.endswith(b"\n"):
            if len(line) > MAX_MESSAGE:
                raise ProtocolError(f"a message is over the {MAX_MESSAGE:,}-byte limit")
            raise ChannelClosed("end of stream inside a message")
        try:
            message = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):  # "[[[[..." nests past the parser's limit
            raise ProtocolError(f"not a JSON message ({len(line):,} bytes)") from None
        if type(message) is not dict or message.get("t") not in _KINDS or type(message.get("id")) is not int:
            raise ProtocolError("not a protocol message (needs t: call|ok|err and an integer id)")
        if message["t"] == "call" and type(message.get("m")) is not str:
            raise ProtocolError("a call without a method name")
        return message

    def close(self) -> None:
        with self._write_lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                os.close(self._write_fd)
            except OSError:
                pass


def _left(deadline: float | None) -> float:
    """Seconds to ``deadline`` for ``Lock.acquire`` (-1: no deadline, wait as long as it takes)."""
    if deadline is None:
        return -1
    return min(max(deadline - time.monotonic(), 0.0), threading.TIMEOUT_MAX)


def _writable(fd: int, deadline: float | None) -> bool:
    """Wait until ``fd`` can be written to (or is broken: the write then fails); False at the deadline."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while True:
        left = _left(deadline)
        if poller.poll(None if left < 0 else left * 1000):
            return True
        if left == 0:
            return False


class RemoteError(Exception):
    """The peer answered a call with an error: ``info`` is its ``e`` object (``type``, ``message``, ...)."""

    def __init__(self, info: dict[str, Any]) -> None:
        message = info.get("message") if type(info.get("message")) is str else ""
        super().__init__(message)
        self.info = info


class CallTimeout(Exception):
    """No answer within the caller's time limit."""


class _Pending:
    __slots__ = ("lock", "message")

    def __init__(self) -> None:
        import _thread

        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.message: dict[str, Any] | None = None


class _Workers:
    """Daemon threads running incoming calls; a new one is started whenever none is idle."""

    def __init__(self, name: str) -> None:
        import queue

        self._name = name
        self._jobs: Any = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._count = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put(job)
                return
            self._count += 1
            number = self._count
        threading.Thread(target=self._work, args=(job,), name=f"{self._name}-{number}", daemon=True).start()

    def _work(self, job: Callable[[], None]) -> None:
        while True:
            try:
                job()
            except BaseException:  # pragma: no cover - jobs report their own errors
                pass
            with self._lock:
                if self._idle >= 8:
                    return
                self._idle += 1
            job = self._jobs.get()


class Peer:
    """Requests both ways over one :class:`Channel`.

    ``handle(method, params)`` answers the peer's calls (on worker threads; what it raises is
    sent back as an error through ``describe_error``). ``on_fault(exc)`` is called once when the
    channel breaks (garbage, EOF); every waiting call then raises :class:`ChannelClosed`.
    """

    def __init__(self, channel: Channel, handle: Callable[[str, Any], Any],
                 describe_error: Callable[[BaseException], dict[str, Any]],
                 on_fault: Callable[[BaseException], None] | None = None, name: str = "peer",
                 max_concurrent: int = 64) -> None:
        self.channel = channel
        self._max_concurrent = max_concurrent
        self._active = 0
        self._handle = handle
        self._describe = describe_error
        self._on_fault = on_fault
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self._next_id = 0
        self._workers = _Workers(name)
        self.fault: BaseException | None = None

    # --- outgoing ---------------------------------------------------------------------

    def call(self, method: str, params: Any, timeout: float | None = None,
             remaining: Callable[[], float] | None = None) -> Any:
        """Send a request and wait for its answer: up to ``timeout`` seconds, or while
        ``remaining()`` (re-read after each wake-up) is positive; ``None`` for both: no limit."""
        pending = _Pending()
        with self._lock:
            if self.fault is not None:
                raise ChannelClosed(str(self.fault))
            self._next_id += 1
            call_id = self._next_id
            self._pending[call_id] = pending
        # sending is bounded by the same limit: a peer that does not read cannot hold the caller
        limit = remaining() if remaining is not None else timeout
        deadline = time.monotonic() + max(limit, 0.0) if limit is not None else None
        try:
            self.channel.send({"t": "call", "id": call_id, "m": method, "p": params}, deadline)
            if remaining is not None:
                got = False
                while not got:
                    left = remaining()
                    if left <= 0:
                        break
                    got = pending.lock.acquire(timeout=min(left, threading.TIMEOUT_MAX))
            elif timeout is not None:
                got = pending.lock.acquire(timeout=max(timeout, 0.0))
            else:
                got = pending.lock.acquire()
        finally:
            with self._lock:
                self._pending.pop(call_id, None)
        if not got:
            raise CallTimeout(method)
        message = pending.message
        if message is None:
            raise ChannelClosed(str(self.fault) if self.fault is not None else "the channel closed")
        if message["t"] == "ok":
            return message.get("r")
        info = message.get("e")
        raise RemoteError(info if type(info) is dict else {"type": "Error", "message": "malformed error"})

    # --- incoming ---------------------------------------------------------------------

    def serve(self) -> None:
        """Read messages until the channel breaks (run on a dedicated thread, or the main one)."""
        try:
            while True:
                message = self.channel.receive()
                if message["t"] == "call":
                    with self._lock:
                        busy = self._active >= self._max_concurrent
                        if not busy:
                            self._active += 1
                    if busy:  # the peer cannot make us start threads without bound
                        self._refuse_busy(message)
                    else:
                        self._workers.submit(lambda m=message: self._answer(m))
                    continue
                with self._lock:
                    pending = self._pending.pop(message["id"], None)
                if pending is None:
                    raise ProtocolError(f"an answer to call {message['id']} that is not waiting")
                pending.message = message
                pending.lock.release()
        except BaseException as exc:
            self._fail(exc)

    def _refuse_busy(self, message: dict[str, Any]) -> None:
        error = {"type": "RuntimeError", "message": f"more than {self._max_concurrent} requests at once; "
                                                    "wait for some to finish"}
        try:
            self.channel.send({"t": "err", "id": message["id"], "e": error})
        except (ValueError, ProtocolError):
            pass

    def _answer(self, message: dict[str, Any]) -> None:
        try:
            reply = {"t": "ok", "id": message["id"], "r": self._handle(message["m"], message.get("p"))}
        except BaseException as exc:
            reply = {"t": "err", "id": message["id"], "e": self._describe(exc)}
        finally:
            with self._lock:
                self._active -= 1
        try:
            self.channel.send(reply)
        except ValueError as exc:  # too big: say so instead
            self.channel.send({"t": "err", "id": message["id"], "e": {"type": "ValueError", "message": str(exc)}})
        except ProtocolError:
            pass

    def fail(self, exc: BaseException) -> None:
        """Break the channel (the host stopped the child): every waiting call raises ChannelClosed."""
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.fault is not None:
                return
            self.fault = exc
        # The owner learns of it first (it stops and reaps the process, records why), then the
        # waiting calls wake up: a caller that sees ChannelClosed finds the fault handled.
        try:
            if self._on_fault is not None:
                self._on_fault(exc)
        finally:
            with self._lock:
                waiting = list(self._pending.values())
                self._pending.clear()
            for pending in waiting:
                pending.lock.release()
