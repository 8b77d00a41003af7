"""``ctx.register_system_prompt_section``: bounded blocks of a new session's system prompt.

A section is a string or ``callable(session_info) -> str`` (run once per new session, under
``plugins.hook_timeout``). Rendering follows Hermes: sections in id order, each stripped; an empty
one is skipped, one over its ``max_chars`` or holding the container's markers is dropped (never
cut), and sections past :data:`MAX_TOTAL_CHARS` of framed text are left out. The result sits between
``<!-- hermes-plugin-sections:start -->`` and ``…:end -->``, each as ``## Plugin Context: <id>``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["SectionEntry", "POSITIONS", "MAX_SECTION_CHARS", "MAX_SECTIONS", "MAX_TOTAL_CHARS", "START", "END",
           "check_section", "render"]

_log = logging.getLogger("plugin_llm.plugins")

POSITIONS = frozenset({"after_memory"})
MAX_SECTION_CHARS = 4_000
MAX_SECTIONS = 32
MAX_TOTAL_CHARS = 8_000
START = "<!-- hermes-plugin-sections:start -->"
END = "<!-- hermes-plugin-sections:end -->"
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_MARKERS = ("hermes-plugin-sections:", "hermes-plugin-section-chars:")


@dataclass(frozen=True)
class SectionEntry:
    id: str
    content: Any  # str or callable(session_info) -> str
    position: str
    max_chars: int
    plugin_key: str


def check_section(section_id: Any, content: Any, position: Any, max_chars: Any, who: str) -> None:
    """ValueError/TypeError for a section Hermes would refuse."""
    if not isinstance(section_id, str) or not _ID.fullmatch(section_id):
        raise ValueError(f"{who}: section id {str(section_id)[:60]!r} must match {_ID.pattern}")
    if not (isinstance(content, str) or callable(content)):
        raise TypeError(f"{who}: content must be a string or a callable(session_info) returning one")
    if position not in POSITIONS:
        raise ValueError(f"{who}: position must be one of {', '.join(sorted(POSITIONS))}, got {str(position)[:40]!r}")
    if type(max_chars) is not int or not 1 <= max_chars <= MAX_SECTION_CHARS:
        raise ValueError(f"{who}: max_chars must be an int from 1 to {MAX_SECTION_CHARS}")
    if isinstance(content, str) and len(content.strip()) > max_chars:
        raise ValueError(f"{who}: content is {len(content.strip())} characters, over max_chars={max_chars}")


def _frame(section_id: str, text: str) -> str:
    return f"## Plugin Context: {section_id}\n<!-- hermes-plugin-section-chars:{len(text)} -->\n\n{text}"


def render(sections: list[SectionEntry], call: Callable[[SectionEntry, dict[str, Any]], Any],
           session_info: dict[str, Any]) -> str:
    """The container with every section that renders within the bounds ('' when none does)."""
    blocks: list[str] = []
    total = 0
    for entry in sorted(sections, key=lambda e: e.id):
        text = entry.content if isinstance(entry.content, str) else call(entry, dict(session_info))
        if not isinstance(text, str):
            continue
        text = text.strip()
        if not text:
            continue
        if len(text) > entry.max_chars or any(marker in text for marker in _MARKERS):
            _log.warning("plugin %s: system prompt section %s left out: %s", entry.plugin_key, entry.id,
                         "over its max_chars" if len(text) > entry.max_chars else "it holds the sections' markers")
            continue
        block = _frame(entry.id, text)
        if total + len(block) > MAX_TOTAL_CHARS:
            _log.warning("plugin %s: system prompt section %s left out: the sections are over %d characters",
                         entry.plugin_key, entry.id, MAX_TOTAL_CHARS)
            continue
        blocks.append(block)
        total += len(block)
    return f"{START}\n" + "\n\n".join(blocks) + f"\n{END}" if blocks else ""
