"""``verify``: walk every file of the log and report the first break in the chain.

Checks, line by line, oldest file first:

- ``bad_json``   the line is not JSON (and is not a recovered torn line);
- ``oversized``  the line is longer than :data:`audit.chain.MAX_LINE_BYTES` or
                 nests deeper than :data:`audit.chain.MAX_DEPTH` (judged before
                 parsing: a hostile line cannot exhaust memory or the stack);
- ``duplicate_key`` an object holds the same key twice (parsers disagree on
                 which value wins, so the line has no single meaning);
- ``torn``       the line is an incomplete record (a crash during a write) that
                 no ``chain_resumed`` event accounts for;
- ``not_a_record`` JSON without valid ``seq``/``prev_hash``/``hash``;
- ``edited``     ``hash`` differs from the SHA-256 of the record's canonical form;
- ``not_canonical`` the content matches its hash, but the bytes are not the
                 writer's rendering of it (re-encoded: spacing, escapes, key
                 order, number forms). The writer's lines are canonical JSON with
                 ``hash`` last, so a line is only accepted byte for byte;
- ``broken_link`` ``prev_hash`` is not the previous record's ``hash``;
- ``seq_gap``    ``seq`` jumps forward (records missing);
- ``seq_order``  ``seq`` goes back or repeats, or two records were swapped;
- ``history_start`` the oldest retained record is not seq 1 (see below);
- ``anchor``     (with ``anchor=``) the record at the anchored ``seq`` has another
                 hash, or is not in the log at all (truncated, pruned or deleted).

A torn line is only a *warning* when the writer recorded its recovery: the
next record is a ``chain_resumed`` event whose ``torn_offset``,
``torn_bytes`` and ``torn_sha256`` describe exactly those bytes.

The start of the chain: the chain continues across the rotated files
(``agent.log.N`` .. ``agent.log.1``, ``agent.log``), so only the oldest
retained record can lack a predecessor, and it must be seq 1 with the
genesis ``prev_hash``. Rotation with ``audit.backup_count`` deletes the oldest
file and leaves no trace in the files that remain, so a log whose head was
pruned by retention cannot be told from one whose first lines were deleted:
both fail with ``history_start`` unless the caller says pruning is expected
(``allow_pruned_head=True``, ``--allow-pruned-head``); then it is a warning.
The detail says whether rotated files were present (with none, nothing was
ever pruned unless ``backup_count`` is 0).

Speed: by default a line in the writer's layout is checked with one SHA-256
over its bytes (:func:`audit.chain.fast_fields`): its hash covers exactly the
bytes on disk, so nothing can be injected into it without recomputing that
hash -- which breaks the next line's link (or, for the last line, the
``--anchor``). Any other line is parsed (bounded, duplicate keys refused) and
must re-render to the same bytes, and so must the last record (the one line
whose hash no other line repeats). ``strict`` parses *every* line that way,
which also catches a forger who recomputed the chain from an earlier line on
but did not render like the writer (re-encoded bytes, duplicate keys).

Without an external anchor, removing records from the *end* of the newest
file cannot be told from a log that simply ends there: keep the ``head`` that
``verify`` prints and pass it back with ``--anchor``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from audit.chain import (
    GENESIS_HASH,
    MAX_LINE_BYTES,
    LineError,
    LineFields,
    fast_fields,
    line_verdict,
    loads_line,
    parse_fields,
)
from audit.errors import AuditLogNotFoundError
from audit.logfiles import resolve_log_path, skip_line, snapshot
from audit.records import EVENT, EVENT_CHAIN_RESUMED

__all__ = ["VerifyProblem", "VerifyResult", "verify", "PROBLEM_KINDS"]

PROBLEM_KINDS = (
    "bad_json", "oversized", "duplicate_key", "torn", "not_a_record", "edited", "not_canonical",
    "broken_link", "seq_gap", "seq_order", "history_start", "anchor",
)
_RESUMED_NEEDLE = b'"' + EVENT_CHAIN_RESUMED.encode() + b'"'
_MAX_PENDING_BYTES = 16 * 1024 * 1024
_TOO_LONG = f"longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB"


@dataclass(frozen=True)
class VerifyProblem:
    """Where and what: ``file`` is the path, ``line`` 1-based within that file."""

    file: str
    line: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.kind}: {self.detail}"


@dataclass
class VerifyResult:
    """Outcome of :func:`verify`; ``ok`` is True only when the chain is whole."""

    ok: bool
    records: int
    files: list[str]
    first_error: VerifyProblem | None = None
    warnings: list[VerifyProblem] = field(default_factory=list)
    head_seq: int | None = None
    head_hash: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "records": self.records,
            "files": self.files,
            "first_error": None if self.first_error is None else self.first_error.__dict__,
            "warnings": [w.__dict__ for w in self.warnings],
            "head": None if self.head_seq is None else {"seq": self.head_seq, "hash": self.head_hash},
        }


@dataclass
class _Bad:
    line: int
    offset: int
    raw: bytes
    kind: str
    detail: str


class _Stop(Exception):
    def __init__(self, problem: VerifyProblem) -> None:
        self.problem = problem


def _bad_kind(body: bytes, has_newline: bool, exc: ValueError) -> tuple[str, str]:
    if not has_newline:
        return "torn", "incomplete last line (a crash or a full disk during a write?)"
    if isinstance(exc, LineError):
        return exc.kind, exc.reason
    pos = getattr(exc, "pos", 0) or 0
    # a prefix of a record: the parser ran out of input (inside a string, or at the end)
    msg = getattr(exc, "msg", "")
    if body.startswith(b"{") and (msg.startswith("Unterminated string") or pos >= len(body.decode("utf-8", "replace")) - 1):
        return "torn", "incomplete record"
    return "bad_json", f"not valid JSON ({exc.__class__.__name__}: {str(exc)[:80]})"


def _history_start(name: str, number: int, seq: int, rotated: bool) -> str:
    if rotated:
        return (f"the oldest retained record is seq {seq}, not seq 1: records 1..{seq - 1} were pruned by "
                f"rotation (audit.backup_count) or deleted, which the remaining files cannot tell apart; "
                f"if retention is expected to drop old files, re-run with --allow-pruned-head")
    return (f"the log was never rotated (no {name}.N beside it), so it must start at seq 1 from the genesis "
            f"hash, but it starts at seq {seq}: records 1..{seq - 1} were removed; only if audit.backup_count "
            f"is 0 (rotation discards the old file) is that expected: then re-run with --allow-pruned-head")


def _covers(event: dict[str, Any], pending: list[_Bad], event_offset: int) -> bool:
    """Does this chain_resumed event describe exactly the pending unreadable bytes?"""
    start = pending[0].offset
    region = b"".join(b.raw for b in pending)
    torn_offset, torn_bytes, torn_sha = event.get("torn_offset"), event.get("torn_bytes"), event.get("torn_sha256")
    if torn_offset != start or start + len(region) != event_offset or not isinstance(torn_bytes, int):
        return False
    # the writer adds "\n" after torn bytes that lacked one; torn_bytes excludes it
    if torn_bytes not in (len(region), len(region) - 1):
        return False
    return hashlib.sha256(region[:torn_bytes]).hexdigest() == torn_sha


def _check_head(name: str, number: int, body: bytes) -> None:
    """The last record in full, as ``strict`` checks every line.

    Its hash is no other line's ``prev_hash``, so it is the one line a forger can
    rewrite and re-hash without touching the rest of the chain.
    """
    try:
        record = loads_line(body)
    except ValueError as exc:
        kind, detail = _bad_kind(body, True, exc)
        raise _Stop(VerifyProblem(name, number, kind, detail)) from None
    fields = parse_fields(record)
    if fields is None:
        raise _Stop(VerifyProblem(name, number, "not_a_record", "JSON line without valid seq, prev_hash and hash"))
    if line_verdict(body, record, fields.hash) != "ok":
        raise _Stop(VerifyProblem(name, number, "not_canonical", (
            f"seq {fields.seq}: its hash covers these bytes, but they are not the writer's rendering of "
            f"their content (the last record rewritten by another tool, with a recomputed hash?)")))


def verify(
    path_or_home: str | os.PathLike[str],
    *,
    strict: bool = False,
    anchor: tuple[int, str] | None = None,
    allow_pruned_head: bool = False,
) -> VerifyResult:
    """Check the whole chain; see the module docstring for what is reported.

    By default a line is checked with one SHA-256 over its bytes as written
    (the writer's lines are canonical JSON plus the hash), falling back to
    parsing and re-rendering; ``strict`` always parses. ``anchor`` is a
    ``(seq, hash)`` recorded earlier: it must still be in the log.
    ``allow_pruned_head`` accepts a log whose oldest record is not seq 1 (old
    files dropped by retention) with a ``history_start`` warning.
    Raises :class:`AuditLogNotFoundError` when there is no log, ``OSError``
    when a log file cannot be read or is not a regular file.
    """
    log_path = resolve_log_path(path_or_home)
    result = VerifyResult(ok=False, records=0, files=[])
    prev: LineFields | None = None
    first_seq: int | None = None
    pending: list[_Bad] = []
    pending_bytes = 0
    gap: VerifyProblem | None = None  # seq jumped: the next record tells a gap from a swap
    anchor_seen = False
    head: tuple[str, int, bytes] | None = None  # the last record, if only its hash was checked
    limit = MAX_LINE_BYTES + 1  # the line and its newline
    try:
        with snapshot(log_path) as snaps:
            if not snaps:
                raise AuditLogNotFoundError(log_path)
            rotated = len(snaps) > 1 or snaps[0].path != log_path
            for snap in snaps:
                name = str(snap.path)
                result.files.append(name)
                f, size = snap.file, snap.size
                f.seek(0)
                readline = f.readline
                offset = number = 0
                while offset < size:  # iter_lines(), inlined: this loop runs a million times
                    raw = readline(limit)
                    if not raw:
                        break
                    number += 1
                    line_offset = offset
                    if len(raw) == limit and raw[-1] != 10:  # over-long: never held whole
                        offset += len(raw) + skip_line(f)
                        pending.append(_Bad(number, line_offset, b"", "oversized", _TOO_LONG))
                        pending_bytes = _MAX_PENDING_BYTES + 1  # its bytes are not kept: nothing can cover them
                        continue
                    if offset + len(raw) > size:
                        raw = raw[: size - offset]
                    offset += len(raw)
                    has_newline = raw.endswith(b"\n")
                    body = raw[:-1] if has_newline else raw
                    record: Any = None
                    checked = False
                    fields = None if strict else fast_fields(body)
                    if fields is None or _RESUMED_NEEDLE in body:
                        try:
                            record = loads_line(body)
                        except ValueError as exc:  # LineError, UnicodeDecodeError too
                            kind, detail = _bad_kind(body, has_newline, exc)
                            pending_bytes += len(raw)
                            pending.append(_Bad(number, line_offset, raw if pending_bytes <= _MAX_PENDING_BYTES else b"", kind, detail))
                            continue
                    if fields is None:
                        checked = True
                        fields = parse_fields(record)
                        if fields is None:
                            raise _Stop(VerifyProblem(name, number, "not_a_record", "JSON line without valid seq, prev_hash and hash"))
                        verdict = line_verdict(body, record, fields.hash)
                        if verdict == "edited" and strict and fast_fields(body) is not None:
                            raise _Stop(VerifyProblem(name, number, "not_canonical", (
                                f"seq {fields.seq}: its hash covers these bytes, but they are not the writer's "
                                f"rendering of their content (written by another tool, with a recomputed hash?)")))
                        if verdict == "edited":
                            raise _Stop(VerifyProblem(name, number, "edited", f"seq {fields.seq}: content does not match its hash"))
                        if verdict == "not_canonical":
                            raise _Stop(VerifyProblem(name, number, "not_canonical", (
                                f"seq {fields.seq}: the content matches its hash, but the line is not byte for byte "
                                f"the writer's rendering (re-encoded: spacing, escapes, key order or number forms)")))
                    if pending:
                        resumed = isinstance(record, dict) and record.get(EVENT) == EVENT_CHAIN_RESUMED
                        if resumed and _covers(record, pending, line_offset):
                            for bad in pending:
                                result.warnings.append(VerifyProblem(
                                    name, bad.line, "torn",
                                    f"{bad.detail}; recovered by chain_resumed at line {number}",
                                ))
                            pending, pending_bytes = [], 0
                        else:
                            bad = pending[0]
                            raise _Stop(VerifyProblem(name, bad.line, bad.kind, bad.detail))
                    if not has_newline:
                        result.warnings.append(VerifyProblem(name, number, "torn", "last record lacks its final newline"))
                    # -- the chain itself --
                    if gap is not None:
                        if prev is not None and fields.seq == prev.seq + 1:
                            raise _Stop(VerifyProblem(gap.file, gap.line, "seq_order", gap.detail + "; records are out of order"))
                        raise _Stop(gap)
                    if prev is None:
                        first_seq = fields.seq
                        if fields.seq == 1 and fields.prev_hash != GENESIS_HASH:
                            raise _Stop(VerifyProblem(name, number, "broken_link", "seq 1 does not start from the genesis hash"))
                        if fields.seq > 1:
                            problem = VerifyProblem(name, number, "history_start",
                                                    _history_start(str(log_path), number, fields.seq, rotated))
                            if not allow_pruned_head:
                                raise _Stop(problem)
                            result.warnings.append(VerifyProblem(
                                name, number, "history_start",
                                f"the retained log starts at seq {fields.seq} (older records pruned by retention, "
                                f"accepted by --allow-pruned-head); its prev_hash cannot be checked",
                            ))
                    elif fields.seq == prev.seq + 1:
                        if fields.prev_hash != prev.hash:
                            raise _Stop(VerifyProblem(name, number, "broken_link", f"seq {fields.seq}: prev_hash does not match the hash of seq {prev.seq}"))
                    elif fields.seq <= prev.seq:
                        raise _Stop(VerifyProblem(name, number, "seq_order", f"seq {fields.seq} after seq {prev.seq}"))
                    else:
                        gap = VerifyProblem(name, number, "seq_gap", f"seq {fields.seq} follows seq {prev.seq} (seq {prev.seq + 1} missing)")
                        continue
                    if anchor is not None and fields.seq == anchor[0]:
                        anchor_seen = True
                        if fields.hash != anchor[1]:
                            raise _Stop(VerifyProblem(name, number, "anchor", f"seq {fields.seq} has hash {fields.hash}, the anchor says {anchor[1]}"))
                    prev = fields
                    head = None if checked else (name, number, body)
                    result.records += 1
                if pending:
                    bad = pending[0]
                    raise _Stop(VerifyProblem(name, bad.line, bad.kind, bad.detail))
            if gap is not None:
                raise _Stop(gap)
            if head is not None:
                _check_head(*head)
            if anchor is not None and not anchor_seen:
                if prev is None or prev.seq < anchor[0]:
                    last = result.files[-1]
                    raise _Stop(VerifyProblem(last, 0, "anchor", f"the log ends at seq {prev.seq if prev else 0} but the anchor names seq {anchor[0]} (truncated?)"))
                raise _Stop(VerifyProblem(result.files[0], 0, "anchor", (
                    f"the anchored record seq {anchor[0]} is not in the log, which starts at seq {first_seq}: "
                    f"it was pruned by retention or deleted; an anchor must name a record that is still "
                    f"retained (keep a newer head from verify)")))
    except _Stop as stop:
        result.first_error = stop.problem
    else:
        result.ok = True
    if prev is not None:
        result.head_seq, result.head_hash = prev.seq, prev.hash
    return result
