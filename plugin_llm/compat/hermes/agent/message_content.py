"""``agent.message_content``: the visible text of a chat message's content."""

from __future__ import annotations

from typing import Any

__all__ = ["flatten_message_text"]


def _text_from_part(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        for key in ("text", "content", "output_text", "input_text"):
            value = part.get(key)
            if isinstance(value, str):
                return value
    return ""


def flatten_message_text(content: Any, *, sep: str = "\n") -> str:
    """Text of a string, a list of content parts (``{"type": "text", "text": ...}``) or one part."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return sep.join(chunk for chunk in (_text_from_part(p) for p in content) if chunk)
    return _text_from_part(content)
