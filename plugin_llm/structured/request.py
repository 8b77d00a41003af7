"""The request of a structured call: its ``response_format`` and its chat messages.

A route that takes a JSON Schema natively gets it as ``response_format``; any other gets
``json_object`` and the schema in the system message.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Sequence

from plugin_llm.structured.inputs import Block, normalise_input
from plugin_llm.structured.schema import check_instructions, check_schema
from plugin_llm.types import PluginLlmImageInput, PluginLlmTextInput

_DEFAULT_SCHEMA_NAME = "response"
_SCHEMA_NAME_MAX = 64  # OpenAI: name must match ^[a-zA-Z0-9_-]{1,64}$
_SCHEMA_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_JSON_DIRECTIVE = (
    "Answer with a single JSON value only: no prose before or after it, "
    "no explanations, no markdown code fences."
)


def response_format(
    *, json_schema: dict | None, schema_name: str | None, json_mode: bool, native_schema: bool
) -> dict[str, Any]:
    """The ``response_format`` for a structured call.

    With a schema on a route that supports it (``native_schema``):
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict": False}}``
    (``strict`` stays off because OpenAI's strict mode rejects ordinary
    schemas, e.g. optional properties; we validate locally anyway).
    Everything else gets ``{"type": "json_object"}`` - including no schema
    and ``json_mode=False``: ``complete_structured`` always expects a JSON
    value back (its result is ``parsed``), so asking for anything else would
    only make replies harder to parse. ``json_mode`` is accepted so callers
    can pass the plugin's arguments through; it does not change the result.
    """
    del json_mode  # see docstring: structured calls always want JSON
    if json_schema is not None and native_schema:
        check_schema(json_schema)
        return {
            "type": "json_schema",
            "json_schema": {"name": _api_schema_name(schema_name), "schema": json_schema, "strict": False},
        }
    return {"type": "json_object"}


def _api_schema_name(schema_name: str | None) -> str:
    """Sanitise ``schema_name`` to OpenAI's ``^[a-zA-Z0-9_-]{1,64}$`` (default ``"response"``)."""
    name = _checked_schema_name(schema_name)
    if name is None:
        return _DEFAULT_SCHEMA_NAME
    cleaned = _SCHEMA_NAME_BAD_CHARS.sub("_", name.strip()).strip("_")[:_SCHEMA_NAME_MAX]
    return cleaned or _DEFAULT_SCHEMA_NAME


def _checked_schema_name(schema_name: Any) -> str | None:
    """``schema_name`` as a str, ``None`` when absent or blank; ValueError for other types."""
    if schema_name is None:
        return None
    if not isinstance(schema_name, str):
        raise ValueError(f"schema_name must be a str, got {type(schema_name).__name__}.")
    return schema_name.strip() or None


def build_messages(
    *,
    instructions: str,
    blocks: Sequence[Any],
    json_schema: dict | None,
    schema_name: str | None,
    system_prompt: str | None,
    native_schema: bool,
) -> list[dict[str, Any]]:
    """The chat messages of a structured call: one system message, one user message.

    System: the plugin's ``system_prompt`` (if any), then the JSON-only
    directive (it also carries the word "JSON", which OpenAI's json_object
    mode requires), the schema name, and - when the route cannot take the
    schema natively - the schema itself as compact JSON (author's key order
    kept, since models tend to follow it).

    User: always a list of OpenAI content parts, even when every part is
    text, so the shape never depends on the input (litellm flattens text-only
    lists for providers without multimodal support). The instructions come
    first, then each block in order; image bytes become ``data:`` URLs and
    URLs pass through. Blank text blocks are dropped: some providers
    (Anthropic) reject empty text parts.
    """
    check_instructions(instructions)
    check_schema(json_schema)
    return [
        {"role": "system", "content": _system_text(json_schema, schema_name, system_prompt, native_schema)},
        {"role": "user", "content": _user_parts(instructions, normalise_input(blocks))},
    ]


def _system_text(
    json_schema: dict | None, schema_name: str | None, system_prompt: str | None, native_schema: bool
) -> str:
    """The system message text: plugin prompt, JSON directive, schema name and (non-native) schema."""
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError(f"system_prompt must be a str or None, got {type(system_prompt).__name__}.")
    sections = [system_prompt.strip()] if system_prompt and system_prompt.strip() else []
    directive = [_JSON_DIRECTIVE]
    name = _checked_schema_name(schema_name)
    if json_schema is not None:
        if native_schema:
            directive.append("The JSON must validate against the JSON Schema attached to this request.")
        else:
            directive.append("The JSON must validate against the JSON Schema below.")
        if name is not None:
            directive.append(f"Schema name: {' '.join(name.split())}")
        if not native_schema:
            schema_text = json.dumps(json_schema, separators=(",", ":"), ensure_ascii=False)
            directive.append(f"JSON Schema:\n{schema_text}")
    sections.append("\n".join(directive))
    return "\n\n".join(sections)


def _user_parts(instructions: str, blocks: tuple[Block, ...]) -> list[dict[str, Any]]:
    """OpenAI content parts: the instructions, then every non-blank block in order."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": instructions}]
    for block in blocks:
        if isinstance(block, PluginLlmTextInput):
            if block.text.strip():
                parts.append({"type": "text", "text": block.text})
        else:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block)}})
    return parts


def _image_url(block: PluginLlmImageInput) -> str:
    """The URL of an image block: its own URL, or a base64 ``data:`` URL of its bytes."""
    if block.url is not None:
        return block.url
    assert block.data is not None  # guaranteed by PluginLlmImageInput
    return f"data:{block.mime_type};base64,{base64.b64encode(block.data).decode('ascii')}"
