"""A structured call's reply: parsed (the whole reply, one fenced block, or JSON in prose),
validated against the schema, and the messages that ask the model to repair it."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # jsonschema is imported when a schema is first checked: a refused call never needs it
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

from plugin_llm.structured.schema import compiled_validator, json_path, short_message

_MAX_REPAIR_ERRORS = 20  # errors listed in a repair prompt
_MAX_EMBEDDED_ATTEMPTS = 64  # bounds the prose scan on pathological replies


@dataclass(frozen=True)
class ParsedReply:
    """A model reply, parsed and checked against the schema.

    ``text`` is the raw reply; ``parsed`` the JSON value (``None`` when the
    reply held no JSON, then ``content_type == "text"``); ``errors`` the
    schema violations as ``"<json path>: <message>"``, sorted by path
    (empty when valid or when there is no schema).
    """

    text: str
    parsed: Any
    content_type: str
    errors: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        """True when the reply is JSON and satisfies the schema (if any)."""
        return self.content_type == "json" and not self.errors


def parse_reply(text: str | None, json_schema: dict | None) -> ParsedReply:
    """Parse a model reply and validate it against ``json_schema`` (never skipped when given).

    Tried in order: the whole reply; the reply without one surrounding
    markdown fence (```json ... ``` or ``` ... ```). Only if neither is JSON,
    the reply is treated as prose around JSON: fenced blocks inside it, then
    top-level ``{...}``/``[...]`` values in it, and the first candidate that
    satisfies the schema wins (the first candidate at all when none does or
    there is no schema). No JSON anywhere gives ``parsed=None,
    content_type="text"``. ``None`` is read as an empty reply. An invalid
    schema raises ``ValueError``.
    """
    raw = "" if text is None else text
    validator = compiled_validator(json_schema) if json_schema is not None else None
    stripped = raw.strip()
    for candidate in (stripped, _strip_surrounding_fence(stripped)):
        if candidate is not None:
            found, value = _loads(candidate)
            if found:
                return _json_reply(raw, value, validator)
    first: ParsedReply | None = None
    for value in _prose_candidates(stripped):
        reply = _json_reply(raw, value, validator)
        if reply.valid:
            return reply
        first = first or reply
    return first or ParsedReply(text=raw, parsed=None, content_type="text", errors=())


def _json_reply(raw: str, value: Any, validator: Validator | None) -> ParsedReply:
    errors = _validation_errors(validator, value) if validator is not None else ()
    return ParsedReply(text=raw, parsed=value, content_type="json", errors=errors)


_SURROUNDING_FENCE = re.compile(r"\A(?P<fence>`{3,}|~{3,})[ \t]*(?:[\w.+-]+[ \t]*)?\n(?P<body>.*?)\n?[ \t]*(?P=fence)\Z", re.S)
_SURROUNDING_FENCE_ONE_LINE = re.compile(r"\A(?P<fence>`{3,})(?:json\b)?(?P<body>.*?)(?P=fence)\Z", re.S | re.I)
_INNER_FENCE = re.compile(r"(?P<fence>`{3,}|~{3,})[ \t]*[\w.+-]*[ \t]*\n(?P<body>.*?)\n?[ \t]*(?P=fence)", re.S)


def _strip_surrounding_fence(text: str) -> str | None:
    """The body of a reply that is one fenced block (multi- or single-line), else ``None``."""
    match = _SURROUNDING_FENCE.match(text) or _SURROUNDING_FENCE_ONE_LINE.match(text)
    return match.group("body").strip() if match else None


def _prose_candidates(text: str) -> Iterator[Any]:
    """JSON values found inside prose: fenced blocks first, then top-level ``{...}``/``[...]``."""
    for match in _INNER_FENCE.finditer(text):
        found, value = _loads(match.group("body").strip())
        if found:
            yield value
    yield from _embedded_values(text)


def _reject_constant(name: str) -> Any:
    """NaN and Infinity are Python extensions, not JSON: refuse them."""
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _embedded_values(text: str) -> Iterator[Any]:
    """Top-level JSON objects/arrays embedded in ``text``, left to right.

    A decoded value's span is skipped, so values nested inside it are not
    offered as separate candidates. The scan is bounded for huge replies.
    """
    position, attempts = 0, 0
    while attempts < _MAX_EMBEDDED_ATTEMPTS:
        starts = [i for i in (text.find("{", position), text.find("[", position)) if i != -1]
        if not starts:
            return
        start = min(starts)
        attempts += 1
        try:
            value, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            position = start + 1
            continue
        yield value
        position = end


def _loads(text: str) -> tuple[bool, Any]:
    """``(True, value)`` if ``text`` is exactly one JSON value (NaN/Infinity refused), else ``(False, None)``."""
    if not text:
        return False, None
    try:
        return True, _DECODER.decode(text)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return False, None


def _validation_errors(validator: Validator, value: Any) -> tuple[str, ...]:
    """All schema violations of ``value`` as ``"<json path>: <message>"``, sorted by path then message."""
    import referencing.exceptions

    try:
        found = list(validator.iter_errors(value))
    except referencing.exceptions.Unresolvable as exc:
        raise ValueError(f"json_schema: a $ref cannot be resolved while validating: {exc}") from None
    except RecursionError:  # reported as a failure, never skipped
        return ("$: the value is nested too deeply to validate",)
    found.sort(key=lambda e: (_path_sort_key(e), e.message))
    rendered = (f"{json_path(e.absolute_path)}: {short_message(e.message)}" for e in found)
    return tuple(dict.fromkeys(rendered))  # dedupe, keep order


def _path_sort_key(error: ValidationError) -> tuple[tuple[int, int | str], ...]:
    # ints and strs do not compare: tag them so mixed paths still sort.
    return tuple((0, p) if isinstance(p, int) else (1, str(p)) for p in error.absolute_path)


def repair_messages(messages: list[dict[str, Any]], reply: ParsedReply) -> list[dict[str, Any]]:
    """A new message list asking the model to fix ``reply``; ``messages`` is not touched.

    It is a deep copy of ``messages``, then the reply as an assistant turn,
    then a user turn listing the schema errors (or saying the reply was not
    JSON) and asking for corrected JSON only. A valid reply has nothing to
    repair: ``ValueError``.
    """
    if reply.valid:
        raise ValueError("repair_messages: the reply is valid JSON for the schema; there is nothing to repair.")
    return [
        *copy.deepcopy(messages),
        # Some providers reject an empty assistant turn.
        {"role": "assistant", "content": reply.text if reply.text.strip() else "(empty reply)"},
        {"role": "user", "content": _repair_text(reply)},
    ]


def _repair_text(reply: ParsedReply) -> str:
    """The user turn of a repair: what was wrong and what to send instead."""
    ask = "Reply again with only the corrected JSON value: no prose, no explanations, no code fences."
    if reply.content_type != "json":
        return f"Your previous reply was not valid JSON.\n{ask}"
    listed = [f"- {e}" for e in reply.errors[:_MAX_REPAIR_ERRORS]]
    if len(reply.errors) > _MAX_REPAIR_ERRORS:
        listed.append(f"- ... and {len(reply.errors) - _MAX_REPAIR_ERRORS} more")
    return (
        "Your previous reply is JSON but does not match the required JSON Schema. Validation errors:\n"
        + "\n".join(listed)
        + f"\n{ask}"
    )
