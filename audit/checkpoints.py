"""Signed checkpoints of the audit chain, in ``logs/agent.log.checkpoints``.

Each is a signed note in the spirit of C2SP tlog-checkpoint (origin, head ``seq``, head hash, then
extension lines: ``time``, ``reason``, ``pruned``, ``torn``, ``key``), followed by one blank line;
the layout is in docs/design.md, "The audit log". A checkpoint at ``seq`` N pins records 1..N:
rewriting any of them changes the hash at N, which no one without the private key can sign again.

They are written under the log's lock, one ``write`` each on an ``O_APPEND`` descriptor; after a
crash mid-write the next writer closes the torn block and names its bytes in a signed ``torn``
line. This module renders, parses and checks them; :func:`audit.verifier.verify` matches them
against the records.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from audit.logfiles import open_log_file
from audit.signing import SIG_PREFIX, AuditKeyError, Retirement, Signer, Verifier, parse_verifier

__all__ = [
    "CHECKPOINTS_SUFFIX",
    "checkpoints_path",
    "Checkpoint",
    "Block",
    "render",
    "iter_blocks",
    "CheckpointReport",
    "check_checkpoints",
]

CHECKPOINTS_SUFFIX = ".checkpoints"
MAX_LINE = 4096
MAX_LINES = 64
MAX_BLOCK = 64 * 1024
_SEQ = re.compile(r"0|[1-9][0-9]{0,18}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SIG_PREFIX_B = SIG_PREFIX.encode("utf-8")
_MAX_PENDING = 16  # unreadable blocks held while waiting for a checkpoint that names them torn


def checkpoints_path(log_path: Path) -> Path:
    return log_path.with_name(log_path.name + CHECKPOINTS_SUFFIX)


@dataclass(frozen=True)
class Checkpoint:
    """One parsed checkpoint (signatures not yet checked)."""

    origin: str
    seq: int
    head: str  #: hex, as in the log
    time: str | None
    reason: str | None
    pruned: tuple[int, str] | None
    torn: tuple[int, int, str] | None
    new_key: str | None
    text: bytes  #: the signed text
    signatures: tuple[tuple[str, int, bytes], ...]  #: (key name, key id, signature)


@dataclass(frozen=True)
class Block:
    """A block of the file: ``checkpoint`` when it parses, else ``error``."""

    line: int
    offset: int
    size: int
    checkpoint: Checkpoint | None
    error: str | None
    complete: bool  #: ended with its blank line (False: the file ends inside it)
    plausible: bool = False  #: incomplete, and what is there could be the start of a checkpoint (a crash)


def render(origin: str, seq: int, head_hex: str, extensions: Sequence[str], signers: Sequence[Signer]) -> bytes:
    """The bytes appended for one checkpoint: note text, blank line, signatures, blank line."""
    head64 = base64.b64encode(bytes.fromhex(head_hex)).decode("ascii")
    text = "".join(line + "\n" for line in (origin, str(seq), head64, *extensions)).encode("utf-8")
    return text + b"\n" + b"".join(s.signature_line(text) for s in signers) + b"\n"


def _parse(text_lines: list[bytes], sig_lines: list[bytes]) -> Checkpoint:
    if len(text_lines) < 3:
        raise ValueError("fewer than 3 lines before the signatures (origin, seq, hash)")
    try:
        lines = [ln.decode("utf-8") for ln in text_lines]
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    origin, seq_text, head64 = lines[0], lines[1], lines[2]
    if not origin or any(c.isspace() or ord(c) < 32 for c in origin):
        raise ValueError("bad origin line")
    if not _SEQ.fullmatch(seq_text):
        raise ValueError("the second line is not a record count")
    try:
        head = base64.b64decode(head64, validate=True)
    except (binascii.Error, ValueError):
        head = b""
    if len(head) != 32:
        raise ValueError("the third line is not a base64 SHA-256 hash")
    time = reason = new_key = None
    pruned: tuple[int, str] | None = None
    torn: tuple[int, int, str] | None = None
    for ext in lines[3:]:
        word, _, rest = ext.partition(" ")
        values = rest.split(" ")
        if word == "time":
            time = rest
        elif word == "reason":
            reason = rest
        elif word == "pruned":
            if len(values) != 2 or not _SEQ.fullmatch(values[0]) or not _HEX64.fullmatch(values[1]):
                raise ValueError("bad 'pruned' line")
            pruned = (int(values[0]), values[1])
        elif word == "torn":
            if len(values) != 3 or not _SEQ.fullmatch(values[0]) or not _SEQ.fullmatch(values[1]) or not _HEX64.fullmatch(values[2]):
                raise ValueError("bad 'torn' line")
            torn = (int(values[0]), int(values[1]), values[2])
        elif word == "key":
            new_key = rest
        elif not word:
            raise ValueError("an empty extension line")
    sigs: list[tuple[str, int, bytes]] = []
    for raw in sig_lines:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("a signature line is not UTF-8") from None
        if not line.startswith(SIG_PREFIX):
            raise ValueError("a signature line does not start with '\u2014 '")
        parts = line[len(SIG_PREFIX):].split(" ")
        if len(parts) != 2:
            raise ValueError("a signature line is not '\u2014 <name> <signature>'")
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a signature is not base64") from None
        if len(blob) < 5:
            raise ValueError("a signature is too short")
        sigs.append((parts[0], int.from_bytes(blob[:4], "big"), blob[4:]))
    text = b"".join(ln + b"\n" for ln in text_lines)
    return Checkpoint(origin, int(seq_text), head.hex(), time, reason, pruned, torn, new_key, text, tuple(sigs))


_EXT_WORDS = ("time", "reason", "pruned", "torn", "key")
_B64 = re.compile(rb"[A-Za-z0-9+/]*={0,2}")


def _plausible_line(position: int, line: bytes, whole: bool) -> bool:
    """Could ``line`` (``whole``: or a prefix of it) be the writer's line at this 1-based text position?"""
    if position == 1:
        return bool(line) and not any(c <= 32 or c == 127 for c in line) if whole else not any(c <= 32 for c in line)
    if position == 2:
        return (bool(line) or not whole) and line.isdigit() or (not whole and not line)
    if position == 3:
        return _B64.fullmatch(line) is not None and (not whole or len(line) == 44)
    word, space, _ = line.partition(b" ")
    if whole or space:
        return word.decode("ascii", "replace") in _EXT_WORDS and bool(space)
    return any(w.startswith(word.decode("ascii", "replace")) for w in _EXT_WORDS)


