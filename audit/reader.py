"""Reading the audit log: filtered streaming, tail, follow, time parsing.

Everything streams over ``agent.log.N`` .. ``agent.log.1``, ``agent.log``
(oldest first) from a consistent snapshot (see :mod:`audit.logfiles`), one
line in memory at a time.

Hostile lines never crash a reader and never get a meaning picked for them: a
line longer than :data:`audit.chain.MAX_LINE_BYTES`, nested deeper than
:data:`audit.chain.MAX_DEPTH`, holding a duplicate key, or not JSON is skipped
and reported to ``on_bad_line(path, line_number, reason)`` (the CLI counts them
and points at ``verify``, which judges them). ``verify`` and ``stats`` live in their own modules
and are re-exported here, so ``audit.reader`` offers every read.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from audit.chain import MAX_LINE_BYTES, LineError, loads_line
from audit.errors import AuditLogNotFoundError
from audit.logfiles import iter_lines, iter_lines_reverse, open_log_file, resolve_log_path, snapshot
from audit.records import PLUGIN_ID, PURPOSE, REQUEST_MODEL, RESPONSE_MODEL, STATUS, TS, is_call_record, is_denied
from audit.summary import StatsRow, percentile, stats
from audit.verifier import VerifyProblem, VerifyResult, verify

__all__ = [
    "iter_records",
    "parse_line",
    "parse_time",
    "record_time",
    "tail_records",
    "follow_records",
    "TailCursor",
    "verify",
    "VerifyResult",
    "VerifyProblem",
    "stats",
    "StatsRow",
    "percentile",
]

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# the writer's own timestamp format: fixed width, UTC, so it compares as text
_OWN_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")
_OWN_TS_BYTES = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")
_GLOB = re.compile(r"[*?\[]")

BadLineHandler = Callable[[Path, int, str], None]
_TOO_LONG = f"longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB"
_TIME_SHOWN = 40  # characters of a rejected time echoed back
_FOLLOW_READ = 1 << 20  # follow reads what was appended a MiB at a time


def parse_line(raw: bytes) -> Any:
    """One log line (bytes, with or without its newline) as JSON.

    Raises :class:`audit.chain.LineError` (a ``ValueError``) for a line that is
    too long, nested too deep or holds a duplicate key, ``ValueError`` when it
    is not exactly one JSON value.
    """
    return loads_line(raw)


def _bad_reason(exc: ValueError) -> str:
    if isinstance(exc, LineError):
        return exc.reason
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 (torn or edited line)"
    return "not JSON (torn or edited line)"


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """An aware datetime from ISO 8601 (``2025-01-31``, ``2025-01-31T12:00:00Z``) or a
    relative time before ``now`` (``90s``, ``15m``, ``1h``, ``7d``, ``2w``; ``now``).

    ISO times without an offset are local time, as an operator typing them means.
    """
    now = now or datetime.now(timezone.utc)
    if now.tzinfo is None:
        now = now.astimezone()
    value = str(text).strip()
    shown = value if len(value) <= _TIME_SHOWN else value[:_TIME_SHOWN] + "..."
    if value.lower() == "now":
        return now
    match = _RELATIVE.match(value)
    try:
        if match:
            moment = now - timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()])
        else:
            try:
                parsed = datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(
                    f"cannot read the time {shown!r}: use ISO 8601 (2025-01-31 or 2025-01-31T12:00:00Z) "
                    f"or a relative time such as 90s, 15m, 1h, 7d"
                ) from None
            moment = parsed if parsed.tzinfo is not None else parsed.astimezone()
        moment.astimezone(timezone.utc)  # every comparison is made in UTC: it must exist there
    except (OverflowError, OSError):  # beyond year 1..9999 (OSError: the C library's localtime)
        raise ValueError(
            f"the time {shown!r} is out of range: use a time between years 1 and 9999, "
            f"e.g. 2025-01-31 or a relative time such as 90s, 15m, 1h, 7d"
        ) from None
    return moment


def record_time(record: dict[str, Any]) -> datetime | None:
    """The record's ``ts`` as an aware datetime, or None when missing/unreadable."""
    value = record.get(TS)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)


