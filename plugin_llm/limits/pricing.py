"""Worst-case cost of one provider request, before it is sent.

Input tokens: counted exactly where the model's tokenizer is at hand (:mod:`.tokens`), else
bounded from above without one: the UTF-8 length of the text plus a per-message overhead (about
4x the real count for English; the settlement replaces it with the real usage); images count a
fixed worst case each. Output tokens are ``max_tokens``, else the
model's ``max_output_tokens``, else ``limits.default_max_output_tokens``.

Prices, in this order: the operator's ``limits.prices`` (``provider/model`` then the bare model
name), the embedded ``local`` model (free), then litellm's bundled price map read as JSON (never
importing litellm), at its highest context tier. ``custom`` endpoints and models the map does not
list are unpriced: a plugin with a budget is refused their calls with a reason, never given them
free. Why a byte count bounds the tokens: docs/design.md, "Limits and leases".
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping as _AbcMapping
from typing import Any, Iterable, Mapping

from plugin_llm.limits.settings import MAX_CALL_NANO, MAX_CALL_TOKENS, NANO, LimitSettings, OperatorPrice

__all__ = ["Price", "Estimate", "find_price", "input_token_bound", "message_token_bound", "json_token_bound",
           "worst_case", "output_token_bound", "operator_cost", "actual_cost_nano", "reports_a_cost", "usage_count",
           "price_map"]

_PRICE_MAP = "model_prices_and_context_window_backup.json"
#: per-message framing (role, separators) of the chat templates in use, generously
_MESSAGE_OVERHEAD = 16
_REQUEST_OVERHEAD = 16
#: the most one image block can cost (OpenAI high detail, Anthropic ~1.6k, Gemini 258)
_IMAGE_TOKENS = 2_000
_INPUT_PRICE = re.compile(r"^(input_cost_per_token(_above_\d+k_tokens)?|cache_creation_input_token_cost(_above_\d+k_tokens)?)$")
_OUTPUT_PRICE = re.compile(r"^output_cost_per_token(_above_\d+k_tokens)?$")
_FREE_PROVIDERS = frozenset({"local"})
_PLAIN_KEYS = frozenset({"role", "content"})  # what a message's per-message overhead covers
_UNPRICED_PROVIDERS = frozenset({"custom"})


@dataclass(frozen=True)
class Price:
    """Nano-dollars per token, and where the price comes from (for messages)."""

    input_nano: float
    output_nano: float
    max_output_tokens: int | None
    source: str
    operator: bool = False


@dataclass(frozen=True)
class Estimate:
    """What one request reserves: tokens, and cost (``None`` = unpriced)."""

    input_tokens: int
    output_tokens: int
    cost_nano: int | None
    price: Price | None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _price_map_path() -> Path | None:
    spec = importlib.util.find_spec("litellm")  # locates the package without importing it
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return Path(locations[0]) / _PRICE_MAP if locations else None


@functools.lru_cache(maxsize=1)
def price_map() -> Mapping[str, Mapping[str, Any]]:
    """litellm's bundled price map as parsed JSON, lower-cased keys; empty without litellm. Cached."""
    path = _price_map_path()
    try:
        data = json.loads(path.read_bytes()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k).strip().lower(): v for k, v in data.items() if isinstance(v, dict) and k != "sample_spec"}


def _max_price(entry: Mapping[str, Any], pattern: re.Pattern[str]) -> float | None:
    found = [float(v) for k, v in entry.items()
             if pattern.match(k) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0]
    return max(found) if found else None


@functools.lru_cache(maxsize=256)
def _operator_price(name: str, price: OperatorPrice) -> Price:
    return Price(
        input_nano=price.input_per_mtok * NANO / 1e6,
        output_nano=price.output_per_mtok * NANO / 1e6,
        max_output_tokens=price.max_output_tokens,
        source=f'limits.prices."{name}"',
        operator=True,
    )


