"""``verify``: walk every file of the log and report the first break in the chain.

Checks, line by line, oldest file first:

- ``bad_json``   the line is not JSON (and is not a recovered torn line);
- ``torn``       the line is an incomplete record (a crash during a write) that
                 no ``chain_resumed`` event accounts for;
- ``not_a_record`` JSON without valid ``seq``/``prev_hash``/``hash``;
- ``edited``     ``hash`` differs from the SHA-256 of the record's canonical form;
- ``broken_link`` ``prev_hash`` is not the previous record's ``hash``;
- ``seq_gap``    ``seq`` jumps forward (records missing);
- ``seq_order``  ``seq`` goes back or repeats, or two records were swapped;
- ``anchor``     (with ``anchor=``) the record at the anchored ``seq`` has another
                 hash, or the log ends before it (truncated).

A torn line is only a *warning* when the writer recorded its recovery: the
next record is a ``chain_resumed`` event whose ``torn_offset``,
``torn_bytes`` and ``torn_sha256`` describe exactly those bytes. The oldest
retained record may have ``seq > 1`` when old files were rotated out; that is
a warning too. Without an external anchor, removing records from the *end*
of the newest file cannot be told from a log that simply ends there: keep the
``head`` that ``verify`` prints and pass it back with ``--anchor``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from audit.chain import GENESIS_HASH, LineFields, fast_fields, parse_fields, record_hash
from audit.errors import AuditLogNotFoundError
from audit.logfiles import resolve_log_path, snapshot
from audit.records import EVENT, EVENT_CHAIN_RESUMED

__all__ = ["VerifyProblem", "VerifyResult", "verify", "PROBLEM_KINDS"]

PROBLEM_KINDS = ("bad_json", "torn", "not_a_record", "edited", "broken_link", "seq_gap", "seq_order", "anchor")
_RESUMED_NEEDLE = b'"' + EVENT_CHAIN_RESUMED.encode() + b'"'
_MAX_PENDING_BYTES = 16 * 1024 * 1024


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
    pos = getattr(exc, "pos", 0) or 0
    if not has_newline:
        return "torn", "incomplete last line (a crash or a full disk during a write?)"
    # a prefix of a record: the parser ran out of input (inside a string, or at the end)
    msg = getattr(exc, "msg", "")
    if body.startswith(b"{") and (msg.startswith("Unterminated string") or pos >= len(body.decode("utf-8", "replace")) - 1):
        return "torn", "incomplete record"
    return "bad_json", f"not valid JSON ({exc.__class__.__name__}: {str(exc)[:80]})"


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


def verify(
    path_or_home: str | os.PathLike[str],
    *,
    strict: bool = False,
    anchor: tuple[int, str] | None = None,
) -> VerifyResult:
    """Check the whole chain; see the module docstring for what is reported.

    By default a line is checked with one SHA-256 over its bytes as written
    (the writer's lines are canonical JSON plus the hash), falling back to
    parsing and re-canonicalising; ``strict`` always parses. ``anchor`` is a
    ``(seq, hash)`` recorded earlier: it must still be in the log.
    Raises :class:`AuditLogNotFoundError` when there is no log.
    """
    log_path = resolve_log_path(path_or_home)
    result = VerifyResult(ok=False, records=0, files=[])
    prev: LineFields | None = None
    pending: list[_Bad] = []
    pending_bytes = 0
    gap: VerifyProblem | None = None  # seq jumped: the next record tells a gap from a swap
    anchor_seen = False
    loads = json.loads
    try:
        with snapshot(log_path) as snaps:
            if not snaps:
                raise AuditLogNotFoundError(log_path)
            for snap in snaps:
                name = str(snap.path)
                result.files.append(name)
                f, size = snap.file, snap.size
                f.seek(0)
                offset = number = 0
                for raw in f:  # iter_lines(), inlined: this loop runs a million times
                    if offset >= size:
                        break
                    number += 1
                    if offset + len(raw) > size:
                        raw = raw[: size - offset]
                    line_offset = offset
                    offset += len(raw)
                    has_newline = raw.endswith(b"\n")
                    body = raw[:-1] if has_newline else raw
                    record: Any = None
                    fields = None if strict else fast_fields(body)
                    if fields is None:
                        try:
                            record = loads(body)
                        except ValueError as exc:
                            kind, detail = _bad_kind(body, has_newline, exc)
                            pending_bytes += len(raw)
                            pending.append(_Bad(number, line_offset, raw if pending_bytes <= _MAX_PENDING_BYTES else b"", kind, detail))
                            continue
                        fields = parse_fields(record)
                        if fields is None:
                            raise _Stop(VerifyProblem(name, number, "not_a_record", "JSON line without valid seq, prev_hash and hash"))
                        if record_hash(record) != fields.hash:
                            raise _Stop(VerifyProblem(name, number, "edited", f"seq {fields.seq}: content does not match its hash"))
                    elif _RESUMED_NEEDLE in body:
                        record = loads(body)
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
                        if fields.seq == 1 and fields.prev_hash != GENESIS_HASH:
                            raise _Stop(VerifyProblem(name, number, "broken_link", "seq 1 does not start from the genesis hash"))
                        if fields.seq > 1:
                            result.warnings.append(VerifyProblem(
                                name, number, "history_start",
                                f"the retained log starts at seq {fields.seq} (older files rotated out?); "
                                f"its prev_hash cannot be checked",
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
                    result.records += 1
                if pending:
                    bad = pending[0]
                    raise _Stop(VerifyProblem(name, bad.line, bad.kind, bad.detail))
            if gap is not None:
                raise _Stop(gap)
            if anchor is not None and not anchor_seen:
                if prev is None or prev.seq < anchor[0]:
                    last = result.files[-1]
                    raise _Stop(VerifyProblem(last, 0, "anchor", f"the log ends at seq {prev.seq if prev else 0} but the anchor names seq {anchor[0]} (truncated?)"))
                result.warnings.append(VerifyProblem(result.files[0], 0, "anchor", f"anchor seq {anchor[0]} is older than the retained log"))
    except _Stop as stop:
        result.first_error = stop.problem
    else:
        result.ok = True
    if prev is not None:
        result.head_seq, result.head_hash = prev.seq, prev.hash
    return result
