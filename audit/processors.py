"""How the writer turns a record into its line: one pass, rendered directly in canonical form.

:class:`RecordRenderer` does, in order: stamp ``ts`` (unless given) and the
schema version, drop message content unless the operator opted in, redact
and normalise every value (:func:`scrub_values`; the host's own ids,
digests and enums skip the redactor), then hash the canonical bytes
(:func:`audit.records.canonical_record`, byte for byte
``canonical_json``) and render the line with ``"hash"`` last
(:func:`audit.chain.render_line`'s layout). A record no reader would accept
(too long, nested too deep) is shrunk by :func:`fit_record` first. It used
to be a chain of structlog processors; with the scrub and the encoding in one
loop over the fields and no copy per stage, a call record's whole write takes
about 30% less CPU (``benchmarks/bench_gateway.py`` prints both renderings).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, MutableMapping
from datetime import datetime, timezone
from typing import Any

from audit.chain import MAX_DEPTH, MAX_LINE_BYTES, nesting_too_deep, render_line
from audit.chain import _HASH_KEY
from audit.records import (
    API,
    CALL_ID,
    CONTENT_FIELDS,
    DECISION,
    EVENT,
    HASH,
    KIND,
    MODE,
    OPERATION_NAME,
    PREV_HASH,
    PROMPT_SHA256,
    RESPONSE_SHA256,
    SCHEMA,
    SCHEMA_SHA256,
    SCHEMA_VERSION,
    STATUS,
    TS,
    VALIDATION,
    _CANONICAL,
    _encode_str,
    _float_text,
    _int_text,
    canonical_json,
    record_layout,
)

#: fields whose values the host generates itself (ids, digests, enums): they can
#: carry no secret, so the redactor skips them (ASCII values only: anything else
#: did not come from the host's own code)
HOST_GENERATED = frozenset({
    API, CALL_ID, DECISION, EVENT, KIND, MODE, OPERATION_NAME, PREV_HASH, PROMPT_SHA256,
    RESPONSE_SHA256, SCHEMA_SHA256, STATUS, TS, VALIDATION,
})

__all__ = [
    "HOST_GENERATED",
    "RecordRenderer",
    "format_ts",
    "scrub_values",
    "fit_record",
]

EventDict = MutableMapping[str, Any]
Redactor = Callable[[str], str]


_ts_cache: tuple[int, str] = (-1, "")


def format_ts(epoch: float) -> str:
    """UTC ISO 8601 with milliseconds and ``Z``: fixed width, so it sorts as text."""
    global _ts_cache
    seconds = int(epoch // 1)
    millis = int((epoch - seconds) * 1000)
    cached_second, prefix = _ts_cache
    if cached_second != seconds:  # formatting a datetime costs more than the rest of this
        prefix = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        _ts_cache = (seconds, prefix)
    return f"{prefix}.{millis:03d}Z"


def _clean_text(text: str, redact: Redactor | None) -> str:
    if redact is not None:
        text = redact(text)
        if not isinstance(text, str):
            text = str(text)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates cannot be written as UTF-8
            text = text.encode("utf-8", "replace").decode("utf-8")
    return text


#: what replaces a value nested deeper than a reader parses (a record holds a
#: handful of levels; the record itself is one more)
DEEP_MARKER = f"[truncated by the audit writer: nested deeper than {MAX_DEPTH - 2} levels]"


def scrub_values(value: Any, redact: Redactor | None, depth: int = 0) -> Any:
    """``value`` as plain JSON data with every string passed through ``redact``.

    Mappings get string keys, sequences become lists, non-finite floats become
    strings (they are not JSON), anything else becomes ``str(value)`` (then
    redacted). The result's canonical JSON is stable under a parse/dump round
    trip, which is what makes the hash verifiable later.
    """
    if value is None or value is True or value is False:
        return value
    cls = type(value)
    if cls is str:
        return _clean_text(value, redact)
    if cls is int:
        return value
    if cls is float:
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH - 2:
        return DEEP_MARKER  # never recurse into (or write) what no reader would parse
    if isinstance(value, dict):
        return {(_clean_text(k, None) if type(k) is str else _clean_text(str(k), redact)): scrub_values(v, redact, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_values(v, redact, depth + 1) for v in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return scrub_values(float(value), redact, depth)
    if isinstance(value, str):
        return _clean_text(str(value), redact)
    return _clean_text(str(value), redact)


#: the fields a record keeps whole however large it is (the writer's own, all short)
_ENVELOPE_FIELDS = frozenset({SCHEMA, "seq", PREV_HASH, TS, EVENT, KIND, CALL_ID, STATUS, "plugin_id"})
#: what a line may hold: what every reader accepts, less room for the marker
_LINE_BUDGET = MAX_LINE_BYTES - 64 * 1024
TRUNCATED = "audit_truncated"


def _marker(value: Any, size: int) -> str:
    import hashlib

    digest = hashlib.sha256(canonical_json({"v": value})).hexdigest() if size <= 4 * MAX_LINE_BYTES else "-"
    return f"[truncated by the audit writer: {size} bytes of JSON, sha256 {digest} of {{\"v\": value}}]"


def fit_record(event_dict: EventDict) -> EventDict:
    """Shrink a record whose line no reader would accept (longer than
    :data:`audit.chain.MAX_LINE_BYTES`, nested deeper than :data:`audit.chain.MAX_DEPTH`).

    The largest non-envelope fields (message content first) are replaced by a
    marker naming their size and SHA-256 until the line fits; ``audit_truncated``
    lists them. The record itself is never dropped.
    """
    sizes = []
    for key, value in event_dict.items():
        if key in _ENVELOPE_FIELDS:
            continue
        encoded = canonical_json({"v": value})
        sizes.append((len(encoded) if not nesting_too_deep(encoded, MAX_DEPTH - 2) else 1 << 62, key))
    sizes.sort(reverse=True)
    total = len(canonical_json(dict(event_dict)))
    deep = nesting_too_deep(canonical_json(dict(event_dict)))
    truncated: list[str] = []
    for size, key in sizes:
        if total <= _LINE_BUDGET and not deep:
            break
        real = size if size < 1 << 62 else len(canonical_json({"v": event_dict[key]}))
        marker = _marker(event_dict[key], real)
        event_dict[key] = marker
        truncated.append(key)
        total = len(canonical_json(dict(event_dict)))
        deep = nesting_too_deep(canonical_json(dict(event_dict)))
    if total > _LINE_BUDGET or deep:  # thousands of small fields: keep the envelope only
        dropped = [k for k in event_dict if k not in _ENVELOPE_FIELDS]
        for key in dropped:
            del event_dict[key]
        truncated = dropped[:100] + ([f"... {len(dropped) - 100} more"] if len(dropped) > 100 else [])
    event_dict[TRUNCATED] = truncated
    return event_dict


class RecordRenderer:
    """One record -> its chained line, in one pass; built per (clock, redactor, settings).

    ``render(event_dict)`` takes the writer's own copy of a record (``str`` keys,
    ``seq`` and ``prev_hash`` set), completes and normalises it in place and
    returns ``(line, event_dict)`` with ``hash`` added. Pure apart from the clock.
    """

    __slots__ = ("_clock", "_redact", "_drop")

    def __init__(self, *, clock: Callable[[], float], redact: Redactor | None, log_content: bool) -> None:
        self._clock = clock
        self._redact = redact
        self._drop: tuple[str, ...] = () if log_content else CONTENT_FIELDS

    def render(self, event_dict: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        if event_dict.get(TS) is None:
            event_dict[TS] = format_ts(self._clock())
        event_dict[SCHEMA] = SCHEMA_VERSION
        for name in self._drop:
            if name in event_dict:
                del event_dict[name]
        event_dict.pop(HASH, None)
        layout = record_layout(event_dict)
        if layout is None:  # a key that is not a str (the writer converts them; a direct caller may not)
            return self._render_generic(event_dict)
        redact = self._redact
        nested = False
        parts: list[str] = []
        append = parts.append
        # scrub and encode in one pass, in canonical (sorted) key order; the encoding is
        # canonical_record's, so the hashed bytes are canonical_json's (tests/test_audit_fastrender.py)
        for key, prefix in layout:
            value = event_dict[key]
            cls = type(value)
            if cls is str:
                if not value.isascii() or (redact is not None and key not in HOST_GENERATED):
                    clean = _clean_text(value, redact)
                    if clean is not value:
                        event_dict[key] = value = clean
                append(prefix + _encode_str(value))
            elif value is None:
                append(prefix + "null")
            elif cls is int:
                append(prefix + _int_text(value))
            elif value is True:
                append(prefix + "true")
            elif value is False:
                append(prefix + "false")
            elif cls is float and value - value == 0.0:  # finite
                append(prefix + _float_text(value))
            else:  # containers, subclasses, non-finite floats, other objects: normalised first
                event_dict[key] = value = scrub_values(value, redact)
                nested = True
                append(prefix + _CANONICAL.encode(value))
        body = ("{" + ",".join(parts) + "}").encode("utf-8")
        digest = hashlib.sha256(body).hexdigest()
        line = body[:-1] + _HASH_KEY + digest.encode("ascii") + b'"}\n'  # render_line's layout
        if len(line) > MAX_LINE_BYTES or (nested and nesting_too_deep(line)):
            fit_record(event_dict)
            line, digest = render_line(event_dict)
        event_dict[HASH] = digest
        return line, event_dict

    def _render_generic(self, event_dict: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """The same steps for a record whose keys are not all ``str`` (rendered by ``canonical_json``)."""
        redact = self._redact
        for key, value in event_dict.items():
            cls = type(value)
            if cls is str:
                if value.isascii() and (redact is None or key in HOST_GENERATED):
                    continue
                event_dict[key] = _clean_text(value, redact)
            elif not (value is None or cls is int or cls is bool or (cls is float and value - value == 0.0)):
                event_dict[key] = scrub_values(value, redact)
        line, digest = render_line(event_dict)
        if len(line) > MAX_LINE_BYTES or nesting_too_deep(line):
            fit_record(event_dict)
            line, digest = render_line(event_dict)
        event_dict[HASH] = digest
        return line, event_dict
