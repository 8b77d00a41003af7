"""What the auditor's page shows, read from the logs and the limits store: values only, no HTML.

Every read is bounded: one streaming pass per view, at most :data:`MAX_ROWS` records kept for a
listing, :data:`MAX_KEYS` distinct denial rules and :data:`MAX_DAYS` days of spend.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.checkpoints import checkpoints_path
from audit.errors import AuditLogNotFoundError
from audit.logfiles import list_log_files
from audit.reader import iter_records
from audit.records import COST_USD, DECISION_KEY, DECISION_REASON, LIMITS_LIMIT, PLUGIN_ID, SEQ, TS, is_denied
from audit.replicas import REPLICA, Replica, merge_records, replicas
from audit.signing import AuditKeyError, read_keyring
from audit.summary import MAX_COST_USD, stats
from audit.verifier import verify
from plugin_llm.limits.views import budgets_for

__all__ = ["Source", "Overview", "ChainState", "Filters", "overview", "records_page", "find_record", "chain_states",
           "MAX_ROWS", "PAGE_SIZE"]

PAGE_SIZE = 50
#: records a listing keeps (page x page size is capped to it)
MAX_ROWS = 5000
#: distinct (plugin, rule, key) denial rows counted; the rest are summed under "other"
MAX_KEYS = 2000
#: days of spend kept for the chart (the newest)
MAX_DAYS = 90
#: plugins drawn in the chart (the biggest spenders; the table lists all)
CHART_PLUGINS = 8


@dataclass(frozen=True)
class Source:
    """The logs the page reads (one per replica) and the home whose limits store says the budgets
    (None: a log copy, no budgets)."""

    replicas: tuple[Replica, ...]
    home: Path | None = None

    @property
    def several(self) -> bool:
        return len(self.replicas) > 1


@dataclass(frozen=True)
class Filters:
    """A listing's filters, as :func:`audit.reader.iter_records` takes them (already checked)."""

    plugin: str | None = None
    status: str | None = None
    decision: str | None = None
    since: Any = None
    until: Any = None
    replica: str | None = None

    def reader_args(self) -> dict[str, Any]:
        return {"plugin": self.plugin, "status": self.status, "decision": self.decision, "since": self.since,
                "until": self.until}


@dataclass
class Overview:
    rows: list[Any]  #: audit.summary.StatsRow per plugin
    daily: dict[str, dict[str, float]]  #: day (YYYY-MM-DD) -> plugin -> USD
    denials: list[tuple[str, str, str, int]]  #: (plugin, rule, config key, count), most first
    budgets: dict[str, Any] = field(default_factory=dict)
    budget_errors: dict[str, str] = field(default_factory=dict)
    budget_note: str | None = None
    bad_lines: int = 0
    per_replica: dict[str, int] = field(default_factory=dict)  #: call records per replica


def _streams(source: Source, filters: Filters, include_events: bool, bad: Any) -> Iterator[dict[str, Any]]:
    chosen = [r for r in source.replicas if filters.replica in (None, r.name)]
    return merge_records((r.name, _present(iter_records(r.log, include_events=include_events, on_bad_line=bad,
                                                        **filters.reader_args()))) for r in chosen)


