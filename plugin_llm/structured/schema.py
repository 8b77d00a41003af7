"""The instructions and the JSON Schema of a structured call, checked; the compiled validators.

Remote ``$ref`` targets are never fetched: only references inside the schema itself
(``#/$defs/...``, embedded ``$id``) and the JSON Schema meta-schemas resolve. ``format`` is an
annotation, as in Draft 2020-12's default vocabulary. Validators are cached by the schema's
canonical JSON digest (:func:`schema_sha256`, also the audit log's).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # jsonschema is imported when a schema is first checked: a refused call never needs it
    import referencing
    from jsonschema.protocols import Validator

from plugin_llm.structured.inputs import check_text, snippet

_MAX_ERROR_MESSAGE = 200  # one validation message; instances can be huge
_VALIDATOR_CACHE_MAX = 256


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
    compiled_validator(json_schema)
    return json_schema


_validator_cache: dict[str, Validator] = {}
_validator_cache_lock = threading.Lock()


def compiled_validator(json_schema: Any) -> Validator:
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
            f"json_schema is not a valid JSON Schema: at {exc.json_path}: {short_message(exc.message)}. "
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
            f"json_schema: at {json_path(['$schema'])}: unknown dialect {snippet(dialect)}. Use "
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
                f"json_schema: $ref {snippet(ref)} cannot be resolved. Only references inside the schema "
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


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def json_path(path: Sequence[int | str]) -> str:
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


def short_message(message: str) -> str:
    """Cap a message: jsonschema messages embed the offending instance, which can be huge."""
    return message if len(message) <= _MAX_ERROR_MESSAGE else message[: _MAX_ERROR_MESSAGE - 1] + "…"
