"""The tool calls a user message asks the local model for: ``call <tool> [with {json}]`` or
``use the <tool> tool [with name=value, ...]``, among the tools offered, and a forced ``tool_choice``."""

from __future__ import annotations

import json
import re
from typing import Any

from plugin_llm.local.instances import _Instance
from plugin_llm.local.messages import _msg


_KV_RE = re.compile(
    r"""\s*(?:and\s+)?(?P<k>[A-Za-z_][\w\-]*)\s*[=:]\s*"""
    r"""(?P<v>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\[[^\]]*\]|\{[^}]*\}|.*?)"""
    r"""\s*(?:[,;]|\band\b|$)"""
)


def _tool_specs(tools: list | None) -> dict[str, dict]:
    """Offered function tools: ``{lower_name: {"name", "parameters"}}``."""
    out: dict[str, dict] = {}
    for tool in tools or []:
        tool = _msg(tool)
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = fn.get("name")
        if isinstance(name, str) and name:
            params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
            out.setdefault(name.lower(), {"name": name, "parameters": params})
    return out


def _parse_kv_args(text: str, params: dict, gen: _Instance) -> dict:
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    lowered = {k.lower(): k for k in props}
    args: dict[str, Any] = {}
    pos = 0
    text = text.strip()
    if text.endswith("."):
        text = text[:-1]
    while pos < len(text):
        m = _KV_RE.match(text, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        key, raw = m.group("k"), m.group("v").strip()
        key = lowered.get(key.lower(), key)
        value: Any
        if raw[:1] in "\"'" and len(raw) >= 2 and raw[-1] == raw[0]:
            value = raw[1:-1]
        elif raw[:1] in "[{":
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw.strip("[]{}")
        else:
            value = raw
        if key in props and isinstance(value, str):
            ok, coerced = gen.coerce(value, props[key])
            value = coerced if ok else value
        args[key] = value
    return args


def _tool_requests(text: str, specs: dict[str, dict], facts: dict) -> list[tuple[str, dict]]:
    """Tool requests recognised in ``text`` (see the module docstring)."""
    if not specs or not text:
        return []
    names = "|".join(re.escape(s["name"]) for s in sorted(specs.values(), key=lambda s: -len(s["name"])))
    pattern = re.compile(
        rf"\b(?P<verb>call|invoke|run|use)\s+(?:the\s+)?[`'\"]?(?P<name>{names})[`'\"]?(?![\w\-])"
        rf"(?P<tool>\s+(?:tool|function))?(?:\s*\(\s*\))?(?P<with>\s+with\b)?",
        re.I,
    )
    decoder = json.JSONDecoder()
    found: list[tuple[str, dict]] = []
    for m in pattern.finditer(text):
        if m.group("verb").lower() == "use" and not (m.group("tool") or m.group("with")):
            continue
        spec = specs[m.group("name").lower()]
        args: dict = {}
        if m.group("with"):
            rest = text[m.end():]
            stripped = rest.lstrip()
            if stripped.startswith("{"):
                try:
                    obj, _ = decoder.raw_decode(stripped)
                    args = obj if isinstance(obj, dict) else {}
                except ValueError:
                    args = {}
            else:
                args = _parse_kv_args(rest.split("\n", 1)[0], spec["parameters"], _Instance(spec["parameters"], facts))
        found.append((spec["name"], args))
    return found


def _forced_tool(tool_choice: Any, specs: dict[str, dict]) -> tuple[str | None, bool]:
    """(name the call must use or None, whether some tool call is required)."""
    if isinstance(tool_choice, str):
        return None, tool_choice.lower() in ("required", "any")
    choice = _msg(tool_choice) if tool_choice is not None else {}
    fn = choice.get("function") if isinstance(choice.get("function"), dict) else choice
    name = fn.get("name") if isinstance(fn, dict) else None
    if isinstance(name, str) and name.lower() in specs:
        return specs[name.lower()]["name"], True
    return None, False
