"""``short_repr``: a value from a file of the home, shown in a message without printing all of it.

A value in config.yaml or a manifest can be megabytes long, or a structure
shared through YAML aliases; ``repr`` of it in a warning would copy all of it
into every log line. Long strings and collections are cut with ``...``.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["short_repr"]

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlong = 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 6


def short_repr(value: Any) -> str:
    """``repr(value)`` when short (strings up to 60 characters, collections up to 6 items), else cut with ``...``."""
    return _REPR.repr(value)
