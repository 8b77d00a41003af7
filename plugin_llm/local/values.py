"""Scalar values for the local model's schema instances: numbers, booleans, dates and the formats.

How a fact's text becomes a value of a schema's type, whether a value meets a string or number
schema's constraints, and an example string for a ``pattern``.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any


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
