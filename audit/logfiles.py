"""Where the log lives and how its files are read, shared by writer and readers.

Layout: ``<home>/logs/agent.log`` is the active file, ``agent.log.1`` the
newest backup, ``agent.log.N`` the oldest; ``agent.log.lock`` is the sidecar
file writers ``flock`` exclusively. Readers take a *shared* lock only for the
instant it takes to open every file and note its size (a snapshot): later
appends and rotations cannot tear or reorder what they read, and they never
hold writers up for longer than a few system calls.

Readers bound what they hold: a line longer than :data:`audit.chain.MAX_LINE_BYTES`
is reported as ``None`` (and skipped over in pieces), and a log file that is not
a regular file (a directory, a FIFO, a device) is refused instead of blocking.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from audit.chain import MAX_LINE_BYTES

__all__ = [
    "LOG_NAME",
    "resolve_log_path",
    "lock_path",
    "backup_path",
    "list_log_files",
    "SnapshotFile",
    "snapshot",
    "open_log_file",
    "read_bounded_line",
    "skip_line",
    "iter_lines",
    "iter_lines_reverse",
]

LOG_NAME = "agent.log"
_READ_CHUNK = 64 * 1024  # per open file; a snapshot holds every file open at once


def resolve_log_path(path_or_home: str | os.PathLike[str]) -> Path:
    """The active log file for a home directory, a logs directory or a log file.

    A directory containing ``agent.log`` is taken as the logs directory;
    any other directory as a home (``<home>/logs/agent.log``).
    """
    path = Path(path_or_home).expanduser()
    if path.is_dir():
        if (path / LOG_NAME).is_file():
            return path / LOG_NAME
        return path / "logs" / LOG_NAME
    return path


def lock_path(log_path: Path) -> Path:
    return log_path.with_name(log_path.name + ".lock")


def backup_path(log_path: Path, index: int) -> Path:
    return log_path.with_name(f"{log_path.name}.{index}")


def list_log_files(log_path: Path) -> list[Path]:
    """Existing log files, oldest first: ``agent.log.N`` .. ``agent.log.1``, ``agent.log``."""
    prefix = log_path.name + "."
    backups: list[tuple[int, Path]] = []
    try:
        with os.scandir(log_path.parent) as entries:
            for entry in entries:
                suffix = entry.name[len(prefix):] if entry.name.startswith(prefix) else ""
                if suffix.isdigit() and suffix == str(int(suffix)) and int(suffix) > 0:
                    backups.append((int(suffix), Path(entry.path)))
    except FileNotFoundError:
        return []
    files = [p for _, p in sorted(backups, reverse=True)]
    if log_path.exists():
        files.append(log_path)
    return files


@dataclass
class SnapshotFile:
    """One file of a snapshot: open handle and the size it had when snapshotted."""

    path: Path
    file: BinaryIO
    size: int

    @property
    def name(self) -> str:
        return self.path.name


@contextmanager
def _shared_lock(log_path: Path, timeout: float = 5.0) -> Iterator[None]:
    """Shared flock on the sidecar, if it exists; never creates it (auditors may be read-only)."""
    try:
        fd = os.open(lock_path(log_path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + timeout
        locked = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                locked = True
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    break  # read without the lock rather than not at all
                time.sleep(0.001)
        yield
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def open_log_file(path: Path) -> BinaryIO:
    """``path`` opened for reading, refusing anything but a regular file.

    Opened non-blocking, so a FIFO or a device put where a log belongs is
    refused at once instead of hanging the reader. Raises ``OSError``
    (``FileNotFoundError`` when it is gone).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
            raise OSError(errno.EINVAL, f"{what}, not an audit log file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=_READ_CHUNK)
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def snapshot(log_path: Path, extra: tuple[Path, ...] = ()) -> Iterator[list[SnapshotFile]]:
    """Open every log file (oldest first) at a consistent instant; close them on exit.

    ``extra`` files (e.g. the checkpoints file) are opened in the same instant,
    when they exist, and appended after the log files (tell them apart by path).
    Raises ``OSError`` when one of them cannot be read or is not a regular file.
    """
    opened: list[SnapshotFile] = []
    try:
        with _shared_lock(log_path):
            for path in [*list_log_files(log_path), *extra]:
                try:
                    f = open_log_file(path)
                except FileNotFoundError:
                    continue
                opened.append(SnapshotFile(path, f, os.fstat(f.fileno()).st_size))
        yield opened
    finally:
        for snap in opened:
            snap.file.close()


def read_bounded_line(f: BinaryIO, limit: int = MAX_LINE_BYTES) -> tuple[bytes | None, int]:
    """The next line of ``f`` and its length in bytes; ``(None, length)`` when longer than ``limit``.

    An over-long line is read past in ``limit``-sized pieces, never held whole.
    ``(b"", 0)`` at the end of the file.
    """
    raw = f.readline(limit + 1)
    if len(raw) <= limit or raw.endswith(b"\n"):
        return raw, len(raw)
    return None, len(raw) + skip_line(f, limit)


def skip_line(f: BinaryIO, piece: int = MAX_LINE_BYTES) -> int:
    """Read past the rest of the current line (newline included), ``piece`` bytes at a time; its length."""
    length = 0
    while True:
        chunk = f.readline(piece)
        length += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return length


def iter_lines(snap: SnapshotFile, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, int, bytes | None]]:
    """``(line_number, byte_offset, raw)`` for each line up to the snapshot size.

    ``raw`` keeps its trailing ``\\n``; a last line without one is torn (or
    being written). Lines are split on ``\\n`` only: JSON escapes every control
    character, so U+2028 and friends inside strings never split a record.
    ``raw`` is None for a line longer than ``limit`` bytes (it is not read into memory).
    """
    f, size = snap.file, snap.size
    f.seek(0)
    readline = f.readline
    offset = 0
    number = 0
    while offset < size:
        raw: bytes | None = readline(limit + 1)  # read_bounded_line(), inlined for the common case
        length = len(raw)  # type: ignore[arg-type]
        if not length:
            break
        if length > limit and not raw.endswith(b"\n"):  # type: ignore[union-attr]
            raw = None
            length += skip_line(f, limit)
        number += 1
        if raw is not None and offset + length > size:
            raw = raw[: size - offset]
            length = len(raw)
        yield number, offset, raw
        offset += length


