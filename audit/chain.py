"""The hash chain: how a record becomes a line, and how a line is checked. Pure.

``hash`` = SHA-256 (hex) over :func:`audit.records.canonical_json` of the
record without its ``hash`` key. ``prev_hash`` is the previous record's
``hash`` (:data:`GENESIS_HASH` for ``seq`` 1). The writer renders the line as
the canonical bytes with ``"hash"`` appended as the *last* key, so the hashed
bytes are literally the line minus its hash suffix; that lets ``verify`` check
a line with one SHA-256 over the bytes it already holds, and fall back to
re-canonicalising the parsed record when the bytes differ (a line rewritten by
another tool but unchanged in content still verifies).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, NamedTuple

from audit.records import HASH, PREV_HASH, SEQ, canonical_json

__all__ = ["GENESIS_HASH", "render_line", "record_hash", "LineFields", "fast_fields", "parse_fields"]

#: ``prev_hash`` of the very first record of a log
GENESIS_HASH = "0" * 64

_HASH_KEY = b',"hash":"'
# suffix = ,"hash":" + 64 hex + "}
_SUFFIX_LEN = len(_HASH_KEY) + 64 + 2
_SEQ_KEY = b'"seq":'
_PREV_KEY = b'"prev_hash":"'
_DIGITS = re.compile(rb"[0-9]+")
_HEX64_QUOTED = re.compile(rb'([0-9a-f]{64})"')
_HEX64 = re.compile(r"[0-9a-f]{64}")


def render_line(record: dict[str, Any]) -> tuple[bytes, str]:
    """``(line, hash)`` for a record that already holds ``seq`` and ``prev_hash``.

    ``record`` must not contain ``hash``; the line ends with ``\\n`` and, thanks
    to JSON escaping, contains no other newline byte.
    """
    body = canonical_json(record)
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
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1 or not _is_hex64(prev) or not _is_hex64(digest):
        return None
    return LineFields(seq, prev, digest)
