"""Where the log lives and how its files are read, shared by writer and readers.

Layout: ``<home>/logs/agent.log`` is the active file, ``agent.log.1`` the
newest backup, ``agent.log.N`` the oldest; ``agent.log.lock`` is the sidecar
file writers ``flock`` exclusively. Readers take a *shared* lock only for the
instant it takes to open every file and note its size (a snapshot): later
appends and rotations cannot tear or reorder what they read, and they never
hold writers up for longer than a few system calls.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "LOG_NAME",
    "resolve_log_path",
    "lock_path",
    "backup_path",
    "list_log_files",
    "SnapshotFile",
    "snapshot",
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


@contextmanager
def snapshot(log_path: Path) -> Iterator[list[SnapshotFile]]:
    """Open every log file (oldest first) at a consistent instant; close them on exit."""
    opened: list[SnapshotFile] = []
    try:
        with _shared_lock(log_path):
            for path in list_log_files(log_path):
                try:
                    f = open(path, "rb", buffering=_READ_CHUNK)
                except FileNotFoundError:
                    continue
                opened.append(SnapshotFile(path, f, os.fstat(f.fileno()).st_size))
        yield opened
    finally:
        for snap in opened:
            snap.file.close()


def iter_lines(snap: SnapshotFile) -> Iterator[tuple[int, int, bytes]]:
    """``(line_number, byte_offset, raw)`` for each line up to the snapshot size.

    ``raw`` keeps its trailing ``\\n``; a last line without one is torn (or
    being written). Lines are split on ``\\n`` only: JSON escapes every control
    character, so U+2028 and friends inside strings never split a record.
    """
    f, size = snap.file, snap.size
    f.seek(0)
    offset = 0
    number = 0
    for raw in f:
        if offset >= size:
            break
        number += 1
        if offset + len(raw) > size:
            raw = raw[: size - offset]
        yield number, offset, raw
        offset += len(raw)


def iter_lines_reverse(fd: int, end: int, chunk: int = 8192) -> Iterator[tuple[int, bytes]]:
    """``(byte_offset, line_without_newline)`` from the end of ``fd[:end]`` backwards.

    Reads ``chunk`` bytes at a time with ``pread`` (doubling as needed), so
    finding the last record of a large file costs one or two small reads.
    A final piece without ``\\n`` is yielded first, as it is; empty lines are
    yielded as ``b""``.
    """
    pos = end
    carry = b""  # start of the earliest line seen so far (may continue further back)
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
            if line or not (final_pending and i == len(parts) - 1):
                yield off, line
            off -= 1
        if len(parts) > 1:
            final_pending = False
        carry = parts[0]
        chunk = min(chunk * 2, 1 << 22)
    if end > 0 and (carry or not final_pending):
        yield 0, carry
