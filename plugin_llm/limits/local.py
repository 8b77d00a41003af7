"""The ``local`` limit store: SQLite in the home (``<home>/limits.sqlite3``).

Correct across threads and processes of one machine: every admission and
settlement is one ``BEGIN IMMEDIATE`` transaction (SQLite's write lock is
taken before anything is read, so check-and-reserve cannot interleave).
Threads of one process share one connection behind a lock (a hand-off on a
Python lock is far cheaper than SQLite's sleeping busy handler); processes
meet at the database lock, waiting at most the call's remaining deadline
(``busy_timeout``). WAL journal with ``synchronous=NORMAL``: a committed
admission survives a crash of the process; a power loss can lose the last
few transactions.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
import weakref
from pathlib import Path

from plugin_llm.limits.settings import PluginLimits
from plugin_llm.limits.store import Admission, Counters, Denial, LimitStore, Reservation, StoreError, buckets_at, decide

__all__ = ["LocalStore", "DB_NAME"]

DB_NAME = "limits.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spend (
    plugin TEXT NOT NULL, bucket TEXT NOT NULL,
    nano INTEGER NOT NULL DEFAULT 0, requests INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (plugin, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reservations (
    plugin TEXT NOT NULL, id TEXT NOT NULL, expires REAL NOT NULL,
    nano INTEGER NOT NULL, tokens INTEGER NOT NULL, minute TEXT NOT NULL, day TEXT NOT NULL, month TEXT NOT NULL,
    PRIMARY KEY (plugin, id)
) WITHOUT ROWID;
"""
# Only calls in flight are rows of `reservations`, so a plugin's rows are found by the primary
# key's prefix with no second index (every index is one more page written per transaction).

_PURGE = "DELETE FROM reservations WHERE plugin = ? AND expires <= ?"
#: one statement for every counter; reservations past their expiry (?5) are ignored, and counted (last
#: column) so that the purge runs only when there is something to purge
_READ = """
SELECT COALESCE(SUM(expires > ?5), 0), MIN(CASE WHEN expires > ?5 THEN expires END),
       COALESCE(SUM(CASE WHEN expires > ?5 AND minute = ?2 THEN 1 END), 0),
       COALESCE(SUM(CASE WHEN expires > ?5 AND minute = ?2 THEN tokens END), 0),
       COALESCE(SUM(CASE WHEN expires > ?5 AND day = ?3 THEN nano END), 0),
       COALESCE(SUM(CASE WHEN expires > ?5 AND month = ?4 THEN nano END), 0),
       (SELECT requests FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT tokens FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'day:' || ?3),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'mon:' || ?4),
       COALESCE(SUM(expires <= ?5), 0)
FROM reservations WHERE plugin = ?1
"""
_HOLD = "INSERT INTO reservations (plugin, id, expires, nano, tokens, minute, day, month) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_DROP = "DELETE FROM reservations WHERE plugin = ? AND id = ?"
#: the finished request in the buckets it was admitted in: cost to day and month, one request and its tokens to the minute
_ADD = (
    "INSERT INTO spend (plugin, bucket, nano, requests, tokens) VALUES "
    "(?1, 'day:' || ?2, ?5, 0, 0), (?1, 'mon:' || ?3, ?5, 0, 0), (?1, 'min:' || ?4, 0, 1, ?6) "
    "ON CONFLICT (plugin, bucket) DO UPDATE SET "
    "nano = nano + excluded.nano, requests = requests + excluded.requests, tokens = tokens + excluded.tokens"
)
_PRUNE_MINUTES = "DELETE FROM spend WHERE plugin = ? AND bucket >= 'min:' AND bucket < 'min:' || ?"
_RESET = "DELETE FROM spend WHERE plugin = ? AND bucket IN ('min:' || ?, 'day:' || ?, 'mon:' || ?)"

