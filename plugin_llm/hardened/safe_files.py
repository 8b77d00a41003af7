"""Read a file of the home without ever blocking or swallowing memory.

``config.yaml``, ``auth.json``, ``.env``, manifests and install metadata are
read by every command and every call. Replacing one with a FIFO, a directory,
a device (a symlink to ``/dev/zero``) or a huge file must give a clear error
naming the file, never a hang: :func:`read_home_file`

1. ``stat``\\ s the path (following symlinks, so a symlinked config keeps
   working) and refuses anything but a regular file *before* opening it;
2. opens it with ``O_NONBLOCK`` (opening a FIFO swapped in meanwhile returns
   at once) and checks the ``fstat`` of the opened descriptor again;
3. refuses a file larger than the caller's bound, and stops reading once the
   bound is passed (a file that grows while it is read).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from plugin_llm.errors import PluginLlmConfigError

__all__ = [
    "KIB",
    "MIB",
    "UnsafeFileError",
    "HomeFile",
    "read_home_file",
    "read_home_text",
    "describe_file_type",
    "resolve_inside",
    "read_text_inside",
]

KIB = 1024
MIB = 1024 * KIB
_CHUNK = 64 * KIB
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


class UnsafeFileError(PluginLlmConfigError):
    """A file of the home that cannot be used as it is; the message names it and the fix."""


@dataclass(frozen=True)
class HomeFile:
    """The bytes read and the ``fstat`` of the descriptor they were read from."""

    data: bytes = field(repr=False)  # may hold credentials (auth.json, .env): never in a repr
    stat: os.stat_result


def describe_file_type(mode: int) -> str:
    """``a FIFO``, ``a directory``, ... for a ``st_mode`` that is not a regular file."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n // KIB} KiB" if n >= KIB else f"{n} bytes"


def _check(st: os.stat_result, path: Path, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = describe_file_type(st.st_mode)
        raise UnsafeFileError(f"{path} is {kind}, not a regular file: replace it with a regular file")
    if st.st_size > max_bytes:
        raise UnsafeFileError(
            f"{path} is {st.st_size} bytes, larger than the {_size(max_bytes)} allowed for it: is it the right file?"
        )


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_inside(path: str | os.PathLike[str], root: str | os.PathLike[str], *, who: str) -> Path:
    """``path`` (relative: to ``root``) with every symlink resolved, when it stays inside ``root``.

    For every path a plugin hands the host (a skill's file, ...): ``root`` is the plugin's own
    directory (resolved too: a ``--link`` install is a symlink). Raises PermissionError, starting
    with ``who`` (e.g. ``plugin x: register_skill('guide')``), when it leads anywhere else.
    """
    real_root = os.path.realpath(root)
    given = Path(path)
    real = os.path.realpath(given if given.is_absolute() else Path(root) / given)
    if not _within(real, real_root):
        shown = repr(str(path)[:300])
        raise PermissionError(f"{who}: {shown} resolves outside the plugin's own directory ({root}): a plugin may "
                              "only hand the host files inside its own directory (a symlink or '..' leading out of "
                              "it is refused); fix: move the file into the plugin's directory")
    return Path(real)


def _opened_inside(fd: int, root: str, path: Path, who: str) -> None:
    """The file actually opened (``/proc/self/fd`` on Linux) is inside ``root``: a path swapped for a
    symlink after it was resolved is caught here."""
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the resolved path was checked just before the open
        return
    if not _within(opened, os.path.realpath(root)):
        raise PermissionError(f"{who}: {str(path)[:300]!r} was replaced by a link out of the plugin's own directory "
                              f"({root}) while it was opened; refused")


def read_text_inside(path: str | os.PathLike[str], root: str | os.PathLike[str], *, who: str,
                     max_bytes: int) -> str | None:
    """:func:`read_home_text` of a file a plugin named, refused (PermissionError) unless it is inside ``root``:
    checked on the resolved path and again on the file descriptor that was opened."""
    real = resolve_inside(path, root, who=who)
    got = read_home_file(real, max_bytes=max_bytes, inside=(os.fspath(root), who))
    if got is None:
        return None
    try:
        return got.data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnsafeFileError(f"{real} is not UTF-8 text (byte offset {exc.start}): save it as UTF-8") from None


def read_home_file(
    path: Path,
    *,
    max_bytes: int,
    check: Callable[[os.stat_result, Path], None] | None = None,
    inside: tuple[str, str] | None = None,
) -> HomeFile | None:
    """The bytes of the regular file ``path`` (at most ``max_bytes``), or None when it does not exist.

    ``check(fstat, path)`` runs on the opened descriptor before anything is
    read (e.g. the 0600 mode rule of ``auth.json``). ``inside=(root, who)``: the
    opened file must be inside ``root`` (PermissionError otherwise; see
    :func:`read_text_inside`). Raises :class:`UnsafeFileError` for anything else: not a regular file, too
    large, unreadable.
    """
    path = Path(path)
    try:
        _check(os.stat(path), path, max_bytes)
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if inside is not None:
        try:
            _opened_inside(fd, inside[0], path, inside[1])
        except BaseException:
            os.close(fd)
            raise
    try:
        st = os.fstat(fd)
        _check(st, path, max_bytes)  # what was opened, in case the path was swapped after the stat
        if check is not None:
            check(st, path)
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, _CHUNK):
            total += len(chunk)
            if total > max_bytes:
                raise UnsafeFileError(
                    f"{path} grew past the {_size(max_bytes)} allowed for it while it was read: is it the right file?"
                )
            chunks.append(chunk)
        return HomeFile(b"".join(chunks), st)
    except BlockingIOError:  # pragma: no cover - a regular file never blocks
        raise UnsafeFileError(f"{path}: reading would block; replace it with a regular file") from None
    except OSError as exc:
        raise UnsafeFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_home_text(path: Path, *, max_bytes: int) -> str | None:
    """:func:`read_home_file` decoded as UTF-8 (a BOM is dropped), or None when the file does not exist."""
    got = read_home_file(path, max_bytes=max_bytes)
    if got is None:
        return None
    try:
        return got.data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnsafeFileError(f"{path} is not UTF-8 text (byte offset {exc.start}): save it as UTF-8") from None
