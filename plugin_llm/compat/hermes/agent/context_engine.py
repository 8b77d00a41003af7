"""``agent.context_engine``: the base class of a Hermes context engine.

The host calls an engine the way Hermes does (see :mod:`plugin_llm.host.memory`):
``on_session_start(session_id, hermes_home=, platform=, model=)`` when the
session starts, ``update_model(model, context_length)`` with the session's
context budget, ``should_compress(prompt_tokens)`` before each model request
and, when it says yes, ``compress(messages, current_tokens=, focus_topic=None,
force=False, memory_context="")`` (only the keywords its signature accepts);
``update_from_response(usage)`` after each response, ``on_session_end(
session_id, messages)`` when the session closes. Only ``name`` and
``compress`` must be defined (Hermes also requires ``update_from_response`` and
``should_compress``; here they have working defaults, so the seed's two-method
example runs as written).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional

__all__ = ["ContextEngine", "sanitize_memory_context", "MEMORY_CONTEXT_MAX_CHARS"]

MEMORY_CONTEXT_MAX_CHARS = 6_000
_HEAD, _TAIL = 4_000, 1_500
_MARKER = "\n...[memory provider context truncated]...\n"
_SECRETISH = re.compile(r"(?i)\b(sk|pk|rk|ghp|gho|xox[abp])[-_][A-Za-z0-9_-]{12,}\b|://[^/\s:@]+:[^/\s@]+@")


def sanitize_memory_context(memory_context: str) -> str:
    """Memory text ready for a model: key-shaped strings and URL credentials redacted, bounded."""
    text = _SECRETISH.sub("[REDACTED]", (memory_context or "").strip())
    if len(text) <= MEMORY_CONTEXT_MAX_CHARS:
        return text
    return text[:_HEAD] + _MARKER + text[-_TAIL:]


class ContextEngine(ABC):
    """Base class of a context engine (``ctx.register_context_engine``)."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Short identifier, matched against ``context.engine``."""

    last_prompt_tokens: int = 0
    last_completion_tokens: int = 0
    last_total_tokens: int = 0
    threshold_tokens: int = 0
    context_length: int = 0
    compression_count: int = 0
    threshold_percent: float = 0.75
    protect_first_n: int = 3
    protect_last_n: int = 6

    def update_from_response(self, usage: Dict[str, Any]) -> None:
        """Track token usage from a response (``prompt_tokens``/``completion_tokens``/``total_tokens``)."""
        if not isinstance(usage, dict):
            return
        self.last_prompt_tokens = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        self.last_completion_tokens = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
        self.last_total_tokens = int(usage.get("total_tokens") or self.last_prompt_tokens + self.last_completion_tokens)

    def should_compress(self, prompt_tokens: Optional[int] = None) -> bool:
        """True when ``prompt_tokens`` (default: the last response's) reaches ``threshold_tokens``."""
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return bool(self.threshold_tokens) and tokens >= self.threshold_tokens

    @abstractmethod
    def compress(
        self,
        messages: List[Dict[str, Any]],
        current_tokens: Optional[int] = None,
        focus_topic: Optional[str] = None,
        force: bool = False,
        memory_context: str = "",
    ) -> List[Dict[str, Any]]:
        """Return the (shorter) OpenAI-format message list to send."""

    def should_compress_preflight(self, messages: List[Dict[str, Any]]) -> bool:
        return False

    def should_defer_preflight_to_real_usage(self, rough_tokens: int) -> bool:
        return False

    def has_content_to_compress(self, messages: List[Dict[str, Any]]) -> bool:
        return True

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        """A conversation begins (kwargs: hermes_home, platform, model)."""

    def on_session_end(self, session_id: str, messages: List[Dict[str, Any]]) -> None:
        """The session really ends (not per turn)."""

    def on_session_reset(self) -> None:
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0

    def get_tool_schemas(self) -> List[Dict[str, Any]]:
        return []

    def handle_tool_call(self, name: str, args: Dict[str, Any], **kwargs: Any) -> str:
        return json.dumps({"error": f"Unknown context engine tool: {name}"})

    def get_status(self) -> Dict[str, Any]:
        last = self.last_prompt_tokens if self.last_prompt_tokens > 0 else 0
        return {
            "last_prompt_tokens": last,
            "threshold_tokens": self.threshold_tokens,
            "context_length": self.context_length,
            "usage_percent": min(100, last / self.context_length * 100) if self.context_length else 0,
            "compression_count": self.compression_count,
        }

    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: str = "",
                     provider: str = "", api_mode: str = "") -> None:
        """The model (or the context budget) changed. The host never passes ``api_key``."""
        self.context_length = context_length
        self.threshold_tokens = int(context_length * self.threshold_percent)
