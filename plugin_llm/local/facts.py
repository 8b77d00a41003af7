"""The ``key: value`` facts of the user messages, which the local model's answers are filled from.

Also the schema pasted into a prompt (``JSON Schema: {...}``) and the repair turns that follow a
reply that did not validate (never a source of facts).
"""

from __future__ import annotations

import json
import re


_FACT_RE = re.compile(
    r"^\s*(?:[-*\u2022>]+\s*|\d+[.)]\s+)?"  # optional bullet / numbering
    r"(?P<key>[A-Za-z][\w \-/().#&']{0,60}?)\s*:"
    r"(?:\s+(?P<value>.*?)|)\s*$"
)
_FACT_SPLIT_RE = re.compile(r"\s*[;,|]\s*(?=[A-Za-z][\w \-/]{0,40}?:\s)")
_BULLET_RE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(?P<item>.+?)\s*$")
_SCHEMA_MARKER_RE = re.compile(r"JSON\s+Schema\s*:", re.I)
_REPAIR_RE = re.compile(
    r"\b(?:previous|last|your|the)\s+(?:reply|response|answer|output|json)\b[^\n]{0,120}?"
    r"\b(?:invalid|not valid|did not|does not|doesn't|didn't|failed|fails|error)"
    r"|\b(?:invalid json|validation error|validation failed|failed validation|did not validate"
    r"|does not validate|not valid json|schema error)\b",
    re.I,
)


def _norm_key(key: str) -> str:
    return re.sub(r"[\s_\-]+", "", key).lower()


def _snake(key: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", key.lower()).strip("_")


def _clean_value(value: str) -> str:
    value = value.strip().rstrip(",;").strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
        value = value[1:-1]
    return value


def extract_facts(text: str) -> dict[str, tuple[str, str | list[str]]]:
    """``key: value`` facts in ``text`` -> ``{normalised_key: (key, value)}``.

    One fact per line (``Vendor: ACME``), or several on a line separated by
    ``;``, ``,`` or ``|`` when each starts with ``Key:`` (``Vendor: ACME,
    Total: 12``). Keys start with a letter and have at most six words. A key
    with an empty value followed by bullet lines (``- a``) gets the list of
    bullets. ``**bold**`` markers are ignored. The first occurrence of a key
    wins; normalised keys are lower case without spaces, ``_`` or ``-``.
    """
    facts: dict[str, tuple[str, str | list[str]]] = {}
    lines = text.replace("**", "").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        for segment in _FACT_SPLIT_RE.split(line):
            m = _FACT_RE.match(segment)
            if not m:
                continue
            key = m.group("key").strip()
            if len(key.split()) > 6:
                continue
            value: str | list[str] = _clean_value(m.group("value") or "")
            if value == "":
                items = []
                while i < len(lines) and (b := _BULLET_RE.match(lines[i])):
                    items.append(_clean_value(b.group("item")))
                    i += 1
                if not items:
                    continue
                value = items
            facts.setdefault(_norm_key(key), (key, value))
    return facts


def _find_schema_in_text(text: str) -> tuple[dict, tuple[int, int]] | None:
    """The JSON object after the last ``JSON Schema:`` marker, with its span."""
    decoder = json.JSONDecoder()
    for m in reversed(list(_SCHEMA_MARKER_RE.finditer(text))):
        start = text.find("{", m.end())
        if start < 0:
            continue
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj, (m.start(), end)
    return None
