"""litellm's bundled price map, looked up entry by entry without importing litellm or parsing it whole.

The map (``model_prices_and_context_window_backup.json``, the one litellm itself reads with
``LITELLM_LOCAL_MODEL_COST_MAP=True``) is 3.5 MB of JSON; parsing it costs a first call tens of
milliseconds and megabytes. :class:`PriceMap` reads the file's text once per lookup batch and
decodes only the entries asked for, matching keys without case as litellm does.
:func:`provider_entry` finds a model's entry under a provider in litellm's lookup order
(``get_model_info``); :func:`described_by_rule` says when litellm would describe an unmapped
model by one of the map's generalization rules instead. tests/test_transport_own.py checks them
against litellm for every entry of the providers the own path serves.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["PriceMap", "price_map_path", "openai_entry", "openai_names", "model_names", "provider_entry",
           "described_by_rule", "mapped_anywhere"]

FILE_NAME = "model_prices_and_context_window_backup.json"
#: litellm's ``_strip_dated_snapshot_suffix`` and ``_strip_openai_finetune_model_name``
_DATED = re.compile(r"-\d{4}-\d{2}-\d{2}$")
_FINETUNE = re.compile(r"(:[^:]*){3}$")
_OPEN = re.compile(r"\s*:\s*\{")
#: the map's block of generalization rules (not a model)
_RULES = "fallback_generalizations"


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
        self._patterns: tuple[re.Pattern, ...] | None = None
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

    def capability_patterns(self) -> tuple[re.Pattern, ...]:
        """The patterns of the map's capability rules: the rules litellm describes an unmapped model by
        (``fallback_generalizations``; a routing rule names only ``litellm_provider``)."""
        if self._patterns is None:
            found = self._block(_RULES)
            rules = found.get("rules") if isinstance(found, dict) else None
            patterns = []
            for rule in rules if isinstance(rules, list) else ():
                if not isinstance(rule, dict) or "extends" in rule:
                    continue
                pattern, info = rule.get("pattern"), rule.get("model_info")
                if not isinstance(pattern, str) or not isinstance(info, dict) or "litellm_provider" in info:
                    continue
                try:
                    patterns.append(re.compile(pattern, re.IGNORECASE))
                except re.error:
                    continue
            self._patterns = tuple(patterns)
        return self._patterns

    def _block(self, name: str) -> Any:
        """The top-level value under ``name`` (exact case), or None."""
        if self._whole is not None:
            found = self._whole.get(name.lower())
            return found[1] if found is not None and found[0] == name else None
        quoted = json.dumps(name)
        start = 0
        while True:
            at = self._text.find(quoted, start)
            if at < 0:
                return None
            start = at + 1
            opened = _OPEN.match(self._text, at + len(quoted))
            if (at and self._text[at - 1] not in " \t\r\n,{") or opened is None:
                continue
            try:
                return json.JSONDecoder().raw_decode(self._text, opened.end() - 1)[0]
            except ValueError:
                return None


def model_names(model: str, provider: str) -> tuple[str, ...]:
    """The names litellm looks ``model`` up under for ``provider``, in its order
    (``_model_cost_lookup_order`` of ``get_potential_model_names``)."""
    if model.startswith(provider + "/"):
        split = model.split("/", 1)[1]
        combined, prefixed = model, f"{provider}/{model}"
    else:
        split = model
        combined = prefixed = f"{provider}/{model}"
    stripped = _FINETUNE.sub("", split) if "ft:" in split else _DATED.sub("", split)
    combined_stripped = f"{provider}/{stripped}"
    return combined, model, combined, split, combined_stripped, stripped, prefixed


def openai_names(model: str) -> tuple[str, ...]:
    """The names litellm looks an ``openai`` model up under, in its order."""
    return model_names(model, "openai")


def provider_entry(prices: PriceMap, model: str, provider: str) -> tuple[str, dict] | None:
    """The entry litellm's ``get_model_info(model, custom_llm_provider=provider)`` reads from the map
    (the first name whose entry names ``provider`` or none), or None."""
    for name in model_names(model, provider):
        found = prices.entry(name)
        if found is None:
            continue
        owner = found[1].get("litellm_provider")
        if owner is None or owner == provider:
            return found
    return None


def openai_entry(prices: PriceMap, model: str) -> tuple[str, dict] | None:
    """The entry litellm's ``get_model_info(model, custom_llm_provider="openai")`` reads, or None."""
    return provider_entry(prices, model, "openai")


def mapped_anywhere(prices: PriceMap, model: str, provider: str) -> bool:
    """Whether any name litellm tries for ``model`` is a key of the map (under any provider)."""
    return any(prices.entry(name) is not None for name in model_names(model, provider))


def described_by_rule(prices: PriceMap, model: str, provider: str) -> bool:
    """Whether litellm describes ``model`` (unmapped under ``provider``) by a capability rule of the map
    (``_get_model_info_from_generalization``): then it has model info, and litellm prices it."""
    patterns = prices.capability_patterns()
    return any(pattern.search(name) for name in model_names(model, provider) for pattern in patterns)
