"""The one module that writes ``config.yaml``.

Reading stays on PyYAML in :mod:`plugin_llm.config`; writing goes through :func:`edit_config`,
which loads the file with ruamel.yaml (round trip: comments, key order, quoting and indentation
survive), refuses a file that does not parse (``file:line:col: problem``), calls ``mutate(doc)``,
checks the new text parses with PyYAML and that nothing it was not asked to change changed
meaning, then writes it atomically (``config.yaml.bak`` holding the previous version) under an
advisory lock, so two CLI processes never lose each other's edit. The helpers
(:func:`ensure_map`, :func:`set_value`, :func:`list_add`, ...) quote new strings PyYAML would read
as something else (``on``, ``no``, ``*``) and keep section comments with their section.

Nothing is written (and no ``.bak`` made) when the edit changes nothing.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import difflib
import io
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.home_layout import CONFIG_FILE
from plugin_llm.hardened.safe_files import UnsafeFileError, read_home_file

__all__ = [
    "ConfigEditError",
    "EditResult",
    "edit_config",
    "ensure_map",
    "list_add",
    "list_remove",
    "set_value",
    "delete_value",
    "get_value",
]

CONFIG_NAME = CONFIG_FILE
NEW_FILE_MODE = 0o600
#: (mapping, sequence, offset) used for a new or empty file: ``key:\n  - item``.
DEFAULT_INDENT = (2, 4, 2)
_NOTHING_WRITTEN = "nothing was written"


class ConfigEditError(PluginLlmConfigError):
    """config.yaml could not be edited safely; the file on disk is unchanged."""


@dataclass(frozen=True)
class EditResult:
    """Outcome of :func:`edit_config`.

    ``diff`` is a unified diff of the old text against the new one (empty when
    unchanged); ``backup`` is the ``.bak`` path when a previous version existed
    and the file was written.
    """

    path: Path
    changed: bool
    backup: Path | None
    diff: str


# --------------------------------------------------------------------------- edit_config


def edit_config(
    home: Path,
    mutate: Callable[[Any], Any],
    *,
    create: bool = True,
    dry_run: bool = False,
) -> EditResult:
    """Load ``<home>/config.yaml``, apply ``mutate(doc)``, write it back safely.

    ``doc`` is a ruamel ``CommentedMap`` (an empty one for a missing or empty
    file when ``create`` is true). Whatever ``mutate`` raises propagates and
    nothing is written. ``dry_run=True`` computes the result and the diff
    without writing anything.
    """
    home = Path(home).expanduser()
    path = home / CONFIG_NAME
    target = _real_target(path)
    with _edit_lock(target, write=not dry_run):
        before = _read(target, create=create, shown=path)
        old_text = before.text if before is not None else ""
        editor = _Editor(path, old_text)
        baseline = editor.dump()
        mutate(editor.doc)
        new_text = editor.dump()
        if new_text == baseline:
            return EditResult(path=path, changed=False, backup=None, diff="")
        editor.verify(new_text)
        diff = "".join(
            difflib.unified_diff(
                old_text.splitlines(keepends=True),
                new_text.splitlines(keepends=True),
                fromfile=f"{path} (before)",
                tofile=f"{path} (after)",
            )
        )
        if dry_run:
            return EditResult(path=path, changed=True, backup=None, diff=diff)
        if before is not None and _stamp(target) != before.stamp:
            raise ConfigEditError(f"{path} changed while it was being edited; {_NOTHING_WRITTEN}, run the command again")
        backup = _write(target, new_text, before, newline=editor.newline)
        return EditResult(path=path, changed=True, backup=backup, diff=diff)


@dataclass(frozen=True)
class _Before:
    text: str
    data: bytes
    mode: int
    stamp: tuple[int, int, int]


def _real_target(path: Path) -> Path:
    """Edit the file a symlinked config.yaml points to, never replace the link."""
    if path.is_symlink():
        return Path(os.path.realpath(path))
    return path


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _read(path: Path, *, create: bool, shown: Path) -> _Before | None:
    from plugin_llm.config import CONFIG_MAX_BYTES  # on first use: it loads PyYAML

    try:  # a FIFO, a device or a directory in its place is refused without blocking
        got = read_home_file(path, max_bytes=CONFIG_MAX_BYTES)
    except UnsafeFileError as exc:
        link = f"{shown} -> " if shown != path else ""  # a symlinked config.yaml: name both
        raise ConfigEditError(f"{link}{exc}; {_NOTHING_WRITTEN}") from None
    if got is None:
        if not create:
            raise ConfigEditError(f"{shown} does not exist; {_NOTHING_WRITTEN}") from None
        if not path.parent.is_dir():
            raise ConfigEditError(f"home directory {path.parent} does not exist; {_NOTHING_WRITTEN}") from None
        return None
    data, st = got.data, got.stat
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigEditError(f"{shown} is not UTF-8 text (byte {exc.start}); {_NOTHING_WRITTEN}") from None
    return _Before(text=text, data=data, mode=stat.S_IMODE(st.st_mode), stamp=(st.st_mtime_ns, st.st_size, st.st_ino))


@contextlib.contextmanager
def _edit_lock(target: Path, *, write: bool) -> Iterator[None]:
    """An advisory lock (``.config.yaml.lock`` beside the file) for read-modify-write."""
    if not write:
        yield
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no locking, still atomic
        yield
        return
    lock_path = target.parent / f".{target.name}.lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, NEW_FILE_MODE)
    except OSError:  # read-only directory: the write will report the real problem
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write(target: Path, text: str, before: _Before | None, *, newline: str) -> Path | None:
    """Atomically replace ``target`` with ``text``; returns the ``.bak`` path (or None)."""
    data = text.replace("\n", newline).encode("utf-8")
    mode = before.mode if before is not None else NEW_FILE_MODE
    backup = None
    if before is not None:
        backup = target.with_name(target.name + ".bak")
        _atomic_write(backup, before.data, mode)
    _atomic_write(target, data, mode)
    return backup


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise ConfigEditError(f"cannot write {path}: {exc.strerror or exc}; {_NOTHING_WRITTEN}") from exc
        raise
    with contextlib.suppress(OSError):  # make the rename durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


# --------------------------------------------------------------------------- parse / dump


def _yaml_error(path: Path, exc: Exception) -> str:
    from plugin_llm.config import describe_yaml_error  # on first use: it loads PyYAML

    return describe_yaml_error(path, exc)


class _Editor:
    """Round-trip state of one edit: the document, its detected style, the checks."""

    def __init__(self, path: Path, text: str) -> None:
        import yaml

        self.path = path
        self.newline = "\r\n" if "\r\n" in text else "\n"
        text = text.replace("\r\n", "\n")
        self.text = text
        try:
            self.old_plain = _host_load(text)
        except yaml.YAMLError as exc:
            raise ConfigEditError(f"{_yaml_error(path, exc)} ({_NOTHING_WRITTEN}; fix the file first)") from None
        if self.old_plain is not None and not isinstance(self.old_plain, dict):
            raise ConfigEditError(
                f"{path}: the top level is a {_kind(self.old_plain)}, expected a mapping of settings "
                f"({_NOTHING_WRITTEN}; fix the file first)"
            )
        from ruamel.yaml.comments import CommentedMap
        from ruamel.yaml.error import YAMLError as RuamelError

        loader = _new_yaml(DEFAULT_INDENT)
        try:
            doc = loader.load(text) if text.strip() else None
        except RuamelError as exc:
            raise ConfigEditError(f"{_yaml_error(path, exc)} ({_NOTHING_WRITTEN}; fix the file first)") from None
        # A file of comments only loads as None: keep its text and append after it.
        self.prefix = text if doc is None and text.strip() else ""
        if self.prefix and not self.prefix.endswith("\n"):
            self.prefix += "\n"
        self.doc = doc if doc is not None else CommentedMap()
        self.old_rt_plain = _plain(self.doc)
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
            new_plain = _host_load(new_text)
        except yaml.YAMLError as exc:  # pragma: no cover - a ruamel bug; refuse rather than write
            raise ConfigEditError(
                f"the edited {self.path} would not parse ({_yaml_error(self.path, exc)}); {_NOTHING_WRITTEN}"
            ) from None
        if new_plain is not None and not isinstance(new_plain, dict):  # pragma: no cover - defensive
            raise ConfigEditError(f"the edited {self.path} would not be a mapping; {_NOTHING_WRITTEN}")
        # Where the round-trip view and PyYAML agreed before, they must still agree:
        # catches plain strings PyYAML reads differently (on/no/yes, *, 0755, ...).
        before = _leaves(self.old_rt_plain) ^ _leaves(self.old_plain)
        after = _leaves(_plain(self.doc)) ^ _leaves(new_plain)
        surprising = sorted(after - before, key=repr)
        if surprising:
            where = ".".join("[*]" if p == "*" else str(p[1]) for p in surprising[0][0]) or "(top level)"
            raise ConfigEditError(
                f"the edited {self.path} would not mean what was intended at {where} "
                f"(a value PyYAML reads differently; quote it); {_NOTHING_WRITTEN}"
            )


def _host_load(text: str) -> Any:
    """Parse exactly as the host does (:func:`plugin_llm.hardened.safe_yaml.load_yaml`).

    It runs before ruamel sees the text, so an alias bomb or a recursive alias
    is refused here (with its line) instead of being expanded by the
    round-trip loader, :func:`_plain` or :func:`_leaves`.
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


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    if value is None:
        return "null"
    return type(value).__name__ if not isinstance(value, str) else "string"


