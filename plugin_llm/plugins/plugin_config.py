"""``ctx.get_config`` / ``ctx.set_config``: a plugin's own ``plugins.entries.<key>.settings``.

Keys are plugin-relative (``endpoint``, ``retry.policy``): anything that could name another part of
config.yaml is refused before the file is read. Writes go through :func:`plugin_llm.config_edit.edit_config`
(the one writer: locked, atomic, comments kept, ``.bak``) and touch only the one value set.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plugin_llm.config_edit import edit_config, ensure_map, set_value

__all__ = ["MAX_VALUE_BYTES", "setting_segments", "read_setting", "checked_value", "write_setting"]

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_RESERVED_ROOTS = frozenset({"model", "plugins", "security", "settings"})
_MAX_SEGMENTS = 16
_MAX_DEPTH = 32
#: the largest value one ``set_config`` call may write (as JSON)
MAX_VALUE_BYTES = 64 * 1024
_MISSING: Any = object()


def setting_segments(key: Any, who: str) -> tuple[str, ...]:
    """``key`` split at dots; ValueError unless every part is a plain name and the first is not reserved."""
    if isinstance(key, str):
        segments = tuple(key.split("."))
        if (0 < len(segments) <= _MAX_SEGMENTS and segments[0].lower() not in _RESERVED_ROOTS
                and all(_SEGMENT.fullmatch(s) for s in segments)):
            return segments
    shown = repr(key[:80]) if isinstance(key, str) else type(key).__name__
    raise ValueError(f"{who}: {shown} is not a plugin-relative config key: use names of letters, digits, '_' "
                     "and '-' joined by dots, such as 'endpoint' or 'retry.policy' (no '/', '\\', '..', and not "
                     f"starting with {', '.join(sorted(_RESERVED_ROOTS))})")


def _walk(node: Any, segments: tuple[str, ...]) -> Any:
    for segment in segments:
        if not isinstance(node, Mapping) or segment not in node:
            return _MISSING
        node = node[segment]
    return node


def read_setting(raw: Any, plugin_key: str, segments: tuple[str, ...], default: Any) -> Any:
    """``plugins.entries.<key>.settings.<segments>``, else the legacy ``….config.<segments>``, else ``default``
    (a copy: the caller cannot change the host's parsed config)."""
    entry = _walk(raw, ("plugins", "entries", plugin_key))
    if not isinstance(entry, Mapping):
        return default
    for section in ("settings", "config"):
        value = _walk(entry.get(section), segments)
        if value is not _MISSING:
            return copy.deepcopy(value)
    return default


def _checked(value: Any, who: str, depth: int = 0) -> Any:
    """``value`` as plain YAML-safe data (a copy), or ValueError naming what is wrong."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"{who}: the value is nested deeper than {_MAX_DEPTH} levels")
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"{who}: {value!r} cannot be written to config.yaml (use a finite number)")
        return value
    if kind in (list, tuple):
        return [_checked(item, who, depth + 1) for item in value]
    if kind is dict:
        out = {}
        for k, item in value.items():
            if type(k) is not str:
                raise ValueError(f"{who}: mapping keys must be strings, got {type(k).__name__}")
            out[k] = _checked(item, who, depth + 1)
        return out
    raise ValueError(f"{who}: a {kind.__name__} cannot be written to config.yaml (use None, bool, int, float, "
                     "str, list or dict)")


def checked_value(value: Any, who: str) -> Any:
    """``value`` as a copy of plain data within :data:`MAX_VALUE_BYTES`, else ValueError."""
    value = _checked(value, who)
    size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    if size > MAX_VALUE_BYTES:
        raise ValueError(f"{who}: the value is {size} bytes as JSON, over the {MAX_VALUE_BYTES}-byte limit of one setting")
    return value


def write_setting(home: Path, plugin_key: str, segments: tuple[str, ...], value: Any, who: str) -> None:
    """Set one value under the plugin's ``settings``; everything else in config.yaml is kept as it is."""
    value = checked_value(value, who)
    path = ("plugins", "entries", plugin_key, "settings", *segments)

    def mutate(doc: Any) -> None:
        node = ensure_map(doc, *path[:4])
        for depth, segment in enumerate(segments[:-1], start=4):  # a non-mapping on the way is replaced
            if segment in node and not isinstance(node[segment], dict):
                del node[segment]
            node = ensure_map(doc, *path[:depth + 1])
        set_value(doc, path, value)

    edit_config(home, mutate)
