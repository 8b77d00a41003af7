"""A context engine that replaces the host's built-in compressor.

Registered with ``ctx.register_context_engine``; it becomes active when
``context.engine`` is ``keep-recent`` (or unset while it is the only engine).
Before every model request the host hands it the full message list and a
token budget; it returns the list to send and must not modify its input.

Strategy, cheapest loss first:

1. tool results older than the current turn are replaced by a one-line stub
   (they are usually long and already digested by the assistant's reply);
2. if still over budget, whole turns are dropped from the oldest, always
   keeping the system messages and the latest user turn. A turn starts at a
   user message, so an assistant tool call and its tool results stay together.
"""

from __future__ import annotations

from plugin_llm.plugins import ContextEngine


def _tokens(messages) -> int:
    chars = 0
    for m in messages:
        chars += len(str(m.get("content") or "")) + sum(
            len(str(c.get("function", {}).get("arguments", ""))) for c in m.get("tool_calls") or ()
        )
    return chars // 4 + 4 * len(messages)


class KeepRecent(ContextEngine):
    name = "keep-recent"

    def compress(self, messages: list[dict], *, budget_tokens: int) -> list[dict]:
        system = [m for m in messages if m.get("role") == "system"]
        rest = [m for m in messages if m.get("role") != "system"]
        starts = [i for i, m in enumerate(rest) if m.get("role") == "user"] or [0]
        last_start = starts[-1]

        # 1. stub old tool output
        out = []
        for i, m in enumerate(rest):
            if i < last_start and m.get("role") == "tool" and len(str(m.get("content") or "")) > 80:
                m = {**m, "content": f"[old tool output elided: {len(str(m['content']))} characters]"}
            out.append(m)
        if _tokens(system + out) <= budget_tokens:
            return system + out

        # 2. drop oldest turns
        for start in starts[1:]:
            if _tokens(system + out[start:]) <= budget_tokens:
                return system + out[start:]
        return system + out[last_start:]


def register(ctx):
    ctx.register_context_engine(KeepRecent())
