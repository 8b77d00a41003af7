"""``hermes_state``: the SQLite helper memory plugins use (``apply_wal_with_fallback``).

Hermes's session database (``SessionDB``) is not provided: this host keeps its
own history.
"""

from __future__ import annotations

import logging
import sqlite3

__all__ = ["apply_wal_with_fallback"]

logger = logging.getLogger(__name__)
_INCOMPATIBLE = ("locking protocol", "not authorized", "disk i/o error", "readonly")
_warned: set[str] = set()


def apply_wal_with_fallback(conn: sqlite3.Connection, *, db_label: str = "state.db") -> str:
    """``journal_mode=WAL`` on ``conn``; ``DELETE`` on a filesystem that cannot do WAL (NFS, SMB)."""
    try:
        mode = conn.execute("PRAGMA journal_mode").fetchone()
        if mode and str(mode[0]).lower() == "wal":
            return "wal"
    except sqlite3.OperationalError:
        pass
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        return "wal"
    except sqlite3.OperationalError as exc:
        if not any(marker in str(exc).lower() for marker in _INCOMPATIBLE):
            raise
        if db_label not in _warned:
            _warned.add(db_label)
            logger.warning("%s: WAL is not supported on this filesystem (%s); using journal_mode=DELETE", db_label, exc)
        conn.execute("PRAGMA journal_mode=DELETE")
        return "delete"