def _plain(node: Any) -> Any:
    """The ruamel document as plain Python (for comparisons)."""
    if isinstance(node, dict):
        return {_plain_scalar(k): _plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain(v) for v in node]
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


def _leaves(node: Any, path: tuple = ()) -> set:
    """``{(path, leaf)}`` of a parsed document; list positions are ``*`` (order-insensitive)."""
    out: set = set()
    if isinstance(node, dict):
        if not node:
            out.add((path, ("map", 0)))
        for k, v in node.items():
            out |= _leaves(v, path + (_norm_leaf(k),))
    elif isinstance(node, (list, tuple)):
        if not node:
            out.add((path, ("seq", 0)))
        for v in node:
            out |= _leaves(v, path + ("*",))
    else:
        out.add((path, _norm_leaf(node)))
    return out


# --------------------------------------------------------------------------- helpers


def _dotted(keys: tuple) -> str:
    return ".".join(str(k) for k in keys) or "(top level)"


def _needs_quotes(text: str) -> bool:
    """True when PyYAML (YAML 1.1, what the host reads) would not read ``text`` back as this string."""
    import yaml

    try:
        value = _host_load(text)
    except yaml.YAMLError:
        return True
    return not isinstance(value, str) or value != text


def _scalar(value: Any, like: Any = None) -> Any:
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
            m[_scalar(k)] = _node(v)
        return m
    if isinstance(value, (list, tuple)):
        s = CommentedSeq(_node(v) for v in value)
        if flow:
            s.fa.set_flow_style()
        else:
            s.fa.set_block_style()
        return s
    return _scalar(value)


