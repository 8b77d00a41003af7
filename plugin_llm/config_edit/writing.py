"""``edit_config``: read ``config.yaml`` safely, apply one edit, write it back atomically.

The file (or the one a symlinked config.yaml points to) is read without blocking on a FIFO or a
device, edited under an advisory lock (``.config.yaml.lock``), and replaced by a temporary file
with the previous version kept as ``config.yaml.bak``; nothing is written when nothing changed.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from plugin_llm.config_edit.roundtrip import NOTHING_WRITTEN, ConfigEditError, Editor
from plugin_llm.hardened.safe_files import UnsafeFileError, read_home_file
from plugin_llm.home_layout import CONFIG_FILE

CONFIG_NAME = CONFIG_FILE


NEW_FILE_MODE = 0o600


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
        editor = Editor(path, old_text)
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
            raise ConfigEditError(f"{path} changed while it was being edited; {NOTHING_WRITTEN}, run the command again")
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
        raise ConfigEditError(f"{link}{exc}; {NOTHING_WRITTEN}") from None
    if got is None:
        if not create:
            raise ConfigEditError(f"{shown} does not exist; {NOTHING_WRITTEN}") from None
        if not path.parent.is_dir():
            raise ConfigEditError(f"home directory {path.parent} does not exist; {NOTHING_WRITTEN}") from None
        return None
    data, st = got.data, got.stat
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigEditError(f"{shown} is not UTF-8 text (byte {exc.start}); {NOTHING_WRITTEN}") from None
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
            raise ConfigEditError(f"cannot write {path}: {exc.strerror or exc}; {NOTHING_WRITTEN}") from exc
        raise
    with contextlib.suppress(OSError):  # make the rename durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
