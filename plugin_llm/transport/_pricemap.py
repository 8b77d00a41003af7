"""litellm's bundled price map, looked up entry by entry without importing litellm or parsing it whole.

The map (``model_prices_and_context_window_backup.json``, the one litellm itself reads with
``LITELLM_LOCAL_MODEL_COST_MAP=True``) is 3.5 MB of JSON; parsing it costs a first call tens of
milliseconds and megabytes. :class:`PriceMap` reads the file's text once per lookup batch and
decodes only the entries asked for, matching keys without case as litellm does.
:func:`openai_entry` finds an ``openai`` model's entry in litellm's lookup order;
tests/test_transport_own.py checks it against litellm for every ``openai`` entry of the map.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["PriceMap", "price_map_path", "openai_entry", "openai_names"]

FILE_NAME = "model_prices_and_context_window_backup.json"
#: litellm's ``_strip_dated_snapshot_suffix`` and ``_strip_openai_finetune_model_name``
_DATED = re.compile(r"-\d{4}-\d{2}-\d{2}$")
_FINETUNE = re.compile(r"(:[^:]*){3}$")
_OPEN = re.compile(r"\s*:\s*\{")


def price_map_path() -> Path | None:
    """Where the installed litellm keeps its bundled map (found without importing litellm)."""
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return Path(locations[0]) / FILE_NAME if locations else None


class PriceMap:
    """The map's text, read once; :meth:`entry` decodes one top-level entry by its key (any case)."""

    def __init__(self, path: Path | None = None) -> None:
        path = path if path is not None else price_map_path()
        try:
            text = path.read_text(encoding="utf-8") if path is not None else "{}"
        except (OSError, ValueError):
            text = "{}"
        self._text = text
        self._whole: dict[str, Any] | None = None
        if not text.isascii():  # lower() could move offsets: decode the whole map once instead
            self._whole = self._parse_whole(text)
            self._lower = ""
        else:
            self._lower = text.lower()

    @staticmethod
    def _parse_whole(text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except ValueError:
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k).lower(): (str(k), v) for k, v in data.items()}

    def entry(self, name: str) -> tuple[str, dict] | None:
        """(the key as the map spells it, its entry) for ``name`` matched without case, or None."""
        if self._whole is not None:
            found = self._whole.get(name.lower())
            return found if found is not None and isinstance(found[1], dict) else None
        quoted = json.dumps(name.lower())
        start = 0
        while True:
            at = self._lower.find(quoted, start)
            if at < 0:
                return None
            start = at + 1
            if at == 0 or self._lower[at - 1] not in " \t\r\n,{":
                continue
            opened = _OPEN.match(self._lower, at + len(quoted))
            if opened is None:
                continue
            try:
                key = json.loads(self._text[at:at + len(quoted)])
                value, _ = json.JSONDecoder().raw_decode(self._text, opened.end() - 1)
            except ValueError:
                continue
            if isinstance(value, dict) and ("litellm_provider" in value or "mode" in value):
                return key, value


def openai_names(model: str) -> tuple[str, ...]:
    """The names litellm looks an ``openai`` model up under, in its order (``get_potential_model_names``)."""
    if model.startswith("openai/"):
        split = model.split("/", 1)[1]
        combined, prefixed = model, f"openai/{model}"
    else:
        split = model
        combined = prefixed = f"openai/{model}"
    stripped = _FINETUNE.sub("", split) if "ft:" in split else _DATED.sub("", split)
    combined_stripped = f"openai/{stripped}"
    return combined, model, combined_stripped, split, combined_stripped, stripped, prefixed


def openai_entry(prices: PriceMap, model: str) -> tuple[str, dict] | None:
    """The entry litellm's ``get_model_info(model, custom_llm_provider="openai")`` reads, or None."""
    for name in openai_names(model):
        found = prices.entry(name)
        if found is None:
            continue
        provider = found[1].get("litellm_provider")
        if provider is None or provider == "openai":
            return found
    return None
