"""``verify``: walk every file of the log, and its signed checkpoints, and report every problem.

Every problem is reported (up to ``max_findings``; the rest are counted), in file order, oldest
file first; after one the walk resynchronises on the next record, so one edit is one finding.
The finding kinds (``edited``, ``seq_gap``, ``broken_link``, ``not_canonical``, ``history_start``,
``checkpoint_mismatch``, ``truncated``, ...) and their meaning are in docs/auditors.md.

With public keys (``pubkeys=``) the checkpoints file (:mod:`audit.checkpoints`) is checked too.
A torn line is only a warning when a ``chain_resumed`` event describes exactly its bytes. The
oldest retained record must be seq 1 unless a signed rotation checkpoint proves the pruning, or
the caller allows it (``allow_pruned_head=True``). ``strict`` parses every line instead of the
one-hash fast check of lines in the writer's layout (why that check is sound: docs/design.md).

What no local check can see: removing the newest records *and* the checkpoints after them leaves
an older, valid state; keep the printed ``head`` elsewhere and pass it back with ``--anchor``.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
from audit.checkpoints import CheckpointReport, check_checkpoints, checkpoints_path
from audit.errors import AuditLogNotFoundError
from audit.logfiles import resolve_log_path, skip_line, snapshot
from audit.signing import Retirement, Verifier
from audit.records import EVENT, EVENT_CHAIN_RESUMED

__all__ = ["VerifyProblem", "VerifyResult", "CheckpointSummary", "verify", "PROBLEM_KINDS", "WARNING_KINDS"]

PROBLEM_KINDS = (
    "bad_json", "oversized", "duplicate_key", "torn", "not_a_record", "edited", "not_canonical",
    "broken_link", "seq_gap", "seq_order", "inserted", "history_start", "anchor",
    "checkpoint_mismatch", "truncated", "checkpoint_signature", "checkpoint_key", "checkpoint_fork",
    "checkpoint_bad", "checkpoint_missing", "checkpoint_retired_key",
)
WARNING_KINDS = ("torn", "history_start", "unverified_tail", "checkpoint_torn", "checkpoint_unchecked")
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
class CheckpointSummary:
    """What the signed checkpoints proved (see :mod:`audit.checkpoints`)."""

    file: str
    present: bool = False
    checked: bool = False  #: signatures were checked against public keys
    count: int = 0  #: blocks in the file
    valid: int = 0  #: checkpoints with a valid signature by a trusted key
    last_seq: int | None = None  #: the newest valid checkpoint
    last_time: str | None = None
    covered_seq: int | None = None  #: records 1..covered_seq are pinned by a signature
    pruned_through: int | None = None  #: a signed rotation says records 1..N were pruned
    keys: list[str] = field(default_factory=list)  #: key ids that signed

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class VerifyResult:
    """Outcome of :func:`verify`; ``ok`` is True only when no problem was found.

    ``problems`` lists every problem found (at most ``max_findings``; ``more``
    counts the rest), ``first_error`` is the first of them.
    """

    ok: bool
    records: int
    files: list[str]
    first_error: VerifyProblem | None = None
    warnings: list[VerifyProblem] = field(default_factory=list)
    head_seq: int | None = None
    head_hash: str | None = None
    problems: list[VerifyProblem] = field(default_factory=list)
    more: int = 0
    checkpoints: CheckpointSummary | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "records": self.records,
            "files": self.files,
            "findings": [dict(p.__dict__, severity="error") for p in self.problems]
            + [dict(w.__dict__, severity="warning") for w in self.warnings],
            "more_findings": self.more,
            "first_error": None if self.first_error is None else self.first_error.__dict__,
            "warnings": [w.__dict__ for w in self.warnings],
            "head": None if self.head_seq is None else {"seq": self.head_seq, "hash": self.head_hash},
            "checkpoints": None if self.checkpoints is None else self.checkpoints.as_dict(),
        }


@dataclass
class _Bad:
    line: int
    offset: int
    raw: bytes
    kind: str
    detail: str


class _Findings:
    """Problems, bounded: the first ``limit`` are kept, the rest counted."""

    def __init__(self, result: VerifyResult, limit: int) -> None:
        self.result, self.limit = result, limit

    def __call__(self, problem: VerifyProblem) -> None:
        if len(self.result.problems) < self.limit:
            self.result.problems.append(problem)
        else:
            self.result.more += 1


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


def _check_head(name: str, number: int, body: bytes) -> VerifyProblem | None:
    """The last record in full, as ``strict`` checks every line.

    Its hash is no other line's ``prev_hash``, so it is the one line a forger can
    rewrite and re-hash without touching the rest of the chain.
    """
    try:
        record = loads_line(body)
    except ValueError as exc:
        kind, detail = _bad_kind(body, True, exc)
        return VerifyProblem(name, number, kind, detail)
    fields = parse_fields(record)
    if fields is None:
        return VerifyProblem(name, number, "not_a_record", "JSON line without valid seq, prev_hash and hash")
    if line_verdict(body, record, fields.hash) != "ok":
        return VerifyProblem(name, number, "not_canonical", (
            f"seq {fields.seq}: its hash covers these bytes, but they are not the writer's rendering of "
            f"their content (the last record rewritten by another tool, with a recomputed hash?)"))
    return None


def verify(
    path_or_home: str | os.PathLike[str],
    *,
    strict: bool = False,
    anchor: tuple[int, str] | None = None,
    allow_pruned_head: bool = False,
    pubkeys: Sequence[Verifier] | None = None,
    max_findings: int = 1000,
    retirements: Sequence[Retirement] = (),
) -> VerifyResult:
    """Check the whole chain and its signed checkpoints; see the module docstring.

    Every problem is reported (up to ``max_findings``), not only the first.
    By default a line is checked with one SHA-256 over its bytes as written
    (the writer's lines are canonical JSON plus the hash), falling back to
    parsing and re-rendering; ``strict`` always parses. ``anchor`` is a
    ``(seq, hash)`` recorded earlier: it must still be in the log.
    ``allow_pruned_head`` accepts a log whose oldest record is not seq 1 (old
    files dropped by retention) with a ``history_start`` warning; a signed
    rotation checkpoint naming exactly the pruned records makes it unnecessary.
    ``pubkeys`` are the public keys checkpoints are checked with; given, the
    log must have valid checkpoints. ``retirements`` are the key rotation records the auditor kept
    with them (``retired`` lines of ``audit pubkey``): a retired key vouches for nothing after its
    hand-over, whatever the checkpoints file says, and the hand-over's head pins the records
    before it. Raises :class:`AuditLogNotFoundError`
    when there is no log, ``OSError`` when a file cannot be read.
    """
    log_path = resolve_log_path(path_or_home)
    cp_path = checkpoints_path(log_path)
    result = VerifyResult(ok=False, records=0, files=[])
    report = _Findings(result, max_findings)
    prev: LineFields | None = None
    first: LineFields | None = None
    first_where: tuple[str, int] = ("", 0)
    pending: list[_Bad] = []
    pending_bytes = 0
    gap: tuple[VerifyProblem, LineFields] | None = None  # seq jumped: the next record tells a gap from a swap
    anchor_seen = False
    head: tuple[str, int, bytes] | None = None  # the last record, if only its hash was checked
    limit = MAX_LINE_BYTES + 1  # the line and its newline
    cp_odd = _not_regular(cp_path)
    if cp_odd:  # a FIFO, a directory ...: a verdict, not an error (and never opened)
        report(VerifyProblem(str(cp_path), 0, "checkpoint_bad", f"{cp_odd}, not a checkpoints file"))
    with snapshot(log_path, extra=() if cp_odd else (cp_path,)) as opened:
        snaps = [s for s in opened if s.path != cp_path]
        cp_snap = next((s for s in opened if s.path == cp_path), None)
        if not snaps:
            raise AuditLogNotFoundError(log_path)
        cps = check_checkpoints(cp_path, pubkeys, max_findings,
                                file=cp_snap.file if cp_snap else None, size=cp_snap.size if cp_snap else 0,
                                retirements=retirements) \
            if cp_snap is not None else None
        heads = cps.heads if cps is not None and cps.checked else {}
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
                        _flush(pending, name, report)
                        pending, pending_bytes = [], 0
                        report(VerifyProblem(name, number, "not_a_record", "JSON line without valid seq, prev_hash and hash"))
                        continue
                    verdict = line_verdict(body, record, fields.hash)
                    if verdict == "edited" and strict and fast_fields(body) is not None:
                        report(VerifyProblem(name, number, "not_canonical", (
                            f"seq {fields.seq}: its hash covers these bytes, but they are not the writer's "
                            f"rendering of their content (written by another tool, with a recomputed hash?)")))
                    elif verdict == "edited":
                        report(VerifyProblem(name, number, "edited", f"seq {fields.seq}: content does not match its hash"))
                    elif verdict == "not_canonical":
                        report(VerifyProblem(name, number, "not_canonical", (
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
                    else:
                        _flush(pending, name, report)
                    pending, pending_bytes = [], 0
                if not has_newline:
                    result.warnings.append(VerifyProblem(name, number, "torn", "last record lacks its final newline"))
                signed = heads.get(fields.seq) if heads else None
                if signed is not None and signed[0] != fields.hash:
                    source = f"signed checkpoint at {cp_path.name}:{signed[1]}" if signed[1] else \
                        "key rotation record kept with the public keys"
                    report(VerifyProblem(name, number, "checkpoint_mismatch", (
                        f"seq {fields.seq} has hash {fields.hash[:16]}..., but the {source} "
                        f"says {signed[0][:16]}...: records up to seq {fields.seq} were "
                        f"rewritten after they were signed (edited, inserted or deleted, the chain recomputed)")))
                # -- the chain itself --
                if gap is not None:
                    problem, later = gap
                    gap = None
                    if prev is not None and fields.seq == prev.seq + 1:
                        report(VerifyProblem(problem.file, problem.line, "seq_order", problem.detail + "; records are out of order"))
                        prev = later if later.seq > fields.seq else fields
                        result.records += 1
                        head = None
                        continue
                    report(problem)
                    prev = later
                if prev is None:
                    first, first_where = fields, (name, number)
                    if fields.seq == 1 and fields.prev_hash != GENESIS_HASH:
                        report(VerifyProblem(name, number, "broken_link", "seq 1 does not start from the genesis hash"))
                elif fields.seq == prev.seq + 1:
                    if fields.prev_hash != prev.hash:
                        report(VerifyProblem(name, number, "broken_link", f"seq {fields.seq}: prev_hash does not match the hash of seq {prev.seq}"))
                elif fields.seq <= prev.seq:
                    if fields.seq == prev.seq and fields.hash != prev.hash:
                        report(VerifyProblem(name, number, "inserted", f"a second record claims seq {fields.seq} (one was inserted)"))
                    else:
                        report(VerifyProblem(name, number, "seq_order", f"seq {fields.seq} after seq {prev.seq}"))
                    continue
                else:
                    gap = (VerifyProblem(name, number, "seq_gap", f"seq {fields.seq} follows seq {prev.seq} (seq {prev.seq + 1} missing)"), fields)
                    result.records += 1
                    head = None if checked else (name, number, body)
                    continue
                if anchor is not None and fields.seq == anchor[0]:
                    anchor_seen = True
                    if fields.hash != anchor[1]:
                        report(VerifyProblem(name, number, "anchor", f"seq {fields.seq} has hash {fields.hash}, the anchor says {anchor[1]}"))
                prev = fields
                head = None if checked else (name, number, body)
                result.records += 1
            if pending:
                _flush(pending, name, report)
                pending, pending_bytes = [], 0
        if gap is not None:
            report(gap[0])
            prev = gap[1]
        if head is not None:
            problem = _check_head(*head)
            if problem is not None:
                report(problem)
        last_file = result.files[-1]
        if anchor is not None and not anchor_seen:
            if prev is None or prev.seq < anchor[0]:
                report(VerifyProblem(last_file, 0, "anchor", f"the log ends at seq {prev.seq if prev else 0} but the anchor names seq {anchor[0]} (truncated?)"))
            else:
                report(VerifyProblem(result.files[0], 0, "anchor", (
                    f"the anchored record seq {anchor[0]} is not in the log, which starts at seq "
                    f"{first.seq if first else 0}: it was pruned by retention or deleted; an anchor must name a record "
                    f"that is still retained (keep a newer head from verify)")))
    summary = _checkpoint_verdicts(cps, cp_path, pubkeys, prev, result, report)
    if first is not None and first.seq > 1:
        proof = None
        if cps is not None and cps.checked:
            proof = next((line for seq, digest, line in cps.pruned if seq == first.seq - 1 and digest == first.prev_hash), None)
        if proof is not None:
            summary.pruned_through = first.seq - 1  # type: ignore[union-attr]
        elif allow_pruned_head:
            result.warnings.append(VerifyProblem(
                first_where[0], first_where[1], "history_start",
                f"the retained log starts at seq {first.seq} (older records pruned by retention, "
                f"accepted by --allow-pruned-head); its prev_hash cannot be checked",
            ))
        else:
            result.problems.insert(0, VerifyProblem(first_where[0], first_where[1], "history_start",
                                                    _history_start(str(log_path), first_where[1], first.seq, rotated)))
    result.checkpoints = summary
    result.ok = not result.problems and not result.more
    result.first_error = result.problems[0] if result.problems else None
    if prev is not None:
        result.head_seq, result.head_hash = prev.seq, prev.hash
    return result


def _not_regular(path: Path) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"


def _flush(pending: list[_Bad], name: str, report: _Findings) -> None:
    for bad in pending:
        report(VerifyProblem(name, bad.line, bad.kind, bad.detail))


def _checkpoint_verdicts(
    cps: CheckpointReport | None,
    cp_path: Path,
    pubkeys: Sequence[Verifier] | None,
    prev: LineFields | None,
    result: VerifyResult,
    report: _Findings,
) -> CheckpointSummary:
    """The findings of the checkpoints file, and what it says about the end of the log."""
    where = str(cp_path)
    summary = CheckpointSummary(where)
    if cps is None:
        if pubkeys and prev is not None:
            report(VerifyProblem(where, 0, "checkpoint_missing", (
                f"the log has {prev.seq} records but {cp_path.name} does not exist: the checkpoints were deleted "
                f"(a log signed from its first `audit keygen` on always has them)")))
        return summary
    summary.present, summary.checked, summary.count, summary.valid = True, cps.checked, cps.blocks, cps.valid
    summary.keys = list(cps.keys)
    for line, kind, detail in cps.problems:
        report(VerifyProblem(where, line, kind, detail))
    result.more += cps.more
    for line, kind, detail in cps.warnings:
        result.warnings.append(VerifyProblem(where, line, kind, detail))
    if not cps.checked:
        return summary
    if cps.last is None:
        if prev is not None and not cps.problems:  # else those findings say why none is valid
            report(VerifyProblem(where, 0, "checkpoint_missing", (
                f"the log has {prev.seq} records but {cp_path.name} holds no valid signed checkpoint "
                f"(emptied, replaced or damaged; a log signed from its first `audit keygen` on always has one)")))
        return summary
    seq, digest, line, time = cps.last
    summary.last_seq, summary.last_time = seq, time
    end = prev.seq if prev is not None else 0
    for pinned, _head in cps.pins:
        if pinned > end and pinned > seq:
            report(VerifyProblem(where, 0, "truncated", (
                f"the key rotation record kept with the public keys pins seq {pinned}, but the log ends at seq "
                f"{end} and its checkpoints at seq {seq}: records and checkpoints were deleted from its end")))
    summary.covered_seq = min(seq, end)
    if seq > end:
        report(VerifyProblem(where, line, "truncated", (
            f"the signed checkpoint of {time or 'unknown time'} covers records up to seq {seq}, but the log ends "
            f"at seq {end}: records {end + 1}..{seq} were deleted from its end")))
    elif end > seq:
        result.warnings.append(VerifyProblem(result.files[-1] if result.files else where, 0, "unverified_tail", (
            f"records {seq + 1}..{end} are newer than the last signed checkpoint (seq {seq}, {time or 'unknown time'}): "
            f"not covered by a signature yet (a writer still running, or one that crashed before checkpointing)")))
    return summary