@functools.lru_cache(maxsize=512)
def _map_price(provider: str, model: str) -> Price | None:
    table = price_map()
    for name, must_match in ((f"{provider}/{model}", False), (model, True)):
        entry = table.get(name)
        if entry is None:
            continue
        if must_match and str(entry.get("litellm_provider", "")).lower() != provider:
            continue  # a bare name listed for another provider is not this provider's price
        ins, out = _max_price(entry, _INPUT_PRICE), _max_price(entry, _OUTPUT_PRICE)
        if ins is None or out is None:
            continue
        limit = entry.get("max_output_tokens")
        return Price(
            input_nano=ins * NANO,
            output_nano=out * NANO,
            max_output_tokens=limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None,
            source=f"litellm's price map ({name})",
        )
    return None


#: (provider, model) -> (the prices it was looked up in, its price, the operator's cost function or None)
_found: dict[tuple[str, str], tuple[Mapping[str, OperatorPrice], Price | None, Any]] = {}


def find_price(provider: str, model: str, prices: Mapping[str, OperatorPrice]) -> Price | None:
    """The price of ``provider/model`` per the order in the module docstring; None when unpriced.
    Remembered per model while ``prices`` is the same object (a config reload makes a new one)."""
    hit = _found.get((provider, model))
    if hit is not None and hit[0] is prices:
        return hit[1]
    price = _find_price(provider, model, prices)
    if len(_found) >= 1024:
        _found.clear()
    _found[(provider, model)] = (prices, price, _cost_function(price))
    return price


def _find_price(provider: str, model: str, prices: Mapping[str, OperatorPrice]) -> Price | None:
    provider = provider.strip().lower()
    model = model.strip().lower()
    if provider and model.startswith(provider + "/"):
        model = model[len(provider) + 1:]
    for name in (f"{provider}/{model}", model):
        if name in prices:
            return _operator_price(name, prices[name])
    if provider in _FREE_PROVIDERS:
        return Price(0.0, 0.0, None, "the embedded local model (free)")
    if provider in _UNPRICED_PROVIDERS:
        return None
    return _map_price(provider, model)


