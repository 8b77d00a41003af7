"""The one YAML loader for files of the home: safe, and bounded.

:func:`load_yaml` and :func:`compose_yaml` check the composed node graph before anything is
constructed from it, so an alias bomb or a self-containing collection cannot hang or overflow
whatever walks the result:

- a recursive alias (a collection containing itself) is refused;
- aliases may add at most ``alias_budget`` values (a long string counts one per 64 characters);
- nesting, counted through aliases, is at most ``max_depth`` levels;
- with ``unique_keys``, a key written twice in one mapping of the named top-level sections (or one
  of those sections written twice) is refused: YAML keeps the last one silently.

A refused document raises :class:`YamlLimitError`, a :class:`yaml.MarkedYAMLError` whose mark is
the offending node, so every ``except yaml.YAMLError`` reports ``file:line:col``. libyaml is used
when PyYAML has it. Why: docs/design.md, "Hardened input".
"""

from __future__ import annotations

import json
import re
from typing import Any, Collection

import yaml

__all__ = [
    "MAX_DEPTH",
    "ALIAS_BUDGET",
    "YamlLimitError",
    "YamlDuplicateKeyError",
    "load_yaml",
    "compose_yaml",
    "check_node",
    "check_unique_keys",
]

#: nesting levels (mappings and sequences, through aliases); config.yaml needs about five
MAX_DEPTH = 64
#: values that aliases may add to one document (each use of ``*a`` adds what ``&a`` stands for;
#: a scalar counts one value per started 64 characters, so a long aliased string counts too)
ALIAS_BUDGET = 10_000
_CHARS_PER_VALUE = 64
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_/@+\-]*")


