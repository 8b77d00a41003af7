"""Request bodies of the service: size cap, strict JSON, known fields, top-level types (issue 14).

Only the outer layer is checked here (a JSON object, every field known, each
of the right JSON type); the values themselves - messages, input blocks,
schemas, sampling parameters - are checked by the pipeline exactly as for
``ctx.llm``, which names the path of a bad value. Endpoint and key fields
(``api_key``, ``base_url``, ...) are passed on, so the pipeline refuses them
as the audited trust denial they are in-process.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import math
from typing import Any

from plugin_llm.call_options import COMPLETE_ONLY, FORBIDDEN, SAMPLING
from plugin_llm.safe_json import loads_bounded

__all__ = [
    "MAX_BODY_BYTES",
    "BadRequest",
    "parse_body",
    "complete_kwargs",
    "structured_kwargs",
    "chat_kwargs",
    "COMPLETE_FIELDS",
    "STRUCTURED_FIELDS",
    "CHAT_FIELDS",
]

#: the largest request body accepted (413 beyond): images travel base64-encoded
MAX_BODY_BYTES = 4 * 1024 * 1024
_MAX_DEPTH = 64

_STR = "a string"
_NUM = "a number"
_INT = "a whole number"
_BOOL = "true or false"
_LIST = "a list"
_OBJ = "an object"

_COMMON = {"provider": _STR, "model": _STR, "temperature": _NUM, "max_tokens": _INT, "timeout": _NUM,
           "agent_id": _STR, "profile": _STR, "purpose": _STR}
_COMPLETE_TYPES = {"messages": _LIST, **_COMMON}
_STRUCTURED_TYPES = {"instructions": _STR, "input": _LIST, "json_schema": _OBJ, "json_mode": _BOOL,
                     "schema_name": _STR, "system_prompt": _STR, **_COMMON}
#: OpenAI's chat completion fields the gateway takes, plus its own extensions (purpose, agent_id, ...)
_CHAT_TYPES = {"messages": _LIST, "model": _STR, "stream": _BOOL, "stream_options": _OBJ, "max_completion_tokens": _INT,
               **{k: v for k, v in _COMMON.items() if k != "model"}}

COMPLETE_FIELDS = frozenset(_COMPLETE_TYPES) | frozenset(SAMPLING) | frozenset(COMPLETE_ONLY) | FORBIDDEN
STRUCTURED_FIELDS = frozenset(_STRUCTURED_TYPES) | frozenset(SAMPLING) | FORBIDDEN
CHAT_FIELDS = frozenset(_CHAT_TYPES) | frozenset(SAMPLING) | frozenset(COMPLETE_ONLY) | FORBIDDEN
_REQUIRED = {"complete": ("messages",), "structured": ("instructions", "input"), "chat": ("messages",)}


class BadRequest(ValueError):
    """A 400 (or 413) answer: ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def _no_constant(name: str) -> Any:
    raise BadRequest(f"the body contains {name}, which is not JSON; send numbers as finite values")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (depth-bounded; NaN/Infinity refused)."""
    if not raw.strip():
        raise BadRequest("the request has no body; send a JSON object such as {\"messages\": [...]}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not UTF-8 (byte {exc.start}); send JSON encoded as UTF-8") from None
    try:
        value = loads_bounded(text, max_depth=_MAX_DEPTH, parse_constant=_no_constant)
    except BadRequest:
        raise
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise BadRequest(f"the body is not usable JSON ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the body must be a JSON object, got a JSON {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _check_fields(body: dict[str, Any], api: str, allowed: frozenset[str], types: dict[str, str]) -> None:
    for name in body:
        if name not in allowed:
            close = difflib.get_close_matches(name[:64], sorted(allowed - FORBIDDEN), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            shown = name[:64] + ("..." if len(name) > 64 else "")
            raise BadRequest(f"unknown field {shown!r}{hint}; this endpoint takes "
                             f"{', '.join(sorted(allowed - FORBIDDEN))}", param=shown)
    for name in _REQUIRED[api]:
        if body.get(name) is None:
            raise BadRequest(f"{name} is required", param=name)
    for name, want in types.items():
        value = body.get(name)
        if value is None:
            continue
        ok = {
            _STR: isinstance(value, str),
            _NUM: isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
            _INT: isinstance(value, int) and not isinstance(value, bool),
            _BOOL: isinstance(value, bool),
            _LIST: isinstance(value, list),
            _OBJ: isinstance(value, dict),
        }[want]
        if not ok:
            raise BadRequest(f"{name} must be {want}, got a JSON {_json_type(value)}", param=name)


def _kwargs(body: dict[str, Any], positional: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in positional}


def complete_kwargs(body: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``(messages, kwargs)`` for ``PluginLlm.acomplete``."""
    _check_fields(body, "complete", COMPLETE_FIELDS, _COMPLETE_TYPES)
    return body["messages"], _kwargs(body, ("messages",))


def _decoded_input(blocks: list[Any]) -> list[Any]:
    """Image ``data`` travels as base64 text; the pipeline takes bytes."""
    out = []
    for index, block in enumerate(blocks):
        if isinstance(block, dict) and isinstance(block.get("data"), str):
            try:
                data = base64.b64decode(block["data"], validate=True)
            except (binascii.Error, ValueError):
                raise BadRequest(f"input[{index}]['data'] must be the image bytes as base64 text", param="input") from None
            block = {**block, "data": data}
        out.append(block)
    return out


def structured_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``PluginLlm.acomplete_structured``."""
    _check_fields(body, "structured", STRUCTURED_FIELDS, _STRUCTURED_TYPES)
    kwargs = dict(body)
    kwargs["input"] = _decoded_input(body["input"])
    if kwargs.get("json_mode") is None:
        kwargs.pop("json_mode", None)
    return kwargs


def chat_kwargs(body: dict[str, Any]) -> tuple[list[Any], dict[str, Any], bool]:
    """``(messages, kwargs, stream)`` of an OpenAI chat completion request.

    ``model`` absent, null or ``"default"`` is the host's route; any other value
    is a model override, which the trust gate decides. ``max_completion_tokens``
    is OpenAI's newer name of ``max_tokens``.
    """
    _check_fields(body, "chat", CHAT_FIELDS, _CHAT_TYPES)
    kwargs = _kwargs(body, ("messages", "stream", "stream_options", "max_completion_tokens"))
    model = kwargs.get("model")
    if model is not None and model.strip().lower() in ("", "default"):
        kwargs.pop("model")
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None and body["max_tokens"] != body["max_completion_tokens"]:
            raise BadRequest("max_tokens and max_completion_tokens differ; send one of them", param="max_completion_tokens")
        kwargs["max_tokens"] = body["max_completion_tokens"]
    options = body.get("stream_options")
    if options is not None:
        unknown = sorted(set(options) - {"include_usage"})
        if unknown or not isinstance(options.get("include_usage", False), bool):
            raise BadRequest("stream_options takes only {'include_usage': true|false}", param="stream_options")
    return body["messages"], kwargs, bool(body.get("stream"))
