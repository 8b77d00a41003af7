"""Untrusted text (plugin manifests, plugin errors, directory names) made safe for a terminal.

A manifest's ``name``, ``description`` or ``author`` can carry escape sequences
(``ESC [ 2 J`` clears the screen, OSC 8 forges links, OSC 52 writes the
clipboard), C1 controls (``U+009B`` is a one-character CSI), or invisible
Unicode (bidi overrides such as ``U+202E`` reorder what a reviewer reads).
One definition of "unsafe" serves both sides:

* :func:`unsafe_characters` — what discovery and install reject in plugin names;
* :func:`escape_unsafe` — what every CLI printer applies to plugin-supplied text
  (each unsafe character becomes a visible ``\\x1b`` / ``\\u202e`` escape, and the
  length is bounded).

Pure and dependency-free: importable from the plugin layer and the CLI alike.
"""

from __future__ import annotations

import re

__all__ = ["UNSAFE_CHARS", "unsafe_characters", "escape_unsafe", "escape_unsafe_text", "escape_unsafe_json"]

#: C0 controls (every one: tab and newline too, so text cannot forge extra lines), DEL,
#: C1 controls, the Arabic letter mark, zero-width and bidi formatting characters,
#: line/paragraph separators, word joiners and invisible operators, isolates, BOM,
#: interlinear annotation marks, Unicode tag characters, and lone surrogates (undecodable
#: bytes of a file name: printing one raw would raise UnicodeEncodeError).
_BEYOND_C0 = "\x7f-\x9f\ud800-\udfff\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f"
UNSAFE_CHARS = re.compile(f"[\x00-\x1f{_BEYOND_C0}]")
#: the same without tab and newline: for multi-line text (command output, model replies)
_UNSAFE_IN_TEXT = re.compile(f"[\x00-\x08\x0b-\x1f{_BEYOND_C0}]")
#: what json.dumps leaves raw: it escapes C0 inside strings, and C0 outside strings is its own layout
_JSON_RAW = re.compile(f"[{_BEYOND_C0}]")


def unsafe_characters(text: str) -> list[str]:
    """The distinct unsafe characters of ``text`` as ``U+XXXX`` codes, in order of appearance."""
    return list(dict.fromkeys(f"U+{ord(ch):04X}" for ch in UNSAFE_CHARS.findall(text)))


_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_unsafe(text: object, limit: int | None = None) -> str:
    """``text`` (``str()`` of it; None is empty) with unsafe characters written as visible
    escapes, cut to ``limit`` characters of the original when it is longer."""
    if text is None:
        return ""
    value = text if isinstance(text, str) else str(text)
    suffix = ""
    if limit is not None and len(value) > limit:
        suffix = f"… (+{len(value) - limit} chars)"
        value = value[:limit]
    return UNSAFE_CHARS.sub(_escape, value) + suffix


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON spells characters beyond the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def escape_unsafe_text(text: object) -> str:
    """Multi-line untrusted text (a plugin command's output, a model's reply) for a
    terminal: like :func:`escape_unsafe` but tabs and line breaks are kept as they are."""
    if text is None:
        return ""
    return _UNSAFE_IN_TEXT.sub(_escape, text if isinstance(text, str) else str(text))


def escape_unsafe_json(json_text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``) with the unsafe characters
    json leaves raw (DEL, C1, bidi, ...) written as ``\\uXXXX`` escapes.

    Still the same JSON value: outside strings JSON text is ASCII (C0 there is only its
    own indentation), and json.dumps escapes C0 inside strings, so every character
    replaced here lies inside a string literal.
    """
    return _JSON_RAW.sub(_json_escape, json_text)
