"""``ctx.state``: a plugin's durable JSON key/value store, ``state.json`` in its data directory.

One file per plugin (0600), replaced atomically; every read-modify-write holds a lock file beside it
(threads and processes: an isolated plugin's process and the host share the file). The whole file is
bounded by :data:`QUOTA_BYTES`; a refused write keeps the previous data. Files are opened without
following links (an isolated plugin owns the directory and could plant one).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from plugin_llm.hardened.atomic_write import write_atomic

__all__ = ["PluginState", "QUOTA_BYTES", "STATE_FILE"]

QUOTA_BYTES = 10 * 1024 * 1024
STATE_FILE = "state.json"
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_LOCKS: dict[str, threading.RLock] = {}
_LOCKS_GUARD = threading.Lock()


class PluginState:
    """``get(key, default)`` / ``set(key, value)`` of JSON values; ``data_dir``, ``path``, ``quota_bytes``."""

    __slots__ = ("_dir", "_prepare")

    def __init__(self, data_dir: Path, prepare: Callable[[], Path] | None = None) -> None:
        self._dir = Path(data_dir)
        self._prepare = prepare  # creates (and checks) the directory on first use

    def __repr__(self) -> str:
        return f"PluginState({str(self.path)!r})"

    @property
    def data_dir(self) -> Path:
        return self._dir

    @property
    def path(self) -> Path:
        return self._dir / STATE_FILE

    @property
    def quota_bytes(self) -> int:
        return QUOTA_BYTES

    @staticmethod
    def _check_key(key: Any) -> None:
        if not isinstance(key, str) or not _KEY.fullmatch(key) or ".." in key:
            raise ValueError("plugin state keys must be 1-128 characters of letters, digits, '_', '-', '.' or ':', "
                             f"starting with a letter or digit, without '..' (got {str(key)[:80]!r})")

    def get(self, key: str, default: Any = None) -> Any:
        """The JSON value stored under ``key`` (a fresh copy), or ``default``."""
        self._check_key(key)
        with self._locked():
            return self._read().get(key, default)

    def set(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key``; ValueError (nothing changed) when it is not JSON or over the quota."""
        self._check_key(key)
        with self._locked():
            data = self._read()
            data[key] = value
            try:
                encoded = json.dumps(data, ensure_ascii=False, allow_nan=False, indent=2).encode("utf-8")
            except (TypeError, ValueError, RecursionError) as exc:
                raise ValueError(f"plugin state value for {key!r} is not JSON-serializable: {str(exc)[:200]}") from None
            if len(encoded) > QUOTA_BYTES:
                raise ValueError(f"plugin state quota exceeded: {len(encoded)} bytes is over the {QUOTA_BYTES}-byte "
                                 "quota of one plugin; nothing was written")
            write_atomic(self.path, encoded)

    def _read(self) -> dict[str, Any]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise RuntimeError(f"cannot read plugin state {self.path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(QUOTA_BYTES + 1)
        if len(raw) > QUOTA_BYTES:
            raise RuntimeError(f"cannot read plugin state {self.path}: it is over the {QUOTA_BYTES}-byte quota")
        try:
            data = json.loads(raw.decode("utf-8-sig"))
        except (ValueError, RecursionError) as exc:
            raise RuntimeError(f"cannot parse plugin state {self.path}: {str(exc)[:200]}") from None
        if not isinstance(data, dict):
            raise RuntimeError(f"cannot parse plugin state {self.path}: its root must be an object")
        return data

    @contextmanager
    def _locked(self) -> Iterator[None]:
        if self._prepare is not None:
            self._prepare()
        lock_path = self._dir / f".{STATE_FILE}.lock"
        with _LOCKS_GUARD:
            thread_lock = _LOCKS.setdefault(str(lock_path), threading.RLock())
        with thread_lock:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                raise RuntimeError(f"cannot lock plugin state {self.path}: {exc.strerror or exc}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the lock
