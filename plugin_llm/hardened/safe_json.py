"""JSON from files of the home, with nesting bounded before the parser recurses.

:func:`json.loads` recurses once per ``[`` or ``{``: 200 KB of ``[[[[...`` in
``auth.json`` raises ``RecursionError`` out of every call. :func:`loads_bounded`
first measures the nesting with one linear scan (strings skipped, so brackets
inside them do not count) and refuses a document deeper than ``max_depth``
with a :class:`JsonTooDeepError`: a :class:`json.JSONDecodeError`, so existing
handlers report it like any other invalid JSON, with its line and column.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "JsonTooDeepError", "check_json_depth", "loads_bounded"]

#: nesting levels allowed in a JSON file of the home (auth.json needs four)
MAX_JSON_DEPTH = 64

#: a bracket, or a whole string skipped as one token; an unterminated string runs to the end
#: (one linear match: the document is invalid there anyway, and the parser says so)
_TOKEN = re.compile(r'[\[\]{}]|"(?:[^"\\]|\\.)*"?', re.DOTALL)


class JsonTooDeepError(json.JSONDecodeError):
    """The document nests deeper than allowed; ``lineno``/``colno`` point at the first bracket too many."""

    def __init__(self, max_depth: int, doc: str, pos: int) -> None:
        super().__init__(f"nested deeper than {max_depth} levels", doc, pos)
        self.doc = ""  # never keep the document (it may hold secrets) on the exception


def check_json_depth(text: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`JsonTooDeepError` when ``text`` nests deeper than ``max_depth``."""
    if text.count("[") + text.count("{") <= max_depth:  # cannot be too deep: no scan
        return
    depth = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                raise JsonTooDeepError(max_depth, text, match.start())
        elif token in "]}":
            depth -= 1


def loads_bounded(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH, decoder: json.JSONDecoder | None = None,
                  **kwargs: Any) -> Any:
    """:func:`json.loads` after :func:`check_json_depth`; ``kwargs`` go to :func:`json.loads`.

    ``decoder`` is a :class:`json.JSONDecoder` built once by the caller (instead of ``kwargs``): ``json.loads``
    builds a new one per call whenever it is given any keyword, which a per-request parser need not pay.
    """
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8-sig")
    check_json_depth(text, max_depth)
    if decoder is None:
        return json.loads(text, **kwargs)
    if kwargs:
        raise TypeError("loads_bounded takes either a decoder or json.loads keywords, not both")
    if text.startswith("\ufeff"):  # what json.loads says of a str with a BOM
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return decoder.decode(text)
