"""Refused tokens counted per client address in ``<home>/service/auth_failures.db``.

Apart from ``tokens.db``, so a copied token file holds digests only. Shared by the processes of
a machine (the Redis token store keeps its counts in Redis instead).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from plugin_llm.service.token_records import TokenError

__all__ = ["FailureFile"]


class FailureFile:
    """Refused tokens per client address in ``<home>/service/auth_failures.db``, shared by the processes of a
    machine. WAL and ``synchronous=NORMAL``: a count is cheap to write and nothing to lose in a crash."""

    _SCHEMA = ("CREATE TABLE IF NOT EXISTS failures (client TEXT PRIMARY KEY, first REAL NOT NULL, "
               "count INTEGER NOT NULL, blocked_until REAL)")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._writes = 0

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(self._SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise TokenError(f"the failed-authentication file {self.path} cannot be used ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); check its permissions, or delete it (it holds only counts)") from None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _run(self, work):
        with self._lock:
            conn = self._connection()
            try:
                return work(conn)
            except sqlite3.Error as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise TokenError(f"the failed-authentication file {self.path} failed ({type(exc).__name__}: "
                                 f"{str(exc)[:200]}); delete it if it is damaged (it holds only counts)") from None

    def block_end(self, client: str, now: float) -> float | None:
        if self._conn is None and not self.path.exists():
            return None  # nothing ever refused here: no file to open
        rows = self._run(lambda conn: conn.execute("SELECT blocked_until FROM failures WHERE client = ? AND "
                                                   "blocked_until > ?", (client, now)).fetchall())
        return rows[0][0] if rows else None

    def count(self, client: str, now: float, brake: Any) -> float | None:
        def work(conn: sqlite3.Connection) -> float | None:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT first, count, blocked_until FROM failures WHERE client = ?",
                               (client,)).fetchone()
            first, count, until = row if row is not None else (now, 0, None)
            if first <= now - brake.window_seconds:  # the window is over: count afresh
                first, count = now, 0
            count += 1
            if until is not None and until <= now:
                until = None
            if until is None and count >= brake.max_failures:
                until = now + brake.block_seconds
            conn.execute("INSERT OR REPLACE INTO failures (client, first, count, blocked_until) VALUES (?, ?, ?, ?)",
                         (client, first, count, until))
            self._writes += 1
            if self._writes % 256 == 0:  # forget addresses whose window and block are both over
                conn.execute("DELETE FROM failures WHERE first <= ? AND (blocked_until IS NULL OR blocked_until <= ?)",
                             (now - brake.window_seconds, now))
            conn.execute("COMMIT")
            return until

        return self._run(work)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
