"""The plain data a host turn passes around: message copies, tool and assistant messages,
token estimates and usage sums, and whether a tool is offered now."""

from __future__ import annotations

import json
import logging
from typing import Any

from plugin_llm.host.compressor import estimate_tokens

_log = logging.getLogger("plugin_llm.host")


def check_tool(entry: Any) -> bool:
    """Whether a tool is offered now: ``is_available()`` (env + check_fn) when the entry has it."""
    available = getattr(entry, "is_available", None)
    if callable(available):
        try:
            return bool(available())
        except Exception:
            return False
    check = getattr(entry, "check_fn", None)
    if check is None:
        return True
    try:
        return bool(check())
    except Exception as exc:
        _log.debug("check_fn of tool %s raised %s; tool not offered", getattr(entry, "name", "?"), exc)
        return False


def copy_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(m) for m in messages]


def char_count(messages: list[dict[str, Any]]) -> int:
    """Characters of the messages' text content (Hermes's ``request_char_count``)."""
    return sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))


def approx_tokens(messages: list[dict[str, Any]]) -> int:
    return estimate_tokens(messages)


def tool_message(call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def assistant_message(result: Any) -> dict[str, Any]:
    """The assistant message to store, always with role and tool_calls when there are any."""
    msg = dict(getattr(result, "message", None) or {})
    msg["role"] = "assistant"
    if result.tool_calls and not msg.get("tool_calls"):
        msg["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.raw_arguments or json.dumps(c.arguments)}}
            for c in result.tool_calls
        ]
    if "content" not in msg:
        msg["content"] = result.text
    return msg


def usage_dict(usage: Any) -> dict[str, Any] | None:
    if usage is None:
        return None
    if isinstance(usage, dict):
        return dict(usage)
    fields = ("input_tokens", "output_tokens", "total_tokens", "cache_read_tokens", "cache_write_tokens",
              "cost_usd")
    return {f: getattr(usage, f, None) for f in fields}


def add_usage(a: Any, b: Any) -> Any:
    if b is None:
        return a
    try:
        return a + b
    except TypeError:
        return a
