"""Public value types of ``ctx.llm``: input blocks and results (SPEC §5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PluginLlmTextInput",
    "PluginLlmImageInput",
    "PluginLlmUsage",
    "PluginLlmCompleteResult",
    "PluginLlmStructuredResult",
]


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
        )


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


@dataclass(frozen=True)
class PluginLlmStructuredResult(PluginLlmCompleteResult):
    """Result of ``complete_structured``: ``parsed`` is the validated JSON value
    (``None`` when the reply was not JSON, then ``content_type == "text"``)."""

    parsed: Any = None
    content_type: str = "text"
