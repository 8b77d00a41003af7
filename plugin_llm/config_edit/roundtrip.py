"""The round-trip document of one edit of ``config.yaml``, and the checks before it is written.

ruamel.yaml loads the text (comments, key order, quoting kept) and dumps it in the file's own
indentation; PyYAML, exactly as the host reads, parses it before ruamel sees it (an alias bomb is
refused there) and again after the edit: nothing the edit did not ask for may change meaning.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import io
from pathlib import Path
from typing import Any

from plugin_llm.errors import PluginLlmConfigError

NOTHING_WRITTEN = "nothing was written"


#: (mapping, sequence, offset) used for a new or empty file: ``key:\n  - item``.
DEFAULT_INDENT = (2, 4, 2)


class ConfigEditError(PluginLlmConfigError):
    """config.yaml could not be edited safely; the file on disk is unchanged."""


def yaml_error(path: Path, exc: Exception) -> str:
    from plugin_llm.config import describe_yaml_error  # on first use: it loads PyYAML

    return describe_yaml_error(path, exc)


class Editor:
    """Round-trip state of one edit: the document, its detected style, the checks."""

    def __init__(self, path: Path, text: str) -> None:
        import yaml

        self.path = path
        self.newline = "\r\n" if "\r\n" in text else "\n"
        text = text.replace("\r\n", "\n")
        self.text = text
        try:
            self.old_plain = host_load(text)
        except yaml.YAMLError as exc:
            raise ConfigEditError(f"{yaml_error(path, exc)} ({NOTHING_WRITTEN}; fix the file first)") from None
        if self.old_plain is not None and not isinstance(self.old_plain, dict):
            raise ConfigEditError(
                f"{path}: the top level is a {kind_of(self.old_plain)}, expected a mapping of settings "
                f"({NOTHING_WRITTEN}; fix the file first)"
            )
        from ruamel.yaml.comments import CommentedMap
        from ruamel.yaml.error import YAMLError as RuamelError

        loader = _new_yaml(DEFAULT_INDENT)
        try:
            doc = loader.load(text) if text.strip() else None
        except RuamelError as exc:
            raise ConfigEditError(f"{yaml_error(path, exc)} ({NOTHING_WRITTEN}; fix the file first)") from None
        # A file of comments only loads as None: keep its text and append after it.
        self.prefix = text if doc is None and text.strip() else ""
        if self.prefix and not self.prefix.endswith("\n"):
            self.prefix += "\n"
        self.doc = doc if doc is not None else CommentedMap()
        self.old_rt_plain = to_plain(self.doc)
        self.yaml = _new_yaml(_detect_indent(self.doc, text)) if doc is not None else loader
        self.yaml.explicit_start = text.lstrip().startswith("---") or None

    def dump(self) -> str:
        if not self.doc:
            return self.prefix if self.prefix else ("" if not self.text.strip() else "{}\n")
        out = io.StringIO()
        self.yaml.dump(self.doc, out)
        return self.prefix + out.getvalue()

    def verify(self, new_text: str) -> None:
        """Never write a file the host can't read, or one that means something unintended."""
        import yaml

        try:
            new_plain = host_load(new_text)
        except yaml.YAMLError as exc:  # pragma: no cover - a ruamel bug; refuse rather than write
            raise ConfigEditError(
                f"the edited {self.path} would not parse ({yaml_error(self.path, exc)}); {NOTHING_WRITTEN}"
            ) from None
        if new_plain is not None and not isinstance(new_plain, dict):  # pragma: no cover - defensive
            raise ConfigEditError(f"the edited {self.path} would not be a mapping; {NOTHING_WRITTEN}")
        # Where the round-trip view and PyYAML agreed before, they must still agree:
        # catches plain strings PyYAML reads differently (on/no/yes, *, 0755, ...).
        before = leaves(self.old_rt_plain) ^ leaves(self.old_plain)
        after = leaves(to_plain(self.doc)) ^ leaves(new_plain)
        surprising = sorted(after - before, key=repr)
        if surprising:
            where = ".".join("[*]" if p == "*" else str(p[1]) for p in surprising[0][0]) or "(top level)"
            raise ConfigEditError(
                f"the edited {self.path} would not mean what was intended at {where} "
                f"(a value PyYAML reads differently; quote it); {NOTHING_WRITTEN}"
            )