def _present(records: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The records, or none while the log does not exist yet (the chain view says so)."""
    try:
        yield from records
    except AuditLogNotFoundError:
        return


class _Bad:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, path: Path, line: int, reason: str) -> None:
        self.count += 1


def _cost(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_COST_USD:
        return float(value)
    return 0.0


def overview(source: Source) -> Overview:
    """Calls, denials and spend per plugin, spend per day, denials per rule and key; budgets from the store."""
    bad = _Bad()
    daily: dict[str, dict[str, float]] = {}
    denials: collections.Counter[tuple[str, str, str]] = collections.Counter()

    per_replica = {r.name: 0 for r in source.replicas}

    def watched(records: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for record in records:
            per_replica[record[REPLICA]] += 1
            plugin = record.get(PLUGIN_ID)
            plugin = plugin if isinstance(plugin, str) and plugin else "-"
            if is_denied(record):
                rule = record.get(DECISION_REASON) or record.get(LIMITS_LIMIT) or record.get("status") or "-"
                key = record.get(DECISION_KEY) or record.get(LIMITS_LIMIT) or "-"
                entry = (plugin, str(rule)[:300], str(key)[:300])
                if entry in denials or len(denials) < MAX_KEYS:
                    denials[entry] += 1
                else:
                    denials[(plugin, "(other rules)", "-")] += 1
            cost = _cost(record.get(COST_USD))
            ts = record.get(TS)
            if cost and isinstance(ts, str) and len(ts) >= 10:
                day = daily.setdefault(ts[:10], {})
                day[plugin] = day.get(plugin, 0.0) + cost
                if len(daily) > MAX_DAYS:
                    del daily[min(daily)]
            yield record

    rows = [r for r in stats(watched(_streams(source, Filters(), False, bad))) if r.dimension == "plugin"]
    result = Overview(rows, dict(sorted(daily.items())),
                      [(p, r, k, n) for (p, r, k), n in denials.most_common()], bad_lines=bad.count,
                      per_replica=per_replica)
    if source.home is not None:
        try:
            result.budgets, result.budget_errors, result.budget_note = budgets_for(source.home, [r.key for r in rows])
        except Exception as exc:  # noqa: BLE001 - the log's view never fails for the budget view
            result.budget_note = f"spend against budget unavailable ({type(exc).__name__})"
    return result


def chart_series(view: Overview) -> dict[str, Any]:
    """The chart's data: days (Unix seconds, UTC midnight) and per plugin its spend each day."""
    from datetime import datetime, timezone

    days = list(view.daily)
    totals: collections.Counter[str] = collections.Counter()
    for spend in view.daily.values():
        totals.update(spend)
    plugins = [p for p, _ in totals.most_common(CHART_PLUGINS)]
    x = [int(datetime.strptime(d, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()) for d in days
         if _is_day(d)]
    kept = [d for d in days if _is_day(d)]
    return {"x": x, "series": [{"plugin": p, "usd": [round(view.daily[d].get(p, 0.0), 6) for d in kept]}
                               for p in plugins]}


def _is_day(text: str) -> bool:
    from datetime import datetime

    try:
        datetime.strptime(text, "%Y-%m-%d")
    except ValueError:
        return False
    return True


def records_page(source: Source, filters: Filters, page: int, size: int = PAGE_SIZE) -> tuple[list[dict[str, Any]], bool]:
    """Page ``page`` (1: the newest) of the matching call records, newest first, and whether older ones exist."""
    page = max(1, min(page, MAX_ROWS // size))
    keep = page * size
    window: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep + 1)
    for record in _streams(source, filters, False, _Bad()):
        window.append(record)
    newest = list(reversed(window))
    return newest[(page - 1) * size: keep], len(window) > keep


def find_record(source: Source, replica: str, seq: int) -> dict[str, Any] | None:
    """The record ``seq`` of ``replica`` (events included), or None."""
    chosen = next((r for r in source.replicas if r.name == replica), None)
    if chosen is None:
        return None
    for record in _present(iter_records(chosen.log, include_events=True)):
        value = record.get(SEQ)
        if value == seq and not isinstance(value, bool):
            record[REPLICA] = chosen.name
            return record
    return None


@dataclass
class ChainState:
    replica: Replica
    result: Any  #: audit.verifier.VerifyResult, or None with ``error``
    pubkey: str | None
    error: str | None = None


_CACHE: dict[tuple[Any, ...], ChainState] = {}
_CACHE_LOCK = threading.Lock()


def _stamp(replica: Replica) -> tuple[Any, ...]:
    """What changes when the log, its checkpoints or its keys change (size, time, inode of each file)."""
    out: list[Any] = [str(replica.log), str(replica.pubkey)]
    for path in [*list_log_files(replica.log), checkpoints_path(replica.log), replica.pubkey]:
        try:
            st = os.stat(path) if path is not None else None
        except OSError:
            st = None
        out.append(None if st is None else (st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def chain_state(replica: Replica) -> ChainState:
    """``audit verify`` of one replica's chain (with its public keys when known), cached until a file changes."""
    stamp = _stamp(replica)
    with _CACHE_LOCK:
        cached = _CACHE.get(stamp)
    if cached is not None:
        return cached
    pubkey = None if replica.pubkey is None else str(replica.pubkey)
    try:
        pubkeys, retirements = read_keyring(replica.pubkey) if replica.pubkey is not None else (None, [])
        state = ChainState(replica, verify(replica.log, pubkeys=pubkeys, retirements=retirements), pubkey)
    except AuditLogNotFoundError:
        state = ChainState(replica, None, pubkey, "no audit log yet")
    except (AuditKeyError, OSError) as exc:
        state = ChainState(replica, None, pubkey, f"cannot verify: {exc}")
    with _CACHE_LOCK:
        if len(_CACHE) > 64:
            _CACHE.clear()
        _CACHE[stamp] = state
    return state


def chain_states(source: Source) -> list[ChainState]:
    return [chain_state(r) for r in source.replicas]


def source_for(paths: Sequence[str | os.PathLike[str]], pubkeys: Sequence[str | os.PathLike[str]] = (),
               home: Path | None = None) -> Source:
    return Source(tuple(replicas(paths, pubkeys)), home)
