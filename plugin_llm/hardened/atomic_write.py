"""Replace a small file atomically: a 0600 temp file in the same directory, fsync, rename.

Used for the files operators' tools write (auth.json, plugins/.install-metadata.json,
<home>/.env): a crash or a full disk leaves either the old file or the new one,
never half of one, and the temp file is removed on failure.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, data: bytes, *, sync_dir: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (mode 0600); ``sync_dir`` also makes the rename durable."""
    directory = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)  # created 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_dir and hasattr(os, "O_DIRECTORY"):
        with contextlib.suppress(OSError):
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
