"""The value rules every section of config.yaml shares: strict booleans and did-you-mean hints (pure)."""

from __future__ import annotations

import difflib
from typing import Any

from plugin_llm.hardened.bounded_repr import short_repr

__all__ = ["parse_bool", "did_you_mean"]


def parse_bool(value: Any, where: str, warnings: list[str]) -> bool:
    """Strict booleans: YAML bools and the strings "true"/"false"; anything else is False + a warning."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    warnings.append(f"{where}: expected true or false, got {short_repr(value)}; treating it as false")
    return False


def did_you_mean(key: str, known) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to ``key``, or ""."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