def _is_flow(node: Any) -> bool:
    fa = getattr(node, "fa", None)
    return bool(fa is not None and fa.flow_style())


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same kind (``True`` is not ``1``)."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return _plain(a) == _plain(b) and type(_plain(a)) is type(_plain(b))


def _get(doc: Any, keys: tuple) -> Any:
    node = doc
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def get_value(doc: Any, keys: tuple[str, ...], default: Any = None) -> Any:
    """The value at ``keys`` (``default`` when any part is missing or not a mapping)."""
    node = doc
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


# Trailing comments. ruamel attaches the comment lines that follow a block (and
# the header comment of the next section) to the deepest last scalar of the
# block. Appending after it, or deleting it, would move those comments into the
# wrong section or drop them; these helpers keep them at the end of the block.


def _end_slot(parent: Any, key: Any) -> tuple[Any, Any]:
    value = parent[key]
    while isinstance(value, (dict, list)) and len(value) and not _is_flow(value):
        parent, key = value, (list(value.keys())[-1] if isinstance(value, dict) else len(value) - 1)
        value = parent[key]
    return parent, key


def _subtree_end(doc: Any, keys: tuple) -> tuple[Any, Any] | None:
    """Where the trailing comments after the block at ``keys`` live (None: empty document)."""
    if not keys:
        if not len(doc):
            return None
        return _end_slot(doc, list(doc.keys())[-1])
    parent = _get(doc, keys[:-1])
    return _end_slot(parent, keys[-1])


def _slot_index(container: Any) -> int:
    return 2 if isinstance(container, dict) else 0


def _detach_rest(slot: tuple[Any, Any] | None) -> str:
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


def _attach_rest(slot: tuple[Any, Any] | None, rest: str) -> None:
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


@contextlib.contextmanager
def _trailing_kept(doc: Any, keys: tuple) -> Iterator[None]:
    """Keep the comments after the block at ``keys`` at its end across a change."""
    rest = _detach_rest(_subtree_end(doc, keys))
    try:
        yield
    finally:
        if rest:
            slot = _subtree_end(doc, keys)
            if slot is None:  # the document became empty: keep the text at its end
                doc.yaml_end_comment_extend([rest.rstrip("\n")], clear=False)  # pragma: no cover
            else:
                _attach_rest(slot, rest)


