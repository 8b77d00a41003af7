"""The token file of a home: ``<home>/service/tokens.db`` (SQLite, mode 0600).

One row per token (id, plugin key, digest, times, signature), in a rollback journal so the file
stands alone and a replica can be given a new copy by ``mv`` (noticed and reopened). Refused
tokens are counted beside it (:mod:`.auth_failures`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from plugin_llm.service.auth_failures import FailureFile
from plugin_llm.service.token_records import TokenError, TokenInfo, digest, failures_path, tokens_path
from plugin_llm.service.token_signing import RecordKey, record_mac
from plugin_llm.service.token_verify import VerifyingStore

__all__ = ["TokenStore"]

_log = logging.getLogger("plugin_llm.service")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    plugin TEXT NOT NULL,
    sha256 TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    expires REAL,
    revoked REAL,
    mac TEXT
);
"""
_COLUMNS = "id, plugin, created, expires, revoked, sha256, mac"


class TokenStore(VerifyingStore):
    """The token file of one home; one connection per process, shared by its threads."""

    def __init__(self, home: Path | str, *, clock=time.time, monotonic=time.monotonic) -> None:
        super().__init__(RecordKey(home), clock=clock, monotonic=monotonic)
        self.path = tokens_path(home)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._opened: tuple[int, int] | None = None
        self._failures = FailureFile(failures_path(home))

    def __repr__(self) -> str:
        return f"TokenStore({str(self.path)!r})"

    def _block_end(self, client: str) -> float | None:
        return self._failures.block_end(client, self._clock())

    def _count_failure(self, client: str, now: float, brake: Any) -> float | None:
        return self._failures.count(client, now, brake)

    # -- file
    def _connection(self, create: bool) -> sqlite3.Connection | None:
        if self._conn is not None and self._pid == os.getpid():
            if self._file_id() == self._opened:
                return self._conn
            self._conn.close()  # the file was replaced (a copy distributed to this replica): open the new one
            self._conn = None
        if not create and not self.path.exists():
            return None
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))  # owner-only before SQLite writes a byte
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
            # a rollback journal, not WAL: the file stands alone (no -wal beside it that a copy would leave
            # behind), so a replica can be given a new copy by mv; reads are rare (one per token per
            # CACHE_SECONDS) and writes rarer still
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.executescript(_SCHEMA)
            self._sign_unsigned_file(conn)
        except (sqlite3.Error, OSError) as exc:
            raise TokenError(f"the token file {self.path} cannot be used ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); check its permissions, or move it away to start afresh") from None
        self._conn, self._pid, self._opened = conn, os.getpid(), self._file_id()
        return conn

    def _sign_unsigned_file(self, conn: sqlite3.Connection) -> None:
        """A file from before records were signed gets its ``mac`` column, and its rows their signatures, once.

        The file is the host's own (0600, hidden from sandboxed plugins), so its rows are what the operator
        created; after this one step an unsigned row is refused like a forged one.
        """
        if any(column[1] == "mac" for column in conn.execute("PRAGMA table_info(tokens)")):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not any(column[1] == "mac" for column in conn.execute("PRAGMA table_info(tokens)")):
                conn.execute("ALTER TABLE tokens ADD COLUMN mac TEXT")
                rows = conn.execute("SELECT id, plugin, created, expires, revoked, sha256 FROM tokens").fetchall()
                if rows:
                    key = self._key.get(create=True)
                    conn.executemany("UPDATE tokens SET mac = ? WHERE id = ?", [(record_mac(key, r), r[0]) for r in rows])
                    _log.info("token file %s: signed its %d existing token records with %s", self.path, len(rows),
                              self._key.path)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _file_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _execute(self, sql: str, params: tuple = (), *, create: bool = False) -> list[tuple]:
        with self._lock:
            conn = self._connection(create)
            if conn is None:
                return []
            try:
                return conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise TokenError(f"the token file {self.path} failed ({type(exc).__name__}: {str(exc)[:200]})") from None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
            self._cache.clear()
        self._failures.close()

    # -- operator commands
    def create(self, plugin: str, *, expires_in: float | None = None) -> tuple[TokenInfo, str]:
        """A new token for ``plugin``: its row and the token (shown once, stored nowhere)."""
        info, token = self._new(plugin, self._clock(), expires_in)
        key = self._key.get(create=True)
        mac = record_mac(key, (info.id, info.plugin, info.created, info.expires, None, digest(token)))
        self._execute("INSERT INTO tokens (id, plugin, sha256, created, expires, revoked, mac) "
                      "VALUES (?, ?, ?, ?, ?, NULL, ?)",
                      (info.id, info.plugin, digest(token), info.created, info.expires, mac), create=True)
        return info, token

    def list(self) -> list[TokenInfo]:
        """Every row; one the home's key did not sign has status ``invalid``."""
        rows = self._execute(f"SELECT {_COLUMNS} FROM tokens ORDER BY created, id")
        key = self._key.get(create=False) if rows else None
        return [self._info(row, self._signed(row, key)) for row in rows]

    def revoke(self, token_id: str) -> TokenInfo:
        """Revoke by id (idempotent: an already revoked token keeps its first revocation time), signed anew."""
        token_id = self._checked_id(token_id)
        now = self._clock()

        def work(conn: sqlite3.Connection) -> tuple | None:
            row = conn.execute(f"SELECT {_COLUMNS} FROM tokens WHERE id = ?", (token_id,)).fetchone()
            if row is None:
                return None
            key = self._key.get(create=True)
            if row[4] is not None and self._signed(row, key):
                return row
            revoked = row[4] if isinstance(row[4], float) else now
            row = (*row[:4], revoked, row[5])
            conn.execute("UPDATE tokens SET revoked = ?, mac = ? WHERE id = ?", (revoked, record_mac(key, row), token_id))
            return (*row, record_mac(key, row))

        row = self._transaction(work)
        if row is None:
            raise TokenError(f"no token {token_id} in {self.path} (see plugin-llm tokens list)")
        with self._lock:
            self._cache.clear()
        return self._info(row, True)

    def _transaction(self, work):
        with self._lock:
            conn = self._connection(False)
            if conn is None:
                return None
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = work(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                raise TokenError(f"the token file {self.path} failed ({type(exc).__name__}: {str(exc)[:200]})") from None

    def _row(self, wanted: str) -> tuple | None:
        rows = self._execute(f"SELECT {_COLUMNS} FROM tokens WHERE sha256 = ?", (wanted,))
        return rows[0] if rows else None
