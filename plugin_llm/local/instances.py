"""A JSON value valid for a schema, filled from the facts where possible (the local model's
structured output and its forced tool arguments)."""

from __future__ import annotations

import json
import re
from typing import Any

from plugin_llm.local.facts import _norm_key
from plugin_llm.local.values import (
    _FALSE,
    _FORMAT_DEFAULTS,
    _NULL,
    _TRUE,
    _coerce_format,
    _number_ok,
    _parse_number,
    _pattern_example,
    _string_ok,
)


_MAX_DEPTH = 16


class _Instance:
    """Builds a JSON value valid for a schema, filled from facts where possible."""

    def __init__(self, root: Any, facts: dict[str, tuple[str, str | list[str]]]) -> None:
        self.root = root
        self.facts = facts

    # -- schema plumbing

    def _resolve(self, schema: Any, depth: int) -> Any:
        """Follow local ``$ref`` and merge ``allOf``; returns a dict (or bool)."""
        for _ in range(_MAX_DEPTH):
            if not isinstance(schema, dict) or "$ref" not in schema:
                break
            target = self._pointer(schema["$ref"])
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest} if isinstance(target, dict) else (target if not rest else rest)
        if isinstance(schema, dict) and isinstance(schema.get("allOf"), list):
            merged: dict = {k: v for k, v in schema.items() if k != "allOf"}
            for sub in schema["allOf"]:
                sub = self._resolve(sub, depth + 1)
                if not isinstance(sub, dict):
                    continue
                for k, v in sub.items():
                    if k == "properties":
                        merged["properties"] = {**v, **merged.get("properties", {})}
                    elif k == "required":
                        merged["required"] = list(dict.fromkeys([*merged.get("required", []), *v]))
                    else:
                        merged.setdefault(k, v)
            schema = merged
        return schema

    def _pointer(self, ref: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return {}
        node = self.root
        for raw in ref[1:].split("/"):
            if raw == "":
                continue
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return {}
        return node

    @staticmethod
    def _types(schema: dict) -> list[str]:
        t = schema.get("type")
        if isinstance(t, str):
            return [t]
        if isinstance(t, list) and t:
            return [x for x in t if isinstance(x, str)]
        if "properties" in schema or "required" in schema or "additionalProperties" in schema:
            return ["object"]
        if "items" in schema or "prefixItems" in schema or "minItems" in schema:
            return ["array"]
        if any(k in schema for k in ("minLength", "maxLength", "pattern", "format")):
            return ["string"]
        if any(k in schema for k in ("minimum", "maximum", "multipleOf", "exclusiveMinimum", "exclusiveMaximum")):
            return ["number"]
        return []

    def _fact(self, path: list[str], schema: dict) -> str | list[str] | None:
        if not path:
            return None
        candidates = [_norm_key("".join(path)), _norm_key(path[-1])]
        if isinstance(schema.get("title"), str):
            candidates.append(_norm_key(schema["title"]))
        for key in candidates:
            if key in self.facts:
                return self.facts[key][1]
        return None

    # -- coercion of one fact to a schema (None when it does not fit)

    def coerce(self, fact: str | list[str], schema: Any, depth: int = 0) -> tuple[bool, Any]:
        schema = self._resolve(schema, depth)
        if schema is True or schema == {}:
            return True, fact
        if not isinstance(schema, dict):
            return False, None
        if "const" in schema:
            return (_same(fact, schema["const"]), schema["const"])
        if isinstance(schema.get("enum"), list):
            for option in schema["enum"]:
                if _same(fact, option):
                    return True, option
            return False, None
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                base = {k: v for k, v in schema.items() if k != key}
                for branch in schema[key]:
                    branch = self._resolve(branch, depth + 1)
                    ok, value = self.coerce(fact, {**base, **branch} if isinstance(branch, dict) else branch, depth + 1)
                    if ok:
                        return True, value
                return False, None
        for t in self._types(schema) or ["string"]:
            ok, value = self._coerce_type(fact, t, schema, depth)
            if ok:
                return True, value
        return False, None

    def _coerce_type(self, fact: str | list[str], t: str, schema: dict, depth: int) -> tuple[bool, Any]:
        if t == "array":
            items = fact if isinstance(fact, list) else [p for p in re.split(r"\s*(?:[,;]|\band\b)\s*", fact) if p]
            out = []
            for item in items:
                ok, value = self.coerce(item, schema.get("items", {}), depth + 1)
                if ok and not (schema.get("uniqueItems") and value in out):
                    out.append(value)
            if "maxItems" in schema:
                out = out[: int(schema["maxItems"])]
            if not out or len(out) < int(schema.get("minItems", 0)):
                return False, None
            return True, out
        if isinstance(fact, list):
            if t != "string":
                return False, None
            fact = ", ".join(fact)
        text = fact.strip()
        if t == "string":
            value = _coerce_format(text, schema.get("format"))
            return _string_ok(value, schema), value
        if t in ("number", "integer"):
            num = _parse_number(text)
            if num is None:
                return False, None
            if t == "integer":
                if not num.is_integer():
                    return False, None
                value: Any = int(num)
            else:
                value = float(num)
            return _number_ok(value, schema), value
        if t == "boolean":
            low = text.lower().rstrip(".!")
            if low in _TRUE:
                return True, True
            if low in _FALSE:
                return True, False
            return False, None
        if t == "null":
            return (text.lower() in _NULL), None
        return False, None

    # -- instance generation

    def value(self, schema: Any, path: list[str], depth: int = 0) -> Any:
        schema = self._resolve(schema, depth)
        if not isinstance(schema, dict):
            fact = self._fact(path, {}) if schema is True else None
            return fact
        fact = self._fact(path, schema)
        if fact is not None:
            ok, value = self.coerce(fact, schema, depth)
            if ok:
                return value
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                base = {k: v for k, v in schema.items() if k != key}
                branches = [self._resolve(b, depth + 1) for b in schema[key]]
                if any(isinstance(b, dict) and self._types(b) == ["null"] for b in branches):
                    return None  # an optional value with no usable fact: null, not an invention
                branch = branches[0]
                merged = {**base, **branch} if isinstance(branch, dict) else branch
                return self.value(merged, path, depth + 1)
        if "default" in schema:
            return schema["default"]
        types = self._types(schema)
        if not types:
            return fact if isinstance(fact, str) else None
        if "null" in types and (len(types) == 1 or fact is None):
            return None
        t = next(x for x in types if x != "null")
        if depth >= _MAX_DEPTH:  # runaway recursive schema: stop as small as possible
            return {"object": {}, "array": [], "string": "", "boolean": False}.get(t, 0)
        if t == "object":
            return self._object(schema, path, depth)
        if t == "array":
            return self._array(schema, path, depth)
        return self.default_scalar(t, schema)

    def _object(self, schema: dict, path: list[str], depth: int) -> dict:
        out: dict[str, Any] = {}
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for name, sub in props.items():
            out[name] = self.value(sub, [*path, name], depth + 1)
        extra = schema.get("additionalProperties", {})
        extra = extra if isinstance(extra, dict) else {}
        for name in schema.get("required", []) or []:
            if name not in out:
                out[name] = self.value(extra, [*path, name], depth + 1)
        n = 0
        while len(out) < int(schema.get("minProperties", 0)) and schema.get("additionalProperties", True) is not False:
            n += 1
            out.setdefault(f"field_{n}", self.value(extra, [*path, f"field_{n}"], depth + 1))
        return out

    def _array(self, schema: dict, path: list[str], depth: int) -> list:
        prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
        items = schema.get("items", {})
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, schema.get("additionalItems", {})
        out = [self.value(sub, [], depth + 1) for sub in prefix]
        minimum = int(schema.get("minItems", 0))
        i = 0
        while len(out) < minimum and i < minimum + 10:
            candidate = self._variant(items, i, depth)
            if not (schema.get("uniqueItems") and candidate in out):
                out.append(candidate)
            i += 1
        return out

    def _variant(self, schema: Any, i: int, depth: int) -> Any:
        """The i-th default item (different items for ``uniqueItems``)."""
        base = self.value(schema, [], depth + 1)
        if i == 0 and base != "":
            return base
        resolved = self._resolve(schema, depth + 1)
        if isinstance(resolved, dict):
            if isinstance(resolved.get("enum"), list) and resolved["enum"]:
                return resolved["enum"][i % len(resolved["enum"])]
            if isinstance(base, bool):
                return [False, True][i % 2]
            if isinstance(base, (int, float)):
                step = resolved.get("multipleOf", 1)
                cand = base + step * i
                return cand if _number_ok(cand, resolved) else base
            if isinstance(base, str):
                cand = f"{base}{i}" if base else f"item{i + 1}"
                return cand if _string_ok(cand, resolved) else base
        return base

    def default_scalar(self, t: str, schema: dict) -> Any:
        if t == "boolean":
            return False
        if t in ("number", "integer"):
            for cand in self._number_candidates(schema, t == "integer"):
                if _number_ok(cand, schema):
                    return int(cand) if t == "integer" else float(cand)
            return int(schema.get("minimum", 0)) if t == "integer" else float(schema.get("minimum", 0))
        if t == "string":
            fmt = schema.get("format")
            candidates = [_FORMAT_DEFAULTS.get(fmt, "")] if fmt else []
            if isinstance(schema.get("pattern"), str):
                example = _pattern_example(schema["pattern"])
                if example is not None:
                    candidates.append(example)
            min_len = int(schema.get("minLength", 0))
            candidates += ["", "x" * min_len]
            if fmt in _FORMAT_DEFAULTS:
                candidates.append(_FORMAT_DEFAULTS[fmt].rjust(min_len, "x"))
            for cand in candidates:
                if _string_ok(cand, schema):
                    return cand
            return candidates[0]
        return None

    @staticmethod
    def _number_candidates(schema: dict, integer: bool) -> list[float]:
        lo = schema.get("minimum")
        hi = schema.get("maximum")
        ex_lo = schema.get("exclusiveMinimum")
        ex_hi = schema.get("exclusiveMaximum")
        if isinstance(ex_lo, bool):
            ex_lo = lo if ex_lo else None
        if isinstance(ex_hi, bool):
            ex_hi = hi if ex_hi else None
        step = schema.get("multipleOf") if isinstance(schema.get("multipleOf"), (int, float)) else None
        if integer:
            step = step if step and float(step).is_integer() else (step or 1)
        cands: list[float] = [0]
        if lo is not None:
            cands.append(lo)
        if ex_lo is not None:
            cands.append(ex_lo + (step or 1))
            if ex_hi is not None:
                cands.append((ex_lo + ex_hi) / 2)
        if hi is not None:
            cands.append(hi)
        if ex_hi is not None:
            cands.append(ex_hi - (step or 1))
        out: list[float] = []
        for c in cands:
            if integer:
                c = float(int(c)) if float(c).is_integer() else float(int(c) + (1 if c > 0 else 0))
            if step:  # round up to a multiple of the step
                k = -(-c // step)
                c = k * step
            out.append(c)
        return out


def _same(fact: Any, option: Any) -> bool:
    if isinstance(fact, list):
        return option == fact
    text = str(fact).strip()
    if isinstance(option, bool) or option is None:
        return text.lower() == json.dumps(option)
    if isinstance(option, (int, float)):
        num = _parse_number(text)
        return num is not None and num == option and not re.search(r"[A-Za-z]{2,}", text)
    if isinstance(option, str):
        return _norm_key(option) == _norm_key(text)
    return False


def _schema_of(response_format: Any) -> dict | None:
    """The JSON Schema carried by a ``json_schema`` response format."""
    if hasattr(response_format, "model_json_schema"):
        try:
            return response_format.model_json_schema()
        except Exception:  # pragma: no cover - defensive
            return None
    if not isinstance(response_format, dict):
        return None
    spec = response_format.get("json_schema")
    if isinstance(spec, dict):
        if isinstance(spec.get("schema"), (dict, bool)):
            return spec["schema"] if isinstance(spec["schema"], dict) else {}
        if "type" in spec or "properties" in spec:
            return spec
    if isinstance(response_format.get("schema"), dict):
        return response_format["schema"]
    return {}
