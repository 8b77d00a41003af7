"""``agent.memory_provider``: the base class of a Hermes memory provider.

The host drives the provider ``memory.provider`` selects, through this
interface (:mod:`plugin_llm.host.memory`): ``is_available()`` decides whether
it is used; ``initialize(session_id, hermes_home=, platform=, agent_context=
"primary")`` once per session; ``system_prompt_block()`` joins the system
prompt; ``on_turn_start(turn, message)`` and ``prefetch(query, session_id=)``
before each turn (the text rides on the turn's user message, never persisted);
``sync_turn(user, assistant, session_id=, messages=)`` and
``queue_prefetch(query, session_id=)`` after it; ``get_tool_schemas()`` are
offered to the model as tools, answered by ``handle_tool_call(name, args)``;
``on_session_end(messages)`` and ``shutdown()`` when the session closes. Each
call runs isolated, under ``plugins.hook_timeout``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional

__all__ = ["MemoryProvider"]

logger = logging.getLogger(__name__)


class MemoryProvider(ABC):
    """Base class of a memory provider (``ctx.register_memory_provider``)."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Short identifier, matched against ``memory.provider``."""

    @abstractmethod
    def is_available(self) -> bool:
        """True when configured and ready (no network calls)."""

    @abstractmethod
    def initialize(self, session_id: str, **kwargs: Any) -> None:
        """Set up for a session (kwargs: hermes_home, platform, agent_context, ...)."""

    def system_prompt_block(self) -> str:
        return ""

    def prefetch(self, query: str, *, session_id: str = "") -> str:
        return ""

    def queue_prefetch(self, query: str, *, session_id: str = "") -> None:
        pass

    def sync_turn(self, user_content: str, assistant_content: str, *, session_id: str = "",
                  messages: Optional[List[Dict[str, Any]]] = None) -> None:
        pass

    @abstractmethod
    def get_tool_schemas(self) -> List[Dict[str, Any]]:
        """OpenAI function schemas of the provider's tools ([] for none)."""

    def handle_tool_call(self, tool_name: str, args: Dict[str, Any], **kwargs: Any) -> str:
        raise NotImplementedError(f"Provider {self.name} does not handle tool {tool_name}")

    def shutdown(self) -> None:
        pass

    def on_turn_start(self, turn_number: int, message: str, **kwargs: Any) -> None:
        pass

    def on_session_end(self, messages: List[Dict[str, Any]]) -> None:
        pass

    def on_session_switch(self, new_session_id: str, *, parent_session_id: str = "", reset: bool = False,
                          rewound: bool = False, **kwargs: Any) -> None:
        pass

    def on_pre_compress(self, messages: List[Dict[str, Any]]) -> str:
        return ""

    def on_delegation(self, task: str, result: str, *, child_session_id: str = "", **kwargs: Any) -> None:
        pass

    def get_config_schema(self) -> List[Dict[str, Any]]:
        return []

    def save_config(self, values: Dict[str, Any], hermes_home: str) -> None:
        pass

    def on_memory_write(self, action: str, target: str, content: str,
                        metadata: Optional[Dict[str, Any]] = None) -> None:
        pass

    def backup_paths(self) -> List[str]:
        return []
