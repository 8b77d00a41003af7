"""A plugin's own frames of an exception it raised, for its author.

:func:`plugin_frames` walks the exception's traceback (and its ``__cause__`` / ``__context__``
chain) and keeps only the frames that run the plugin's code: a file under the plugin's directory,
or a module of the ``hermes_plugins`` namespace. Each frame is ``file:line in function: source
line``, relative to the plugin's directory, escaped and bounded. Reading a traceback runs no
plugin code, so this is safe to call on anything a plugin raised.

:class:`FailureReporter` reports a failure of a tool handler or middleware callback as hook and
load failures are reported: once per distinct error, a WARNING line, the frames at DEBUG (on
screen with ``--debug``) and an operational audit event carrying them, bounded and redacted.
"""

from __future__ import annotations

import traceback

import linecache
import logging
import os
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Callable

from plugin_llm.hardened.terminal_text import escape_unsafe

__all__ = ["MAX_FRAMES", "plugin_frames", "frames_text", "plugin_dir_of", "release_frames", "FailureReporter"]

#: Frames kept (the innermost ones: where it failed).
MAX_FRAMES = 12
#: Characters kept of one frame line.
_MAX_LINE = 300
#: Exceptions followed along ``__cause__`` / ``__context__``.
_MAX_CHAIN = 5
_NAMESPACE = "hermes_plugins."


def _is_plugin_frame(filename: str, module: Any, root: str | None) -> bool:
    if root is not None and (filename == root or filename.startswith(root + os.sep)):
        return True
    return type(module) is str and module.startswith(_NAMESPACE)


def _root(plugin_dir: Path | str | None) -> str | None:
    if plugin_dir is None:
        return None
    try:
        return os.path.realpath(os.fspath(plugin_dir))
    except (OSError, TypeError, ValueError):
        return None


def _frames_of(tb: TracebackType | None, root: str | None) -> list[str]:
    out: list[str] = []
    seen = 0
    while tb is not None and seen < 1000:
        seen += 1
        frame, lineno = tb.tb_frame, tb.tb_lineno
        code = frame.f_code
        filename = code.co_filename
        try:
            real = os.path.realpath(filename)
        except (OSError, ValueError):
            real = filename
        if _is_plugin_frame(real, frame.f_globals.get("__name__"), root):
            shown = os.path.relpath(real, root) if root is not None and real.startswith(root + os.sep) else filename
            source = linecache.getline(filename, lineno).strip()
            line = f"{shown}:{lineno} in {code.co_name}"
            if source:
                line += f": {source}"
            out.append(escape_unsafe(line, _MAX_LINE))
        tb = tb.tb_next
    return out


def plugin_frames(exc: BaseException | None, plugin_dir: Path | str | None = None) -> list[str]:
    """The plugin's frames of ``exc`` (outermost first, at most :data:`MAX_FRAMES`, the innermost
    kept); an exception it raised while handling another adds that one's frames before its own."""
    root = _root(plugin_dir)
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < _MAX_CHAIN and all(current is not c for c in chain):
        chain.append(current)
        cause = current.__cause__
        current = cause if isinstance(cause, BaseException) else (
            current.__context__ if not current.__suppress_context__ else None)
    frames: list[str] = []
    for item in reversed(chain):
        tb = item.__traceback__
        frames.extend(_frames_of(tb if isinstance(tb, TracebackType) else None, root))
    if len(frames) > MAX_FRAMES:
        frames = [f"... {len(frames) - MAX_FRAMES + 1} earlier frame(s)"] + frames[-(MAX_FRAMES - 1):]
    return frames


def frames_text(exc: BaseException | None, plugin_dir: Path | str | None = None, *, indent: str = "  ") -> str:
    """:func:`plugin_frames` as lines to append to an error message ("" when there are none)."""
    frames = plugin_frames(exc, plugin_dir)
    if not frames:
        return ""
    return "\n" + indent + "plugin traceback (most recent call last):\n" + "\n".join(indent + "  " + f for f in frames)


def plugin_dir_of(manager: Any, plugin_key: Any) -> Path | None:
    """The directory of plugin ``plugin_key`` in ``manager`` (None for an entry point or unknown key)."""
    try:
        record = manager._records.get(plugin_key)
        return record.candidate.path if record is not None else None
    except Exception:
        return None


#: Characters of a failure's message kept in its audit event (as ``hook_error`` keeps).
MAX_EVENT_MESSAGE = 500


def _redact(text: str) -> str:
    try:
        from auth import redact
    except ImportError:  # pragma: no cover - auth is part of the host
        return text
    return redact(text)


def release_frames(error: BaseException) -> None:
    """Drop the locals of ``error``'s finished frames (their lines stay printable). Held by the error,
    which the host keeps (a hook's outcome) or re-raises (a command's), they kept what the plugin's code
    held -- an abandoned stream, with its reservation and concurrency slot -- alive until the cyclic
    garbage collector ran, a minute or more later."""
    if error.__traceback__ is not None:
        traceback.clear_frames(error.__traceback__)


class FailureReporter:
    """Reports each distinct failure of plugin code once: log and audit log, with the plugin's frames.

    ``audit(event, **fields)`` writes the operational event (the manager's sink,
    which the audit writer redacts again). Identical failures (same event,
    plugin, subject and error text) are reported once, as hook failures are, so
    a tool failing on every call cannot flood either log; the memory of what
    was reported is bounded.
    """

    _MAX_REPORTED = 1024

    def __init__(self, logger: logging.Logger, audit: Callable[..., None]) -> None:
        self._log = logger
        self._audit = audit
        self._lock = threading.Lock()
        self._reported: set[tuple[str, str, str, str]] = set()

    def report(self, event: str, plugin_key: str, what: str, text: str, *, error: BaseException | None = None,
               plugin_dir: Path | str | None = None, log: bool = True, **fields: Any) -> bool:
        """Report ``what`` (``tool calc``, ``middleware tool_execution``) of ``plugin_key`` failing
        with ``text`` (a safe ``Type: message``); ``log=False`` audits only (the caller prints the
        error and its frames itself). False when this failure was already reported. The error's
        frames are released (:func:`release_frames`)."""
        if error is not None:
            release_frames(error)
        signature = (event, plugin_key, what, text)
        with self._lock:
            if signature in self._reported:
                return False
            if len(self._reported) >= self._MAX_REPORTED:
                self._reported.clear()
            self._reported.add(signature)
        text = _redact(text)
        frames = [_redact(frame) for frame in plugin_frames(error, plugin_dir)] if error is not None else []
        if log:
            self._log.warning("%s of plugin %s failed: %s (further identical errors are not logged)",
                              what, plugin_key, text)
        if log and frames:
            self._log.debug("%s of plugin %s failed:\n  plugin traceback (most recent call last):\n%s",
                            what, plugin_key, "\n".join("    " + f for f in frames))
        from .untrusted import type_name  # never trusts the plugin's class

        name = type_name(error) if error is not None else None
        message = text[len(name) + 2:] if name and text.startswith(name + ": ") else text
        extra = {"error.type": name} if name else {}
        try:
            self._audit(event, plugin=plugin_key, plugin_id=plugin_key, message=message[:MAX_EVENT_MESSAGE],
                        frames=frames, **fields, **extra)
        except Exception:  # reporting never breaks the host
            self._log.debug("audit of a plugin failure failed", exc_info=True)
        return True
