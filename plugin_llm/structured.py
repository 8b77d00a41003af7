"""Structured output for ``PluginLlm.complete_structured``.

Pure functions, no I/O and no litellm: they turn a plugin's ``instructions`` +
``input`` + ``json_schema`` into chat ``messages`` and a ``response_format``,
and turn the model's reply text back into a parsed value plus schema errors.
The pipeline owns the calls, retries and repairs: ``normalise_input``,
``check_instructions`` and ``check_schema`` (``ValueError`` before any call),
``build_messages`` and ``response_format``; after the call ``parse_reply``, and
``repair_messages`` for a JSON reply that does not validate.

Remote ``$ref`` targets are never fetched: only references inside the schema
itself (``#/$defs/...``, embedded ``$id``) and the JSON Schema meta-schemas
resolve. ``format`` is an annotation, as in Draft 2020-12's default
vocabulary, so results do not depend on optional format-checker packages.
"""

from __future__ import annotations

import base64
import copy
import difflib
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

if TYPE_CHECKING:  # jsonschema is imported when a schema is first checked: a refused call never needs it
    import referencing
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

from plugin_llm.types import PluginLlmImageInput, PluginLlmTextInput

__all__ = [
    "ParsedReply",
    "build_messages",
    "check_instructions",
    "check_schema",
    "normalise_input",
    "parse_reply",
    "repair_messages",
    "response_format",
    "schema_sha256",
]

_Block = PluginLlmTextInput | PluginLlmImageInput

_DEFAULT_SCHEMA_NAME = "response"
_SCHEMA_NAME_MAX = 64  # OpenAI: name must match ^[a-zA-Z0-9_-]{1,64}$
_SCHEMA_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9_-]+")

_TEXT_KEYS = frozenset({"type", "text"})
_IMAGE_KEYS = frozenset({"type", "data", "url", "mime_type", "file_name"})
_URL_SCHEMES = ("http://", "https://", "data:")
# RFC 6838 type/subtype; also keeps ";" and "," out of the data: URL we build.
_MIME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*$")

_JSON_DIRECTIVE = (
    "Answer with a single JSON value only: no prose before or after it, "
    "no explanations, no markdown code fences."
)

_MAX_ERROR_MESSAGE = 200  # one validation message; instances can be huge
_MAX_REPAIR_ERRORS = 20  # errors listed in a repair prompt
_MAX_EMBEDDED_ATTEMPTS = 64  # bounds the prose scan on pathological replies
_VALIDATOR_CACHE_MAX = 256


# --------------------------------------------------------------------------
# Input blocks
# --------------------------------------------------------------------------

_SNIPPET = 40  # characters of a bad str value shown in an error message
_MAX_BLOCKS = 100_000  # input blocks in one call: far beyond any context window


def _snippet(value: Any) -> str:
    """A short description of a bad value for an error message: never an unbounded ``repr``.

    Strings are shown truncated, small numbers and None/bools as they are,
    anything else (huge ints, containers, arbitrary objects) by type name.
    """
    if isinstance(value, str):
        return repr(str(value[:_SNIPPET])) + ("..." if len(value) > _SNIPPET else "")
    if value is None or isinstance(value, bool):
        return repr(value)
    if type(value) is int and -10**15 < value < 10**15:
        return int.__repr__(value)
    if type(value) is float:
        return float.__repr__(value)
    return f"a value of type {type(value).__name__}"



