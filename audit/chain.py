"""The hash chain: how a record becomes a line, and how a line is checked. Pure.

``hash`` = SHA-256 (hex) over :func:`audit.records.canonical_json` of the
record without its ``hash`` key. ``prev_hash`` is the previous record's
``hash`` (:data:`GENESIS_HASH` for ``seq`` 1). The writer renders the line as
the canonical bytes with ``"hash"`` appended as the *last* key, so the hashed
bytes are literally the line minus its hash suffix; that lets ``verify`` check
a line with one SHA-256 over the bytes it already holds. A line is accepted
only byte for byte as the writer renders it (:func:`line_verdict`): one that
parses to the same content but was re-encoded -- or holds a duplicate key,
which parsers resolve differently -- was not written by the writer.

Every reader parses lines with :func:`loads_line`, which bounds length and
nesting *before* parsing and refuses duplicate keys.
"""

from __future__ import annotations

import hashlib
import json
import re
from itertools import accumulate
from typing import Any, NamedTuple

from audit.records import HASH, PREV_HASH, SEQ, canonical_json, canonical_record

__all__ = [
    "GENESIS_HASH",
    "MAX_LINE_BYTES",
    "MAX_DEPTH",
    "LineError",
    "render_line",
    "record_hash",
    "LineFields",
    "fast_fields",
    "parse_fields",
    "nesting_too_deep",
    "loads_line",
    "line_verdict",
]

#: ``prev_hash`` of the very first record of a log
GENESIS_HASH = "0" * 64

#: the longest line a reader parses. The writer's records are a few KB; even with
#: ``audit.log_content`` on, a call's messages stay far below this.
MAX_LINE_BYTES = 16 * 1024 * 1024
#: the deepest nesting of arrays/objects a reader parses (the writer's records nest
#: a handful of levels: record > messages > message > content parts > part)
MAX_DEPTH = 64

_HASH_KEY = b',"hash":"'
# suffix = ,"hash":" + 64 hex + "}
_SUFFIX_LEN = len(_HASH_KEY) + 64 + 2
_SEQ_KEY = b'"seq":'
_PREV_KEY = b'"prev_hash":"'
_DIGITS = re.compile(rb"[1-9][0-9]{0,17}")  # seq < 10**18: a longer one takes the slow path (and fails there)
_HEX64_QUOTED = re.compile(rb'([0-9a-f]{64})"')
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_SEQ = 10**18  # a writer appending a million records a second needs 30,000 years to get here


def render_line(record: dict[str, Any]) -> tuple[bytes, str]:
    """``(line, hash)`` for a record that already holds ``seq`` and ``prev_hash``.

    ``record`` must not contain ``hash``; the line ends with ``\\n`` and, thanks
    to JSON escaping, contains no other newline byte. Rendered with
    :func:`~audit.records.canonical_record` (the bytes of ``canonical_json``).
    """
    body = canonical_record(record)
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + _HASH_KEY + digest.encode("ascii") + b'"}\n', digest


def record_hash(record: dict[str, Any]) -> str:
    """The hash a parsed record should carry (its canonical form without ``hash``)."""
    body = {k: v for k, v in record.items() if k != HASH}
    return hashlib.sha256(canonical_json(body)).hexdigest()


class LineFields(NamedTuple):
    """The chain fields of one line."""

    seq: int
    prev_hash: str
    hash: str


def fast_fields(raw: bytes) -> LineFields | None:
    """Chain fields of a line as the writer renders it, or None to take the slow path.

    ``raw`` is the line without its newline. Succeeds only when the hash suffix
    matches the SHA-256 of the preceding bytes (so those bytes are exactly what
    was hashed) and ``seq``/``prev_hash`` occur once each, so they cannot be
    confused with a nested key. Anything else returns None and the caller
    parses the JSON (:func:`parse_fields`). This is ``verify``'s hot loop.
    """
    if len(raw) <= _SUFFIX_LEN or raw[-2:] != b'"}' or raw[-_SUFFIX_LEN : -_SUFFIX_LEN + len(_HASH_KEY)] != _HASH_KEY:
        return None
    digest = raw[-66:-2]
    h = hashlib.sha256(memoryview(raw)[:-_SUFFIX_LEN])
    h.update(b"}")
    if h.hexdigest().encode("ascii") != digest:
        return None
    i = raw.rfind(_SEQ_KEY)
    j = raw.find(_PREV_KEY)
    # exactly one of each, as a key (preceded by "," or "{"; inside a string a quote is escaped)
    if i < 1 or j < 1 or raw.find(_SEQ_KEY) != i or raw.rfind(_PREV_KEY) != j:
        return None
    if raw[i - 1] not in b",{" or raw[j - 1] not in b",{":
        return None
    seq = _DIGITS.match(raw, i + len(_SEQ_KEY))
    prev = _HEX64_QUOTED.match(raw, j + len(_PREV_KEY))
    if seq is None or prev is None or raw[seq.end() : seq.end() + 1] not in (b",", b"}"):
        return None
    return LineFields(int(seq.group()), prev.group(1).decode("ascii"), digest.decode("ascii"))


