"""``agent.skill_commands``: the helper memory plugins use to skip skill scaffolding.

This host does not expand ``/skill`` invocations into the user's message, so a
user message is always the user's own text: it is returned unchanged.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["extract_user_instruction_from_skill_message"]


def extract_user_instruction_from_skill_message(content: Any) -> Optional[str]:
    """The user's instruction: the string itself (None for anything that is not a string)."""
    return content if isinstance(content, str) else None