def _own_ts(moment: datetime) -> str:
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _as_set(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    else:
        items = [str(v).strip() for v in value]
    items = [v for v in items if v]
    return tuple(items) or None


def _needle(value: str) -> bytes:
    """Bytes a matching line must contain (the JSON string as the writer renders it)."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def _model_needle(pattern: str) -> bytes:
    """For a glob, the opening quote and literal prefix the JSON string must start with."""
    match = _GLOB.search(pattern)
    if match is None:
        return _needle(pattern)
    return _needle(pattern[: match.start()])[:-1]  # drop the closing quote


_TS_KEY = b'"ts":"'


class _Filter:
    """The query's predicates, with what can be precomputed precomputed."""

    def __init__(
        self,
        plugins: tuple[str, ...] | None,
        statuses: tuple[str, ...] | None,
        models: tuple[str, ...] | None,
        purpose: str | None,
        since: datetime | None,
        until: datetime | None,
        include_events: bool,
        decisions: tuple[str, ...] | None = None,
    ) -> None:
        self.plugins, self.statuses, self.models = plugins, statuses, models
        self.decisions = decisions
        self.purpose, self.since, self.until = purpose, since, until
        self.include_events = include_events
        self.timed = since is not None or until is not None
        # the writer's timestamps compare as text: no datetime per record
        self.since_text = _own_ts(since) if since is not None else None
        self.until_text = _own_ts(until) if until is not None else None
        self.globs = bool(models) and any(_GLOB.search(m) for m in models)  # type: ignore[union-attr]

    def prefilter(self) -> list[tuple[bytes, ...]]:
        """Groups of byte strings; a line lacking every needle of some group cannot match.

        This lets a selective query skip JSON parsing for most lines. It is
        sound for lines as the writer renders them (plain JSON string escapes).
        """
        groups: list[tuple[bytes, ...]] = []
        for values in (self.plugins, self.statuses):
            if values:
                groups.append(tuple(_needle(v) for v in values))
        if self.models:
            groups.append(tuple(_model_needle(m) for m in self.models))
        return groups

    def time_verdict(self, raw: bytes) -> bool | None:
        """From the raw line: True in range, False out of range, None when it takes a parse.

        Decided on the writer's own fixed-width UTC ``ts`` (``"ts":"...Z"``,
        once in the line); any other form is left to the parsed record.
        """
        i = raw.find(_TS_KEY)
        if i < 1 or raw.rfind(_TS_KEY) != i or raw[i - 1] not in b",{" or raw[i + 30 : i + 31] != b'"':
            return None
        ts = raw[i + 6 : i + 30]
        if not _OWN_TS_BYTES.match(ts):
            return None
        text = ts.decode("ascii")
        return not ((self.since_text is not None and text < self.since_text)
                    or (self.until_text is not None and text > self.until_text))

    def matches(self, record: dict[str, Any], time_checked: bool = False) -> bool:
        if not self.include_events and not is_call_record(record):
            return False
        if self.plugins and record.get(PLUGIN_ID) not in self.plugins:
            return False
        if self.statuses and record.get(STATUS) not in self.statuses:
            return False
        if self.decisions and (not is_call_record(record)
                               or ("denied" if is_denied(record) else "allowed") not in self.decisions):
            return False
        if self.models:
            names = [m for m in (record.get(REQUEST_MODEL), record.get(RESPONSE_MODEL)) if isinstance(m, str)]
            if self.globs:
                if not any(fnmatch.fnmatchcase(n, pat) for n in names for pat in self.models):
                    return False
            elif not any(n in self.models for n in names):
                return False
        if self.purpose is not None:
            purpose = record.get(PURPOSE)
            if not isinstance(purpose, str) or self.purpose not in purpose.casefold():
                return False
        if self.timed and not time_checked and not self._in_range(record):
            return False
        return True

    def _in_range(self, record: dict[str, Any]) -> bool:
        ts = record.get(TS)
        if isinstance(ts, str) and _OWN_TS.match(ts):  # fast: compare as text
            if self.since_text is not None and ts < self.since_text:
                return False
            if self.until_text is not None and ts > self.until_text:
                return False
            return True
        moment = record_time(record)
        if moment is None:
            return False
        return (self.since is None or moment >= self.since) and (self.until is None or moment <= self.until)


def _time_arg(value: str | datetime | None, now: datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value.astimezone() if isinstance(value, datetime) and value.tzinfo is None else value
    return parse_time(value, now)


def iter_records(
    path_or_home: str | os.PathLike[str],
    *,
    plugin: str | Iterable[str] | None = None,
    status: str | Iterable[str] | None = None,
    model: str | Iterable[str] | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    purpose: str | None = None,
    include_events: bool = False,
    on_bad_line: BadLineHandler | None = None,
    now: datetime | None = None,
    decision: str | Iterable[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Records matching every given filter, oldest first, in constant memory.

    ``plugin``/``status``/``model`` take one value, a comma-separated string or
    an iterable (any may match); ``model`` matches the requested or the
    reported model and accepts globs (``gpt-4o*``); ``purpose`` is a
    case-insensitive substring; ``since``/``until`` are inclusive (datetime,
    ISO text or relative like ``1h``); ``decision`` is ``allowed`` or ``denied`` (a refusal by the
    trust gate or a limit: :func:`audit.records.is_denied`). Operational events are included only
    with ``include_events``. Lines that cannot be read (not JSON, too long, too
    deep, a duplicate key, not an object) are skipped and passed to
    ``on_bad_line(path, line_number, reason)``; use :func:`verify` to judge them.
    Raises :class:`AuditLogNotFoundError` when there is no log.
    """
    flt = _Filter(
        plugins=_as_set(plugin),
        statuses=_as_set(status),
        models=_as_set(model),
        purpose=purpose.casefold() if purpose else None,
        since=_time_arg(since, now),
        until=_time_arg(until, now),
        include_events=include_events,
        decisions=_as_set(decision),
    )
    log_path = resolve_log_path(path_or_home)
    groups = flt.prefilter()
    timed = flt.timed
    with snapshot(log_path) as snaps:
        if not snaps:
            raise AuditLogNotFoundError(log_path)
        for snap in snaps:
            for number, _offset, raw in iter_lines(snap):
                if raw is None:
                    if on_bad_line is not None:
                        on_bad_line(snap.path, number, _TOO_LONG)
                    continue
                if groups and not all(any(n in raw for n in group) for group in groups):
                    continue
                in_range = flt.time_verdict(raw) if timed else None
                if in_range is False:
                    continue
                try:
                    record = loads_line(raw)
                except ValueError as exc:  # LineError and UnicodeDecodeError are ValueErrors too
                    if on_bad_line is not None:
                        on_bad_line(snap.path, number, _bad_reason(exc))
                    continue
                if not isinstance(record, dict):
                    if on_bad_line is not None:
                        on_bad_line(snap.path, number, "not a JSON object")
                    continue
                if flt.matches(record, time_checked=in_range is True):
                    yield record


@dataclass(frozen=True)
class TailCursor:
    """Where :func:`follow_records` continues: the active file's identity and size."""

    path: Path
    inode: int
    offset: int


def tail_records(
    path_or_home: str | os.PathLike[str],
    n: int = 10,
    *,
    include_events: bool = True,
    on_bad_line: BadLineHandler | None = None,
) -> tuple[list[dict[str, Any]], TailCursor]:
    """The last ``n`` records (oldest first) read backwards from the end, and a cursor to follow on.

    Unreadable lines met on the way are skipped and passed to
    ``on_bad_line(path, 0, reason)`` (0: counting lines backwards has no line number).
    """
    log_path = resolve_log_path(path_or_home)
    found: list[dict[str, Any]] = []
    with snapshot(log_path) as snaps:
        if not snaps:
            raise AuditLogNotFoundError(log_path)
        newest = snaps[-1]
        cursor = TailCursor(log_path, os.fstat(newest.file.fileno()).st_ino if newest.path == log_path else -1, newest.size)
        for snap in reversed(snaps):
            if len(found) >= n:
                break
            for _offset, line in iter_lines_reverse(snap.file.fileno(), snap.size, limit=MAX_LINE_BYTES):
                if not line:
                    if line is None and on_bad_line is not None:
                        on_bad_line(snap.path, 0, _TOO_LONG)
                    continue
                record = _loads_or_none(line, snap.path, on_bad_line)
                if record is not None and (include_events or is_call_record(record)):
                    found.append(record)
                    if len(found) >= n:
                        break
    found.reverse()
    return found, cursor


def follow_records(
    cursor: TailCursor,
    *,
    include_events: bool = True,
    poll_interval: float = 0.25,
    max_wait: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_bad_line: BadLineHandler | None = None,
) -> Iterator[dict[str, Any]]:
    """Records appended after ``cursor``, as they arrive, across rotations.

    Polls every ``poll_interval`` seconds; stops after ``max_wait`` seconds
    (None: until the consumer stops iterating, e.g. on Ctrl-C). Unreadable
    lines go to ``on_bad_line(path, 0, reason)``; a line growing past
    :data:`audit.chain.MAX_LINE_BYTES` is dropped up to its newline, never buffered whole.
    """
    deadline = None if max_wait is None else time.monotonic() + max_wait
    path = cursor.path
    f = None
    buf = b""
    dropping = False  # inside a line already reported as too long: skip to its newline

    def emit(lines: Iterable[bytes | None]) -> Iterator[dict[str, Any]]:
        for line in lines:
            if line is None and on_bad_line is not None:
                on_bad_line(path, 0, _TOO_LONG)
            record = _loads_or_none(line, path, on_bad_line) if line else None
            if record is not None and (include_events or is_call_record(record)):
                yield record

    try:
        try:
            f = open_log_file(path)
            if os.fstat(f.fileno()).st_ino == cursor.inode:
                f.seek(cursor.offset)
        except FileNotFoundError:
            f = None
        while True:
            chunk = f.read(_FOLLOW_READ) if f is not None else b""
            switch = False
            if not chunk:  # nothing new: was the file rotated away (or created)?
                try:
                    inode: int | None = os.stat(path).st_ino
                except FileNotFoundError:
                    inode = None
                if inode is not None and (f is None or inode != os.fstat(f.fileno()).st_ino):
                    switch = True
                    if f is not None:
                        chunk = f.read(_FOLLOW_READ)  # lines written just before the rotation
                        switch = not chunk  # drain the old file first, then switch
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                if dropping and lines:
                    lines[0], dropping = b"", False  # the end of the over-long line
                yield from emit(lines)
                if dropping:
                    buf = b""
                elif len(buf) > MAX_LINE_BYTES:
                    if on_bad_line is not None:
                        on_bad_line(path, 0, _TOO_LONG)
                    buf, dropping = b"", True
            if switch:
                if f is not None:
                    # several rotations between two polls: read the backups newer than our file
                    yield from emit(_rotated_after(path, os.fstat(f.fileno()).st_ino))
                    f.close()
                    f = None
                buf, dropping = b"", False
                try:
                    f = open_log_file(path)
                except FileNotFoundError:
                    f = None
                continue
            if not chunk:
                if deadline is not None and time.monotonic() >= deadline:
                    return
                sleep(poll_interval)
    finally:
        if f is not None:
            f.close()


def _loads_or_none(line: bytes, path: Path, on_bad_line: BadLineHandler | None) -> dict[str, Any] | None:
    try:
        record = loads_line(line)
    except ValueError as exc:
        if on_bad_line is not None:
            on_bad_line(path, 0, _bad_reason(exc))
        return None
    if not isinstance(record, dict):
        if on_bad_line is not None:
            on_bad_line(path, 0, "not a JSON object")
        return None
    return record


def _rotated_after(log_path: Path, inode: int) -> Iterator[bytes | None]:
    """Lines of the backups newer than the file with ``inode``, oldest first (None: too long)."""
    with snapshot(log_path) as snaps:
        inodes = [os.fstat(s.file.fileno()).st_ino for s in snaps]
        if inode not in inodes:
            return  # our file was dropped by retention: nothing to bridge
        for snap in snaps[inodes.index(inode) + 1 :]:
            if snap.path != log_path:
                for _number, _offset, raw in iter_lines(snap):
                    yield raw.rstrip(b"\n") if raw is not None else None
