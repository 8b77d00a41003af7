"""The changes an ``edit_config`` mutate makes: ``get_value``, ``ensure_map``, ``set_value``,
``delete_value``, ``list_add`` and ``list_remove``.

New strings PyYAML would read as something else (``on``, ``no``, ``*``) are quoted; new items
follow the quote and flow style of their neighbours; a section's trailing comments stay with it.
"""

from __future__ import annotations

from typing import Any

from plugin_llm.config_edit.comments import attach_rest, detach_rest, subtree_end, trailing_kept
from plugin_llm.config_edit.roundtrip import (
    NOTHING_WRITTEN, ConfigEditError, host_load, is_flow, kind_of, node_at, to_plain,
)


def get_value(doc: Any, keys: tuple[str, ...], default: Any = None) -> Any:
    """The value at ``keys`` (``default`` when any part is missing or not a mapping)."""
    node = doc
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def ensure_map(doc: Any, *keys: str) -> Any:
    """The mapping at ``keys``, creating missing (or null) levels as needed.

    ``ensure_map(doc, "plugins", "entries", "image_gen/openai", "llm")``. A level
    that exists but is not a mapping raises :class:`ConfigEditError` naming it.
    """
    from ruamel.yaml.comments import CommentedMap

    if not isinstance(doc, dict):
        raise ConfigEditError(f"the top level of config.yaml is a {kind_of(doc)}, not a mapping; {NOTHING_WRITTEN}")
    node = doc
    for i, key in enumerate(keys):
        here = tuple(keys[: i + 1])
        current = node.get(key) if key in node else None
        if key not in node:
            _add_key(doc, tuple(keys[:i]), node, key, CommentedMap())
        elif current is None:
            node[key] = CommentedMap()
        elif not isinstance(current, dict):
            raise ConfigEditError(
                f"{_dotted(here)} in config.yaml is a {kind_of(current)}, expected a mapping; "
                f"fix it by hand ({NOTHING_WRITTEN})"
            )
        node = node[key]
    return node


def set_value(doc: Any, keys: tuple[str, ...], value: Any) -> bool:
    """Set ``keys`` to ``value`` (creating parents); False when it already had that value.

    A string replacing a quoted string keeps its quote style; lists and dicts are
    converted to round-trip nodes (new lists follow the style of a sibling list,
    block style otherwise).
    """
    keys = tuple(keys)
    if not keys:
        raise ValueError("set_value needs at least one key")
    parent = ensure_map(doc, *keys[:-1])
    key = keys[-1]
    if key in parent:
        old = parent[key]
        if not isinstance(value, (dict, list, tuple)) and not isinstance(old, (dict, list)) and _same(old, value):
            return False
        if isinstance(value, (dict, list, tuple)) and to_plain(old) == to_plain(value):
            return False
        parent[key] = scalar(value, like=old) if not isinstance(value, (dict, list, tuple)) else _container(parent, value)
        return True
    new = scalar(value) if not isinstance(value, (dict, list, tuple)) else _container(parent, value)
    _add_key(doc, keys[:-1], parent, key, new)
    return True


def delete_value(doc: Any, keys: tuple[str, ...]) -> bool:
    """Remove the key at ``keys``; False when it (or a parent) is absent."""
    keys = tuple(keys)
    if not keys:
        raise ValueError("delete_value needs at least one key")
    parent = node_at(doc, keys[:-1]) if len(keys) > 1 else doc
    if not isinstance(parent, dict) or keys[-1] not in parent:
        return False
    container_keys = keys[:-1]
    is_last = list(parent.keys())[-1] == keys[-1]
    rest = detach_rest(subtree_end(doc, container_keys)) if is_last else ""
    del parent[keys[-1]]
    if rest:
        if len(parent):
            attach_rest(subtree_end(doc, container_keys), rest)
        elif container_keys:
            grand = node_at(doc, container_keys[:-1]) if len(container_keys) > 1 else doc
            attach_rest((grand, container_keys[-1]), rest)
        else:  # pragma: no cover - emptied the whole document
            doc.yaml_end_comment_extend([rest.rstrip("\n")], clear=False)
    return True


def list_add(doc: Any, keys: tuple[str, ...], value: Any) -> bool:
    """Append ``value`` to the list at ``keys`` (created when missing); False when already present.

    Strings are compared exactly after stripping. The new item follows the quote
    style of the existing items; a flow list (``[a, b]``) stays flow. An empty
    ``[]`` carries no style of its own and becomes a block list; a lone string
    (``enabled: foo``, which the host reads as ``[foo]``) becomes a block list too.
    """
    keys = tuple(keys)
    if not keys:
        raise ValueError("list_add needs at least one key")
    if isinstance(value, str):
        value = value.strip()
    seq = _list_at(doc, keys, create=True)
    if any(_matches(item, value) for item in seq):
        return False
    like = seq[-1] if len(seq) else None
    with trailing_kept(doc, keys):
        seq.append(scalar(value, like=like) if not isinstance(value, (dict, list, tuple)) else _node(value))
    return True