def _text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _content_tokens(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return _text_bytes(content)
    if isinstance(content, (list, tuple)):
        total = 0
        for block in content:
            is_map = type(block) is dict or isinstance(block, _AbcMapping)
            if is_map and block.get("type") in ("image_url", "image", "input_image"):
                total += _IMAGE_TOKENS
            elif is_map and isinstance(block.get("text"), str):
                total += _text_bytes(block["text"]) + _MESSAGE_OVERHEAD
            else:
                total += _json_bytes(block)
        return total
    return _json_bytes(content)


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def input_token_bound(messages: Iterable[Mapping[str, Any]], extra: Iterable[Any] = ()) -> int:
    """An upper bound of the input tokens of ``messages`` plus ``extra`` (tools, response_format)."""
    total = _REQUEST_OVERHEAD
    for message in messages:
        if type(message) is not dict and not isinstance(message, _AbcMapping):  # (typing.Mapping's check is slow)
            total += _MESSAGE_OVERHEAD + _json_bytes(message)
            continue
        content = message.get("content")
        if type(content) is str and content.isascii():  # the usual message: one ASCII text
            total += _MESSAGE_OVERHEAD + len(content)
            if len(message) == 2 and "role" in message:  # and a role, nothing else (cheaper than the keys view)
                continue
        else:
            total += _MESSAGE_OVERHEAD + _content_tokens(content)
        if message.keys() <= _PLAIN_KEYS:
            continue
        for key, value in message.items():
            if key not in _PLAIN_KEYS and value is not None:
                total += _json_bytes(value)
    for value in extra:
        if value is not None:
            total += _json_bytes(value)
    return total


def message_token_bound(message: Any) -> int:
    """:func:`input_token_bound`'s share of one message (what an exact count falls back to)."""
    return input_token_bound((message,)) - _REQUEST_OVERHEAD


def json_token_bound(value: Any) -> int:
    """:func:`input_token_bound`'s share of one of its ``extra`` values (tools, response_format)."""
    return _json_bytes(value)


def output_token_bound(price: Price | None, max_tokens: Any, settings: LimitSettings) -> int:
    """The most output tokens a request can use: ``max_tokens``, else the model's limit, else the default."""
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
        return max_tokens
    if price is not None and price.max_output_tokens:
        return price.max_output_tokens
    return settings.default_max_output_tokens


def worst_case(
    messages: Iterable[Mapping[str, Any]],
    *,
    provider: str,
    model: str,
    max_tokens: int | None,
    settings: LimitSettings,
    extra: Iterable[Any] = (),
    need_price: bool = True,
) -> Estimate:
    """The most one request can use: input bound + output limit, priced when a price is known.
    (The byte bound: admission counts exactly where it can, see :mod:`.tokens`.)"""
    price = find_price(provider, model, settings.prices) if need_price else None
    output = output_token_bound(price, max_tokens, settings)
    input_tokens = input_token_bound(messages, extra)
    cost = None
    if price is not None:
        cost = math.ceil(input_tokens * price.input_nano + output * price.output_nano)
    return Estimate(input_tokens, output, cost, price)


def operator_cost(provider: str, model: str, prices: Mapping[str, OperatorPrice]) -> Any:
    """The operator's price of ``provider/model`` (``limits.prices``) as the transport's cost function
    (``TransportRequest.cost``): US dollars of a reply's tokens, exactly what a budget is charged;
    None when the operator set no price for it. One function per price, reused."""
    hit = _found.get((provider, model))
    if hit is not None and hit[0] is prices:
        return hit[2]
    return _cost_function(find_price(provider, model, prices))


def _cost_function(price: Price | None) -> Any:
    if price is None or not price.operator:
        return None
    in_nano, out_nano = price.input_nano, price.output_nano

    def cost(route: Any, response: Any, prompt: int, completion: int, cache_read: int = 0, cache_write: int = 0) -> float:
        return math.ceil(max(0, prompt) * in_nano + max(0, completion) * out_nano) / NANO  # actual_cost_nano's

    return cost


def usage_count(value: object) -> int:
    """A reported token count as a store counts it: a whole number from 0 to MAX_CALL_TOKENS (what is
    not a finite number counts 0, as a reply that reports nothing)."""
    if type(value) is int:
        return min(MAX_CALL_TOKENS, max(0, value))
    try:
        return min(MAX_CALL_TOKENS, max(0, int(value or 0)))
    except (TypeError, ValueError, OverflowError):
        return 0


def reports_a_cost(cost_usd: object) -> bool:
    """Whether a reply's ``cost_usd`` says it cost something (a positive finite number; 0.0 is what a
    transport reports for a reply without usage, and no cost is unknown, never free)."""
    return (isinstance(cost_usd, (int, float)) and not isinstance(cost_usd, bool) and math.isfinite(cost_usd)
            and cost_usd > 0)


def actual_cost_nano(price: Price | None, cost_usd: float | None, input_tokens: int, output_tokens: int) -> int:
    """What a finished request cost: the operator's price if set, else the provider-reported cost
    (litellm's, exact per tier), else the tokens at the (worst-case) map price; 0 when nothing is known.
    At most :data:`~plugin_llm.limits.settings.MAX_CALL_NANO`."""
    tokens_cost = None
    if price is not None:
        tokens_cost = min(MAX_CALL_NANO, math.ceil(max(0, input_tokens) * price.input_nano
                                                   + max(0, output_tokens) * price.output_nano))
        if price.operator:
            return tokens_cost
    if isinstance(cost_usd, (int, float)) and not isinstance(cost_usd, bool) and math.isfinite(cost_usd) and cost_usd >= 0:
        return min(MAX_CALL_NANO, math.ceil(cost_usd * NANO))
    return tokens_cost or 0
