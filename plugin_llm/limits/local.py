"""The ``local`` limit store: SQLite in the home (``<home>/limits.sqlite3``, created 0600).

Correct across threads and processes of one machine: an admission, a settlement and a lease step
(:class:`~plugin_llm.limits.store.LeaseOp`) are each ONE SQL statement, an ``INSERT`` whose
trigger checks and records everything and drops the row itself. A single write statement is its
own transaction that takes the write lock before it reads, so check-and-reserve cannot interleave.

Threads of one process share one connection behind a lock; processes meet at the database lock,
waiting at most the call's remaining deadline (``busy_timeout``). WAL with ``synchronous=NORMAL``:
a committed admission survives a crash of the process; a power loss can lose the last few
transactions. The trigger pattern and why: docs/design.md, "Limits and leases".
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import weakref
from pathlib import Path

from plugin_llm.home_layout import LIMITS_DB
from plugin_llm.limits.settings import MAX_TOTAL, PluginLimits
from plugin_llm.limits.store import (
    LIMIT_NAMES,
    MAX_BREAKER_ROUTES,
    MAX_PROBE_SECONDS,
    BreakerState,
    breaker_after_failure,
    breaker_row,
    breaker_state,
    check_route,
    Admission,
    Counters,
    LEASE_SHARE,
    Denial,
    LeaseGrant,
    LeaseOp,
    LimitStore,
    Reservation,
    SettlementQueue,
    StoreDataError,
    StoreError,
    buckets_at,
    new_reservation_id,
    deny,
)

__all__ = ["LocalStore", "DB_NAME", "SCHEMA_VERSION"]

DB_NAME = LIMITS_DB  # in the home (plugin_llm.home_layout)
SCHEMA_VERSION = 5
#: the request tables hold no rows: a schema older than this version is upgraded by recreating them
_REQUEST_TABLES = """
DROP TRIGGER IF EXISTS admit_request; DROP TABLE IF EXISTS admit;
DROP TRIGGER IF EXISTS settle_request; DROP TABLE IF EXISTS settle;
DROP TRIGGER IF EXISTS lease_request; DROP TABLE IF EXISTS lease;
"""
#: version 3 gave a reservation a number of calls in flight and of requests (a lease holds several);
#: version 4 saturates the usage counters at MAX_TOTAL (the triggers only: recreated);
#: version 5 adds the routes' circuit breakers (a table of their own)
_V3_COLUMNS = """
ALTER TABLE reservations ADD COLUMN slots INTEGER NOT NULL DEFAULT 1;
ALTER TABLE reservations ADD COLUMN requests INTEGER NOT NULL DEFAULT 1;
"""

# Only calls in flight are rows of `reservations`, so a plugin's rows are found by the primary
# key's prefix with no second index (every index is one more page written per transaction).
# `admit` and `settle` never hold a row: their triggers act, then RAISE(IGNORE) the insert.
#: what the lease trigger decides against, from the plugin's rows: the other reservations in flight
#: (o_*: slots, and requests, tokens and nano-dollars in this minute, day and month) and the usage
#: already settled in the same windows (u_*); once for the check, once for the grant
_TOTALS = """FROM (SELECT COALESCE(SUM(slots), 0) AS o_slots,
          COALESCE(SUM(CASE WHEN minute = NEW.minute THEN requests END), 0) AS o_req,
          COALESCE(SUM(CASE WHEN minute = NEW.minute THEN tokens END), 0) AS o_tok,
          COALESCE(SUM(CASE WHEN day = NEW.day THEN nano END), 0) AS o_day,
          COALESCE(SUM(CASE WHEN month = NEW.month THEN nano END), 0) AS o_mon
     FROM reservations WHERE plugin = NEW.plugin AND id <> NEW.id),
    (SELECT COALESCE((SELECT requests FROM spend WHERE plugin = NEW.plugin AND bucket = 'min:' || NEW.minute), 0) AS u_req,
          COALESCE((SELECT tokens FROM spend WHERE plugin = NEW.plugin AND bucket = 'min:' || NEW.minute), 0) AS u_tok,
          COALESCE((SELECT nano FROM spend WHERE plugin = NEW.plugin AND bucket = 'day:' || NEW.day), 0) AS u_day,
          COALESCE((SELECT nano FROM spend WHERE plugin = NEW.plugin AND bucket = 'mon:' || NEW.month), 0) AS u_mon)"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spend (
    plugin TEXT NOT NULL, bucket TEXT NOT NULL,
    nano INTEGER NOT NULL DEFAULT 0, requests INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (plugin, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reservations (
    plugin TEXT NOT NULL, id TEXT NOT NULL, expires REAL NOT NULL,
    nano INTEGER NOT NULL, tokens INTEGER NOT NULL, minute TEXT NOT NULL, day TEXT NOT NULL, month TEXT NOT NULL,
    slots INTEGER NOT NULL DEFAULT 1, requests INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (plugin, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS breakers (
    route TEXT NOT NULL PRIMARY KEY, state TEXT NOT NULL, failures INTEGER NOT NULL,
    first_failure REAL, opened_at REAL, retry_at REAL, updated REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS settle (plugin TEXT, id TEXT, nano INTEGER, tokens INTEGER, minute TEXT, day TEXT, month TEXT);
CREATE TABLE IF NOT EXISTS admit (
    plugin TEXT, id TEXT, expires REAL, nano INTEGER, tokens INTEGER, minute TEXT, day TEXT, month TEXT, now REAL,
    max_concurrent INTEGER, requests_per_minute INTEGER, tokens_per_minute INTEGER, budget_day INTEGER,
    budget_month INTEGER, settlements TEXT
);
CREATE TRIGGER IF NOT EXISTS admit_request BEFORE INSERT ON admit BEGIN
  INSERT INTO settle SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
      json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]')
    FROM json_each(NEW.settlements) WHERE NEW.settlements IS NOT NULL;
  DELETE FROM reservations WHERE plugin = NEW.plugin AND expires <= NEW.now;
  SELECT RAISE(ABORT, 'limit:1') WHERE NEW.max_concurrent IS NOT NULL
    AND (SELECT COALESCE(SUM(slots), 0) FROM reservations WHERE plugin = NEW.plugin) + 1 > NEW.max_concurrent;
  SELECT RAISE(ABORT, 'limit:2') WHERE NEW.requests_per_minute IS NOT NULL
    AND COALESCE((SELECT requests FROM spend WHERE plugin = NEW.plugin AND bucket = 'min:' || NEW.minute), 0)
      + (SELECT COALESCE(SUM(requests), 0) FROM reservations WHERE plugin = NEW.plugin AND minute = NEW.minute)
      + 1 > NEW.requests_per_minute;
  SELECT RAISE(ABORT, 'limit:3') WHERE NEW.tokens_per_minute IS NOT NULL
    AND COALESCE((SELECT tokens FROM spend WHERE plugin = NEW.plugin AND bucket = 'min:' || NEW.minute), 0)
      + (SELECT COALESCE(SUM(tokens), 0) FROM reservations WHERE plugin = NEW.plugin AND minute = NEW.minute)
      + NEW.tokens > NEW.tokens_per_minute;
  SELECT RAISE(ABORT, 'limit:4') WHERE NEW.budget_day IS NOT NULL
    AND COALESCE((SELECT nano FROM spend WHERE plugin = NEW.plugin AND bucket = 'day:' || NEW.day), 0)
      + (SELECT COALESCE(SUM(nano), 0) FROM reservations WHERE plugin = NEW.plugin AND day = NEW.day)
      + NEW.nano > NEW.budget_day;
  SELECT RAISE(ABORT, 'limit:5') WHERE NEW.budget_month IS NOT NULL
    AND COALESCE((SELECT nano FROM spend WHERE plugin = NEW.plugin AND bucket = 'mon:' || NEW.month), 0)
      + (SELECT COALESCE(SUM(nano), 0) FROM reservations WHERE plugin = NEW.plugin AND month = NEW.month)
      + NEW.nano > NEW.budget_month;
  INSERT INTO reservations (plugin, id, expires, nano, tokens, minute, day, month)
    VALUES (NEW.plugin, NEW.id, NEW.expires, NEW.nano, NEW.tokens, NEW.minute, NEW.day, NEW.month);
  SELECT RAISE(IGNORE);
END;
CREATE TRIGGER IF NOT EXISTS settle_request BEFORE INSERT ON settle BEGIN
  DELETE FROM reservations WHERE plugin = NEW.plugin AND id = NEW.id;
  INSERT INTO spend (plugin, bucket, nano, requests, tokens) VALUES
    (NEW.plugin, 'day:' || NEW.day, NEW.nano, 0, 0),
    (NEW.plugin, 'mon:' || NEW.month, NEW.nano, 0, 0),
    (NEW.plugin, 'min:' || NEW.minute, 0, 1, NEW.tokens)
    ON CONFLICT (plugin, bucket) DO UPDATE SET nano = MIN(nano + excluded.nano, @MAX@),
      requests = MIN(requests + excluded.requests, @MAX@), tokens = MIN(tokens + excluded.tokens, @MAX@);
  SELECT RAISE(IGNORE);
END;

CREATE TABLE IF NOT EXISTS lease (
    plugin TEXT, id TEXT, now REAL, expires REAL, minute TEXT, day TEXT, month TEXT,
    s_req INTEGER, s_tok INTEGER, s_nano INTEGER,
    k_slots INTEGER, k_req INTEGER, k_tok INTEGER, k_nano INTEGER,
    a_slots INTEGER, a_req INTEGER, a_tok INTEGER, a_nano INTEGER,
    w_slots INTEGER, w_req INTEGER, w_tok INTEGER, w_nano INTEGER,
    max_concurrent INTEGER, requests_per_minute INTEGER, tokens_per_minute INTEGER, budget_day INTEGER,
    budget_month INTEGER
);
CREATE TRIGGER IF NOT EXISTS lease_request BEFORE INSERT ON lease BEGIN
  INSERT INTO spend (plugin, bucket, nano, requests, tokens) SELECT * FROM (VALUES
    (NEW.plugin, 'day:' || NEW.day, NEW.s_nano, 0, 0),
    (NEW.plugin, 'mon:' || NEW.month, NEW.s_nano, 0, 0),
    (NEW.plugin, 'min:' || NEW.minute, 0, NEW.s_req, NEW.s_tok)) WHERE NEW.s_req + NEW.s_tok + NEW.s_nano > 0
    ON CONFLICT (plugin, bucket) DO UPDATE SET nano = MIN(nano + excluded.nano, @MAX@),
      requests = MIN(requests + excluded.requests, @MAX@), tokens = MIN(tokens + excluded.tokens, @MAX@);
  DELETE FROM reservations WHERE plugin = NEW.plugin AND expires <= NEW.now;
  SELECT CASE
      WHEN NEW.max_concurrent IS NOT NULL AND o_slots + NEW.k_slots + NEW.a_slots > NEW.max_concurrent
        THEN RAISE(ABORT, 'limit:1')
      WHEN NEW.requests_per_minute IS NOT NULL AND u_req + o_req + NEW.k_req + NEW.a_req > NEW.requests_per_minute
        THEN RAISE(ABORT, 'limit:2')
      WHEN NEW.tokens_per_minute IS NOT NULL AND u_tok + o_tok + NEW.k_tok + NEW.a_tok > NEW.tokens_per_minute
        THEN RAISE(ABORT, 'limit:3')
      WHEN NEW.budget_day IS NOT NULL AND u_day + o_day + NEW.k_nano + NEW.a_nano > NEW.budget_day
        THEN RAISE(ABORT, 'limit:4')
      WHEN NEW.budget_month IS NOT NULL AND u_mon + o_mon + NEW.k_nano + NEW.a_nano > NEW.budget_month
        THEN RAISE(ABORT, 'limit:5')
    END
    @TOTALS@ WHERE NEW.a_slots > 0;
  INSERT OR REPLACE INTO reservations (plugin, id, expires, nano, tokens, minute, day, month, slots, requests)
    SELECT NEW.plugin, NEW.id, NEW.expires,
      NEW.k_nano + NEW.a_nano + MAX(0, MIN(NEW.w_nano,
        CASE WHEN NEW.budget_day IS NULL AND NEW.budget_month IS NULL THEN 0
             ELSE MIN(COALESCE(NEW.budget_day - u_day - o_day, 9e18), COALESCE(NEW.budget_month - u_mon - o_mon, 9e18))
                  - NEW.k_nano - NEW.a_nano END / @SHARE@)),
      NEW.k_tok + NEW.a_tok + MAX(0, MIN(NEW.w_tok,
        COALESCE(NEW.tokens_per_minute - u_tok - o_tok - NEW.k_tok - NEW.a_tok, 0) / @SHARE@)),
      NEW.minute, NEW.day, NEW.month,
      NEW.k_slots + NEW.a_slots + MAX(0, MIN(NEW.w_slots,
        COALESCE(NEW.max_concurrent - o_slots - NEW.k_slots - NEW.a_slots, 0) / @SHARE@)),
      NEW.k_req + NEW.a_req + MAX(0, MIN(NEW.w_req,
        COALESCE(NEW.requests_per_minute - u_req - o_req - NEW.k_req - NEW.a_req, 0) / @SHARE@))
    @TOTALS@;
  DELETE FROM reservations WHERE plugin = NEW.plugin AND id = NEW.id
    AND slots = 0 AND requests = 0 AND tokens = 0 AND nano = 0;
  SELECT RAISE(IGNORE);
END;
""".replace("@TOTALS@", _TOTALS).replace("@SHARE@", str(LEASE_SHARE)).replace("@MAX@", str(MAX_TOTAL))

_ADMIT = "INSERT INTO admit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
#: the finished request in the buckets it was admitted in: cost to day and month, one request and its tokens to the minute
_SETTLE = "INSERT INTO settle VALUES (?, ?, ?, ?, ?, ?, ?)"
#: many settlements (a JSON array of _SETTLE rows) in one statement
_SETTLE_MANY = (
    "INSERT INTO settle SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), "
    "json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]') "
    "FROM json_each(?)"
)
#: every counter in one statement (one snapshot); reservations past their expiry (?5) are ignored
_READ = """
SELECT COALESCE(SUM(CASE WHEN expires > ?5 THEN slots END), 0), MIN(CASE WHEN expires > ?5 THEN expires END),
       COALESCE(SUM(CASE WHEN expires > ?5 AND minute = ?2 THEN requests END), 0),
       COALESCE(SUM(CASE WHEN expires > ?5 AND minute = ?2 THEN tokens END), 0),
       COALESCE(SUM(CASE WHEN expires > ?5 AND day = ?3 THEN nano END), 0),
       COALESCE(SUM(CASE WHEN expires > ?5 AND month = ?4 THEN nano END), 0),
       (SELECT requests FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT tokens FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'day:' || ?3),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'mon:' || ?4)
FROM reservations WHERE plugin = ?1
"""
_LEASE = "INSERT INTO lease VALUES (" + ", ".join(["?"] * 27) + ")"
_HELD = "SELECT slots, requests, tokens, nano, expires FROM reservations WHERE plugin = ? AND id = ?"
_encode = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per call
_PRUNE_MINUTES = "DELETE FROM spend WHERE plugin = ? AND bucket >= 'min:' AND bucket < 'min:' || ?"
_RESET = "DELETE FROM spend WHERE plugin = ?1 AND bucket IN ('min:' || ?2, 'day:' || ?3, 'mon:' || ?4)"
_FORGOTTEN = """
SELECT (SELECT requests FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT tokens FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'day:' || ?3),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'mon:' || ?4)
"""

_BREAKER = "SELECT state, failures, first_failure, opened_at, retry_at FROM breakers WHERE route = ?"
#: the probe of an open breaker whose cooldown (or a half-open one whose probe lease) is over: one
#: statement, so of several callers exactly one changes the row and gets it
_TAKE_PROBE = ("UPDATE breakers SET state = 'half_open', retry_at = ?1, updated = ?2 "
               "WHERE route = ?3 AND state IN ('open', 'half_open') AND retry_at <= ?2")
_PUT_BREAKER = "INSERT OR REPLACE INTO breakers VALUES (?, ?, ?, ?, ?, ?, ?)"
#: a new route in a full table: the oldest closed breaker goes (else the oldest open one)
_EVICT_BREAKER = ("DELETE FROM breakers WHERE route = "
                  "(SELECT route FROM breakers ORDER BY state <> 'closed', updated LIMIT 1)")

_NOT_A_COUNT = ("a count that is not a whole number of 0 or more (the file was edited, or is corrupt; fix or delete "
                "the plugin's rows in its spend table: a reset does not erase what it cannot read and record)")


class _Corrupt(sqlite3.DatabaseError):
    """A plugin's row holds something that is not a count (see :class:`StoreDataError`)."""


def _forgotten(counts: list) -> Counters:
    """What a reset deleted (minute requests and tokens, day and month nano-dollars)."""
    if not all(type(v) is int and v >= 0 for v in counts):
        raise _Corrupt(_NOT_A_COUNT)
    return Counters(minute_requests=counts[0], minute_tokens=counts[1], day_spent=counts[2], month_spent=counts[3])


_STORES: "weakref.WeakSet[LocalStore]" = weakref.WeakSet()
#: connections inherited over fork: never closed in the child (closing could checkpoint or
#: remove the parent's WAL); kept referenced so they are not finalised either
_INHERITED: list[sqlite3.Connection] = []


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._forget_connection()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _refused_limit(exc: sqlite3.IntegrityError) -> int:
    """The index (into LIMIT_NAMES) of the limit a trigger refused with, else re-raise."""
    text = str(exc)
    if text.startswith("limit:") and text[6:].isdigit() and 1 <= int(text[6:]) <= len(LIMIT_NAMES):
        return int(text[6:]) - 1
    raise exc


def _numbers(c: Counters, index: int) -> tuple[int, int]:
    """(used, in flight) of limit ``index`` in the counters."""
    return (
        (0, c.in_flight),
        (c.minute_requests, c.minute_requests_reserved),
        (c.minute_tokens, c.minute_tokens_reserved),
        (c.day_spent, c.day_reserved),
        (c.month_spent, c.month_reserved),
    )[index]


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class LocalStore(LimitStore):
    """SQLite store at ``path``; one connection per process, shared by its threads."""

    name = "local"
    supports_leases = True

    def __init__(self, path: Path | str, *, timeout: float = 2.0) -> None:
        self.path = Path(path)
        self._queue = SettlementQueue(self._apply_queued, "local", timeout)
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
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))  # owner-only, like the home's other files
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=max(0.001, timeout))
        try:
            conn.execute("PRAGMA page_size = 1024")  # only on creation: small pages, fewer bytes per WAL frame
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                self._create_or_upgrade(conn)
            elif version != SCHEMA_VERSION:
                raise StoreError(f"the local limits store {self.path} has schema version {version}, this gateway "
                                 f"uses {SCHEMA_VERSION}: stop the other gateway version, or move the file away "
                                 "to start the counts afresh")
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _create_or_upgrade(conn: sqlite3.Connection) -> None:
        """Create the schema, or upgrade an older one in place, in one write transaction (the version
        is read again under the lock: another process may have done it meanwhile)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                script = _REQUEST_TABLES if version else ""
                columns = {row[1] for row in conn.execute("PRAGMA table_info(reservations)")}
                if columns and "slots" not in columns:
                    script += _V3_COLUMNS
                script += _SCHEMA + f"PRAGMA user_version = {SCHEMA_VERSION};"
                statement = ""
                for piece in script.split(";"):  # one statement at a time: executescript would commit first
                    statement += piece + ";"
                    if sqlite3.complete_statement(statement):  # not a ';' inside a trigger body
                        if statement.strip(" \n;"):
                            conn.execute(statement)
                        statement = ""
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _run(self, timeout: float, work):
        """Run ``work(conn)`` (single statements: each its own transaction), waiting at most ``timeout`` seconds."""
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
            return work(conn)
        except _Corrupt as exc:
            raise StoreDataError(f"the local limits store {self.path} failed: {exc}") from None
        except sqlite3.Error as exc:
            raise StoreError(f"the local limits store {self.path} failed: {_reason(exc)}") from None
        except OSError as exc:
            raise StoreError(f"the local limits store {self.path} cannot be opened: {_reason(exc)}") from None
        finally:
            self._lock.release()

    @staticmethod
    def _read(conn: sqlite3.Connection, plugin_id: str, now: float, b) -> Counters:
        row = conn.execute(_READ, (plugin_id, b.minute, b.day, b.month, now)).fetchone()
        counts = [v or 0 for i, v in enumerate(row) if i != 1]
        earliest = row[1]
        if not all(type(v) is int and v >= 0 for v in counts) or not (earliest is None or type(earliest) in (int, float)):
            raise _Corrupt(_NOT_A_COUNT)
        return Counters(
            in_flight=counts[0], earliest_expiry=earliest, minute_requests_reserved=counts[1],
            minute_tokens_reserved=counts[2], day_reserved=counts[3], month_reserved=counts[4],
            minute_requests=counts[5], minute_tokens=counts[6], day_spent=counts[7], month_spent=counts[8],
        )

    def admit(self, plugin_id: str, reservation: Reservation, limits: PluginLimits, now: float, *,
              timeout: float) -> Admission | Denial:
        b = buckets_at(now)
        rid = new_reservation_id()
        expires = now + max(0.0, reservation.ttl)
        row = (plugin_id, rid, expires, int(reservation.cost_nano), int(reservation.tokens), b.minute, b.day, b.month, now,
               limits.max_concurrent, limits.requests_per_minute, limits.tokens_per_minute,
               limits.budget_day_nano, limits.budget_month_nano)

        queued = self._queue.take()  # settlements ride along, applied first by the same statement
        batch = _encode(queued) if queued else None
        applied = not queued

        def work(conn: sqlite3.Connection) -> Admission | Denial:
            nonlocal applied
            try:
                conn.execute(_ADMIT, (*row, batch))
                applied = True
            except sqlite3.IntegrityError as exc:
                refused = _refused_limit(exc)
                if not applied:  # the refusal undid the whole statement: the settlements go on their own
                    conn.execute(_SETTLE_MANY, (batch,))
                    applied = True
                # The statement decided; read the numbers it saw for the message (they may have moved since).
                c = self._read(conn, plugin_id, now, b)
                used, held = _numbers(c, refused)
                return deny(plugin_id, limits, refused, used, held, reservation, b, c.earliest_expiry)
            if self._pruned.get(plugin_id) != b.minute:  # once a minute: drop minute rows older than the last one
                self._pruned[plugin_id] = b.minute
                try:
                    conn.execute(_PRUNE_MINUTES, (plugin_id, time.strftime("%Y-%m-%dT%H:%M", time.gmtime(now - 60))))
                except sqlite3.Error:
                    pass  # housekeeping only: the next minute tries again
            return Admission(plugin_id, rid, reservation.cost_nano, reservation.tokens, b, expires)

        try:
            return self._run(timeout, work)
        except BaseException:
            if not applied:
                self._queue.put_back(queued)  # undone (or never sent): nothing of them was applied
            raise

    def lease(self, plugin_id: str, op: LeaseOp, limits: PluginLimits, *, timeout: float) -> LeaseGrant | Denial:
        b = op.buckets
        caps = (limits.max_concurrent, limits.requests_per_minute, limits.tokens_per_minute,
                limits.budget_day_nano, limits.budget_month_nano)
        head = (plugin_id, op.lease_id, op.now)
        where = (b.minute, b.day, b.month)

        def work(conn: sqlite3.Connection) -> LeaseGrant | Denial:
            try:
                conn.execute(_LEASE, (*head, op.expires, *where, *op.settled, *op.keep, *op.ask, *op.want, *caps))
            except sqlite3.IntegrityError as exc:
                refused = _refused_limit(exc)
                # undone as a whole: settle and shrink to what the calls in flight hold, which never refuses
                conn.execute(_LEASE, (*head, op.keep_expires, *where, *op.settled, *op.keep, 0, 0, 0, 0, 0, 0, 0, 0,
                                      *caps))
                c = self._read(conn, plugin_id, op.now, b)
                used, held = _numbers(c, refused)
                r = Reservation(cost_nano=op.ask[3], tokens=op.ask[2], ttl=0.0)
                return deny(plugin_id, limits, refused, used, held, r, b, c.earliest_expiry)
            row = conn.execute(_HELD, (plugin_id, op.lease_id)).fetchone()
            if row is None:
                return LeaseGrant((0, 0, 0, 0), op.keep_expires)
            return LeaseGrant((row[0], row[1], row[2], row[3]), row[4])

        return self._run(timeout, work)

    @staticmethod
    def _settle_row(admission: Admission, cost_nano: int, tokens: int) -> tuple:
        a, b = admission, admission.buckets
        return (a.plugin_id, a.reservation_id, max(0, int(cost_nano)), max(0, int(tokens)), b.minute, b.day, b.month)

    def settle(self, admission: Admission, cost_nano: int, tokens: int, *, timeout: float) -> None:
        row = self._settle_row(admission, cost_nano, tokens)
        self._run(timeout, lambda conn: conn.execute(_SETTLE, row))

    def settle_later(self, admission: Admission, cost_nano: int, tokens: int) -> None:
        self._queue.add(self._settle_row(admission, cost_nano, tokens))

    def _apply_queued(self, rows: list[tuple], timeout: float) -> None:
        batch = _encode(rows)
        try:
            self._run(timeout, lambda conn: conn.execute(_SETTLE_MANY, (batch,)))
        except BaseException:
            self._queue.put_back(rows)  # one statement: all or none were applied
            raise

    def flush(self, *, timeout: float) -> None:
        self._queue.flush(timeout)

    def counters(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        if self._conn is None and not os.path.lexists(self.path):  # nothing was ever counted in this home: a
            return Counters()  # read (limits show, audit stats on an evidence copy) creates nothing
        self.return_leases(plugin_id, timeout=timeout)
        self._queue.flush(timeout)
        b = buckets_at(now)
        return self._run(timeout, lambda conn: self._read(conn, plugin_id, now, b))

    def reset(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        self.return_leases(plugin_id, timeout=timeout)
        self._queue.flush(timeout)
        b = buckets_at(now)
        args = (plugin_id, b.minute, b.day, b.month)

        def forget(conn: sqlite3.Connection) -> Counters:
            conn.execute("BEGIN IMMEDIATE")  # what is deleted is what is read: no settlement in between
            try:
                forgotten = _forgotten([v or 0 for v in conn.execute(_FORGOTTEN, args).fetchone()])
                conn.execute(_RESET, args)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return forgotten

        return self._run(timeout, forget)

    # -- circuit breakers: a table of their own, read-modify-write under the write lock
    def _unused(self) -> bool:
        """Nothing was ever recorded in this home: a read (or a success) creates nothing."""
        return self._conn is None and not os.path.lexists(self.path)

    def breaker_acquire(self, route: str, policy, now: float, *, timeout: float, probe_for: float) -> str:
        check_route(route)
        if policy.failures <= 0 or self._unused():
            return "closed"
        probe_until = now + max(0.0, min(float(probe_for), MAX_PROBE_SECONDS))

        def work(conn: sqlite3.Connection) -> str:
            found = conn.execute(_BREAKER, (route,)).fetchone()  # a read: most routes are closed
            row = breaker_row(*found) if found is not None else None
            if row is None or row.state == "closed":
                return "closed"
            if now < row.retry_at:
                return "open"
            taken = conn.execute(_TAKE_PROBE, (probe_until, now, route)).rowcount
            return "probe" if taken == 1 else "open"

        return self._run(timeout, work)

    def breaker_report(self, route: str, ok: bool, policy, now: float, *, timeout: float) -> str:
        check_route(route)
        if policy.failures <= 0 or (ok and self._unused()):
            return "closed"
        if ok:
            self._run(timeout, lambda conn: conn.execute("DELETE FROM breakers WHERE route = ?", (route,)))
            return "closed"

        def fail(conn: sqlite3.Connection) -> str:
            conn.execute("BEGIN IMMEDIATE")  # the row read is the row changed: no report in between
            try:
                found = conn.execute(_BREAKER, (route,)).fetchone()
                if found is None and conn.execute("SELECT COUNT(*) FROM breakers").fetchone()[0] >= MAX_BREAKER_ROUTES:
                    conn.execute(_EVICT_BREAKER)
                new = breaker_after_failure(breaker_row(*found) if found is not None else None, policy, now)
                conn.execute(_PUT_BREAKER, (route, new.state, new.failures, new.first_failure, new.opened_at,
                                            new.retry_at, now))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return new.state

        return self._run(timeout, fail)

    def breaker_states(self, now: float, *, timeout: float) -> dict[str, BreakerState]:
        if self._unused():
            return {}

        def read(conn: sqlite3.Connection) -> dict[str, BreakerState]:
            out = {}
            for route, *values in conn.execute(
                    "SELECT route, state, failures, first_failure, opened_at, retry_at FROM breakers ORDER BY route"):
                row = breaker_row(*values)
                if row is not None and isinstance(route, str):  # (an edited row counts as closed: not listed)
                    out[route] = breaker_state(route, row)
            return out

        return self._run(timeout, read)

    def breaker_reset(self, route: str | None, *, timeout: float) -> None:
        if route is not None:
            check_route(route)
        if self._unused():
            return
        if route is None:
            self._run(timeout, lambda conn: conn.execute("DELETE FROM breakers"))
        else:
            self._run(timeout, lambda conn: conn.execute("DELETE FROM breakers WHERE route = ?", (route,)))

    def close(self) -> None:
        try:
            self.close_leases(timeout=2.0)
        except StoreError:
            pass  # the leases expire by themselves
        try:
            self._queue.flush()
        except StoreError:
            pass  # put back: applied at exit or by the next store on this file
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._busy_ms = -1
