"""The embedded ``local`` model: an offline, deterministic stand-in.

This is **not a language model**. It is a small rule-based responder that speaks the OpenAI
``chat.completion`` format so that the gateway, the demo and the tests work on a fresh machine
with no key and no network. It is pure: stdlib only, no network, no randomness, no clock; the
same request always yields the same reply (byte for byte).

It answers, in order of precedence: **tool calls** when an offered tool is asked for
(``call <tool> [with {json}]``, ``use the <tool> tool [with name=value, ...]``); **structured
output** for ``response_format`` (an instance that validates, filled from ``key: value`` facts of
the user messages, see :func:`extract_facts`); **tool results** (``Tool <name> returned: ...``);
else a **chat** echo or a one-sentence summary. ``max_tokens`` truncates with
``finish_reason="length"``; usage comes from a deterministic tokenizer (``\\w+|[^\\w\\s]``).
Every rule in full: docs/design.md, "The local model".
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from typing import Any

__all__ = ["LOCAL_MODEL", "IMAGE_TOKENS", "generate", "count_tokens", "extract_facts", "stream_pieces"]

#: The model name the local model reports, whatever alias was requested.
LOCAL_MODEL = "local-echo-1"
#: Fixed prompt-token cost of one image part.
IMAGE_TOKENS = 85

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_MAX_DEPTH = 16
_QUOTE_CHARS = 200


# --------------------------------------------------------------------------- tokens


def count_tokens(text: str) -> int:
    """Number of tokens in ``text``: word runs and single punctuation marks."""
    return len(_TOKEN_RE.findall(text)) if text else 0


def stream_pieces(text: str, words: int = 4) -> list[str]:
    """``text`` as the deltas of a streamed reply: pieces of ``words`` words, whitespace kept.

    ``"".join(stream_pieces(t)) == t`` for every text; the in-process ``local``
    provider and ``plugin-llm serve-local`` stream the same pieces.
    """
    if not text:
        return []
    spaced = re.split(r"(?<=\s)(?=\S)", text)  # words with their trailing whitespace
    return ["".join(spaced[i:i + words]) for i in range(0, len(spaced), words)]


def _truncate(text: str, max_tokens: int) -> tuple[str, int, bool]:
    """``text`` cut after its ``max_tokens``-th token -> (text, tokens, truncated)."""
    ends = [m.end() for m in _TOKEN_RE.finditer(text)]
    if len(ends) <= max_tokens:
        return text, len(ends), False
    return text[: ends[max_tokens - 1]], max_tokens, True


# --------------------------------------------------------------------------- messages


def _msg(m: Any) -> dict:
    """A message as a plain dict (accepts pydantic-like message objects)."""
    if isinstance(m, dict):
        return m
    dump = getattr(m, "model_dump", None)
    if callable(dump):
        try:
            return dump()
        except Exception:  # pragma: no cover - defensive
            pass
    return {k: getattr(m, k, None) for k in ("role", "content", "name", "tool_calls", "tool_call_id")}


def _content(content: Any) -> tuple[str, int]:
    """(text, number of images) of a message ``content`` (string or list of parts)."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, (list, tuple)):
        return str(content), 0
    texts: list[str] = []
    images = 0
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("image_url", "input_image", "image"):
            images += 1
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n".join(texts), images


def _tool_calls_text(message: dict) -> str:
    parts = []
    for call in message.get("tool_calls") or []:
        call = _msg(call)
        fn = _msg(call.get("function") or {})
        parts.append(f"{fn.get('name') or ''} {fn.get('arguments') or ''}")
    return "\n".join(parts)


def _prompt_tokens(messages: list[dict], tools: list | None) -> int:
    total = 0
    for m in messages:
        text, images = _content(m.get("content"))
        total += count_tokens(text) + IMAGE_TOKENS * images + count_tokens(_tool_calls_text(m))
    if tools:
        total += count_tokens(json.dumps(tools, sort_keys=True, default=str))
    return total


# --------------------------------------------------------------------------- facts

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


# --------------------------------------------------------------------------- scalar coercion

_NUM_RE = re.compile(r"\d[\d,.' \u00a0]*\d|\d")
_TRUE = {"yes", "y", "true", "t", "1", "on", "checked", "enabled", "ok"}
_FALSE = {"no", "n", "false", "f", "0", "off", "unchecked", "disabled", "none"}
_NULL = {"null", "none", "n/a", "na", "-", "", "nil"}