def list_remove(doc: Any, keys: tuple[str, ...], value: Any) -> bool:
    """Remove every occurrence of ``value`` (exact, after stripping); False when absent."""
    keys = tuple(keys)
    if not keys:
        raise ValueError("list_remove needs at least one key")
    parent = node_at(doc, keys[:-1]) if len(keys) > 1 else doc
    if not isinstance(parent, dict) or keys[-1] not in parent:
        return False
    current = parent[keys[-1]]
    if isinstance(current, str):
        if not _matches(current, value):
            return False
        seq = _list_at(doc, keys, create=True)  # lone string -> [string], removed below
    elif isinstance(current, list):
        seq = current
    else:
        return False
    positions = [i for i, item in enumerate(seq) if _matches(item, value)]
    if not positions:
        return False
    rest = ""
    if positions[-1] == len(seq) - 1 and not is_flow(seq):
        rest = detach_rest(subtree_end(doc, keys))
    for i in reversed(positions):
        del seq[i]
    if not len(seq):
        seq.fa.set_flow_style()  # `key: []`
    if rest:
        attach_rest(subtree_end(doc, keys), rest)
    return True


def _add_key(doc: Any, keys: tuple, mapping: Any, key: str, value: Any) -> None:
    with trailing_kept(doc, keys):
        mapping[scalar(key)] = value


def _container(parent: Any, value: Any) -> Any:
    flow = None
    if isinstance(value, (list, tuple)):
        flow = _sibling_list_flow(parent)
    return _node(value, flow=flow)


def _sibling_list_flow(parent: Any) -> bool:
    for sibling in parent.values():
        if isinstance(sibling, list) and len(sibling):
            return is_flow(sibling)
    return False


def _list_at(doc: Any, keys: tuple, *, create: bool) -> Any:
    """The list at ``keys``; a lone string becomes a one-item list; None when absent and not created."""
    from ruamel.yaml.comments import CommentedSeq

    parent = ensure_map(doc, *keys[:-1]) if create else (node_at(doc, keys[:-1]) if len(keys) > 1 else doc)
    if not isinstance(parent, dict):
        if parent is None and not create:
            return None
        raise ConfigEditError(f"{_dotted(keys[:-1])} in config.yaml is a {kind_of(parent)}, expected a mapping; fix it by hand ({NOTHING_WRITTEN})")
    key = keys[-1]
    if key not in parent or parent[key] is None:
        if not create:
            return None
        seq = CommentedSeq()
        if _sibling_list_flow(parent):
            seq.fa.set_flow_style()
        else:
            seq.fa.set_block_style()
        if key in parent:
            parent[key] = seq
        else:
            _add_key(doc, keys[:-1], parent, key, seq)
        return seq
    current = parent[key]
    if isinstance(current, str):  # `enabled: foo` is read as [foo]: make that explicit
        seq = CommentedSeq([current])
        seq.fa.set_block_style()
        parent[key] = seq
        return seq
    if not isinstance(current, list):
        raise ConfigEditError(
            f"{_dotted(keys)} in config.yaml is a {kind_of(current)}, expected a list; fix it by hand ({NOTHING_WRITTEN})"
        )
    return current


def _matches(item: Any, value: Any) -> bool:
    if isinstance(item, str) and isinstance(value, str):
        return item.strip() == value.strip()
    return _same(item, value)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same kind (``True`` is not ``1``)."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return to_plain(a) == to_plain(b) and type(to_plain(a)) is type(to_plain(b))


def _dotted(keys: tuple) -> str:
    return ".".join(str(k) for k in keys) or "(top level)"


def _needs_quotes(text: str) -> bool:
    """True when PyYAML (YAML 1.1, what the host reads) would not read ``text`` back as this string."""
    import yaml

    try:
        value = host_load(text)
    except yaml.YAMLError:
        return True
    return not isinstance(value, str) or value != text


def scalar(value: Any, like: Any = None) -> Any:
    """A value ready to be stored: strings quoted when PyYAML would misread them.

    ``like`` is an existing scalar whose quoting style a new string should follow.
    """
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString, SingleQuotedScalarString

    if isinstance(value, str) and not _is_ruamel_string(value):
        if isinstance(like, SingleQuotedScalarString):
            return SingleQuotedScalarString(value)
        if isinstance(like, DoubleQuotedScalarString) or _needs_quotes(value):
            return DoubleQuotedScalarString(value)
    return value


def _is_ruamel_string(value: Any) -> bool:
    from ruamel.yaml.scalarstring import ScalarString

    return isinstance(value, ScalarString)


def _node(value: Any, *, flow: bool | None = None) -> Any:
    """Convert plain dicts/lists (recursively) into round-trip nodes."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(value, (CommentedMap, CommentedSeq)):
        return value
    if isinstance(value, dict):
        m = CommentedMap()
        for k, v in value.items():
            m[scalar(k)] = _node(v)
        return m
    if isinstance(value, (list, tuple)):
        s = CommentedSeq(_node(v) for v in value)
        if flow:
            s.fa.set_flow_style()
        else:
            s.fa.set_block_style()
        return s
    return scalar(value)