def _plausible_prefix(text_lines: list[bytes], sig_lines: list[bytes], phase: str, partial: bytes) -> bool:
    """Is an incomplete block what a crash part-way through appending a checkpoint leaves?

    Anything else (a line no writer writes) is damage, not a tear: it must not pass as one.
    """
    if len(text_lines) + len(sig_lines) > MAX_LINES:
        return False
    for position, line in enumerate(text_lines, 1):
        if not _plausible_line(position, line, True):
            return False
    prefix = _SIG_PREFIX_B
    for line in sig_lines:
        if not line.startswith(prefix) or line.count(b" ") != 2:
            return False
    if not partial:
        return True
    if phase == "text":
        return _plausible_line(len(text_lines) + 1, partial, False)
    return prefix.startswith(partial) or (partial.startswith(prefix) and partial.count(b" ") <= 2)


def iter_blocks(f: BinaryIO, size: int) -> Iterator[Block]:
    """The blocks of a checkpoints file up to ``size``, bounded: lines of at most
    :data:`MAX_LINE` bytes, blocks of at most :data:`MAX_LINES` lines."""
    f.seek(0)
    offset = 0
    number = 0
    while offset < size:
        raw = f.readline(MAX_LINE + 1)
        if not raw:
            break
        if offset + len(raw) > size:
            raw = raw[: size - offset]
        number += 1
        if raw == b"\n":  # blank lines between blocks (after a torn one)
            offset += 1
            continue
        start, first_line = offset, number
        text_lines: list[bytes] = []
        sig_lines: list[bytes] = []
        phase = "text"
        error: str | None = None
        complete = False
        partial = b""
        while True:
            offset += len(raw)
            if not raw.endswith(b"\n"):
                if offset >= size:
                    error = error or "incomplete (the file ends inside it)"
                    partial = raw
                    break
                error = error or f"a line longer than {MAX_LINE} bytes"
                while offset < size:  # read past the rest of it, holding nothing
                    more = f.readline(MAX_LINE)
                    if not more:
                        break
                    offset += len(more)
                    if more.endswith(b"\n"):
                        break
            else:
                body = raw[:-1]
                if len(text_lines) + len(sig_lines) > MAX_LINES:
                    if not body and (phase == "sigs" or not text_lines):
                        complete = True
                        break
                    if not body:
                        phase = "sigs"
                elif phase == "text":
                    if body:
                        text_lines.append(body)
                    else:
                        phase = "sigs"
                elif body:
                    sig_lines.append(body)
                else:
                    complete = True
                    if not sig_lines:
                        error = error or "no signature"
                    break
            if len(text_lines) + len(sig_lines) > MAX_LINES:
                error = error or f"more than {MAX_LINES} lines"
            if offset >= size:
                error = error or "incomplete (the file ends inside it)"
                break
            raw = f.readline(MAX_LINE + 1)
            if not raw:
                error = error or "incomplete (the file ends inside it)"
                break
            if offset + len(raw) > size:
                raw = raw[: size - offset]
            number += 1
        checkpoint = None
        whole_but_the_end = not complete and phase == "sigs" and sig_lines and not partial and offset >= size
        if error is None or (whole_but_the_end and len(text_lines) + len(sig_lines) <= MAX_LINES):
            try:  # a block missing only its closing blank line is still a whole signed note
                checkpoint = _parse(text_lines, sig_lines)
                error = None
            except ValueError as exc:
                error = str(exc)
        plausible = not complete and _plausible_prefix(text_lines, sig_lines, phase, partial)
        yield Block(first_line, start, offset - start, checkpoint, error, complete, plausible)