_FORMAT_DEFAULTS = {
    "date": "1970-01-01",
    "date-time": "1970-01-01T00:00:00Z",
    "time": "00:00:00Z",
    "email": "user@example.com",
    "idn-email": "user@example.com",
    "uri": "https://example.com",
    "iri": "https://example.com",
    "uri-reference": "https://example.com",
    "iri-reference": "https://example.com",
    "url": "https://example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "duration": "P0D",
}
_DATE_FORMATS = (
    "%Y-%m-%d", "%Y/%m/%d", "%Y.%m.%d", "%B %d, %Y", "%B %d %Y", "%b %d, %Y", "%b %d %Y",
    "%d %B %Y", "%d %b %Y", "%d %B, %Y", "%d %b, %Y",
)
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATETIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:[Zz]|[+-]\d{2}:?\d{2})?$")
_TIME_RE = re.compile(r"^\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$")
_EMAIL_RE = re.compile(r"[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+")
_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:[^\s]+$")
_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_IPV4_RE = re.compile(r"^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$")
_HOST_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?)*$")


def _parse_number(text: str) -> float | None:
    """``"$1,200.50"``, ``"12,50 EUR"``, ``"(3)"``, ``"15%"`` -> float, else None."""
    s = text.strip()
    m = _NUM_RE.search(s)
    if not m:
        return None
    digits = re.sub(r"[' \u00a0]", "", m.group(0))
    if "," in digits and "." in digits:
        if digits.rfind(",") > digits.rfind("."):
            digits = digits.replace(".", "").replace(",", ".")
        else:
            digits = digits.replace(",", "")
    elif "," in digits:
        if re.fullmatch(r"\d{1,3}(,\d{3})+", digits):
            digits = digits.replace(",", "")
        elif digits.count(",") == 1:
            digits = digits.replace(",", ".")
        else:
            return None
    elif digits.count(".") > 1:
        if re.fullmatch(r"\d{1,3}(\.\d{3})+", digits):
            digits = digits.replace(".", "")
        else:
            return None
    try:
        value = float(digits)
    except ValueError:
        return None
    prefix = s[: m.start()]
    if prefix.rstrip().endswith(("-", "\u2212", "(")):
        value = -value
    return value


def _coerce_date(text: str) -> str | None:
    s = text.strip()
    m = re.match(r"(\d{4})-(\d{1,2})-(\d{1,2})", s)
    if m:
        try:
            return _dt.date(int(m[1]), int(m[2]), int(m[3])).isoformat()
        except ValueError:
            return None
    s = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", s)
    for fmt in _DATE_FORMATS:
        try:
            return _dt.datetime.strptime(s, fmt).date().isoformat()
        except ValueError:
            pass
    m = re.fullmatch(r"(\d{1,2})[/.](\d{1,2})[/.](\d{4})", s)
    if m:  # month first unless the first number cannot be a month
        a, b, y = int(m[1]), int(m[2]), int(m[3])
        month, day = (b, a) if a > 12 else (a, b)
        try:
            return _dt.date(y, month, day).isoformat()
        except ValueError:
            return None
    return None


def _coerce_datetime(text: str) -> str | None:
    s = text.strip()
    m = re.match(r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2})(:\d{2}(?:\.\d+)?)?\s*([Zz]|[+-]\d{2}:?\d{2})?$", s)
    if m:
        tz = m[4] or "Z"
        if tz not in ("Z", "z") and ":" not in tz:
            tz = tz[:3] + ":" + tz[3:]
        return f"{m[1]}T{m[2]}{m[3] or ':00'}{tz.upper()}"
    date = _coerce_date(s)
    return f"{date}T00:00:00Z" if date else None


def _format_ok(value: str, fmt: str | None) -> bool:
    if not fmt:
        return True
    if fmt == "date":
        return bool(_DATE_RE.match(value)) and _coerce_date(value) == value
    if fmt == "date-time":
        return bool(_DATETIME_RE.match(value)) and "T" in value.upper() and value[-1:] in "Zz0123456789"
    if fmt == "time":
        return bool(_TIME_RE.match(value))
    if fmt in ("email", "idn-email"):
        return bool(_EMAIL_RE.fullmatch(value))
    if fmt in ("uri", "iri", "url"):
        return bool(_URI_RE.match(value))
    if fmt == "uuid":
        return bool(_UUID_RE.match(value))
    if fmt == "ipv4":
        return bool(_IPV4_RE.match(value))
    if fmt in ("hostname", "idn-hostname"):
        return bool(_HOST_RE.match(value))
    return True


def _coerce_format(value: str, fmt: str | None) -> str:
    if fmt == "date":
        return _coerce_date(value) or value
    if fmt == "date-time":
        return _coerce_datetime(value) or value
    if fmt in ("email", "idn-email"):
        m = _EMAIL_RE.search(value)
        return m.group(0) if m else value
    if fmt in ("uri", "iri", "url"):
        m = re.search(r"[A-Za-z][A-Za-z0-9+.\-]*://\S+", value)
        if m:
            return m.group(0).rstrip(".,;)")
        if re.fullmatch(r"[\w\-]+(\.[\w\-]+)+(/\S*)?", value.strip()):
            return "https://" + value.strip()
    return value


