"""One public ``ctx.llm`` call's arguments, built once per call by the facade (``plugin_llm.llm``).

The values are kept as the plugin passed them: the pipeline checks them, in
its fixed order, when the call runs (an async call's or a stream's problems
surface where the plugin awaits or iterates it). A new ``ctx.llm`` parameter
is a field here, a parameter of the facade's methods, and its use in the
pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CallRequest", "StructuredSpec"]


@dataclass(frozen=True, slots=True)
class StructuredSpec:
    """What ``complete_structured`` asks for beyond a chat call."""

    instructions: Any
    input: Any
    json_schema: Any = None
    json_mode: Any = False
    schema_name: Any = None
    system_prompt: Any = None


@dataclass(frozen=True, slots=True)
class CallRequest:
    """The arguments of one call: ``mode`` is how the shell runs it (``"sync"`` or ``"async"``)."""

    mode: str
    messages: Any = None  # complete / stream / chat; a structured call's are built from ``structured``
    provider: Any = None  # the overrides the trust policy decides on
    model: Any = None
    agent_id: Any = None
    profile: Any = None
    temperature: Any = None  # the request's parameters
    max_tokens: Any = None
    timeout: Any = None
    purpose: Any = None
    task: Any = None  # an auxiliary task's key (``auxiliary.<task>``); decided first by the trust gate
    options: dict[str, Any] | None = None  # ``**options``: further provider parameters (``call_options``)
    tools: Any = None  # the host's own calls (``HostLlm.chat``); a plugin passes ``tools=`` in ``options``
    structured: StructuredSpec | None = None

    @property
    def api(self) -> str:
        """The ``api`` of the call's records: ``"structured"`` or ``"complete"`` (a stream's too)."""
        return "complete" if self.structured is None else "structured"
