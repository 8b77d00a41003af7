"""The ``local`` limit store: SQLite in the home (``<home>/limits.sqlite3``, created 0600).

Correct across threads and processes of one machine: an admission, a settlement and a lease step
(:class:`~plugin_llm.limits.store.LeaseOp`) are each ONE SQL statement, an ``INSERT`` whose
trigger checks and records everything and drops the row itself. A single write statement is its
own transaction that takes the write lock before it reads, so check-and-reserve cannot interleave.

Threads of one process share one connection behind a lock; processes meet at the database lock,
waiting at most the call's remaining deadline (``busy_timeout``). WAL with ``synchronous=NORMAL``:
a committed admission survives a crash of the process; a power loss can lose the last few
transactions. The schema and statements: :mod:`.local_sql`; the trigger pattern and why:
docs/design.md, "Limits and leases".
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
from plugin_llm.limits.local_sql import (
    ADMIT,
    BREAKER,
    EVICT_BREAKER,
    FORGOTTEN,
    HELD,
    LEASE,
    PRUNE_MINUTES,
    PUT_BREAKER,
    READ,
    REQUEST_TABLES,
    RESET,
    SCHEMA,
    SCHEMA_VERSION,
    SETTLE,
    SETTLE_MANY,
    TAKE_PROBE,
    V3_COLUMNS,
)
from plugin_llm.limits.settings import PluginLimits
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
    Denial,
    LeaseGrant,
    LeaseOp,
    QueuedStore,
    Reservation,
    SettlementQueue,
    StoreDataError,
    StoreError,
    buckets_at,
    new_reservation_id,
    lease_denial,
    limit_caps,
    deny,
)

__all__ = ["LocalStore", "DB_NAME", "SCHEMA_VERSION"]

DB_NAME = LIMITS_DB  # in the home (plugin_llm.home_layout)
_encode = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per call

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


class LocalStore(QueuedStore):
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
                script = REQUEST_TABLES if version else ""
                columns = {row[1] for row in conn.execute("PRAGMA table_info(reservations)")}
                if columns and "slots" not in columns:
                    script += V3_COLUMNS
                script += SCHEMA + f"PRAGMA user_version = {SCHEMA_VERSION};"
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
        row = conn.execute(READ, (plugin_id, b.minute, b.day, b.month, now)).fetchone()
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
                conn.execute(ADMIT, (*row, batch))
                applied = True
            except sqlite3.IntegrityError as exc:
                refused = _refused_limit(exc)
                if not applied:  # the refusal undid the whole statement: the settlements go on their own
                    conn.execute(SETTLE_MANY, (batch,))
                    applied = True
                # The statement decided; read the numbers it saw for the message (they may have moved since).
                c = self._read(conn, plugin_id, now, b)
                used, held = _numbers(c, refused)
                return deny(plugin_id, limits, refused, used, held, reservation, b, c.earliest_expiry)
            if self._pruned.get(plugin_id) != b.minute:  # once a minute: drop minute rows older than the last one
                self._pruned[plugin_id] = b.minute
                try:
                    conn.execute(PRUNE_MINUTES, (plugin_id, time.strftime("%Y-%m-%dT%H:%M", time.gmtime(now - 60))))
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
        caps = limit_caps(limits)
        head = (plugin_id, op.lease_id, op.now)
        where = (b.minute, b.day, b.month)

        def work(conn: sqlite3.Connection) -> LeaseGrant | Denial:
            try:
                conn.execute(LEASE, (*head, op.expires, *where, *op.settled, *op.keep, *op.ask, *op.want, *caps))
            except sqlite3.IntegrityError as exc:
                refused = _refused_limit(exc)
                # undone as a whole: settle and shrink to what the calls in flight hold, which never refuses
                conn.execute(LEASE, (*head, op.keep_expires, *where, *op.settled, *op.keep, 0, 0, 0, 0, 0, 0, 0, 0,
                                      *caps))
                c = self._read(conn, plugin_id, op.now, b)
                used, held = _numbers(c, refused)
                return lease_denial(plugin_id, limits, op, refused, used, held, c.earliest_expiry)
            row = conn.execute(HELD, (plugin_id, op.lease_id)).fetchone()
            if row is None:
                return LeaseGrant((0, 0, 0, 0), op.keep_expires)
            return LeaseGrant((row[0], row[1], row[2], row[3]), row[4])

        return self._run(timeout, work)

    @staticmethod
    def _settle_item(admission: Admission, cost_nano: int, tokens: int) -> tuple:
        a, b = admission, admission.buckets
        return (a.plugin_id, a.reservation_id, max(0, int(cost_nano)), max(0, int(tokens)), b.minute, b.day, b.month)

    def settle(self, admission: Admission, cost_nano: int, tokens: int, *, timeout: float) -> None:
        row = self._settle_item(admission, cost_nano, tokens)
        self._run(timeout, lambda conn: conn.execute(SETTLE, row))

    def _apply_queued(self, rows: list[tuple], timeout: float) -> None:
        batch = _encode(rows)
        try:
            self._run(timeout, lambda conn: conn.execute(SETTLE_MANY, (batch,)))
        except BaseException:
            self._queue.put_back(rows)  # one statement: all or none were applied
            raise

    def counters(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        if self._conn is None and not os.path.lexists(self.path):  # nothing was ever counted in this home: a
            return Counters()  # read (limits show, audit stats on an evidence copy) creates nothing
        b = self._caught_up(plugin_id, now, timeout)
        return self._run(timeout, lambda conn: self._read(conn, plugin_id, now, b))

    def reset(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        b = self._caught_up(plugin_id, now, timeout)
        args = (plugin_id, b.minute, b.day, b.month)

        def forget(conn: sqlite3.Connection) -> Counters:
            conn.execute("BEGIN IMMEDIATE")  # what is deleted is what is read: no settlement in between
            try:
                forgotten = _forgotten([v or 0 for v in conn.execute(FORGOTTEN, args).fetchone()])
                conn.execute(RESET, args)
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
            found = conn.execute(BREAKER, (route,)).fetchone()  # a read: most routes are closed
            row = breaker_row(*found) if found is not None else None
            if row is None or row.state == "closed":
                return "closed"
            if now < row.retry_at:
                return "open"
            taken = conn.execute(TAKE_PROBE, (probe_until, now, route)).rowcount
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
                found = conn.execute(BREAKER, (route,)).fetchone()
                if found is None and conn.execute("SELECT COUNT(*) FROM breakers").fetchone()[0] >= MAX_BREAKER_ROUTES:
                    conn.execute(EVICT_BREAKER)
                new = breaker_after_failure(breaker_row(*found) if found is not None else None, policy, now)
                conn.execute(PUT_BREAKER, (route, new.state, new.failures, new.first_failure, new.opened_at,
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
        self._close_leases_and_queue()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._busy_ms = -1
