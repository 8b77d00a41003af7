"""The built-in context compressor: trim the oldest turns past a token budget.

The engine a session uses when no plugin registered one (``context.engine: compressor``). Leading
system messages and the last user turn are always kept (even when that turn alone exceeds the
budget); an assistant message with ``tool_calls`` and the ``tool`` messages answering it are kept
or dropped together; otherwise whole turns are dropped, oldest first, until the estimate fits, and
one short system note says how many messages were left out.

Token counts are an estimate (about four characters per token plus a small per-message overhead;
no tokenizer). The input list is never modified.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from plugin_llm.plugins.engines import ContextEngine

__all__ = ["ContextCompressor", "estimate_tokens", "estimate_message_tokens", "DEFAULT_BUDGET_TOKENS"]

#: Budget used when neither the session nor ``context.budget_tokens`` sets one.
DEFAULT_BUDGET_TOKENS = 16_000

_PER_MESSAGE_OVERHEAD = 4
_CHARS_PER_TOKEN = 4


def _content_chars(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # OpenAI content parts
        total = 0
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    total += len(part["text"])
                elif part.get("type") == "image_url":
                    total += 340 * _CHARS_PER_TOKEN  # an image costs a few hundred tokens
                else:
                    total += len(json.dumps(part, default=str))
            else:
                total += len(str(part))
        return total
    return len(str(content))


def estimate_message_tokens(message: dict[str, Any]) -> int:
    """Rough token count of one chat message (content, tool calls, name)."""
    chars = _content_chars(message.get("content"))
    for call in message.get("tool_calls") or ():
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        chars += len(str(fn.get("name", ""))) + len(str(fn.get("arguments", "")))
    if message.get("name"):
        chars += len(str(message["name"]))
    return _PER_MESSAGE_OVERHEAD + (chars + _CHARS_PER_TOKEN - 1) // _CHARS_PER_TOKEN


def estimate_tokens(messages: Iterable[dict[str, Any]]) -> int:
    """Rough token count of a message list."""
    return sum(estimate_message_tokens(m) for m in messages)


def _units(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Group messages so an assistant tool call and its tool results stay together."""
    units: list[list[dict[str, Any]]] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        unit = [msg]
        i += 1
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            while i < len(messages) and messages[i].get("role") == "tool":
                unit.append(messages[i])
                i += 1
        units.append(unit)
    return units


def _turns(units: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Split units into turns; a turn starts at each user message."""
    turns: list[list[dict[str, Any]]] = []
    for unit in units:
        if not turns or unit[0].get("role") == "user":
            turns.append([])
        turns[-1].extend(unit)
    return turns


class ContextCompressor(ContextEngine):
    """Trim the oldest turns until the conversation fits ``budget_tokens``.

    A :class:`~plugin_llm.plugins.ContextEngine` like the ones plugins
    register, so a session treats the two alike. ``note=False`` drops the "N earlier messages omitted" system note.
    """

    name = "compressor"

    def __init__(self, *, note: bool = True) -> None:
        self.note = note

    def compress(self, messages: list[dict[str, Any]], *, budget_tokens: int) -> list[dict[str, Any]]:
        messages = list(messages)
        if budget_tokens <= 0 or estimate_tokens(messages) <= budget_tokens:
            return messages

        head = 0
        while head < len(messages) and messages[head].get("role") == "system":
            head += 1
        system, rest = messages[:head], messages[head:]
        # Orphan tool results (their assistant call already gone) cannot be sent.
        while rest and rest[0].get("role") == "tool":
            rest = rest[1:]
        turns = _turns(_units(rest))
        if len(turns) <= 1:
            return system + rest

        last = turns[-1]
        older = turns[:-1]
        fixed = estimate_tokens(system) + estimate_tokens(last)
        if self.note:
            fixed += estimate_message_tokens(self._note(10_000))
        # Keep the newest older turns that still fit, dropping from the oldest.
        kept: list[list[dict[str, Any]]] = []
        used = fixed
        for turn in reversed(older):
            cost = estimate_tokens(turn)
            if used + cost > budget_tokens:
                break
            kept.append(turn)
            used += cost
        kept.reverse()
        dropped = sum(len(t) for t in older[: len(older) - len(kept)])
        if dropped == 0:
            return system + rest
        body = [m for turn in kept for m in turn] + last
        if self.note:
            return system + [self._note(dropped)] + body
        return system + body

    @staticmethod
    def _note(dropped: int) -> dict[str, Any]:
        plural = "message was" if dropped == 1 else "messages were"
        return {
            "role": "system",
            "content": f"[context] {dropped} earlier {plural} omitted to stay within the context budget.",
        }
