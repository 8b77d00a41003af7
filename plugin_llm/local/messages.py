"""The local model's reading of a request: messages as plain dicts, their text, images and tokens.

Tokens come from a deterministic tokenizer (``\\w+|[^\\w\\s]``); one image part costs
:data:`IMAGE_TOKENS` prompt tokens.
"""

from __future__ import annotations

import json
import re
from typing import Any


#: The model name the local model reports, whatever alias was requested.
LOCAL_MODEL = "local-echo-1"
#: Fixed prompt-token cost of one image part.
IMAGE_TOKENS = 85


_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """Number of tokens in ``text``: word runs and single punctuation marks."""
    return len(_TOKEN_RE.findall(text)) if text else 0


def stream_pieces(text: str, words: int = 4) -> list[str]:
    """``text`` as the deltas of a streamed reply: pieces of ``words`` words, whitespace kept.

    ``"".join(stream_pieces(t)) == t`` for every text; the in-process ``local``
    provider and ``plugin-llm serve-local`` stream the same pieces.
    """
    if not text:
        return []
    spaced = re.split(r"(?<=\s)(?=\S)", text)  # words with their trailing whitespace
    return ["".join(spaced[i:i + words]) for i in range(0, len(spaced), words)]


def _truncate(text: str, max_tokens: int) -> tuple[str, int, bool]:
    """``text`` cut after its ``max_tokens``-th token -> (text, tokens, truncated)."""
    ends = [m.end() for m in _TOKEN_RE.finditer(text)]
    if len(ends) <= max_tokens:
        return text, len(ends), False
    return text[: ends[max_tokens - 1]], max_tokens, True


def _msg(m: Any) -> dict:
    """A message as a plain dict (accepts pydantic-like message objects)."""
    if isinstance(m, dict):
        return m
    dump = getattr(m, "model_dump", None)
    if callable(dump):
        try:
            return dump()
        except Exception:  # pragma: no cover - defensive
            pass
    return {k: getattr(m, k, None) for k in ("role", "content", "name", "tool_calls", "tool_call_id")}


def _content(content: Any) -> tuple[str, int]:
    """(text, number of images) of a message ``content`` (string or list of parts)."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, (list, tuple)):
        return str(content), 0
    texts: list[str] = []
    images = 0
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("image_url", "input_image", "image"):
            images += 1
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n".join(texts), images


def _tool_calls_text(message: dict) -> str:
    parts = []
    for call in message.get("tool_calls") or []:
        call = _msg(call)
        fn = _msg(call.get("function") or {})
        parts.append(f"{fn.get('name') or ''} {fn.get('arguments') or ''}")
    return "\n".join(parts)


def _prompt_tokens(messages: list[dict], tools: list | None) -> int:
    total = 0
    for m in messages:
        text, images = _content(m.get("content"))
        total += count_tokens(text) + IMAGE_TOKENS * images + count_tokens(_tool_calls_text(m))
    if tools:
        total += count_tokens(json.dumps(tools, sort_keys=True, default=str))
    return total
