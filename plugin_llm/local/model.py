"""The embedded ``local`` model: an offline, deterministic stand-in.

This is **not a language model**. It is a small rule-based responder that speaks the OpenAI
``chat.completion`` format so that the gateway, the demo and the tests work on a fresh machine
with no key and no network. It is pure: stdlib only, no network, no randomness, no clock; the
same request always yields the same reply (byte for byte).

It answers, in order of precedence: **tool calls** when an offered tool is asked for
(``call <tool> [with {json}]``, ``use the <tool> tool [with name=value, ...]``); **structured
output** for ``response_format`` (an instance that validates, filled from ``key: value`` facts of
the user messages, see :func:`extract_facts`); **tool results** (``Tool <name> returned: ...``);
else a **chat** echo or a one-sentence summary. ``max_tokens`` truncates with
``finish_reason="length"``; usage comes from a deterministic tokenizer (``\\w+|[^\\w\\s]``).
Its parts: :mod:`plugin_llm.local`; every rule in full: docs/design.md, "The local model".
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from plugin_llm.local.facts import _REPAIR_RE, _find_schema_in_text, _snake, extract_facts
from plugin_llm.local.instances import _Instance, _schema_of
from plugin_llm.local.messages import (
    IMAGE_TOKENS,
    LOCAL_MODEL,
    _content,
    _msg,
    _prompt_tokens,
    _truncate,
    count_tokens,
    stream_pieces,
)
from plugin_llm.local.tools import _forced_tool, _tool_requests, _tool_specs

__all__ = ["LOCAL_MODEL", "IMAGE_TOKENS", "generate", "count_tokens", "extract_facts", "stream_pieces"]


_QUOTE_CHARS = 200


_SUMMARY_RE = re.compile(r"\b(?:summari[sz]e|summary|tl;\s?dr|tldr)\b", re.I)
_SENTENCE_RE = re.compile(r".+?(?:[.!?](?=\s|$)|$)", re.S)


def _sentences(text: str) -> list[str]:
    flat = " ".join(text.split())
    return [s.strip() for s in _SENTENCE_RE.findall(flat) if s.strip()]


def _chat_reply(text: str, images: int) -> str:
    m = _SUMMARY_RE.search(text)
    if m:
        rest = text[m.end():]
        cut = [i for i in (rest.find(":"), rest.find("\n")) if i >= 0]
        source = rest[min(cut) + 1:] if cut else ""
        if not source.strip():
            source = " ".join(s for s in _sentences(text) if not _SUMMARY_RE.search(s))
        sentences = _sentences(source)
        if sentences:
            return sentences[0]
    flat = " ".join(text.split())
    quoted = flat if len(flat) <= _QUOTE_CHARS else flat[:_QUOTE_CHARS].rstrip() + "\u2026"
    words = len(flat.split())
    extra = f", {images} image{'s' if images != 1 else ''}" if images else ""
    return f'Local model reply to: "{quoted}" ({words} word{"s" if words != 1 else ""}{extra})'


def _tool_results_reply(messages: list[dict]) -> str | None:
    trailing: list[dict] = []
    for m in reversed(messages):
        if m.get("role") in ("tool", "function"):
            trailing.append(m)
        else:
            break
    if not trailing:
        return None
    names: dict[str, str] = {}
    for m in messages:
        for call in m.get("tool_calls") or []:
            call = _msg(call)
            fn = _msg(call.get("function") or {})
            if call.get("id"):
                names[call["id"]] = fn.get("name") or "tool"
    lines = []
    for m in reversed(trailing):
        name = m.get("name") or names.get(m.get("tool_call_id") or "", "tool")
        text, _ = _content(m.get("content"))
        lines.append(f"Tool {name} returned: {text}")
    return "\n".join(lines)


def _sha(data: Any) -> str:
    raw = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


#: Installed by :mod:`plugin_llm.testing` (``replies=``): ``script(messages) -> str | dict | None``; a str
#: is the reply's text (no rule below applies), None falls through to the rules, a dict is a scripted turn
#: (:func:`_scripted_turn`). Empty in normal use.
_SCRIPT: list[Any] = []
#: the key of a completion that carries a scripted stream (``pieces``, ``error``): the in-process
#: provider pops it (:mod:`plugin_llm.transport._loading`); never in a reply otherwise
SCRIPTED_STREAM = "_scripted_stream"


def _scripted_turn(turn: dict, request_hash: str) -> tuple[str | None, list[dict] | None, dict | None]:
    """(text, tool calls, stream) of a scripted turn: ``{"content": str}``, ``{"tool_calls": [{"name",
    "arguments"}]}``, ``{"pieces": [str], "error": exc}`` (a stream, then the error if any) or
    ``{"error": exc}`` (raised here: the attempt fails as the provider's would)."""
    pieces, error = turn.get("pieces"), turn.get("error")
    if error is not None and not pieces:
        raise error
    calls = turn.get("tool_calls")
    if calls:
        return None, [{"id": "call_" + _sha([request_hash, i, c["name"]])[:24], "type": "function",
                       "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments") or {},
                                                                               ensure_ascii=False)}}
                      for i, c in enumerate(calls)], None
    if pieces:
        return "".join(pieces), None, {"pieces": list(pieces), "error": error}
    return str(turn.get("content") or ""), None, None


