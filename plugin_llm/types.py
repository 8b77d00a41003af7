"""Public value types of ``ctx.llm``: input blocks and results."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PluginLlmTextInput",
    "PluginLlmImageInput",
    "PluginLlmUsage",
    "PluginLlmCompleteResult",
    "PluginLlmStructuredResult",
    "PluginLlmToolCall",
    "MAX_USAGE_TOKENS",
    "MAX_USAGE_COST_USD",
    "checked_usage",
]

#: more tokens than any one call can use: a provider reporting more is wrong
MAX_USAGE_TOKENS = 10**9
#: more dollars than any one call can cost
MAX_USAGE_COST_USD = 1e6
_TOKEN_FIELDS = ("input_tokens", "output_tokens", "total_tokens", "cache_read_tokens", "cache_write_tokens")


@dataclass(frozen=True)
class PluginLlmTextInput:
    """A text block for ``complete_structured(input=[...])``."""

    text: str
    type: str = field(default="text", init=False)


@dataclass(frozen=True)
class PluginLlmImageInput:
    """An image block: raw ``data`` bytes or a ``url`` (http(s) or data: URL)."""

    data: bytes | None = None
    url: str | None = None
    mime_type: str = "image/png"
    file_name: str = ""
    type: str = field(default="image", init=False)

    def __post_init__(self) -> None:
        if (self.data is None) == (self.url is None):
            raise ValueError("PluginLlmImageInput needs exactly one of data=bytes or url=str")

    def __repr__(self) -> str:  # never dump megabytes of image bytes into logs
        src = f"data=<{len(self.data)} bytes>" if self.data is not None else f"url={self.url[:60]!r}"
        return f"PluginLlmImageInput({src}, mime_type={self.mime_type!r}, file_name={self.file_name!r})"


@dataclass(frozen=True)
class PluginLlmUsage:
    """Token counts and cost of one call (summed over repair attempts)."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None
    #: True when the provider reported no usage (a stream without a usage chunk) and the
    #: token counts are litellm's estimate for the model
    estimated: bool = False

    def __add__(self, other: "PluginLlmUsage") -> "PluginLlmUsage":
        if self.cost_usd is None or other.cost_usd is None:
            cost = self.cost_usd if other.cost_usd is None else other.cost_usd
            if self.cost_usd is None and other.cost_usd is None:
                cost = None
        else:
            cost = self.cost_usd + other.cost_usd
        return PluginLlmUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=cost,
            estimated=self.estimated or other.estimated,
        )


@dataclass(frozen=True)
class PluginLlmToolCall:
    """A tool call the model asked for: ``arguments`` parsed (``{}`` when they are not a JSON
    object), ``raw_arguments`` as the model wrote them."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str


@dataclass(frozen=True)
class PluginLlmCompleteResult:
    """Result of ``complete``/``acomplete``.

    ``provider`` is the route actually used; ``model`` the provider-reported
    model when there is one. ``audit`` holds ``plugin_id, purpose, profile,
    schema_name, call_id``; ``call_id`` matches the audit line in agent.log.
    """

    text: str
    provider: str
    model: str
    agent_id: str | None
    usage: PluginLlmUsage
    audit: dict[str, Any]
    #: the tool calls the model asked for (``complete(..., tools=[...])``); empty otherwise
    tool_calls: tuple[PluginLlmToolCall, ...] = ()


@dataclass(frozen=True)
class PluginLlmStructuredResult(PluginLlmCompleteResult):
    """Result of ``complete_structured``: ``parsed`` is the validated JSON value
    (``None`` when the reply was not JSON, then ``content_type == "text"``)."""

    parsed: Any = None
    content_type: str = "text"


def _describe_number(value: Any) -> str:
    """A bounded description of a bad reported value (never the repr of a huge or hostile object)."""
    if isinstance(value, bool):
        return f"bool {value}"
    if isinstance(value, int):
        if -10**30 < value < 10**30:
            return int.__repr__(value)
        if value.bit_length() < 14_000:  # str() of more than 4300 digits raises ValueError
            return f"an int of {len(int.__repr__(abs(value)))} digits"
        return f"an int of about {int(math.log10(abs(value))) + 1} digits"
    if isinstance(value, float):
        return float.__repr__(value)
    return f"a {type(value).__name__}"


def _checked_tokens(name: str, value: Any, anomalies: list[str]) -> int:
    if type(value) is int and 0 <= value <= MAX_USAGE_TOKENS:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        clamped = 0 if value < 0 else min(int(value), MAX_USAGE_TOKENS)
    elif isinstance(value, float) and math.isfinite(value):
        clamped = 0 if value < 0 else min(int(value), MAX_USAGE_TOKENS)
    else:
        clamped = 0
    anomalies.append(f"{name}: reported {_describe_number(value)}, recorded as {clamped}")
    return clamped


def _checked_cost(value: Any, anomalies: list[str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, int) and 0 <= value <= MAX_USAGE_COST_USD:
            return float(value)
        if isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= MAX_USAGE_COST_USD:
            return value
        if (isinstance(value, int) or math.isfinite(value)) and value > MAX_USAGE_COST_USD:
            anomalies.append(f"cost_usd: reported {_describe_number(value)}, recorded as {MAX_USAGE_COST_USD:g}")
            return MAX_USAGE_COST_USD
    anomalies.append(f"cost_usd: reported {_describe_number(value)}, recorded as unknown")
    return None


def checked_usage(usage: Any) -> tuple[PluginLlmUsage, tuple[str, ...]]:
    """``usage`` as any transport reported it, made sane, plus what had to be fixed.

    Token counts must be ints in ``[0, MAX_USAGE_TOKENS]``: negatives become 0,
    larger values are clamped, bools and non-numbers count as 0. ``cost_usd``
    must be ``None`` or a finite number in ``[0, MAX_USAGE_COST_USD]``: NaN,
    infinities, negatives and non-numbers become ``None`` (unknown), larger
    values are clamped. Each fix is described (boundedly) in the returned
    anomalies, which the gateway puts in the audit record. The common case, a
    sane ``PluginLlmUsage``, is returned as it is.
    """
    if not isinstance(usage, PluginLlmUsage):
        return PluginLlmUsage(), (f"usage: reported {_describe_number(usage)}, not PluginLlmUsage; recorded as 0 tokens",)
    anomalies: list[str] = []
    tokens = [_checked_tokens(name, getattr(usage, name), anomalies) for name in _TOKEN_FIELDS]
    cost = _checked_cost(usage.cost_usd, anomalies)
    if not anomalies:
        return usage, ()
    return PluginLlmUsage(*tokens, cost_usd=cost, estimated=usage.estimated is True), tuple(anomalies)