def normalise_input(input: Any) -> tuple[_Block, ...]:  # noqa: A002 - the public parameter name
    """Return ``input`` as a tuple of ``PluginLlmTextInput``/``PluginLlmImageInput``.

    Accepts a string (one text block), or a list or tuple whose items are those dataclasses, dicts of the
    same shape (``{"type": "text", "text": ...}``, ``{"type": "image",
    "data": b"...", "mime_type": ..., "file_name": ...}`` or ``{"type":
    "image", "url": ...}``; ``type`` may be omitted when ``text`` or
    ``data``/``url`` makes it obvious) or bare strings (text). Raises
    ``ValueError`` naming the item index, the problem and the fix, so bad
    input fails before any provider call. Already-normalised input passes
    through unchanged, so calling this twice is harmless.
    """
    if isinstance(input, str):  # one text block: the obvious meaning of a plain string
        blocks = (PluginLlmTextInput(check_text("input", input)),)
        if not input.strip():
            raise ValueError("input has no content: the text is blank. Put the material to process in input.")
        return blocks
    if isinstance(input, (bytes, Mapping, PluginLlmTextInput, PluginLlmImageInput)) or not isinstance(
        input, (list, tuple)
    ):
        raise ValueError(
            f"input must be a string or a list of text/image blocks, got {type(input).__name__}. "
            "Wrap it in a list, e.g. input=[{'type': 'text', 'text': '...'}]."
        )
    if not input:
        raise ValueError(
            "input is empty: complete_structured needs at least one text or image block, "
            "e.g. input=[{'type': 'text', 'text': '...'}]."
        )
    if len(input) > _MAX_BLOCKS:
        raise ValueError(
            f"input has {len(input):,} blocks; at most {_MAX_BLOCKS:,} are accepted in one call. "
            "Join small text blocks into one, or split the work over several calls."
        )
    blocks = tuple(_normalise_item(index, item) for index, item in enumerate(input))
    if not any(isinstance(b, PluginLlmImageInput) or b.text.strip() for b in blocks):
        raise ValueError(
            "input has no content: every text block is blank and there is no image. "
            "Put the material to process in input, e.g. input=[{'type': 'text', 'text': '...'}]."
        )
    return blocks


def _normalise_item(index: int, item: Any) -> _Block:
    """Turn one ``input`` item into a block, or raise a ValueError naming ``input[index]``."""
    where = f"input[{index}]"
    if isinstance(item, PluginLlmTextInput):
        _checked_text(where, item.text)
        return item
    if isinstance(item, PluginLlmImageInput):
        return _image_block(where, item.data, item.url, item.mime_type, item.file_name)
    if isinstance(item, str):
        return PluginLlmTextInput(check_text(where, item))
    if isinstance(item, Mapping):
        return _block_from_dict(where, item)
    raise ValueError(
        f"{where}: unsupported block of type {type(item).__name__}. Use a str, "
        "PluginLlmTextInput(text), PluginLlmImageInput(data=bytes|url=str) or a dict "
        "{'type': 'text', 'text': ...} / {'type': 'image', 'data': ... or 'url': ...}."
    )


def _block_from_dict(where: str, item: Mapping[str, Any]) -> _Block:
    """Build a block from a dict, inferring a missing ``type`` from its keys."""
    kind = item["type"] if "type" in item else _infer_type(where, item)
    if kind == "text":
        _reject_unknown_keys(where, item, _TEXT_KEYS)
        if "text" not in item:
            raise ValueError(f"{where}: text block has no 'text'. Use {{'type': 'text', 'text': '...'}}.")
        return PluginLlmTextInput(_checked_text(where, item["text"]))
    if kind == "image":
        _reject_unknown_keys(where, item, _IMAGE_KEYS)
        return _image_block(
            where,
            item.get("data"),
            item.get("url"),
            item.get("mime_type", "image/png"),
            item.get("file_name", ""),
        )
    raise ValueError(
        f"{where}: unknown block type {_snippet(kind)}. Use 'text' ({{'type': 'text', 'text': '...'}}) or "
        "'image' ({'type': 'image', 'data': b'...', 'mime_type': 'image/png'} or "
        "{'type': 'image', 'url': 'https://...'})."
    )


def _infer_type(where: str, item: Mapping[str, Any]) -> str:
    """The block type of a dict without ``"type"``: text if it has ``text``, image if ``data``/``url``."""
    has_text = "text" in item
    has_image = "data" in item or "url" in item
    if has_text and not has_image:
        return "text"
    if has_image and not has_text:
        return "image"
    keys = ", ".join(_snippet(k) for k in list(item)[:8]) + (", ..." if len(item) > 8 else "") if item else "no keys"
    raise ValueError(
        f"{where}: cannot tell the block type of a dict with {keys}. Add 'type': 'text' "
        "(with 'text') or 'type': 'image' (with 'data' or 'url')."
    )


