"""A plugin's own frames of an exception it raised, for its author.

``plugin-llm`` never shows the host's internals for a plugin's bug, but the
author needs *where* their code failed. :func:`plugin_frames` walks the
exception's traceback (and its ``__cause__`` / ``__context__`` chain) and keeps
only the frames that run the plugin's code: a file under the plugin's
directory, or a module of the ``hermes_plugins`` namespace directory plugins
are imported into. Each frame is ``file:line in function: source line``, the
file relative to the plugin's directory, with unsafe characters escaped and
the count and lengths bounded.

Reading a traceback runs no plugin code (code objects and line numbers are
plain data; source lines come from :mod:`linecache`), so this is safe to call
on anything a plugin raised.
"""

from __future__ import annotations

import linecache
import os
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["MAX_FRAMES", "plugin_frames", "frames_text", "plugin_dir_of"]

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
    from plugin_llm.terminal_text import escape_unsafe

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