def _string_ok(value: str, schema: dict) -> bool:
    if len(value) < int(schema.get("minLength", 0)):
        return False
    if "maxLength" in schema and len(value) > int(schema["maxLength"]):
        return False
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            if not re.search(pattern, value):
                return False
        except re.error:
            pass
    return _format_ok(value, schema.get("format"))


def _number_ok(value: float, schema: dict) -> bool:
    if "minimum" in schema and value < schema["minimum"]:
        return False
    if "maximum" in schema and value > schema["maximum"]:
        return False
    ex_min, ex_max = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if ex_min is True and "minimum" in schema and value <= schema["minimum"]:  # draft 4
        return False
    if ex_max is True and "maximum" in schema and value >= schema["maximum"]:
        return False
    if isinstance(ex_min, (int, float)) and not isinstance(ex_min, bool) and value <= ex_min:
        return False
    if isinstance(ex_max, (int, float)) and not isinstance(ex_max, bool) and value >= ex_max:
        return False
    step = schema.get("multipleOf")
    if isinstance(step, (int, float)) and step > 0:
        q = value / step
        if abs(q - round(q)) > 1e-9:
            return False
    return True


def _pattern_example(pattern: str) -> str | None:
    """A short string matching ``pattern`` built from its parse tree, or None."""
    try:
        import re._parser as sre_parse  # Python 3.11+
    except ImportError:  # pragma: no cover
        import sre_parse  # type: ignore[no-redef]
    try:
        tree = sre_parse.parse(pattern)
    except Exception:
        return None

    cats = {
        "CATEGORY_DIGIT": "0", "CATEGORY_NOT_DIGIT": "a", "CATEGORY_SPACE": " ",
        "CATEGORY_NOT_SPACE": "a", "CATEGORY_WORD": "a", "CATEGORY_NOT_WORD": "-",
    }

    def in_set(items: list) -> str:
        negate = any(op.name == "NEGATE" for op, _ in items)
        if not negate:
            for op, av in items:
                if op.name == "LITERAL":
                    return chr(av)
                if op.name == "RANGE":
                    return chr(av[0])
                if op.name == "CATEGORY":
                    return cats.get(av.name, "a")
            return "a"
        for cand in "a0A_- .x":
            if not any(
                (op.name == "LITERAL" and ord(cand) == av)
                or (op.name == "RANGE" and av[0] <= ord(cand) <= av[1])
                or (op.name == "CATEGORY" and re.fullmatch({"CATEGORY_DIGIT": r"\d", "CATEGORY_NOT_DIGIT": r"\D",
                    "CATEGORY_SPACE": r"\s", "CATEGORY_NOT_SPACE": r"\S", "CATEGORY_WORD": r"\w",
                    "CATEGORY_NOT_WORD": r"\W"}.get(av.name, r"(?!)"), cand))
                for op, av in items
            ):
                return cand
        return "~"

    def gen(items: Any, groups: dict[int, str]) -> str:
        out = []
        for op, av in items:
            name = op.name
            if name == "LITERAL":
                out.append(chr(av))
            elif name == "NOT_LITERAL":
                out.append("a" if av != ord("a") else "b")
            elif name == "ANY":
                out.append("a")
            elif name == "IN":
                out.append(in_set(av))
            elif name == "BRANCH":
                out.append(gen(av[1][0], groups))
            elif name == "SUBPATTERN":
                text = gen(av[-1], groups)
                if av[0]:
                    groups[av[0]] = text
                out.append(text)
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                out.append("".join(gen(av[2], groups) for _ in range(av[0])))
            elif name == "ATOMIC_GROUP":
                out.append(gen(av, groups))
            elif name == "GROUPREF":
                out.append(groups.get(av, ""))
            elif name == "CATEGORY":
                out.append(cats.get(av.name, "a"))
            elif name in ("AT", "ASSERT", "ASSERT_NOT"):
                continue
            else:
                raise ValueError(name)
        return "".join(out)

    try:
        return gen(tree, {})
    except Exception:
        return None


# --------------------------------------------------------------------------- schema instances


