"""Several logs, one view: the logs of replicas of the service, each its own chain.

A replica is named by its directory (a home, or a logs directory) or, for a log file, by the
directory it is in; its chain is verified on its own, with its own public keys, and its records are
merged with the others' by ``ts`` for the listings, each saying which replica it came from.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path
from typing import Any

from audit.logfiles import resolve_log_path
from audit.reader import record_time
from audit.records import TS

__all__ = ["Replica", "REPLICA", "replicas", "default_pubkey", "merge_records", "sort_key"]

#: the field a merged listing adds to each record: the replica it came from
REPLICA = "replica"
_PUB = Path("keys") / "audit-signing.pub"
_MAX_NAME = 80


@dataclass(frozen=True)
class Replica:
    """One replica's log: ``name`` (unique in the view), the active log file, its public keys file if known."""

    name: str
    log: Path
    pubkey: Path | None = None


def default_pubkey(given: Path, log: Path) -> Path | None:
    """The public keys file found beside a replica's log: ``<home>/keys/audit-signing.pub`` or an
    ``audit-signing.pub`` in the log's directory (or ``given`` directory), else None."""
    candidates = [log.parent / _PUB.name, log.parent.parent / _PUB]
    if given.is_dir():
        candidates[:0] = [given / _PUB, given / _PUB.name]
    return next((c for c in candidates if c.is_file()), None)


def _name(given: Path, log: Path) -> str:
    base = given if given.is_dir() else log.parent
    if base.name == "logs" and not given.is_dir():
        base = base.parent
    name = base.resolve().name or str(base)
    return name[:_MAX_NAME]


def replicas(paths: Sequence[str | os.PathLike[str]], pubkeys: Sequence[str | os.PathLike[str]] = ()) -> list[Replica]:
    """The replicas of ``paths`` (log files, logs directories or homes), named uniquely.

    ``pubkeys``, when given, pairs with ``paths`` in order (one keys file per replica); otherwise
    each replica's keys are looked for beside its log (:func:`default_pubkey`).
    Raises ``ValueError`` when the counts differ.
    """
    if pubkeys and len(pubkeys) != len(paths):
        raise ValueError(f"{len(pubkeys)} public keys file(s) for {len(paths)} log(s): give one --pubkey per --log, "
                         f"in the same order, or none (each log's audit-signing.pub beside it is used)")
    out: list[Replica] = []
    taken: dict[str, int] = {}
    for i, raw in enumerate(paths):
        given = Path(raw).expanduser()
        log = resolve_log_path(given)
        name = _name(given, log)
        if name in taken:
            taken[name] += 1
            name = f"{name}#{taken[name]}"
        else:
            taken[name] = 1
        pub = Path(pubkeys[i]).expanduser() if pubkeys else default_pubkey(given, log)
        out.append(Replica(name, log, pub))
    return out


def sort_key(record: dict[str, Any]) -> str:
    """The record's time as text that sorts in time order: the writer's own UTC ``ts`` as is, another
    ISO form converted, none (or unreadable) first."""
    ts = record.get(TS)
    if not isinstance(ts, str):
        return ""
    if len(ts) == 24 and ts.endswith("Z"):
        return ts

    moment = record_time(record)
    if moment is None:
        return ""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def merge_records(streams: Iterable[tuple[str, Iterable[dict[str, Any]]]]) -> Iterator[dict[str, Any]]:
    """The records of every ``(replica name, records)`` stream, merged by time (each stream is
    oldest first), each with :data:`REPLICA` set to its replica. Streams are read lazily."""
    def tagged(name: str, records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for record in records:
            record[REPLICA] = name
            yield record

    return heapq.merge(*(tagged(n, r) for n, r in streams), key=sort_key)