_STORES: "weakref.WeakSet[LocalStore]" = weakref.WeakSet()
#: connections inherited over fork: never closed in the child (closing could checkpoint or
#: remove the parent's WAL); kept referenced so they are not finalised either
_INHERITED: list[sqlite3.Connection] = []


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._forget_connection()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class LocalStore(LimitStore):
    """SQLite store at ``path``; one connection per process, shared by its threads."""

    name = "local"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._busy_ms = -1
        self._pruned: dict[str, str] = {}  # plugin -> minute bucket last pruned up to
        _STORES.add(self)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.path)!r})"

    def _forget_connection(self) -> None:
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None
        self._busy_ms = -1
        self._lock = threading.Lock()  # a parent thread may have held it at fork time

    def _connect(self, timeout: float) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=max(0.001, timeout))
        try:
            conn.execute("PRAGMA page_size = 1024")  # only on creation: small pages, fewer bytes per WAL frame
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self, timeout: float, work):
        """Run ``work(conn)`` in one BEGIN IMMEDIATE transaction, waiting at most ``timeout`` seconds."""
        start = time.monotonic()
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            raise StoreError(f"the local limits store {self.path} is busy (waited {timeout:.2f}s for this process's lock)")
        try:
            conn = self._conn
            if conn is None:
                conn = self._conn = self._connect(timeout - (time.monotonic() - start))
            busy_ms = max(1, int((timeout - (time.monotonic() - start)) * 1000)) // 10 * 10 or 1
            if busy_ms != self._busy_ms:
                conn.execute(f"PRAGMA busy_timeout = {busy_ms:d}")
                self._busy_ms = busy_ms
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result
        except sqlite3.Error as exc:
            raise StoreError(f"the local limits store {self.path} failed: {_reason(exc)}") from None
        except OSError as exc:
            raise StoreError(f"the local limits store {self.path} cannot be opened: {_reason(exc)}") from None
        finally:
            self._lock.release()

    @staticmethod
    def _read(conn: sqlite3.Connection, plugin_id: str, now: float, b, *, purge: bool = True) -> Counters:
        row = conn.execute(_READ, (plugin_id, b.minute, b.day, b.month, now)).fetchone()
        if purge and row[10]:
            conn.execute(_PURGE, (plugin_id, now))
        return Counters(
            in_flight=row[0], earliest_expiry=row[1], minute_requests_reserved=row[2], minute_tokens_reserved=row[3],
            day_reserved=row[4], month_reserved=row[5], minute_requests=row[6] or 0, minute_tokens=row[7] or 0,
            day_spent=row[8] or 0, month_spent=row[9] or 0,
        )

    def admit(self, plugin_id: str, reservation: Reservation, limits: PluginLimits, now: float, *,
              timeout: float) -> Admission | Denial:
        b = buckets_at(now)

        def work(conn: sqlite3.Connection) -> Admission | Denial:
            denial = decide(plugin_id, limits, self._read(conn, plugin_id, now, b), reservation, b)
            if denial is not None:
                return denial
            rid = uuid.uuid4().hex
            expires = now + max(0.0, reservation.ttl)
            conn.execute(_HOLD, (plugin_id, rid, expires, reservation.cost_nano, reservation.tokens, b.minute, b.day, b.month))
            if self._pruned.get(plugin_id) != b.minute:  # once a minute: drop minute rows older than the last one
                conn.execute(_PRUNE_MINUTES, (plugin_id, time.strftime("%Y-%m-%dT%H:%M", time.gmtime(now - 60))))
                self._pruned[plugin_id] = b.minute
            return Admission(plugin_id, rid, reservation.cost_nano, reservation.tokens, b, expires)

        return self._run(timeout, work)

    def settle(self, admission: Admission, cost_nano: int, tokens: int, *, timeout: float) -> None:
        a, b = admission, admission.buckets

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(_DROP, (a.plugin_id, a.reservation_id))
            conn.execute(_ADD, (a.plugin_id, b.day, b.month, b.minute, max(0, int(cost_nano)), max(0, int(tokens))))

        self._run(timeout, work)

    def counters(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        b = buckets_at(now)
        return self._run(timeout, lambda conn: self._read(conn, plugin_id, now, b, purge=False))

    def reset(self, plugin_id: str, now: float, *, timeout: float) -> None:
        b = buckets_at(now)
        self._run(timeout, lambda conn: conn.execute(_RESET, (plugin_id, b.minute, b.day, b.month)))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._busy_ms = -1