class _Instance:
    """Builds a JSON value valid for a schema, filled from facts where possible."""

    def __init__(self, root: Any, facts: dict[str, tuple[str, str | list[str]]]) -> None:
        self.root = root
        self.facts = facts

    # -- schema plumbing

    def _resolve(self, schema: Any, depth: int) -> Any:
        """Follow local ``$ref`` and merge ``allOf``; returns a dict (or bool)."""
        for _ in range(_MAX_DEPTH):
            if not isinstance(schema, dict) or "$ref" not in schema:
                break
            target = self._pointer(schema["$ref"])
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest} if isinstance(target, dict) else (target if not rest else rest)
        if isinstance(schema, dict) and isinstance(schema.get("allOf"), list):
            merged: dict = {k: v for k, v in schema.items() if k != "allOf"}
            for sub in schema["allOf"]:
                sub = self._resolve(sub, depth + 1)
                if not isinstance(sub, dict):
                    continue
                for k, v in sub.items():
                    if k == "properties":
                        merged["properties"] = {**v, **merged.get("properties", {})}
                    elif k == "required":
                        merged["required"] = list(dict.fromkeys([*merged.get("required", []), *v]))
                    else:
                        merged.setdefault(k, v)
            schema = merged
        return schema

    def _pointer(self, ref: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return {}
        node = self.root
        for raw in ref[1:].split("/"):
            if raw == "":
                continue
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return {}
        return node

    @staticmethod
    def _types(schema: dict) -> list[str]:
        t = schema.get("type")
        if isinstance(t, str):
            return [t]
        if isinstance(t, list) and t:
            return [x for x in t if isinstance(x, str)]
        if "properties" in schema or "required" in schema or "additionalProperties" in schema:
            return ["object"]
        if "items" in schema or "prefixItems" in schema or "minItems" in schema:
            return ["array"]
        if any(k in schema for k in ("minLength", "maxLength", "pattern", "format")):
            return ["string"]
        if any(k in schema for k in ("minimum", "maximum", "multipleOf", "exclusiveMinimum", "exclusiveMaximum")):
            return ["number"]
        return []

    def _fact(self, path: list[str], schema: dict) -> str | list[str] | None:
        if not path:
            return None
        candidates = [_norm_key("".join(path)), _norm_key(path[-1])]
        if isinstance(schema.get("title"), str):
            candidates.append(_norm_key(schema["title"]))
        for key in candidates:
            if key in self.facts:
                return self.facts[key][1]
        return None

    # -- coercion of one fact to a schema (None when it does not fit)

    def coerce(self, fact: str | list[str], schema: Any, depth: int = 0) -> tuple[bool, Any]:
        schema = self._resolve(schema, depth)
        if schema is True or schema == {}:
            return True, fact
        if not isinstance(schema, dict):
            return False, None
        if "const" in schema:
            return (_same(fact, schema["const"]), schema["const"])
        if isinstance(schema.get("enum"), list):
            for option in schema["enum"]:
                if _same(fact, option):
                    return True, option
            return False, None
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                base = {k: v for k, v in schema.items() if k != key}
                for branch in schema[key]:
                    branch = self._resolve(branch, depth + 1)
                    ok, value = self.coerce(fact, {**base, **branch} if isinstance(branch, dict) else branch, depth + 1)
                    if ok:
                        return True, value
                return False, None
        for t in self._types(schema) or ["string"]:
            ok, value = self._coerce_type(fact, t, schema, depth)
            if ok:
                return True, value
        return False, None

    def _coerce_type(self, fact: str | list[str], t: str, schema: dict, depth: int) -> tuple[bool, Any]:
        if t == "array":
            items = fact if isinstance(fact, list) else [p for p in re.split(r"\s*(?:[,;]|\band\b)\s*", fact) if p]
            out = []
            for item in items:
                ok, value = self.coerce(item, schema.get("items", {}), depth + 1)
                if ok and not (schema.get("uniqueItems") and value in out):
                    out.append(value)
            if "maxItems" in schema:
                out = out[: int(schema["maxItems"])]
            if not out or len(out) < int(schema.get("minItems", 0)):
                return False, None
            return True, out
        if isinstance(fact, list):
            if t != "string":
                return False, None
            fact = ", ".join(fact)
        text = fact.strip()
        if t == "string":
            value = _coerce_format(text, schema.get("format"))
            return _string_ok(value, schema), value
        if t in ("number", "integer"):
            num = _parse_number(text)
            if num is None:
                return False, None
            if t == "integer":
                if not num.is_integer():
                    return False, None
                value: Any = int(num)
            else:
                value = float(num)
            return _number_ok(value, schema), value
        if t == "boolean":
            low = text.lower().rstrip(".!")
            if low in _TRUE:
                return True, True
            if low in _FALSE:
                return True, False
            return False, None
        if t == "null":
            return (text.lower() in _NULL), None
        return False, None

    # -- instance generation

    def value(self, schema: Any, path: list[str], depth: int = 0) -> Any:
        schema = self._resolve(schema, depth)
        if not isinstance(schema, dict):
            fact = self._fact(path, {}) if schema is True else None
            return fact
        fact = self._fact(path, schema)
        if fact is not None:
            ok, value = self.coerce(fact, schema, depth)
            if ok:
                return value
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                base = {k: v for k, v in schema.items() if k != key}
                branches = [self._resolve(b, depth + 1) for b in schema[key]]
                if any(isinstance(b, dict) and self._types(b) == ["null"] for b in branches):
                    return None  # an optional value with no usable fact: null, not an invention
                branch = branches[0]
                merged = {**base, **branch} if isinstance(branch, dict) else branch
                return self.value(merged, path, depth + 1)
        if "default" in schema:
            return schema["default"]
        types = self._types(schema)
        if not types:
            return fact if isinstance(fact, str) else None
        if "null" in types and (len(types) == 1 or fact is None):
            return None
        t = next(x for x in types if x != "null")
        if depth >= _MAX_DEPTH:  # runaway recursive schema: stop as small as possible
            return {"object": {}, "array": [], "string": "", "boolean": False}.get(t, 0)
        if t == "object":
            return self._object(schema, path, depth)
        if t == "array":
            return self._array(schema, path, depth)
        return self.default_scalar(t, schema)

    def _object(self, schema: dict, path: list[str], depth: int) -> dict:
        out: dict[str, Any] = {}
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for name, sub in props.items():
            out[name] = self.value(sub, [*path, name], depth + 1)
        extra = schema.get("additionalProperties", {})
        extra = extra if isinstance(extra, dict) else {}
        for name in schema.get("required", []) or []:
            if name not in out:
                out[name] = self.value(extra, [*path, name], depth + 1)
        n = 0
        while len(out) < int(schema.get("minProperties", 0)) and schema.get("additionalProperties", True) is not False:
            n += 1
            out.setdefault(f"field_{n}", self.value(extra, [*path, f"field_{n}"], depth + 1))
        return out

    def _array(self, schema: dict, path: list[str], depth: int) -> list:
        prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
        items = schema.get("items", {})
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, schema.get("additionalItems", {})
        out = [self.value(sub, [], depth + 1) for sub in prefix]
        minimum = int(schema.get("minItems", 0))
        i = 0
        while len(out) < minimum and i < minimum + 10:
            candidate = self._variant(items, i, depth)
            if not (schema.get("uniqueItems") and candidate in out):
                out.append(candidate)
            i += 1
        return out

    def _variant(self, schema: Any, i: int, depth: int) -> Any:
        """The i-th default item (different items for ``uniqueItems``)."""
        base = self.value(schema, [], depth + 1)
        if i == 0 and base != "":
            return base
        resolved = self._resolve(schema, depth + 1)
        if isinstance(resolved, dict):
            if isinstance(resolved.get("enum"), list) and resolved["enum"]:
                return resolved["enum"][i % len(resolved["enum"])]
            if isinstance(base, bool):
                return [False, True][i % 2]
            if isinstance(base, (int, float)):
                step = resolved.get("multipleOf", 1)
                cand = base + step * i
                return cand if _number_ok(cand, resolved) else base
            if isinstance(base, str):
                cand = f"{base}{i}" if base else f"item{i + 1}"
                return cand if _string_ok(cand, resolved) else base
        return base

    def default_scalar(self, t: str, schema: dict) -> Any:
        if t == "boolean":
            return False
        if t in ("number", "integer"):
            for cand in self._number_candidates(schema, t == "integer"):
                if _number_ok(cand, schema):
                    return int(cand) if t == "integer" else float(cand)
            return int(schema.get("minimum", 0)) if t == "integer" else float(schema.get("minimum", 0))
        if t == "string":
            fmt = schema.get("format")
            candidates = [_FORMAT_DEFAULTS.get(fmt, "")] if fmt else []
            if isinstance(schema.get("pattern"), str):
                example = _pattern_example(schema["pattern"])
                if example is not None:
                    candidates.append(example)
            min_len = int(schema.get("minLength", 0))
            candidates += ["", "x" * min_len]
            if fmt in _FORMAT_DEFAULTS:
                candidates.append(_FORMAT_DEFAULTS[fmt].rjust(min_len, "x"))
            for cand in candidates:
                if _string_ok(cand, schema):
                    return cand
            return candidates[0]
        return None

    @staticmethod
    def _number_candidates(schema: dict, integer: bool) -> list[float]:
        lo = schema.get("minimum")
        hi = schema.get("maximum")
        ex_lo = schema.get("exclusiveMinimum")
        ex_hi = schema.get("exclusiveMaximum")
        if isinstance(ex_lo, bool):
            ex_lo = lo if ex_lo else None
        if isinstance(ex_hi, bool):
            ex_hi = hi if ex_hi else None
        step = schema.get("multipleOf") if isinstance(schema.get("multipleOf"), (int, float)) else None
        if integer:
            step = step if step and float(step).is_integer() else (step or 1)
        cands: list[float] = [0]
        if lo is not None:
            cands.append(lo)
        if ex_lo is not None:
            cands.append(ex_lo + (step or 1))
            if ex_hi is not None:
                cands.append((ex_lo + ex_hi) / 2)
        if hi is not None:
            cands.append(hi)
        if ex_hi is not None:
            cands.append(ex_hi - (step or 1))
        out: list[float] = []
        for c in cands:
            if integer:
                c = float(int(c)) if float(c).is_integer() else float(int(c) + (1 if c > 0 else 0))
            if step:  # round up to a multiple of the step
                k = -(-c // step)
                c = k * step
            out.append(c)
        return out


def _same(fact: Any, option: Any) -> bool:
    if isinstance(fact, list):
        return option == fact
    text = str(fact).strip()
    if isinstance(option, bool) or option is None:
        return text.lower() == json.dumps(option)
    if isinstance(option, (int, float)):
        num = _parse_number(text)
        return num is not None and num == option and not re.search(r"[A-Za-z]{2,}", text)
    if isinstance(option, str):
        return _norm_key(option) == _norm_key(text)
    return False


def _schema_of(response_format: Any) -> dict | None:
    """The JSON Schema carried by a ``json_schema`` response format."""
    if hasattr(response_format, "model_json_schema"):
        try:
            return response_format.model_json_schema()
        except Exception:  # pragma: no cover - defensive
            return None
    if not isinstance(response_format, dict):
        return None
    spec = response_format.get("json_schema")
    if isinstance(spec, dict):
        if isinstance(spec.get("schema"), (dict, bool)):
            return spec["schema"] if isinstance(spec["schema"], dict) else {}
        if "type" in spec or "properties" in spec:
            return spec
    if isinstance(response_format.get("schema"), dict):
        return response_format["schema"]
    return {}


# --------------------------------------------------------------------------- tools

_KV_RE = re.compile(
    r"""\s*(?:and\s+)?(?P<k>[A-Za-z_][\w\-]*)\s*[=:]\s*"""
    r"""(?P<v>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\[[^\]]*\]|\{[^}]*\}|.*?)"""
    r"""\s*(?:[,;]|\band\b|$)"""
)


def _tool_specs(tools: list | None) -> dict[str, dict]:
    """Offered function tools: ``{lower_name: {"name", "parameters"}}``."""
    out: dict[str, dict] = {}
    for tool in tools or []:
        tool = _msg(tool)
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = fn.get("name")
        if isinstance(name, str) and name:
            params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
            out.setdefault(name.lower(), {"name": name, "parameters": params})
    return out


def _parse_kv_args(text: str, params: dict, gen: _Instance) -> dict:
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    lowered = {k.lower(): k for k in props}
    args: dict[str, Any] = {}
    pos = 0
    text = text.strip()
    if text.endswith("."):
        text = text[:-1]
    while pos < len(text):
        m = _KV_RE.match(text, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        key, raw = m.group("k"), m.group("v").strip()
        key = lowered.get(key.lower(), key)
        value: Any
        if raw[:1] in "\"'" and len(raw) >= 2 and raw[-1] == raw[0]:
            value = raw[1:-1]
        elif raw[:1] in "[{":
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw.strip("[]{}")
        else:
            value = raw
        if key in props and isinstance(value, str):
            ok, coerced = gen.coerce(value, props[key])
            value = coerced if ok else value
        args[key] = value
    return args


def _tool_requests(text: str, specs: dict[str, dict], facts: dict) -> list[tuple[str, dict]]:
    """Tool requests recognised in ``text`` (see the module docstring)."""
    if not specs or not text:
        return []
    names = "|".join(re.escape(s["name"]) for s in sorted(specs.values(), key=lambda s: -len(s["name"])))
    pattern = re.compile(
        rf"\b(?P<verb>call|invoke|run|use)\s+(?:the\s+)?[`'\"]?(?P<name>{names})[`'\"]?(?![\w\-])"
        rf"(?P<tool>\s+(?:tool|function))?(?:\s*\(\s*\))?(?P<with>\s+with\b)?",
        re.I,
    )
    decoder = json.JSONDecoder()
    found: list[tuple[str, dict]] = []
    for m in pattern.finditer(text):
        if m.group("verb").lower() == "use" and not (m.group("tool") or m.group("with")):
            continue
        spec = specs[m.group("name").lower()]
        args: dict = {}
        if m.group("with"):
            rest = text[m.end():]
            stripped = rest.lstrip()
            if stripped.startswith("{"):
                try:
                    obj, _ = decoder.raw_decode(stripped)
                    args = obj if isinstance(obj, dict) else {}
                except ValueError:
                    args = {}
            else:
                args = _parse_kv_args(rest.split("\n", 1)[0], spec["parameters"], _Instance(spec["parameters"], facts))
        found.append((spec["name"], args))
    return found


def _forced_tool(tool_choice: Any, specs: dict[str, dict]) -> tuple[str | None, bool]:
    """(name the call must use or None, whether some tool call is required)."""
    if isinstance(tool_choice, str):
        return None, tool_choice.lower() in ("required", "any")
    choice = _msg(tool_choice) if tool_choice is not None else {}
    fn = choice.get("function") if isinstance(choice.get("function"), dict) else choice
    name = fn.get("name") if isinstance(fn, dict) else None
    if isinstance(name, str) and name.lower() in specs:
        return specs[name.lower()]["name"], True
    return None, False


# --------------------------------------------------------------------------- chat replies

_SUMMARY_RE = re.compile(r"\b(?:summari[sz]e|summary|tl;\s?dr|tldr)\b", re.I)
_SENTENCE_RE = re.compile(r".+?(?:[.!?](?=\s|$)|$)", re.S)


def _sentences(text: str) -> list[str]:
    flat = " ".join(text.split())
    return [s.strip() for s in _SENTENCE_RE.findall(flat) if s.strip()]


def _chat_reply(text: str, images: int) -> str:
    m = _SUMMARY_RE.search(text)
    if m:
        rest = text[m.end():]
        cut = [i for i in (rest.find(":"), rest.find("\n")) if i >= 0]
        source = rest[min(cut) + 1:] if cut else ""
        if not source.strip():
            source = " ".join(s for s in _sentences(text) if not _SUMMARY_RE.search(s))
        sentences = _sentences(source)
        if sentences:
            return sentences[0]
    flat = " ".join(text.split())
    quoted = flat if len(flat) <= _QUOTE_CHARS else flat[:_QUOTE_CHARS].rstrip() + "\u2026"
    words = len(flat.split())
    extra = f", {images} image{'s' if images != 1 else ''}" if images else ""
    return f'Local model reply to: "{quoted}" ({words} word{"s" if words != 1 else ""}{extra})'


def _tool_results_reply(messages: list[dict]) -> str | None:
    trailing: list[dict] = []
    for m in reversed(messages):
        if m.get("role") in ("tool", "function"):
            trailing.append(m)
        else:
            break
    if not trailing:
        return None
    names: dict[str, str] = {}
    for m in messages:
        for call in m.get("tool_calls") or []:
            call = _msg(call)
            fn = _msg(call.get("function") or {})
            if call.get("id"):
                names[call["id"]] = fn.get("name") or "tool"
    lines = []
    for m in reversed(trailing):
        name = m.get("name") or names.get(m.get("tool_call_id") or "", "tool")
        text, _ = _content(m.get("content"))
        lines.append(f"Tool {name} returned: {text}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- generate


def _sha(data: Any) -> str:
    raw = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


#: Installed by :mod:`plugin_llm.testing` (``replies=``): ``script(messages) -> str | dict | None``; a str
#: is the reply's text (no rule below applies), None falls through to the rules, a dict is a scripted turn
#: (:func:`_scripted_turn`). Empty in normal use.
_SCRIPT: list[Any] = []
#: the key of a completion that carries a scripted stream (``pieces``, ``error``): the in-process
#: provider pops it (:mod:`plugin_llm.transport._loading`); never in a reply otherwise
SCRIPTED_STREAM = "_scripted_stream"


def _scripted_turn(turn: dict, request_hash: str) -> tuple[str | None, list[dict] | None, dict | None]:
    """(text, tool calls, stream) of a scripted turn: ``{"content": str}``, ``{"tool_calls": [{"name",
    "arguments"}]}``, ``{"pieces": [str], "error": exc}`` (a stream, then the error if any) or
    ``{"error": exc}`` (raised here: the attempt fails as the provider's would)."""
    pieces, error = turn.get("pieces"), turn.get("error")
    if error is not None and not pieces:
        raise error
    calls = turn.get("tool_calls")
    if calls:
        return None, [{"id": "call_" + _sha([request_hash, i, c["name"]])[:24], "type": "function",
                       "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments") or {},
                                                                               ensure_ascii=False)}}
                      for i, c in enumerate(calls)], None
    if pieces:
        return "".join(pieces), None, {"pieces": list(pieces), "error": error}
    return str(turn.get("content") or ""), None, None


def generate(
    messages: list[dict],
    *,
    model: str | None = None,
    response_format: dict | None = None,
    tools: list[dict] | None = None,
    tool_choice: Any = None,
    max_tokens: int | None = None,
    created: int = 0,
    **ignored: Any,
) -> dict:
    """Answer one chat request deterministically; returns a ``chat.completion`` dict.

    ``model`` is accepted (any alias) but the reply always reports
    :data:`LOCAL_MODEL`. ``created`` is the timestamp to report (default 0, so
    replies are byte-for-byte reproducible). Other OpenAI parameters
    (``temperature``, ``stream``, ...) are accepted and ignored, except
    ``max_completion_tokens`` which stands in for ``max_tokens``.
    """
    msgs = [_msg(m) for m in (messages or [])]
    if max_tokens is None:
        max_tokens = ignored.get("max_completion_tokens")
    request_hash = _sha([msgs, response_format if isinstance(response_format, dict) else str(response_format),
                         tools, tool_choice, max_tokens])

    # Facts come from user (and tool-result) messages, excluding repair turns
    # after the first user message and any schema pasted into the prompt.
    fact_texts: list[str] = []
    first_user = True
    last_user_text, last_user_images = "", 0
    for m in msgs:
        role = m.get("role")
        if role not in ("user", "tool", "function"):
            continue
        text, images = _content(m.get("content"))
        if role == "user":
            last_user_text, last_user_images = text, images
            if not first_user and _REPAIR_RE.search(text):
                continue
            first_user = False
        found = _find_schema_in_text(text)
        if found:
            _, (a, b) = found
            text = text[:a] + text[b:]
        fact_texts.append(text)
    facts: dict = {}
    for text in fact_texts:
        for key, fact in extract_facts(text).items():
            facts.setdefault(key, fact)

    content: str | None = None
    tool_calls: list[dict] | None = None
    scripted = _SCRIPT[-1](msgs) if _SCRIPT else None  # plugin_llm.testing: replies an author scripted
    stream: dict | None = None
    if isinstance(scripted, dict):
        scripted, tool_calls, stream = _scripted_turn(scripted, request_hash)
    specs = _tool_specs(tools) if scripted is None and tool_calls is None else {}
    last_role = msgs[-1].get("role") if msgs else None
    if specs and last_role == "user" and tool_choice != "none":
        forced, required = _forced_tool(tool_choice, specs)
        requests = _tool_requests(last_user_text, specs, facts)
        if forced:
            requests = [r for r in requests if r[0] == forced]
        if not requests and required:
            name = forced or next(iter(specs.values()))["name"]
            params = specs[name.lower()]["parameters"] or {"type": "object"}
            args = _Instance(params, facts).value(params, [])
            requests = [(name, args if isinstance(args, dict) else {})]
        if requests:
            tool_calls = [
                {
                    "id": "call_" + _sha([request_hash, i, name])[:24],
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
                for i, (name, args) in enumerate(requests)
            ]

    if tool_calls is None:
        rf_type = response_format.get("type") if isinstance(response_format, dict) else (
            "json_schema" if hasattr(response_format, "model_json_schema") else None)
        if scripted is not None:
            content = scripted
        elif rf_type == "json_schema":
            schema = _schema_of(response_format)
            content = json.dumps(_Instance(schema, facts).value(schema, []), ensure_ascii=False)
        elif rf_type == "json_object":
            schema = None
            for m in reversed(msgs):
                if m.get("role") in ("system", "developer", "user"):
                    found = _find_schema_in_text(_content(m.get("content"))[0])
                    if found:
                        schema = found[0]
                        break
            if schema is not None:
                value = _Instance(schema, facts).value(schema, [])
            elif facts:
                value = {_snake(key): fact for key, fact in facts.values()}
            else:
                value = {"reply": _chat_reply(last_user_text, last_user_images)}
            content = json.dumps(value, ensure_ascii=False)
        else:
            content = _tool_results_reply(msgs) if last_role in ("tool", "function") else None
            if content is None:
                content = _chat_reply(last_user_text, last_user_images)

    finish = "stop"
    if tool_calls is not None:
        finish = "tool_calls"
        completion_tokens = sum(
            count_tokens(c["function"]["name"]) + count_tokens(c["function"]["arguments"]) for c in tool_calls
        )
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    else:
        assert content is not None
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
            content, completion_tokens, cut = _truncate(content, max_tokens)
            if cut:
                finish = "length"
        else:
            completion_tokens = count_tokens(content)
        message = {"role": "assistant", "content": content}

    prompt_tokens = _prompt_tokens(msgs, tools)
    reply = {
        "id": "chatcmpl-local-" + request_hash[:24],
        "object": "chat.completion",
        "created": created,
        "model": LOCAL_MODEL,
        "system_fingerprint": LOCAL_MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    if stream is not None:
        reply[SCRIPTED_STREAM] = stream
    return reply