def _is_hex64(value: Any) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def parse_fields(record: Any) -> LineFields | None:
    """Chain fields of a parsed record, or None when it is not a chained record."""
    if not isinstance(record, dict):
        return None
    seq, prev, digest = record.get(SEQ), record.get(PREV_HASH), record.get(HASH)
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < _MAX_SEQ:
        return None
    if not _is_hex64(prev) or not _is_hex64(digest):
        return None
    return LineFields(seq, prev, digest)


# -- parsing a line that may be hostile ----------------------------------------------------

# a JSON string (escapes included); what is left once strings are removed is structure
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# every byte except the four brackets, deleted by bytes.translate
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class LineError(ValueError):
    """A line refused before or while parsing: too long, nested too deep, a duplicate key.

    ``kind`` is ``"oversized"`` or ``"duplicate_key"`` (``verify``'s verdict);
    ``reason`` is short and never quotes more than a few characters of the line.
    """

    def __init__(self, reason: str, kind: str = "oversized") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


def nesting_too_deep(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Do the brackets of ``raw`` (outside JSON strings) nest deeper than ``limit``?

    Linear and C-speed: a flat record (one ``{``, no ``[``: most of the writer's)
    is answered by two ``memchr`` scans, a line with at most ``limit`` brackets by
    two ``count`` calls; only a line with more has its strings cut out and its
    bracket depth summed.
    """
    if b"[" not in raw and raw.find(b"{", raw.find(b"{") + 1) < 0:
        return False
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key if len(key) <= 40 else key[:40] + "..."
                raise LineError(f"duplicate key {json.dumps(shown, ensure_ascii=True)}", "duplicate_key")
            seen.add(key)
    return record


_JSON_SPACE = " \t\r\n"
# JSONDecoder.scan_once parses one value at an index without json.loads' wrapper
# work (encoding detection, whitespace regexes)
_SCAN = json.JSONDecoder(object_pairs_hook=_unique_pairs).scan_once


def loads_line(raw: bytes) -> Any:
    """One log line (bytes, with or without its newline) as JSON, refusing what no writer writes.

    Raises :class:`LineError` for a line longer than :data:`MAX_LINE_BYTES`,
    nested deeper than :data:`MAX_DEPTH` (checked *before* parsing, so a
    hostile ``[[[[...`` line cannot exhaust the stack) or holding a duplicate
    key in any object (parsers disagree on which value wins, so such a line
    has no single meaning); ``ValueError`` when it is not exactly one JSON value.
    """
    if len(raw) > MAX_LINE_BYTES + 1:
        raise LineError(f"longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB")
    if nesting_too_deep(raw):
        raise LineError(f"nesting deeper than {MAX_DEPTH}")
    text = raw.decode("utf-8")
    start = 0
    if text[:1] != "{":
        while start < len(text) and text[start] in _JSON_SPACE:
            start += 1
    try:
        value, end = _SCAN(text, start)
    except StopIteration:
        raise ValueError("not JSON") from None
    size = len(text)
    if end != size and not (end == size - 1 and text[end] == "\n") and text[end:].strip(_JSON_SPACE):
        raise ValueError("extra data after the value")
    return value


def line_verdict(body: bytes, record: dict[str, Any], digest: str) -> str:
    """``"ok"``, ``"edited"`` or ``"not_canonical"`` for a parsed line (``body``: without its newline).

    ``"ok"``: ``body`` is byte for byte how the writer renders ``record`` (canonical
    JSON without ``hash``, ``"hash"`` appended last: :func:`render_line`) and
    ``digest`` is the SHA-256 of that rendering. ``"edited"``: the content does
    not match ``digest``. ``"not_canonical"``: it does, but the bytes were
    re-encoded (spacing, escapes, key order, number forms) -- no writer wrote them.
    """
    rest = {k: v for k, v in record.items() if k != HASH}
    try:
        canonical = canonical_json(rest)
    except (ValueError, TypeError):
        return "edited"
    if hashlib.sha256(canonical).hexdigest() != digest:
        return "edited"
    if body != canonical[:-1] + _HASH_KEY + digest.encode("ascii") + b'"}':
        return "not_canonical"
    return "ok"
