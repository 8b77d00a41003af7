"""litellm's model names, read from its bundled price map as a JSON file (litellm is never imported)."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path

#: model names served by the embedded model (any ``local-*`` name) or an operator endpoint
_UNCHECKED_PROVIDERS = frozenset({"local", "custom"})
_PRICE_MAP = "model_prices_and_context_window_backup.json"


def _price_map_path() -> Path | None:
    spec = importlib.util.find_spec("litellm")  # locates the package, does not import it
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return Path(locations[0]) / _PRICE_MAP if locations else None


#: a top-level key of the price map as litellm writes the file; nested keys are indented deeper
_TOP_LEVEL_KEY = re.compile(rb'\n    "([^"\\]*)": \{')


@functools.lru_cache(maxsize=1)
def _listed_model_names() -> frozenset[str] | None:
    """Top-level keys of the price map found by a regex over the raw file (~10 ms, not ~40).

    None when the file is missing or not laid out as expected (then only the
    JSON parse is used)."""
    path = _price_map_path()
    try:
        data = path.read_bytes().lower() if path is not None else None
    except OSError:
        return None
    if not data or b'\n    "sample_spec": {' not in data:
        return None
    return frozenset(k.decode("utf-8", "replace").strip() for k in _TOP_LEVEL_KEY.findall(data))


@functools.lru_cache(maxsize=1)
def litellm_model_names() -> frozenset[str] | None:
    """Lower-cased model names of litellm's bundled price map, or None without litellm.

    Parsed with :mod:`json` (``find_spec`` locates the package without importing it).
    """
    path = _price_map_path()
    if path is None:
        return None
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return frozenset(str(k).strip().lower() for k in data if k != "sample_spec")


def _candidates(name: str) -> list[str]:
    wanted = name.strip().lower()
    provider, sep, rest = wanted.partition("/")
    return [wanted, rest] if sep and rest else [wanted]


def litellm_knows_model(name: str, names: frozenset[str] | None = None) -> bool | None:
    """Whether litellm knows ``name`` (``provider/model`` or bare); None when it cannot tell.

    A name among the keys found by a regex over the file is known; anything
    else is confirmed against the parsed JSON (once per process), so a change
    of the file's layout can only cost time, never a wrong warning.
    """
    if names is None:
        listed = _listed_model_names()
        if listed is not None and any(c in listed for c in _candidates(name)):
            return True
        names = litellm_model_names()
    if names is None:
        return None
    return any(c in names for c in _candidates(name))


def _model_unchecked(name: str) -> bool:
    lowered = name.strip().lower()
    provider, sep, _ = lowered.partition("/")
    return lowered == "*" or lowered.startswith("local-") or (bool(sep) and provider in _UNCHECKED_PROVIDERS)
