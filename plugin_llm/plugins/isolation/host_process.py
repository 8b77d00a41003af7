"""The host's handle on one isolated plugin's child process, and the thread that starts them all.

:class:`_Child` is a running worker: its ``Popen``, its protocol peer (the child's requests are
answered by its :class:`.remote.RemotePlugin`), the drain of its stderr (the last lines are kept for
error messages; a flood stops it) and how it is stopped and reaped. :class:`_Spawner` runs every
``Popen`` on one long-lived thread (``PR_SET_PDEATHSIG`` is tied to the thread that forks).
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from .host_llm import _OpenStreams
from .protocol import Channel, ChannelClosed, Peer, ProtocolError

if TYPE_CHECKING:  # for annotations only: remote imports this module
    from .remote import RemotePlugin

_log = logging.getLogger("plugin_llm.plugins")
_output_log = logging.getLogger("plugin_llm.plugins.output")

#: stderr bytes within FLOOD_WINDOW seconds that count as a flood (the child is stopped).
FLOOD_BYTES = 4 * 1024 * 1024
FLOOD_WINDOW = 10.0
#: Lines of the child's output kept for error messages, and characters of each.
_TAIL_LINES = 12
_TAIL_CHARS = 300


# --- spawning from one long-lived thread -----------------------------------------------------


class _Spawner:
    """Runs ``Popen`` on one daemon thread that lives as long as the host (PR_SET_PDEATHSIG)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="plugin-spawner", daemon=True)
                self._thread.start()
        box: dict[str, Any] = {}
        done = threading.Event()
        self._jobs.put((fn, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _loop(self) -> None:
        while True:
            fn, box, done = self._jobs.get()
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc
            done.set()


_SPAWNER = _Spawner()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: setattr(_SPAWNER, "_thread", None))


# --- one child process ---------------------------------------------------------------------


class _Child:
    """A running worker process: its Popen, protocol peer, output drain and fault state."""

    def __init__(self, owner: "RemotePlugin", proc: subprocess.Popen, spec: Any) -> None:
        self.owner = owner
        self.proc = proc
        self.spec = spec
        self.started = time.monotonic()
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.dead = False
        self.reason = ""
        self.settled = threading.Event()  # set once whoever stopped it has recorded why
        self.streams = _OpenStreams(owner.key)
        write_fd = os.dup(proc.stdin.fileno())  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
        self.peer = Peer(Channel(proc.stdout, write_fd, bounded_writes=True), self._answer, owner._describe_host_error,  # type: ignore[arg-type]
                         on_fault=self._on_channel_fault, name=f"plugin-host-{owner.key[:40]}")
        self._reader = threading.Thread(target=self.peer.serve, name=f"plugin-reader-{owner.key[:40]}", daemon=True)
        self._drain = threading.Thread(target=self._drain_stderr, name=f"plugin-stderr-{owner.key[:40]}", daemon=True)
        self._reader.start()
        self._drain.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _answer(self, method: str, params: Any) -> Any:
        return self.owner._answer(self, method, params)

    def _on_channel_fault(self, exc: BaseException) -> None:
        if self.dead:  # stopped by the host: wake the waiting calls once the fault is recorded
            self.settled.wait(10)
            return
        if isinstance(exc, ChannelClosed):
            code = self._exit_code(2.0)
            how = f"exit status {code}" if code is not None and code >= 0 else (
                f"killed by signal {-code}" if code is not None else "it closed its channel")
            self.owner._fault(self, "exited", f"its process exited unexpectedly ({how}){self.tail_text()}")
        elif isinstance(exc, ProtocolError):
            self.owner._fault(self, "protocol", f"its process sent an invalid message ({exc}); it was stopped")
        else:
            self.owner._fault(self, "protocol", f"reading its process failed ({type(exc).__name__}); it was stopped")

    def _exit_code(self, wait: float) -> int | None:
        try:
            return self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None

    def _drain_stderr(self) -> None:
        stream = self.proc.stderr
        assert stream is not None
        window_start, window_bytes, partial = time.monotonic(), 0, b""
        key = self.owner.key
        try:
            while True:
                chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
                if not chunk:
                    break
                now = time.monotonic()
                if now - window_start > FLOOD_WINDOW:
                    window_start, window_bytes = now, 0
                window_bytes += len(chunk)
                if window_bytes > FLOOD_BYTES and not self.dead:
                    self.owner._fault(self, "flood", f"its process flooded its output (over {FLOOD_BYTES // (1024 * 1024)} MiB "
                                                      f"within {FLOOD_WINDOW:g} s); it was stopped")
                    continue  # keep draining until the pipe closes: the child never blocks on a full pipe
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()[-_TAIL_CHARS * 4:]
                for raw in lines[-_TAIL_LINES:]:
                    text = raw.decode("utf-8", "replace")[:_TAIL_CHARS]
                    self.tail.append(text)
                    if _output_log.isEnabledFor(logging.INFO):
                        _output_log.info("[%s] %s", key, text)
        except (OSError, ValueError):
            pass

    def join_output(self, wait: float) -> None:
        self._drain.join(wait)

    def tail_text(self) -> str:
        lines = [line for line in list(self.tail) if line.strip()]
        if not lines:
            return ""
        return "; its last output: " + " | ".join(lines[-3:])

    def kill(self) -> None:
        """Stop the process group now, reap it (no zombie), then wake the calls waiting on it."""
        self.terminate()
        self.settled.set()
        self.peer.fail(ChannelClosed(self.reason or "the host stopped the plugin's process"))

    def terminate(self) -> None:
        """SIGKILL the process group and reap it; the channel stays as it is."""
        self.dead = True
        self.streams.abandon_all()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            try:
                self.proc.kill()
            except OSError:
                pass
        self._reap()

    def close(self, grace: float = 1.0) -> None:
        """Ask the child to exit (close its input), then kill it if it does not."""
        self.dead = True
        self.streams.abandon_all()
        self.settled.set()
        self.peer.channel.close()
        if self._exit_code(grace) is None:
            self.kill()
        else:
            self.peer.fail(ChannelClosed("stopped"))
            self._reap()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL of our own child
            _log.warning("plugin %s: process %d did not exit after SIGKILL", self.owner.key, self.proc.pid)
        for stream in (self.proc.stdout, self.proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self.spec.cleanup()
        except Exception:  # pragma: no cover
            _log.debug("scratch cleanup failed", exc_info=True)
