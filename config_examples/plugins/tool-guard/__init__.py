"""A tool-call policy: refuse listed tools and protected paths before they run.

``pre_tool_call`` hooks run before every tool handler. Returning
``{"action": "block", "message": "..."}`` stops the call: the handler never
runs and the model receives the message as the tool's result. The first
valid block wins; anything else returned is ignored. A guard that raises or
times out also blocks (``pre_tool_call`` fails closed).

A second hook, ``transform_tool_result``, cuts very long tool results before
they reach the model (the first string returned replaces the result).

The policy lives in ``data/policy.yaml`` beside this file.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

POLICY_FILE = Path(__file__).parent / "data" / "policy.yaml"


def _load_policy() -> dict:
    data = yaml.safe_load(POLICY_FILE.read_text(encoding="utf-8")) or {}
    return {
        "blocked_tools": dict(data.get("blocked_tools") or {}),
        "protected_paths": [os.path.expanduser(p).rstrip("/") for p in data.get("protected_paths") or []],
        "max_result_chars": int(data.get("max_result_chars") or 0),
    }


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _protected(text: str, roots: list[str]) -> str | None:
    if "/" not in text and not text.startswith("~"):
        return None
    path = os.path.normpath(os.path.expanduser(text.strip()))
    for root in roots:
        if path == root or path.startswith(root + os.sep):
            return root
    return None


def register(ctx):
    policy = _load_policy()

    def guard(tool_name, args=None, **_):
        reason = policy["blocked_tools"].get(tool_name)
        if reason:
            return {"action": "block", "message": f"tool-guard: {reason}"}
        for text in _strings(args or {}):
            root = _protected(text, policy["protected_paths"])
            if root:
                return {"action": "block",
                        "message": f"tool-guard: {tool_name} may not touch {text!r} (under {root})."}
        return None  # allow

    def cap_result(tool_name, result=None, **_):
        limit = policy["max_result_chars"]
        if limit and isinstance(result, str) and len(result) > limit:
            return result[:limit] + f"\n[tool-guard: result cut to {limit} of {len(result)} characters]"
        return None  # keep the result as it is

    ctx.register_hook("pre_tool_call", guard)
    ctx.register_hook("transform_tool_result", cap_result)
