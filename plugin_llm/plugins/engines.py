"""Base classes of the single-choice provider plugins.

A plugin registers an *instance* of a subclass:

- :class:`ContextEngine` (``ctx.register_context_engine``) replaces the host's
  built-in compressor; one may be registered in total. ``context.engine`` in
  config.yaml selects it (its ``name``, or the plugin's key/name); unset, the
  registered one is used; ``compressor`` keeps the built-in.
- :class:`MemoryProvider` (``ctx.register_memory_provider``): several may be
  registered; the active one is the one ``memory.provider`` names (unset or
  ``""`` = built-in memory only).
"""

from __future__ import annotations

import abc

__all__ = ["ContextEngine", "MemoryProvider"]


class ContextEngine(abc.ABC):
    """Decides what part of the conversation fits the next model call."""

    #: Shown in listings and matched against ``context.engine``.
    name: str = ""

    @abc.abstractmethod
    def compress(self, messages: list[dict], *, budget_tokens: int) -> list[dict]:
        """Return the messages to send (OpenAI chat format) within ``budget_tokens``.

        Must not mutate ``messages``; keep the system prompt and the latest user turn.
        """


class MemoryProvider(abc.ABC):
    """Long-term memory consulted before a turn and updated after it."""

    #: Matched against ``memory.provider``.
    name: str = ""

    def is_available(self) -> bool:
        """False when the provider cannot work now (missing service, key...)."""
        return True

    @abc.abstractmethod
    def recall(self, query: str, *, session_id: str) -> str | None:
        """Text worth adding to the prompt for ``query`` (None when nothing is relevant)."""

    @abc.abstractmethod
    def remember(self, user_message: str, assistant_message: str, *, session_id: str) -> None:
        """Store what is worth keeping from one finished exchange."""