# -- checking -----------------------------------------------------------------------------


@dataclass
class CheckpointReport:
    """What the checkpoints file says, once signatures are checked.

    ``heads`` maps a ``seq`` to ``(hash, line)`` of the valid checkpoints;
    ``problems``/``warnings`` are ``(line, kind, detail)``.
    """

    path: Path
    present: bool = False
    checked: bool = False  #: signatures were checked (there were public keys)
    blocks: int = 0
    valid: int = 0
    heads: dict[int, tuple[str, int]] = field(default_factory=dict)
    last: tuple[int, str, int, str | None] | None = None  #: (seq, hash, line, time) of the newest valid one
    origin: str | None = None
    pruned: list[tuple[int, str, int]] = field(default_factory=list)  #: (through seq, its hash, line)
    keys: list[str] = field(default_factory=list)  #: key ids that signed valid checkpoints
    pins: list[tuple[int, str]] = field(default_factory=list)  #: (seq, head) of the kept key rotation records
    problems: list[tuple[int, str, str]] = field(default_factory=list)
    more: int = 0  #: problems beyond max_findings, counted only
    warnings: list[tuple[int, str, str]] = field(default_factory=list)


def _covers(cp: Checkpoint, pending: list[Block], block_offset: int, f: BinaryIO) -> bool:
    """Does the checkpoint's signed ``torn`` line name exactly the bytes before it (padding aside)?"""
    if cp.torn is None or not pending:
        return False
    offset, length, digest = cp.torn
    if offset != pending[0].offset or offset + length > block_offset:
        return False
    here = f.tell()
    try:
        f.seek(offset)
        h = hashlib.sha256()
        left = length
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                return False
            h.update(chunk)
            left -= len(chunk)
        padding = f.read(block_offset - offset - length) if block_offset - offset - length <= MAX_BLOCK else b"x"
    finally:
        f.seek(here)
    return h.hexdigest() == digest and not padding.strip(b"\n")


def _after_retirement(key: tuple[str, int], seq: int, handover: tuple[int, str, int, int]) -> str:
    at, _head, successor, line = handover
    where = f"at line {line}" if line else "in the rotation record kept with the public keys"
    return (f"checkpoint for seq {seq} is signed only by key {key[1]:08x}, which was retired at seq {at} (handed over "
            f"to key {successor:08x}, {where}): a retired key may have leaked, so it vouches for nothing after its "
            f"retirement; the log was rewritten and re-signed with it")


def _retired_signers(cp: Checkpoint, line: int, signers: list[tuple[str, int]],
                     retired: dict[tuple[str, int], tuple[int, str, int, int]]) -> str | None:
    """Why ``cp`` is refused when only retired keys signed it, else None: it comes after a signer's
    hand-over (in seq, or in the file) or gives that hand-over's seq another head."""
    if not retired or any(k not in retired for k in signers):
        return None
    for key in signers:
        handover = retired[key]
        at, head, _successor, at_line = handover
        if cp.seq > at or (cp.seq == at and cp.head != head) or (at_line and line > at_line):
            return _after_retirement(key, cp.seq, handover)
    return None


