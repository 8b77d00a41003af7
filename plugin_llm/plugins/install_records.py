"""The record of installed plugins (``plugins/.install-metadata.json``) and finding a plugin by name.

One :class:`InstalledPlugin` per key: its source, kind, pinned ref, revision and the files the
install created. The record is read bounded and written atomically, under a lock that lets one
install, update or remove run at a time per plugins directory.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from plugin_llm.hardened.atomic_write import write_atomic
from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.hardened.safe_files import MIB, read_home_text
from plugin_llm.hardened.safe_json import loads_bounded

from .discovery import SOURCE_USER, scan_directory
from .install_sources import InstallError

METADATA_FILENAME = ".install-metadata.json"
#: the install record is refused beyond this size (one entry is a few hundred bytes)
METADATA_MAX_BYTES = 4 * MIB


# --------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class InstalledPlugin:
    """One entry of ``plugins/.install-metadata.json``."""

    key: str
    source: str  # as given (password masked)
    kind: str  # git | dir | link (``--link``: a symlink to the author's directory)
    location: str  # git URL (masked) or directory path
    subdir: str | None
    ref: str | None  # --ref given at install: pinned, never updated
    revision: str | None  # the commit installed (git), None for directories
    installed_at: str
    updated_at: str | None = None
    repo: str | None = None  # clone location relative to plugins/ when it is not the plugin dir
    created_files: tuple[str, ...] = ()
    tree_sha256: str | None = None  # directory installs: content hash at install (local-edit check)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "key"}
        data["created_files"] = list(self.created_files)
        return data

    @classmethod
    def from_json(cls, key: str, data: dict[str, Any]) -> "InstalledPlugin":
        known = {f for f in cls.__dataclass_fields__ if f != "key"}
        values = {k: v for k, v in data.items() if k in known}
        values["created_files"] = tuple(values.get("created_files") or ())
        values.setdefault("source", "")
        values.setdefault("kind", "dir")
        values.setdefault("location", values["source"])
        values.setdefault("subdir", None)
        values.setdefault("ref", None)
        values.setdefault("revision", None)
        values.setdefault("installed_at", "")
        return cls(key=key, **values)


def _metadata_path(plugins_dir: Path) -> Path:
    return plugins_dir / METADATA_FILENAME


def read_metadata(plugins_dir: Path) -> dict[str, InstalledPlugin]:
    """Installed plugins by key (empty when the file does not exist)."""
    path = _metadata_path(plugins_dir)
    try:  # bounded and never blocking (a FIFO is refused); nesting checked before json recurses
        text = read_home_text(path, max_bytes=METADATA_MAX_BYTES)
        if text is None:
            return {}
        raw = loads_bounded(text)
    except PluginLlmConfigError as exc:  # the message names the file and what it is
        raise InstallError(f"{exc}; or move it aside to start a fresh record") from None
    except ValueError as exc:
        raise InstallError(f"{path} is unreadable ({exc}); move it aside to start a fresh record") from None
    plugins = raw.get("plugins") if isinstance(raw, dict) else None
    if not isinstance(plugins, dict):
        raise InstallError(f"{path} has no 'plugins' mapping; move it aside to start a fresh record")
    return {k: InstalledPlugin.from_json(k, v) for k, v in plugins.items() if isinstance(v, dict)}


def _write_metadata(plugins_dir: Path, entries: dict[str, InstalledPlugin]) -> None:
    data = {"version": 1, "plugins": {k: entries[k].to_json() for k in sorted(entries)}}
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    write_atomic(_metadata_path(plugins_dir), text.encode("utf-8"))


@contextlib.contextmanager
def _plugins_lock(plugins_dir: Path) -> Iterator[None]:
    """One install/update/remove at a time per plugins directory."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(plugins_dir / ".install.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _now() -> str:
    # microseconds: installs within one second still order (registry.load_order: the first installed
    # keeps a clashing name); a record written with whole seconds sorts before ones of that second
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


# --------------------------------------------------------------------------- lookup


def installed_plugins(plugins_dir: Path) -> dict[str, tuple[str, Path | None]]:
    """Plugins present in ``plugins/`` or recorded in the metadata: key -> (name, path)."""
    found: dict[str, tuple[str, Path | None]] = {}
    for cand in scan_directory(plugins_dir, SOURCE_USER):
        found[cand.key] = (cand.name, cand.path)
    for key in read_metadata(plugins_dir):
        found.setdefault(key, (key.rsplit("/", 1)[-1], None))
    return found


def resolve_name(name: str, plugins: dict[str, str], *, what: str = "plugin", where: str = "") -> str:
    """A key from a key, a manifest name or a unique bare leaf; :class:`InstallError` otherwise.

    ``plugins`` maps key -> manifest name.
    """
    name = name.strip()
    if name in plugins:
        return name
    matches = sorted(k for k, n in plugins.items() if n == name or k.rsplit("/", 1)[-1] == name)
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise InstallError(f"{name!r} is ambiguous: it matches {', '.join(matches)}; use the full key")
    import difflib

    names = list(dict.fromkeys([*plugins, *sorted(set(plugins.values()))]))  # a key that is also a name: once
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    if not plugins:
        known = " (none found)"
    elif len(plugins) <= 20:
        known = f" (known: {', '.join(sorted(plugins))})"
    else:
        known = f" ({len(plugins)} known; see `plugin-llm plugins list`)"
    raise InstallError(f"no {what} {name!r}{where}{hint}{known}")


def resolve_installed(plugins_dir: Path, name: str) -> str:
    found = installed_plugins(plugins_dir)
    return resolve_name(name, {k: v[0] for k, v in found.items()}, what="installed plugin", where=f" in {plugins_dir}")
