"""House style: context for every turn, tidy replies, and two read-only skills.

- ``pre_llm_call`` returns ``{"context": "..."}``. The host appends it to the
  *current user message* of this turn's model requests only: it never enters
  the system prompt (which stays cacheable) and is never stored in the
  conversation history.
- ``transform_llm_output`` gets the final reply text; returning a string
  replaces it (here: trailing spaces and runs of blank lines are removed).
- ``ctx.register_skill`` ships ``skills/*.md`` as ``house-style:house-style``
  and ``house-style:release-notes``: read-only, loaded by qualified name,
  kept out of the home's skill index, scanned for prompt-injection patterns.
"""

from __future__ import annotations

import re
from pathlib import Path

SKILLS = Path(__file__).parent / "skills"
STYLE = "House style: lead with the answer, short sentences, plain words."


def register(ctx):
    def add_style(is_first_turn=False, **_):
        return {"context": STYLE}

    def tidy(response_text=None, **_):
        if not isinstance(response_text, str):
            return None
        tidied = re.sub(r"\n{3,}", "\n\n", "\n".join(line.rstrip() for line in response_text.splitlines()))
        tidied = tidied.strip()
        return tidied if tidied != response_text else None  # None: leave the reply alone

    ctx.register_hook("pre_llm_call", add_style)
    ctx.register_hook("transform_llm_output", tidy)
    ctx.register_skill("house-style", SKILLS / "house-style.md", description="how replies should read")
    ctx.register_skill("release-notes", SKILLS / "release-notes.md", description="release notes layout")
