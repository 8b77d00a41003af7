"""Request bodies of the service: size cap, strict JSON, known fields, top-level types.

Only the outer layer is checked here: a JSON object, every field known (an
unknown one gets the ``TypeError`` ``ctx.llm`` raises for that keyword, with
its did-you-mean), the required ones present, and the few fields the pipeline
does not check itself (``json_mode``; the OpenAI-only ``stream``, ...). The
values - messages, input blocks, schemas, sampling parameters, identifiers -
are checked by the pipeline exactly as for ``ctx.llm``, with the same
messages, which name the path of a bad value. Endpoint and key fields
(``api_key``, ``base_url``, ...) are passed on, so the pipeline refuses them
as the audited trust denial they are in-process.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
from typing import Any

from plugin_llm.call_options import COMPLETE_ONLY, FORBIDDEN, SAMPLING, check_options
from plugin_llm.hardened.safe_json import loads_bounded

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
    "ALL_FIELDS",
]

#: the largest request body accepted (413 beyond): images travel base64-encoded
MAX_BODY_BYTES = 4 * 1024 * 1024
_MAX_DEPTH = 64

_STR = "a string"
_INT = "a whole number"
_BOOL = "true or false"
_OBJ = "an object"

#: the parameters PluginLlm names (their values are checked by the pipeline, with its messages)
_COMMON = ("provider", "model", "temperature", "max_tokens", "timeout", "agent_id", "profile", "purpose", "task")
_NAMED = {"complete": ("messages", *_COMMON),
          "structured": ("instructions", "input", "json_schema", "json_mode", "schema_name", "system_prompt", *_COMMON)}
#: checked here: JSON has real booleans, and the pipeline reads json_mode as truthy
_STRUCTURED_TYPES = {"json_mode": _BOOL}
#: OpenAI's chat completion fields the gateway takes besides PluginLlm's, checked here
_CHAT_TYPES = {"model": _STR, "stream": _BOOL, "stream_options": _OBJ, "max_completion_tokens": _INT}

COMPLETE_FIELDS = frozenset(_NAMED["complete"]) | frozenset(SAMPLING) | frozenset(COMPLETE_ONLY) | FORBIDDEN
STRUCTURED_FIELDS = frozenset(_NAMED["structured"]) | frozenset(SAMPLING) | FORBIDDEN
CHAT_FIELDS = frozenset(_NAMED["complete"]) | frozenset(_CHAT_TYPES) | frozenset(SAMPLING) | frozenset(COMPLETE_ONLY) \
    | FORBIDDEN
#: every name a field of any endpoint may have (to name the field of a pipeline's ValueError/TypeError)
ALL_FIELDS = COMPLETE_FIELDS | STRUCTURED_FIELDS | CHAT_FIELDS
_REQUIRED = {"complete": ("messages",), "structured": ("instructions", "input"), "chat": ("messages",)}


class BadRequest(ValueError):
    """A 400 (or 413) answer: ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def _no_constant(name: str) -> Any:
    raise BadRequest(f"the body contains {name}, which is not JSON; send numbers as finite values")


#: one decoder for every request (json.loads with a keyword builds a new one per call)
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (depth-bounded; NaN/Infinity refused)."""
    if not raw.strip():
        raise BadRequest("the request has no body; send a JSON object such as {\"messages\": [...]}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not UTF-8 (byte {exc.start}); send JSON encoded as UTF-8") from None
    try:
        value = loads_bounded(text, max_depth=_MAX_DEPTH, decoder=_DECODER)
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


def _check_types(body: dict[str, Any], types: dict[str, str]) -> None:
    for name, want in types.items():
        value = body.get(name)
        if value is None:
            continue
        ok = {
            _STR: isinstance(value, str),
            _INT: isinstance(value, int) and not isinstance(value, bool),
            _BOOL: isinstance(value, bool),
            _OBJ: isinstance(value, dict),
        }[want]
        if not ok:
            raise BadRequest(f"{name} must be {want}, got a JSON {_json_type(value)}", param=name)


def _check_required(body: dict[str, Any], api: str) -> None:
    for name in _REQUIRED[api]:
        if name not in body:
            raise BadRequest(f"{name} is required", param=name)


def _check_native_fields(body: dict[str, Any], api: str, allowed: frozenset[str]) -> None:
    """An unknown field is refused with the TypeError ``ctx.llm`` raises for that keyword (did-you-mean included)."""
    unknown = {name: body[name] for name in body if name not in allowed}
    if unknown:
        name = next(iter(unknown))
        named = [n for n in _NAMED[api] if n not in ("temperature", "max_tokens", "timeout")]
        close = difflib.get_close_matches(name[:64], named, n=1)
        if close:  # a misspelt named parameter that check_options would not suggest
            raise TypeError(f"unexpected keyword argument {name[:64]!r} (did you mean {close[0]!r}?)")
        check_options(api, unknown)  # raises TypeError (unknown name, or one taken by complete() only)
        raise TypeError(f"unexpected keyword argument {next(iter(unknown))[:64]!r}")  # pragma: no cover


def complete_kwargs(body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``(messages, kwargs)`` for ``PluginLlm.acomplete`` (values checked by the pipeline)."""
    _check_native_fields(body, "complete", COMPLETE_FIELDS)
    _check_required(body, "complete")
    return body["messages"], {k: v for k, v in body.items() if k != "messages"}


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
    """Keyword arguments for ``PluginLlm.acomplete_structured`` (values checked by the pipeline)."""
    _check_native_fields(body, "structured", STRUCTURED_FIELDS)
    _check_required(body, "structured")
    _check_types(body, _STRUCTURED_TYPES)
    kwargs = dict(body)
    if isinstance(body["input"], list):
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
    for name in body:
        if name not in CHAT_FIELDS:
            close = difflib.get_close_matches(name[:64], sorted(CHAT_FIELDS - FORBIDDEN), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            shown = name[:64] + ("..." if len(name) > 64 else "")
            raise BadRequest(f"unknown field {shown!r}{hint}; the gateway's chat completions take "
                             f"{', '.join(sorted(CHAT_FIELDS - FORBIDDEN))}", param=shown)
    _check_required(body, "chat")
    _check_types(body, _CHAT_TYPES)
    kwargs = {k: v for k, v in body.items() if k not in ("messages", "stream", "stream_options", "max_completion_tokens")}
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