def _handover_clash(cp: Checkpoint, new: Verifier, signers: list[tuple[str, int]],
                    retired: dict[tuple[str, int], tuple[int, str, int, int]]) -> str | None:
    """A key rotation a retired key signs that is not the hand-over recorded for it (a leaked key
    endorsing a key of its holder's), else None."""
    for key in signers:
        handover = retired.get(key)
        if handover is None or key == (new.name, new.key_id):
            continue
        if (cp.seq, cp.head, new.key_id) != handover[:3]:
            return (f"key rotation to key {new.key_id:08x} at seq {cp.seq} signed by key {key[1]:08x}, which was "
                    f"handed over to key {handover[2]:08x} at seq {handover[0]}: a retired key endorses no other key")
    return None


def check_checkpoints(
    path: Path,
    verifiers: Sequence[Verifier] | None,
    max_findings: int = 1000,
    *,
    file: BinaryIO | None = None,
    size: int | None = None,
    retirements: Sequence[Retirement] = (),
) -> CheckpointReport:
    """Parse ``path`` and check every checkpoint's signature against ``verifiers``.

    A checkpoint counts only when a trusted key signed it validly; a ``key``
    line in such a checkpoint, signed by that new key as well, adds the new key
    (key rotation) and retires the old one: a checkpoint only retired keys
    signed is refused when it comes after the hand-over, in the file or in
    ``seq``. ``retirements`` (kept by the auditor with the public keys) retire
    keys whatever the file says, and pin the hand-over's head. Without
    ``verifiers`` nothing is trusted (a warning says so). Raises ``OSError``
    when the file exists but cannot be read.
    """
    report = CheckpointReport(path)
    if file is not None:
        f = file
    else:
        try:
            f = open_log_file(path)
        except FileNotFoundError:
            return report
    report.present = True
    report.checked = bool(verifiers)
    trusted: dict[tuple[str, int], Verifier] = {(v.name, v.key_id): v for v in verifiers or ()}
    keys_seen: dict[str, None] = {}
    pending: list[Block] = []
    reasons: dict[int, tuple[str, str]] = {}  # block offset -> (kind, detail) when it parsed but failed

    unknown: dict[str, list[int]] = {}  # key ids of untrusted signers -> [first line, count]
    # a retired key -> (the hand-over's seq, head, successor key id, its line; 0: kept by the auditor)
    retired: dict[tuple[str, int], tuple[int, str, int, int]] = {}
    alone: dict[tuple[str, int], tuple[int, int]] = {}  # a key -> (highest seq it alone signed, line)
    for r in retirements:
        if (r.name, r.key_id) in trusted:
            retired[(r.name, r.key_id)] = (r.seq, r.head, r.successor, 0)
            report.heads.setdefault(r.seq, (r.head, 0))  # the hand-over's head pins every record up to it
            report.pins.append((r.seq, r.head))

    def problem(line: int, kind: str, detail: str) -> None:
        if len(report.problems) < max_findings:
            report.problems.append((line, kind, detail))
        else:
            report.more += 1

    if size is None:
        size = os.fstat(f.fileno()).st_size
    try:
        for block in iter_blocks(f, size):
            report.blocks += 1
            cp = block.checkpoint
            if len(pending) >= _MAX_PENDING:  # a run of garbage no crash leaves: judge the oldest now
                bad = pending.pop(0)
                problem(bad.line, *reasons.pop(bad.offset, ("checkpoint_bad", f"not a checkpoint: {bad.error}")))
            if cp is None:
                pending.append(block)
                continue
            if not trusted:
                continue
            ok_sigs = [(n, k) for n, k, sig in cp.signatures if (n, k) in trusted and trusted[(n, k)].verify(cp.text, sig)]
            bad_sigs = [(n, k) for n, k, sig in cp.signatures if (n, k) in trusted and (n, k) not in ok_sigs]
            if bad_sigs:
                name, key_id = bad_sigs[0]
                # pending: a torn line of a later checkpoint may name it (a crash cut its signature short)
                reasons[block.offset] = ("checkpoint_signature", (
                    f"checkpoint for seq {cp.seq}: the signature of key {key_id:08x} does not match its text "
                    f"(the checkpoint was altered or forged)"))
                pending.append(block)
                continue
            if not ok_sigs:  # one finding per set of unknown keys, with a count
                ids = ", ".join(f"{k:08x}" for _n, k, _s in cp.signatures) or "none"
                seen_ids = unknown.setdefault(ids, [block.line, 0, cp.seq])
                seen_ids[1] += 1
                continue
            if pending:
                if _covers(cp, pending, block.offset, f):
                    for bad in pending:
                        why = bad.error or "its signature cut short"
                        report.warnings.append((bad.line, "checkpoint_torn", (
                            f"a checkpoint torn by a crash ({why}); recovered by the checkpoint at line {block.line}")))
                else:
                    for bad in pending:
                        problem(bad.line, *reasons.get(bad.offset, ("checkpoint_bad", f"not a checkpoint: {bad.error}")))
                pending = []
            if not block.complete:
                report.warnings.append((block.line, "checkpoint_torn", (
                    "the last checkpoint lacks its closing blank line (a crash right after writing it); "
                    "it is whole and signed, so it counts")))
            if report.origin is None:
                report.origin = cp.origin
            elif cp.origin != report.origin:
                problem(block.line, "checkpoint_bad", "checkpoint of another log (its origin line differs)")
                continue
            refusal = _retired_signers(cp, block.line, ok_sigs, retired)
            if refusal is not None:
                problem(block.line, "checkpoint_retired_key", refusal)
                continue
            if len(ok_sigs) == 1 and cp.new_key is None:
                seen_alone = alone.get(ok_sigs[0])
                if seen_alone is None or cp.seq > seen_alone[0]:
                    alone[ok_sigs[0]] = (cp.seq, block.line)
            if cp.new_key is not None:
                try:
                    new = parse_verifier(cp.new_key, f"{path}:{block.line}")
                except AuditKeyError as exc:
                    problem(block.line, "checkpoint_bad", f"key rotation: {exc}")
                    continue
                signed_by_new = any((n, k) == (new.name, new.key_id) and new.verify(cp.text, sig) for n, k, sig in cp.signatures)
                if not signed_by_new:
                    problem(block.line, "checkpoint_key", "key rotation names a new key that did not sign it")
                    continue
                clash = _handover_clash(cp, new, ok_sigs, retired)
                if clash is not None:
                    problem(block.line, "checkpoint_retired_key", clash)
                    continue
                for old in ok_sigs:  # retired from here on in the file too (a kept record: the same hand-over)
                    if old != (new.name, new.key_id) and (old not in retired or not retired[old][3]):
                        retired[old] = (cp.seq, cp.head, new.key_id, block.line)
                trusted[(new.name, new.key_id)] = new
            for _, key_id in ok_sigs:
                keys_seen[f"{key_id:08x}"] = None
            report.valid += 1
            seen = report.heads.get(cp.seq)
            if seen is not None and seen[0] != cp.head:
                first = f"line {seen[1]}" if seen[1] else "the key rotation record kept with the public keys"
                problem(block.line, "checkpoint_fork", (
                    f"two signed checkpoints for seq {cp.seq} with different heads ({first} and line {block.line}): "
                    f"the log was rewritten after the first one was signed"))
                continue
            if seen is None:
                report.heads[cp.seq] = (cp.head, block.line)
            if report.last is None or cp.seq >= report.last[0]:
                report.last = (cp.seq, cp.head, block.line, cp.time)
            if cp.pruned is not None:
                report.pruned.append((cp.pruned[0], cp.pruned[1], block.line))
    finally:
        if file is None:
            f.close()
    for bad in pending:
        if bad is pending[-1] and not bad.complete and bad.plausible:
            report.warnings.append((bad.line, "checkpoint_torn", (
                f"the last checkpoint is incomplete ({bad.error}): a crash while writing it; "
                f"the next writer recovers it")))
        else:
            problem(bad.line, *reasons.get(bad.offset, ("checkpoint_bad", f"not a checkpoint: {bad.error}")))
    for key, (seq, line) in alone.items():  # signed alone, earlier in the file, past the key's later retirement
        handover = retired.get(key)
        if handover is not None and handover[3] and seq > handover[0]:
            problem(line, "checkpoint_retired_key", _after_retirement(key, seq, handover))
    for ids, (line, count, seq) in unknown.items():
        also = f" (and {count - 1} later checkpoint{'s' if count > 2 else ''} signed the same way)" if count > 1 else ""
        problem(line, "checkpoint_key", (
            f"checkpoint for seq {seq} is signed by key id(s) {ids}, none of them a public key given "
            f"(or endorsed by a key rotation){also}: forged, or the auditor needs the right public keys"))
    report.keys = list(keys_seen)
    if report.blocks and not trusted:
        report.warnings.append((0, "checkpoint_unchecked", (
            f"{report.blocks} checkpoint(s) not checked: no public key; pass --pubkey FILE "
            f"(from `plugin-llm audit pubkey`) to check them")))
    return report