def host_load(text: str) -> Any:
    """Parse exactly as the host does (:func:`plugin_llm.hardened.safe_yaml.load_yaml`).

    It runs before ruamel sees the text, so an alias bomb or a recursive alias
    is refused here (with its line) instead of being expanded by the
    round-trip loader, :func:`to_plain` or :func:`leaves`.
    """
    from plugin_llm.config import GOVERNED_SECTIONS  # on first use: it loads PyYAML
    from plugin_llm.hardened.safe_yaml import load_yaml  # on first use: it loads PyYAML

    return load_yaml(text, unique_keys=GOVERNED_SECTIONS)


def _new_yaml(indent: tuple[int, int, int]):
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap long lines or flow lists
    mapping, sequence, offset = indent
    y.indent(mapping=mapping, sequence=sequence, offset=offset)
    return y


def _indent_candidates(text: str) -> list[tuple[int, int, int]]:
    """Plausible (mapping, sequence, offset) settings, the text's own guess first."""
    mapping = offset = None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for prev, line in zip(lines, lines[1:]):
        prev_indent = len(prev) - len(prev.lstrip(" "))
        indent = len(line) - len(line.lstrip(" "))
        if not prev.rstrip().endswith(":") or indent < prev_indent:
            continue
        if line.lstrip().startswith("- "):
            offset = indent - prev_indent if offset is None else offset
        elif indent > prev_indent and mapping is None:
            mapping = indent - prev_indent
        if mapping is not None and offset is not None:
            break
    out: list[tuple[int, int, int]] = []
    guess_m = mapping or 2
    guess_o = offset if offset is not None else 2
    for m in (guess_m, 2, 4, 3):
        for o in (guess_o, 0, 2, 4, 1, 3):
            cand = (m, max(o + 2, 2), o)
            if cand not in out:
                out.append(cand)
    return out


def _detect_indent(doc: Any, text: str) -> tuple[int, int, int]:
    """The indentation that reproduces ``text`` best (exactly, in the usual case)."""
    best: tuple[int, tuple[int, int, int]] | None = None
    original = text.splitlines()
    for cand in _indent_candidates(text):
        out = io.StringIO()
        y = _new_yaml(cand)
        y.explicit_start = text.lstrip().startswith("---") or None
        y.dump(doc, out)
        dumped = out.getvalue()
        if dumped == text:
            return cand
        distance = sum(1 for tag, *_ in _opcodes(original, dumped.splitlines()) if tag != "equal")
        if best is None or distance < best[0]:
            best = (distance, cand)
    return best[1] if best else DEFAULT_INDENT


def _opcodes(a: list[str], b: list[str]):
    return difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()


def kind_of(value: Any) -> str:
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    if value is None:
        return "null"
    return type(value).__name__ if not isinstance(value, str) else "string"


def to_plain(node: Any) -> Any:
    """The ruamel document as plain Python (for comparisons)."""
    if isinstance(node, dict):
        return {_plain_scalar(k): to_plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [to_plain(v) for v in node]
    return _plain_scalar(node)


def _plain_scalar(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def _norm_leaf(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return ("bool" if isinstance(value, bool) else "null", value)
    if isinstance(value, int):
        return ("int", int(value))
    if isinstance(value, float):
        return ("float", repr(float(value)))
    if isinstance(value, str):
        return ("str", str(value))
    if isinstance(value, (_dt.date, _dt.datetime)):
        return ("time", value.isoformat())
    return ("other", repr(value))


def leaves(node: Any, path: tuple = ()) -> set:
    """``{(path, leaf)}`` of a parsed document; list positions are ``*`` (order-insensitive)."""
    out: set = set()
    if isinstance(node, dict):
        if not node:
            out.add((path, ("map", 0)))
        for k, v in node.items():
            out |= leaves(v, path + (_norm_leaf(k),))
    elif isinstance(node, (list, tuple)):
        if not node:
            out.add((path, ("seq", 0)))
        for v in node:
            out |= leaves(v, path + ("*",))
    else:
        out.add((path, _norm_leaf(node)))
    return out


def node_at(doc: Any, keys: tuple) -> Any:
    node = doc
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def is_flow(node: Any) -> bool:
    fa = getattr(node, "fa", None)
    return bool(fa is not None and fa.flow_style())
