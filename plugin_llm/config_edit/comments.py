"""Trailing comments of a block of ``config.yaml``, kept at its end across an edit.

ruamel attaches the comment lines that follow a block (and the header comment of the next
section) to the deepest last scalar of the block. Appending after it, or deleting it, would move
those comments into the wrong section or drop them; these helpers keep them at the end of the
block.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from plugin_llm.config_edit.roundtrip import is_flow, node_at


@contextlib.contextmanager
def trailing_kept(doc: Any, keys: tuple) -> Iterator[None]:
    """Keep the comments after the block at ``keys`` at its end across a change."""
    rest = detach_rest(subtree_end(doc, keys))
    try:
        yield
    finally:
        if rest:
            slot = subtree_end(doc, keys)
            if slot is None:  # the document became empty: keep the text at its end
                doc.yaml_end_comment_extend([rest.rstrip("\n")], clear=False)  # pragma: no cover
            else:
                attach_rest(slot, rest)


def _end_slot(parent: Any, key: Any) -> tuple[Any, Any]:
    value = parent[key]
    while isinstance(value, (dict, list)) and len(value) and not is_flow(value):
        parent, key = value, (list(value.keys())[-1] if isinstance(value, dict) else len(value) - 1)
        value = parent[key]
    return parent, key


def subtree_end(doc: Any, keys: tuple) -> tuple[Any, Any] | None:
    """Where the trailing comments after the block at ``keys`` live (None: empty document)."""
    if not keys:
        if not len(doc):
            return None
        return _end_slot(doc, list(doc.keys())[-1])
    parent = node_at(doc, keys[:-1])
    return _end_slot(parent, keys[-1])


def _slot_index(container: Any) -> int:
    return 2 if isinstance(container, dict) else 0


def detach_rest(slot: tuple[Any, Any] | None) -> str:
    """Remove and return the comment lines after the end-of-line comment of ``slot``."""
    if slot is None:
        return ""
    container, key = slot
    entry = container.ca.items.get(key)
    pos = _slot_index(container)
    token = entry[pos] if entry and len(entry) > pos else None
    if token is None or not isinstance(getattr(token, "value", None), str):
        return ""
    value = token.value
    nl = value.find("\n")
    if nl < 0 or nl == len(value) - 1:
        return ""
    head, rest = value[: nl + 1], value[nl + 1 :]
    if head.strip():
        token.value = head
    else:
        entry[pos] = None
        if not any(entry):
            del container.ca.items[key]
    return rest


def attach_rest(slot: tuple[Any, Any] | None, rest: str) -> None:
    if not rest or slot is None:
        return
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    container, key = slot
    pos = _slot_index(container)
    entry = container.ca.items.setdefault(key, [None, None, None, None])
    token = entry[pos]
    if token is not None and isinstance(getattr(token, "value", None), str):
        token.value = token.value if token.value.endswith("\n") else token.value + "\n"
        token.value += rest
    else:
        entry[pos] = CommentToken("\n" + rest, CommentMark(0), None)
