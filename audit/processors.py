"""The writer's structlog processor chain: small functions, one concern each.

Order (see :func:`build_chain`): add the timestamp, stamp the schema version,
drop message content unless the operator opted in, redact and normalise every
value, then hash-chain and render the line. Each processor has structlog's
signature ``(logger, method_name, event_dict) -> event_dict``; the last one
returns ``((line,), {"record": event_dict})`` so the logger (the locked
appender) receives the finished bytes and the record it was made from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, MutableMapping
from datetime import datetime, timezone
from typing import Any

from audit.chain import MAX_DEPTH, MAX_LINE_BYTES, nesting_too_deep, render_line
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
)

#: fields whose values the host generates itself (ids, digests, enums): they can
#: carry no secret, so the redactor (the writer's largest cost) skips them
_HOST_GENERATED = frozenset({
    API, CALL_ID, DECISION, EVENT, KIND, MODE, OPERATION_NAME, PREV_HASH, PROMPT_SHA256,
    RESPONSE_SHA256, SCHEMA_SHA256, STATUS, TS, VALIDATION,
})

__all__ = [
    "Processor",
    "format_ts",
    "add_timestamp",
    "add_schema_version",
    "drop_content",
    "scrub",
    "scrub_values",
    "render_chained",
    "build_chain",
]

EventDict = MutableMapping[str, Any]
Processor = Callable[[Any, str, EventDict], Any]
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


def add_timestamp(clock: Callable[[], float]) -> Processor:
    """Processor setting ``ts`` from ``clock()`` (epoch seconds) unless the record has one."""

    def _add_timestamp(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
        if event_dict.get(TS) is None:
            event_dict[TS] = format_ts(clock())
        return event_dict

    return _add_timestamp


def add_schema_version(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
    """Stamp the record layout version (``schema: 1``)."""
    event_dict[SCHEMA] = SCHEMA_VERSION
    return event_dict


def drop_content(fields: Iterable[str] = CONTENT_FIELDS) -> Processor:
    """Processor removing message-content fields (used when ``log_content`` is off)."""
    names = tuple(fields)

    def _drop_content(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
        for name in names:
            event_dict.pop(name, None)
        return event_dict

    return _drop_content


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


def scrub(redact: Redactor | None) -> Processor:
    """Processor redacting and normalising every value (keys are field names, kept)."""

    def _scrub(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
        for key, value in event_dict.items():
            cls = type(value)
            if cls is str:
                if key in _HOST_GENERATED and value.isascii():
                    continue
                if redact is not None or not value.isascii():
                    event_dict[key] = _clean_text(value, redact)
            elif value is None or cls is int or cls is bool:
                continue
            else:
                event_dict[key] = scrub_values(value, redact)
        return event_dict

    return _scrub


#: the fields a record keeps whole however large it is (the writer's own, all short)
_ENVELOPE_FIELDS = frozenset({SCHEMA, "seq", PREV_HASH, TS, EVENT, KIND, CALL_ID, STATUS, "plugin_id"})
#: what a line may hold: what every reader accepts, less room for the marker
_LINE_BUDGET = MAX_LINE_BYTES - 64 * 1024
TRUNCATED = "audit_truncated"


def _marker(value: Any, size: int) -> str:
    import hashlib

    from audit.records import canonical_json

    digest = hashlib.sha256(canonical_json({"v": value})).hexdigest() if size <= 4 * MAX_LINE_BYTES else "-"
    return f"[truncated by the audit writer: {size} bytes of JSON, sha256 {digest} of {{\"v\": value}}]"


def fit_record(event_dict: EventDict) -> EventDict:
    """Shrink a record whose line no reader would accept (longer than
    :data:`audit.chain.MAX_LINE_BYTES`, nested deeper than :data:`audit.chain.MAX_DEPTH`).

    The largest non-envelope fields (message content first) are replaced by a
    marker naming their size and SHA-256 until the line fits; ``audit_truncated``
    lists them. The record itself is never dropped.
    """
    from audit.records import canonical_json

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


def render_chained(_logger: Any, _name: str, event_dict: EventDict) -> tuple[tuple[bytes], dict[str, Any]]:
    """Hash the record (which holds ``seq``/``prev_hash``) and render its line.

    A line no reader would accept (too long, nested too deep) is never written:
    the record is shrunk by :func:`fit_record` first.
    """
    event_dict.pop(HASH, None)
    line, digest = render_line(dict(event_dict))
    if len(line) > MAX_LINE_BYTES or nesting_too_deep(line):
        fit_record(event_dict)
        line, digest = render_line(dict(event_dict))
    event_dict[HASH] = digest
    return (line,), {"record": event_dict}


def build_chain(*, clock: Callable[[], float], redact: Redactor | None, log_content: bool) -> list[Processor]:
    """The processors in order; rebuilt when settings or the redactor change."""
    chain: list[Processor] = [add_timestamp(clock), add_schema_version]
    if not log_content:
        chain.append(drop_content())
    chain.append(scrub(redact))
    chain.append(render_chained)
    return chain