def _reject_unknown_keys(where: str, item: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Refuse misspelt keys (``mime`` for ``mime_type``) instead of silently ignoring them."""
    for key in item:
        if key not in allowed:
            close = difflib.get_close_matches(key[:_SNIPPET], sorted(allowed), n=1) if isinstance(key, str) else []
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"{where}: unknown key {_snippet(key)} in a {_snippet(item.get('type', 'block'))} block; "
                f"allowed keys are {', '.join(sorted(allowed))}.{hint}"
            )


def _checked_text(where: str, text: Any) -> str:
    """Return ``text`` if it is a str that can be sent, else raise a ValueError naming the item."""
    if not isinstance(text, str):
        raise ValueError(f"{where}: 'text' must be a str, got {type(text).__name__}.")
    return check_text(f"{where}: 'text'", text)


def text_problem(text: str) -> str | None:
    """What makes ``text`` unsendable, or None: a lone UTF-16 surrogate is a valid Python str (and JSON
    allows it as ``"\\ud800"``) but not Unicode text; UTF-8 cannot encode it and no provider takes it.
    (An ASCII str costs one ``isascii()``.)"""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"has a lone surrogate (U+{ord(text[exc.start]):04X}) at character {exc.start}: it is not valid "
                "Unicode text, so it cannot be sent as UTF-8; remove it or replace it (in Python "
                "text.encode('utf-8', 'replace').decode('utf-8')), or send the whole pair when the text was cut "
                "inside a character")
    return None


def check_text(where: str, text: str) -> str:
    """``text`` unchanged, or ``ValueError`` naming ``where`` when it cannot be sent (:func:`text_problem`)."""
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(f"{where} {problem}")
    return text


def _image_block(where: str, data: Any, url: Any, mime_type: Any, file_name: Any) -> PluginLlmImageInput:
    """Validate image fields and build the block (exactly one of bytes ``data`` or ``url``)."""
    if data is None and url is None:
        raise ValueError(
            f"{where}: image block has neither 'data' nor 'url'. Pass data=<bytes> (with mime_type) "
            "or url='https://...'."
        )
    if data is not None and url is not None:
        raise ValueError(f"{where}: image block has both 'data' and 'url'. Pass exactly one of them.")
    if not isinstance(file_name, str):
        raise ValueError(f"{where}: 'file_name' must be a str, got {type(file_name).__name__}.")
    if url is not None:
        return PluginLlmImageInput(url=_checked_url(where, url), file_name=file_name)
    if isinstance(data, bytearray):
        data = bytes(data)
    if not isinstance(data, bytes):
        hint = " If it is base64 text, decode it with base64.b64decode() first." if isinstance(data, str) else ""
        raise ValueError(f"{where}: image 'data' must be bytes, got {type(data).__name__}.{hint}")
    if not data:
        raise ValueError(f"{where}: image 'data' is empty (0 bytes). Pass the image file's bytes.")
    if not isinstance(mime_type, str) or not _MIME_RE.match(mime_type):
        raise ValueError(
            f"{where}: image 'mime_type' must be a media type such as 'image/png' or 'image/jpeg', "
            f"got {_snippet(mime_type)}."
        )
    return PluginLlmImageInput(data=data, mime_type=mime_type, file_name=file_name)


def _checked_url(where: str, url: Any) -> str:
    """Accept only http(s) and data: URLs; anything else (paths, file:) is refused."""
    if not isinstance(url, str):
        raise ValueError(f"{where}: image 'url' must be a str, got {type(url).__name__}.")
    if not url.strip().lower().startswith(_URL_SCHEMES):
        raise ValueError(
            f"{where}: image 'url' must start with http://, https:// or data:, got {_snippet(url)}. "
            "For a local file, read it and pass data=<bytes> with mime_type."
        )
    return url


# --------------------------------------------------------------------------
# Instructions and schema
# --------------------------------------------------------------------------


def check_instructions(instructions: Any) -> str:
    """Return ``instructions`` unchanged if it is a non-blank str, else raise ``ValueError``."""
    if not isinstance(instructions, str):
        raise ValueError(
            f"instructions must be a str describing the task, got {type(instructions).__name__}."
        )
    if not instructions.strip():
        raise ValueError(
            "instructions is blank: say what to do with the input, e.g. "
            "instructions='Extract the invoice total and currency.'"
        )
    return check_text("instructions", instructions)


def schema_sha256(json_schema: dict | None) -> str | None:
    """SHA-256 hex of the schema's canonical JSON (sorted keys, compact, UTF-8); ``None`` for no schema.

    Key order does not matter, so the audit log can group calls by schema.
    """
    if json_schema is None:
        return None
    return _sha256_hex(_canonical_json(json_schema))


def check_schema(json_schema: Any) -> dict | None:
    """Return ``json_schema`` if it is ``None`` or a dict that is a valid JSON Schema.

    The draft comes from ``$schema`` (default Draft 2020-12). Otherwise raise
    ``ValueError`` naming the offending path inside the schema. ``$ref``
    targets must resolve within the schema: remote references are refused,
    never fetched. The compiled validator is cached by ``schema_sha256``
    (built from a private copy, so later edits to the caller's dict cannot
    leak into it).
    """
    if json_schema is None:
        return None
    _validator(json_schema)
    return json_schema


_validator_cache: dict[str, Validator] = {}
_validator_cache_lock = threading.Lock()


def _validator(json_schema: Any) -> Validator:
    """The compiled validator for ``json_schema``, checking the schema on first sight."""
    if not isinstance(json_schema, dict):
        raise ValueError(
            f"json_schema must be a dict (a JSON Schema object), got {type(json_schema).__name__}. "
            "Pass e.g. {'type': 'object', 'properties': {...}} or json_schema=None."
        )
    canonical = _canonical_json(json_schema)
    digest = _sha256_hex(canonical)
    with _validator_cache_lock:
        cached = _validator_cache.get(digest)
    if cached is not None:
        return cached
    validator = _compile_validator(json.loads(canonical))
    with _validator_cache_lock:
        if len(_validator_cache) >= _VALIDATOR_CACHE_MAX:
            _validator_cache.pop(next(iter(_validator_cache)))  # oldest first
        _validator_cache[digest] = validator
    return validator


def _compile_validator(schema: dict) -> Validator:
    """Check ``schema`` against its meta-schema and its ``$ref``s, then build a validator."""
    import referencing
    from jsonschema.exceptions import SchemaError

    cls = _validator_class(schema)
    try:
        cls.check_schema(schema)
        _check_refs(schema, cls)
    except SchemaError as exc:
        raise ValueError(
            f"json_schema is not a valid JSON Schema: at {exc.json_path}: {_short(exc.message)}. "
            "Fix the schema (see https://json-schema.org/understanding-json-schema) or pass json_schema=None."
        ) from None
    except RecursionError:
        raise ValueError("json_schema is nested too deeply to check; flatten it with $defs and $ref.") from None
    # An empty Registry has no retrieve function: unknown URIs fail instead of
    # being downloaded (jsonschema's default registry would fetch them).
    return cls(schema, registry=referencing.Registry())


def _validator_class(schema: dict) -> type[Validator]:
    """The validator class for the schema's ``$schema`` (Draft 2020-12 when absent)."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import validator_for

    if "$schema" not in schema:
        return Draft202012Validator
    dialect = schema["$schema"]
    cls = validator_for(schema, default=None) if isinstance(dialect, str) else None  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(
            f"json_schema: at {_json_path(['$schema'])}: unknown dialect {_snippet(dialect)}. Use "
            "'https://json-schema.org/draft/2020-12/schema' (or another published draft) or omit '$schema'."
        )
    return cls


def _check_refs(schema: dict, cls: type[Validator]) -> None:
    """Raise ValueError for a ``$ref`` that cannot be resolved without fetching anything."""
    from jsonschema_specifications import REGISTRY as _META_SCHEMAS  # ships with jsonschema
    from referencing.jsonschema import specification_with

    specification = specification_with(cls.ID_OF(cls.META_SCHEMA))
    root = specification.create_resource(schema)
    # The meta-schemas are resolvable, as in the validator jsonschema builds.
    resolver = _META_SCHEMAS.with_resource(root.id() or "", root).crawl().resolver_with_root(root)
    _check_refs_in(root, resolver)


def _check_refs_in(resource: referencing.Resource, resolver: referencing.Resolver) -> None:
    """Look up this (sub)schema's ``$ref``, then recurse with the base URI each ``$id`` sets."""
    import referencing.exceptions

    contents = resource.contents
    ref = contents.get("$ref") if isinstance(contents, dict) else None
    if isinstance(ref, str):
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            raise ValueError(
                f"json_schema: $ref {_snippet(ref)} cannot be resolved. Only references inside the schema "
                "('#/$defs/...') and to the JSON Schema meta-schemas are supported; remote schemas "
                "are never fetched, so inline them under $defs."
            ) from None
    for sub in resource.subresources():
        _check_refs_in(sub, resolver.in_subresource(sub))


def _canonical_json(value: Any) -> str:
    """Canonical JSON text: sorted keys, no whitespace, UTF-8 characters kept, no NaN, nothing UTF-8
    cannot encode (a lone surrogate in a key or value: the schema is sent, and hashed, as UTF-8)."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"json_schema must be JSON-serialisable (plain dicts, lists, str, numbers): {exc}") from None
    except RecursionError:
        raise ValueError("json_schema is nested too deeply; flatten it with $defs and $ref.") from None
    return check_text("json_schema", text)


def _sha256_hex(text: str) -> str:
    """Of a schema's canonical JSON (:func:`_canonical_json`, which refuses text UTF-8 cannot encode)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------
# Request: response_format and messages
# --------------------------------------------------------------------------


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


def _user_parts(instructions: str, blocks: tuple[_Block, ...]) -> list[dict[str, Any]]:
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


# --------------------------------------------------------------------------
# Reply: parsing, validation and repair
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedReply:
    """A model reply, parsed and checked against the schema.

    ``text`` is the raw reply; ``parsed`` the JSON value (``None`` when the
    reply held no JSON, then ``content_type == "text"``); ``errors`` the
    schema violations as ``"<json path>: <message>"``, sorted by path
    (empty when valid or when there is no schema).
    """

    text: str
    parsed: Any
    content_type: str
    errors: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        """True when the reply is JSON and satisfies the schema (if any)."""
        return self.content_type == "json" and not self.errors


def parse_reply(text: str | None, json_schema: dict | None) -> ParsedReply:
    """Parse a model reply and validate it against ``json_schema`` (never skipped when given).

    Tried in order: the whole reply; the reply without one surrounding
    markdown fence (```json ... ``` or ``` ... ```). Only if neither is JSON,
    the reply is treated as prose around JSON: fenced blocks inside it, then
    top-level ``{...}``/``[...]`` values in it, and the first candidate that
    satisfies the schema wins (the first candidate at all when none does or
    there is no schema). No JSON anywhere gives ``parsed=None,
    content_type="text"``. ``None`` is read as an empty reply. An invalid
    schema raises ``ValueError``.
    """
    raw = "" if text is None else text
    validator = _validator(json_schema) if json_schema is not None else None
    stripped = raw.strip()
    for candidate in (stripped, _strip_surrounding_fence(stripped)):
        if candidate is not None:
            found, value = _loads(candidate)
            if found:
                return _json_reply(raw, value, validator)
    first: ParsedReply | None = None
    for value in _prose_candidates(stripped):
        reply = _json_reply(raw, value, validator)
        if reply.valid:
            return reply
        first = first or reply
    return first or ParsedReply(text=raw, parsed=None, content_type="text", errors=())


def _json_reply(raw: str, value: Any, validator: Validator | None) -> ParsedReply:
    errors = _validation_errors(validator, value) if validator is not None else ()
    return ParsedReply(text=raw, parsed=value, content_type="json", errors=errors)


_SURROUNDING_FENCE = re.compile(r"\A(?P<fence>`{3,}|~{3,})[ \t]*(?:[\w.+-]+[ \t]*)?\n(?P<body>.*?)\n?[ \t]*(?P=fence)\Z", re.S)
_SURROUNDING_FENCE_ONE_LINE = re.compile(r"\A(?P<fence>`{3,})(?:json\b)?(?P<body>.*?)(?P=fence)\Z", re.S | re.I)
_INNER_FENCE = re.compile(r"(?P<fence>`{3,}|~{3,})[ \t]*[\w.+-]*[ \t]*\n(?P<body>.*?)\n?[ \t]*(?P=fence)", re.S)


def _strip_surrounding_fence(text: str) -> str | None:
    """The body of a reply that is one fenced block (multi- or single-line), else ``None``."""
    match = _SURROUNDING_FENCE.match(text) or _SURROUNDING_FENCE_ONE_LINE.match(text)
    return match.group("body").strip() if match else None


def _prose_candidates(text: str) -> Iterator[Any]:
    """JSON values found inside prose: fenced blocks first, then top-level ``{...}``/``[...]``."""
    for match in _INNER_FENCE.finditer(text):
        found, value = _loads(match.group("body").strip())
        if found:
            yield value
    yield from _embedded_values(text)


def _reject_constant(name: str) -> Any:
    """NaN and Infinity are Python extensions, not JSON: refuse them."""
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _embedded_values(text: str) -> Iterator[Any]:
    """Top-level JSON objects/arrays embedded in ``text``, left to right.

    A decoded value's span is skipped, so values nested inside it are not
    offered as separate candidates. The scan is bounded for huge replies.
    """
    position, attempts = 0, 0
    while attempts < _MAX_EMBEDDED_ATTEMPTS:
        starts = [i for i in (text.find("{", position), text.find("[", position)) if i != -1]
        if not starts:
            return
        start = min(starts)
        attempts += 1
        try:
            value, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            position = start + 1
            continue
        yield value
        position = end


def _loads(text: str) -> tuple[bool, Any]:
    """``(True, value)`` if ``text`` is exactly one JSON value (NaN/Infinity refused), else ``(False, None)``."""
    if not text:
        return False, None
    try:
        return True, _DECODER.decode(text)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return False, None


def _validation_errors(validator: Validator, value: Any) -> tuple[str, ...]:
    """All schema violations of ``value`` as ``"<json path>: <message>"``, sorted by path then message."""
    import referencing.exceptions

    try:
        found = list(validator.iter_errors(value))
    except referencing.exceptions.Unresolvable as exc:
        raise ValueError(f"json_schema: a $ref cannot be resolved while validating: {exc}") from None
    except RecursionError:  # reported as a failure, never skipped
        return ("$: the value is nested too deeply to validate",)
    found.sort(key=lambda e: (_path_sort_key(e), e.message))
    rendered = (f"{_json_path(e.absolute_path)}: {_short(e.message)}" for e in found)
    return tuple(dict.fromkeys(rendered))  # dedupe, keep order


def _path_sort_key(error: ValidationError) -> tuple[tuple[int, int | str], ...]:
    # ints and strs do not compare: tag them so mixed paths still sort.
    return tuple((0, p) if isinstance(p, int) else (1, str(p)) for p in error.absolute_path)


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _json_path(path: Sequence[int | str]) -> str:
    """JSONPath of an instance location: ``$``, ``$.items[1].qty``, ``$["a b"]``."""
    out = ["$"]
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENTIFIER.match(part):
            out.append(f".{part}")
        else:
            out.append(f"[{json.dumps(part, ensure_ascii=False)}]")
    return "".join(out)


def _short(message: str) -> str:
    """Cap a message: jsonschema messages embed the offending instance, which can be huge."""
    return message if len(message) <= _MAX_ERROR_MESSAGE else message[: _MAX_ERROR_MESSAGE - 1] + "…"


def repair_messages(messages: list[dict[str, Any]], reply: ParsedReply) -> list[dict[str, Any]]:
    """A new message list asking the model to fix ``reply``; ``messages`` is not touched.

    It is a deep copy of ``messages``, then the reply as an assistant turn,
    then a user turn listing the schema errors (or saying the reply was not
    JSON) and asking for corrected JSON only. A valid reply has nothing to
    repair: ``ValueError``.
    """
    if reply.valid:
        raise ValueError("repair_messages: the reply is valid JSON for the schema; there is nothing to repair.")
    return [
        *copy.deepcopy(messages),
        # Some providers reject an empty assistant turn.
        {"role": "assistant", "content": reply.text if reply.text.strip() else "(empty reply)"},
        {"role": "user", "content": _repair_text(reply)},
    ]


def _repair_text(reply: ParsedReply) -> str:
    """The user turn of a repair: what was wrong and what to send instead."""
    ask = "Reply again with only the corrected JSON value: no prose, no explanations, no code fences."
    if reply.content_type != "json":
        return f"Your previous reply was not valid JSON.\n{ask}"
    listed = [f"- {e}" for e in reply.errors[:_MAX_REPAIR_ERRORS]]
    if len(reply.errors) > _MAX_REPAIR_ERRORS:
        listed.append(f"- ... and {len(reply.errors) - _MAX_REPAIR_ERRORS} more")
    return (
        "Your previous reply is JSON but does not match the required JSON Schema. Validation errors:\n"
        + "\n".join(listed)
        + f"\n{ask}"
    )