def _add_key(doc: Any, keys: tuple, mapping: Any, key: str, value: Any) -> None:
    with _trailing_kept(doc, keys):
        mapping[_scalar(key)] = value


def ensure_map(doc: Any, *keys: str) -> Any:
    """The mapping at ``keys``, creating missing (or null) levels as needed.

    ``ensure_map(doc, "plugins", "entries", "image_gen/openai", "llm")``. A level
    that exists but is not a mapping raises :class:`ConfigEditError` naming it.
    """
    from ruamel.yaml.comments import CommentedMap

    if not isinstance(doc, dict):
        raise ConfigEditError(f"the top level of config.yaml is a {_kind(doc)}, not a mapping; {_NOTHING_WRITTEN}")
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
                f"{_dotted(here)} in config.yaml is a {_kind(current)}, expected a mapping; "
                f"fix it by hand ({_NOTHING_WRITTEN})"
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
        if isinstance(value, (dict, list, tuple)) and _plain(old) == _plain(value):
            return False
        parent[key] = _scalar(value, like=old) if not isinstance(value, (dict, list, tuple)) else _container(parent, value)
        return True
    new = _scalar(value) if not isinstance(value, (dict, list, tuple)) else _container(parent, value)
    _add_key(doc, keys[:-1], parent, key, new)
    return True


def _container(parent: Any, value: Any) -> Any:
    flow = None
    if isinstance(value, (list, tuple)):
        flow = _sibling_list_flow(parent)
    return _node(value, flow=flow)


def _sibling_list_flow(parent: Any) -> bool:
    for sibling in parent.values():
        if isinstance(sibling, list) and len(sibling):
            return _is_flow(sibling)
    return False


def delete_value(doc: Any, keys: tuple[str, ...]) -> bool:
    """Remove the key at ``keys``; False when it (or a parent) is absent."""
    keys = tuple(keys)
    if not keys:
        raise ValueError("delete_value needs at least one key")
    parent = _get(doc, keys[:-1]) if len(keys) > 1 else doc
    if not isinstance(parent, dict) or keys[-1] not in parent:
        return False
    container_keys = keys[:-1]
    is_last = list(parent.keys())[-1] == keys[-1]
    rest = _detach_rest(_subtree_end(doc, container_keys)) if is_last else ""
    del parent[keys[-1]]
    if rest:
        if len(parent):
            _attach_rest(_subtree_end(doc, container_keys), rest)
        elif container_keys:
            grand = _get(doc, container_keys[:-1]) if len(container_keys) > 1 else doc
            _attach_rest((grand, container_keys[-1]), rest)
        else:  # pragma: no cover - emptied the whole document
            doc.yaml_end_comment_extend([rest.rstrip("\n")], clear=False)
    return True


def _list_at(doc: Any, keys: tuple, *, create: bool) -> Any:
    """The list at ``keys``; a lone string becomes a one-item list; None when absent and not created."""
    from ruamel.yaml.comments import CommentedSeq

    parent = ensure_map(doc, *keys[:-1]) if create else (_get(doc, keys[:-1]) if len(keys) > 1 else doc)
    if not isinstance(parent, dict):
        if parent is None and not create:
            return None
        raise ConfigEditError(f"{_dotted(keys[:-1])} in config.yaml is a {_kind(parent)}, expected a mapping; fix it by hand ({_NOTHING_WRITTEN})")
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
            f"{_dotted(keys)} in config.yaml is a {_kind(current)}, expected a list; fix it by hand ({_NOTHING_WRITTEN})"
        )
    return current


def _matches(item: Any, value: Any) -> bool:
    if isinstance(item, str) and isinstance(value, str):
        return item.strip() == value.strip()
    return _same(item, value)


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
    with _trailing_kept(doc, keys):
        seq.append(_scalar(value, like=like) if not isinstance(value, (dict, list, tuple)) else _node(value))
    return True


def list_remove(doc: Any, keys: tuple[str, ...], value: Any) -> bool:
    """Remove every occurrence of ``value`` (exact, after stripping); False when absent."""
    keys = tuple(keys)
    if not keys:
        raise ValueError("list_remove needs at least one key")
    parent = _get(doc, keys[:-1]) if len(keys) > 1 else doc
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
    if positions[-1] == len(seq) - 1 and not _is_flow(seq):
        rest = _detach_rest(_subtree_end(doc, keys))
    for i in reversed(positions):
        del seq[i]
    if not len(seq):
        seq.fa.set_flow_style()  # `key: []`
    if rest:
        _attach_rest(_subtree_end(doc, keys), rest)
    return True