def iter_lines_reverse(
    fd: int, end: int, chunk: int = 8192, limit: int | None = None
) -> Iterator[tuple[int, bytes | None]]:
    """``(byte_offset, line_without_newline)`` from the end of ``fd[:end]`` backwards.

    Reads ``chunk`` bytes at a time with ``pread`` (doubling as needed), so
    finding the last record of a large file costs one or two small reads.
    A final piece without ``\\n`` is yielded first, as it is; empty lines are
    yielded as ``b""``. With ``limit``, a line longer than ``limit`` bytes is
    yielded as ``None`` (with the offset where it starts) and never held whole.
    """
    pos = end
    carry = b""  # start of the earliest line seen so far (may continue further back)
    overlong = False  # carry is only the start of a line already known to be too long
    final_pending = True  # the piece after the file's last newline is not handled yet
    while pos > 0:
        size = min(chunk, pos)
        pos -= size
        data = os.pread(fd, size, pos) + carry
        parts = data.split(b"\n")
        off = pos + len(data)
        for i in range(len(parts) - 1, 0, -1):
            line = parts[i]
            off -= len(line)
            if i == len(parts) - 1 and overlong:
                yield off, None
                overlong = False
            elif line or not (final_pending and i == len(parts) - 1):
                yield off, (None if limit is not None and len(line) > limit else line)
            off -= 1
        if len(parts) > 1:
            final_pending = False
            overlong = False
        carry = parts[0]
        if limit is not None and len(carry) > limit:
            carry, overlong = b"", True  # keep going back to its start, holding nothing
        chunk = min(chunk * 2, 1 << 22)
    if end > 0 and (carry or overlong or not final_pending):
        yield 0, None if overlong else carry