class YamlLimitError(yaml.MarkedYAMLError):
    """A document refused for its shape (alias expansion, recursion, depth), not its syntax."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class YamlDuplicateKeyError(yaml.MarkedYAMLError):
    """A key written twice in one mapping where every key must count (``unique_keys``)."""

    def __init__(self, problem: str, first: Any, again: Any) -> None:
        super().__init__(context="first written here", context_mark=first, problem=problem, problem_mark=again)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _weight(node: yaml.Node) -> int:
    """What one node stands for: 1, plus 1 per 64 characters of a scalar (a long string is many values)."""
    return 1 + len(node.value) // _CHARS_PER_VALUE if isinstance(node, yaml.ScalarNode) else 1


def check_node(root: yaml.Node, *, max_depth: int = MAX_DEPTH, alias_budget: int = ALIAS_BUDGET) -> None:
    """Refuse a composed document that is recursive, too deep or expands too much.

    One iterative depth-first walk over the distinct nodes (so linear in the
    document's size, whatever it expands to). A node reached again after its
    subtree is complete is an alias: it adds its expanded size to the budget
    and its depth below the current level. A node reached again while its own
    subtree is still open contains itself.
    """
    size: dict[int, int] = {}  # id(node) -> expanded weight of its subtree
    depth: dict[int, int] = {}  # id(node) -> expanded depth of its subtree (a scalar is 1)
    open_ids: set[int] = {id(root)}
    stack: list[tuple[yaml.Node, Any, list[int]]] = [(root, iter(_children(root)), [_weight(root), 0])]
    added = 0
    while stack:
        node, children, acc = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            open_ids.discard(id(node))
            size[id(node)], depth[id(node)] = acc[0], acc[1] + 1
            if stack:
                parent = stack[-1][2]
                parent[0] += acc[0]
                parent[1] = max(parent[1], acc[1] + 1)
            continue
        key = id(child)
        if key in open_ids:
            raise YamlLimitError(
                "a recursive alias: this anchored collection contains itself; write the value out instead", child.start_mark
            )
        if key in size:  # an alias of a complete subtree
            added += size[key]
            if added > alias_budget:
                raise YamlLimitError(
                    f"aliases would repeat more than {alias_budget} values (the anchor here stands for "
                    f"{size[key]}; an alias bomb?): write the values out or use fewer aliases",
                    child.start_mark,
                )
            if len(stack) + depth[key] > max_depth:
                raise YamlLimitError(f"nested deeper than {max_depth} levels through an alias", child.start_mark)
            acc[0] += size[key]
            acc[1] = max(acc[1], depth[key])
            continue
        if len(stack) + 1 > max_depth:
            raise YamlLimitError(f"nested deeper than {max_depth} levels", child.start_mark)
        if isinstance(child, yaml.ScalarNode):  # a leaf: no need to go down
            size[key], depth[key] = _weight(child), 1
            acc[0] += size[key]
            acc[1] = max(acc[1], 1)
            continue
        open_ids.add(key)
        stack.append((child, iter(_children(child)), [1, 0]))


def _key_identity(node: yaml.Node) -> Any:
    """The key as the constructed dict sees it (``1`` and ``0x1``, ``true`` and ``True`` are one key)."""
    if not isinstance(node, yaml.ScalarNode):
        return ("node", id(node))  # a collection as a key: never the same as another
    if node.tag == "tag:yaml.org,2002:str":
        return node.value
    try:
        value = yaml.constructor.SafeConstructor().construct_object(node)
        hash(value)
        return value
    except Exception:  # a scalar the constructor refuses fails the load anyway
        return (node.tag, node.value)


def _key_text(node: yaml.Node) -> str:
    """A key for a dotted path: plain when it is a plain word, else JSON-quoted (no control characters)."""
    if not isinstance(node, yaml.ScalarNode):
        return "(a collection)"
    text = str(node.value)[:80]
    return text if _PLAIN_KEY.fullmatch(text) else json.dumps(text)


def check_unique_keys(root: yaml.Node | None, sections: Collection[str]) -> None:
    """Refuse a duplicate key in the top-level ``sections``, at any depth, and a section written twice.

    Keys elsewhere may repeat (the last one counts, as YAML says). A merge key
    (``<<: *base``) is not a duplicate of the keys it merges. Raises
    :class:`YamlDuplicateKeyError` naming both lines; run after :func:`check_node`
    (the graph is bounded and acyclic).
    """
    if not isinstance(root, yaml.MappingNode) or not sections:
        return
    stack: list[tuple[yaml.Node, str]] = []
    seen: dict[Any, yaml.Node] = {}
    for key_node, value_node in root.value:
        if not (isinstance(key_node, yaml.ScalarNode) and key_node.value in sections):
            continue
        ident = _key_identity(key_node)
        if ident in seen:
            raise _duplicate(key_node, seen[ident], "")
        seen[ident] = key_node
        stack.append((value_node, _key_text(key_node)))
    visited: set[int] = set()
    while stack:
        node, path = stack.pop()
        if id(node) in visited:  # an alias of a collection already checked
            continue
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            keys: dict[Any, yaml.Node] = {}
            for key_node, value_node in node.value:
                if key_node.tag != "tag:yaml.org,2002:merge":
                    ident = _key_identity(key_node)
                    if ident in keys:
                        raise _duplicate(key_node, keys[ident], path)
                    keys[ident] = key_node
                stack.append((value_node, f"{path}.{_key_text(key_node)}"))


def _duplicate(again: yaml.Node, first: yaml.Node, path: str) -> YamlDuplicateKeyError:
    where = f"in {path} " if path else "at the top level "
    key = _key_text(again)
    return YamlDuplicateKeyError(
        f"duplicate key {key if key.startswith(chr(34)) else repr(key)} {where}(lines {first.start_mark.line + 1} "
        f"and {again.start_mark.line + 1}): YAML would silently keep only the last one; keep one of them",
        first.start_mark, again.start_mark,
    )


class _BoundedMixin:
    """``get_single_node`` / ``get_single_data`` that check the graph before construction."""

    max_depth = MAX_DEPTH
    alias_budget = ALIAS_BUDGET
    unique_keys: Collection[str] = ()

    def checked_node(self) -> yaml.Node | None:
        node = self.get_single_node()  # type: ignore[attr-defined]
        if node is not None:
            check_node(node, max_depth=self.max_depth, alias_budget=self.alias_budget)
            check_unique_keys(node, self.unique_keys)
        return node

    def get_single_data(self) -> Any:
        node = self.checked_node()
        return self.construct_document(node) if node is not None else None  # type: ignore[attr-defined]


class _PureLoader(_BoundedMixin, yaml.SafeLoader):
    """The pure-Python loader; its recursive composer stops at ``max_depth`` instead of the stack."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise YamlLimitError(f"nested deeper than {self.max_depth} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_CSafe = getattr(yaml, "CSafeLoader", None)
if _CSafe is not None:

    class _CLoader(_BoundedMixin, _CSafe):  # type: ignore[valid-type, misc]
        """libyaml's loader (composition in C; libyaml itself stops at 1000 levels)."""

    _LOADER: type = _CLoader
else:  # pragma: no cover - PyYAML built without libyaml
    _LOADER = _PureLoader


def _loader(text: str, max_depth: int, alias_budget: int, pure: bool, unique_keys: Collection[str] = ()) -> Any:
    cls = _PureLoader if pure else _LOADER
    loader = cls(text)
    loader.max_depth, loader.alias_budget, loader.unique_keys = max_depth, alias_budget, frozenset(unique_keys)
    return loader


def load_yaml(text: str, *, max_depth: int = MAX_DEPTH, alias_budget: int = ALIAS_BUDGET, pure: bool = False,
              unique_keys: Collection[str] = ()) -> Any:
    """Safe-load one document (None when empty); raises :class:`yaml.YAMLError` (or :class:`YamlLimitError`).

    ``pure=True`` forces the pure-Python loader (tests; libyaml is used otherwise when available).
    ``unique_keys``: top-level sections where a duplicate key is refused (:func:`check_unique_keys`).
    """
    if not text.strip():
        return None
    loader = _loader(text, max_depth, alias_budget, pure, unique_keys)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def compose_yaml(text: str, *, max_depth: int = MAX_DEPTH, alias_budget: int = ALIAS_BUDGET, pure: bool = False,
                 unique_keys: Collection[str] = ()) -> yaml.Node | None:
    """The checked node graph of one document (for line numbers); None when empty."""
    if not text.strip():
        return None
    loader = _loader(text, max_depth, alias_budget, pure, unique_keys)
    try:
        return loader.checked_node()
    finally:
        loader.dispose()