def generate(
    messages: list[dict],
    *,
    model: str | None = None,
    response_format: dict | None = None,
    tools: list[dict] | None = None,
    tool_choice: Any = None,
    max_tokens: int | None = None,
    created: int = 0,
    **ignored: Any,
) -> dict:
    """Answer one chat request deterministically; returns a ``chat.completion`` dict.

    ``model`` is accepted (any alias) but the reply always reports
    :data:`LOCAL_MODEL`. ``created`` is the timestamp to report (default 0, so
    replies are byte-for-byte reproducible). Other OpenAI parameters
    (``temperature``, ``stream``, ...) are accepted and ignored, except
    ``max_completion_tokens`` which stands in for ``max_tokens``.
    """
    msgs = [_msg(m) for m in (messages or [])]
    if max_tokens is None:
        max_tokens = ignored.get("max_completion_tokens")
    request_hash = _sha([msgs, response_format if isinstance(response_format, dict) else str(response_format),
                         tools, tool_choice, max_tokens])

    # Facts come from user (and tool-result) messages, excluding repair turns
    # after the first user message and any schema pasted into the prompt.
    fact_texts: list[str] = []
    first_user = True
    last_user_text, last_user_images = "", 0
    for m in msgs:
        role = m.get("role")
        if role not in ("user", "tool", "function"):
            continue
        text, images = _content(m.get("content"))
        if role == "user":
            last_user_text, last_user_images = text, images
            if not first_user and _REPAIR_RE.search(text):
                continue
            first_user = False
        found = _find_schema_in_text(text)
        if found:
            _, (a, b) = found
            text = text[:a] + text[b:]
        fact_texts.append(text)
    facts: dict = {}
    for text in fact_texts:
        for key, fact in extract_facts(text).items():
            facts.setdefault(key, fact)

    content: str | None = None
    tool_calls: list[dict] | None = None
    scripted = _SCRIPT[-1](msgs) if _SCRIPT else None  # plugin_llm.testing: replies an author scripted
    stream: dict | None = None
    if isinstance(scripted, dict):
        scripted, tool_calls, stream = _scripted_turn(scripted, request_hash)
    specs = _tool_specs(tools) if scripted is None and tool_calls is None else {}
    last_role = msgs[-1].get("role") if msgs else None
    if specs and last_role == "user" and tool_choice != "none":
        forced, required = _forced_tool(tool_choice, specs)
        requests = _tool_requests(last_user_text, specs, facts)
        if forced:
            requests = [r for r in requests if r[0] == forced]
        if not requests and required:
            name = forced or next(iter(specs.values()))["name"]
            params = specs[name.lower()]["parameters"] or {"type": "object"}
            args = _Instance(params, facts).value(params, [])
            requests = [(name, args if isinstance(args, dict) else {})]
        if requests:
            tool_calls = [
                {
                    "id": "call_" + _sha([request_hash, i, name])[:24],
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
                for i, (name, args) in enumerate(requests)
            ]

    if tool_calls is None:
        rf_type = response_format.get("type") if isinstance(response_format, dict) else (
            "json_schema" if hasattr(response_format, "model_json_schema") else None)
        if scripted is not None:
            content = scripted
        elif rf_type == "json_schema":
            schema = _schema_of(response_format)
            content = json.dumps(_Instance(schema, facts).value(schema, []), ensure_ascii=False)
        elif rf_type == "json_object":
            schema = None
            for m in reversed(msgs):
                if m.get("role") in ("system", "developer", "user"):
                    found = _find_schema_in_text(_content(m.get("content"))[0])
                    if found:
                        schema = found[0]
                        break
            if schema is not None:
                value = _Instance(schema, facts).value(schema, [])
            elif facts:
                value = {_snake(key): fact for key, fact in facts.values()}
            else:
                value = {"reply": _chat_reply(last_user_text, last_user_images)}
            content = json.dumps(value, ensure_ascii=False)
        else:
            content = _tool_results_reply(msgs) if last_role in ("tool", "function") else None
            if content is None:
                content = _chat_reply(last_user_text, last_user_images)

    finish = "stop"
    if tool_calls is not None:
        finish = "tool_calls"
        completion_tokens = sum(
            count_tokens(c["function"]["name"]) + count_tokens(c["function"]["arguments"]) for c in tool_calls
        )
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    else:
        assert content is not None
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
            content, completion_tokens, cut = _truncate(content, max_tokens)
            if cut:
                finish = "length"
        else:
            completion_tokens = count_tokens(content)
        message = {"role": "assistant", "content": content}

    prompt_tokens = _prompt_tokens(msgs, tools)
    reply = {
        "id": "chatcmpl-local-" + request_hash[:24],
        "object": "chat.completion",
        "created": created,
        "model": LOCAL_MODEL,
        "system_fingerprint": LOCAL_MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    if stream is not None:
        reply[SCRIPTED_STREAM] = stream
    return reply
