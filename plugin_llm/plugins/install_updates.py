"""Updating and removing installed plugins.

``update`` pulls a git install (``--ff-only``; refused when pinned with ``--ref`` or with local
edits, rolled back when the new version does not validate) or re-copies a directory install from
where it came from (refused with local edits). ``remove`` deletes a plugin's directory, its clone
and its record together, and moves its private data aside.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from plugin_llm.hardened.terminal_text import escape_unsafe

from .install_records import (
    InstalledPlugin,
    _metadata_path,
    _now,
    _plugins_lock,
    _write_metadata,
    read_metadata,
    resolve_installed,
)
from .install_sources import DEFAULT_GIT_TIMEOUT, InstallError, InstallSource, _git, _local_edits, _revision, _within
from .install_staging import STAGING_PREFIX, _entry_from_staged, commit_staged, discard_staged, stage_plugin
from .install_targets import _existing_paths, _occupant_problem, _occupied, _prune_empty, _rmtree_no_follow
from .install_tree import _manifest_has_name, _tree_hash, _validate_tree, copy_example_files
from .isolation.sandbox import plugin_data_path, quarantine_plugin_data


@dataclass(frozen=True)
class UpdateResult:
    key: str
    old_revision: str | None
    new_revision: str | None
    changed: bool
    created_files: tuple[str, ...] = ()


def update_plugin(home: Path, name: str, *, timeout: float = DEFAULT_GIT_TIMEOUT) -> UpdateResult:
    """``git pull --ff-only`` a git install (refusing pinned installs and local edits), or
    re-copy a directory install from its recorded path (refusing local edits)."""
    plugins_dir = Path(home) / "plugins"
    key = resolve_installed(plugins_dir, name)
    entries = read_metadata(plugins_dir)
    entry = entries.get(key)
    if entry is None:
        raise InstallError(
            f"{key} was not installed with `plugin-llm plugins install` (no record in {_metadata_path(plugins_dir)}); "
            "update it by hand, or reinstall it with `plugins install SOURCE --force`"
        )
    if entry.kind == "link":  # --link: edits in the linked directory apply on the next load
        return UpdateResult(key, None, None, False, ())
    if entry.kind == "dir":
        return _update_dir(home, plugins_dir, entry, timeout)
    if entry.ref:
        raise InstallError(
            f"{key} is pinned to {entry.ref} (installed with --ref); reinstall to move it: "
            f"`plugin-llm plugins install {entry.source} --ref NEW --force` (or without --ref to follow the branch)"
        )
    plugin_path = plugins_dir.joinpath(*key.split("/"))
    repo = plugins_dir / entry.repo if entry.repo else plugin_path
    if not (repo / ".git").exists():
        raise InstallError(f"{repo} is not a git checkout any more; reinstall with `plugins install {entry.source} --force`")
    with _plugins_lock(plugins_dir):
        edits = _local_edits(repo, timeout)
        if edits:
            shown = ", ".join(edits[:5]) + (f" (+{len(edits) - 5} more)" if len(edits) > 5 else "")
            raise InstallError(
                f"{key} has local edits ({shown}); update refused so they are not lost. "
                f"Inspect them with `git -C {repo} status`, then discard or commit them, "
                f"or reinstall with `plugins install {entry.source} --force`"
            )
        old = _revision(repo, timeout)
        protocol = InstallSource("git", entry.location, entry.subdir, entry.source).protocol
        _git(["-C", str(repo), "pull", "--ff-only", "--quiet"], timeout=timeout, protocol=protocol, what="pull --ff-only")
        new = _revision(repo, timeout)
        created: list[str] = []
        if new != old:
            root = repo / entry.subdir if entry.subdir else repo
            try:
                manifest = _validate_tree(root, key)
                leaf = key.rsplit("/", 1)[-1]
                if manifest.name != leaf and _manifest_has_name(root):
                    raise InstallError(f"the new version renames the plugin to {manifest.name!r}; reinstall it instead")
            except InstallError as exc:
                _git(["-C", str(repo), "reset", "--hard", "--quiet", old], timeout=timeout, what="reset")
                raise InstallError(f"update of {key} rolled back to {old[:12]}: {exc}") from None
            created = copy_example_files(root)
        entries = read_metadata(plugins_dir)
        entries[key] = replace(
            entry, revision=new, updated_at=_now() if new != old else entry.updated_at,
            created_files=tuple(dict.fromkeys([*entry.created_files, *created])),
        )
        _write_metadata(plugins_dir, entries)
    return UpdateResult(key, old, new, new != old, tuple(created))


def _update_dir(home: Path, plugins_dir: Path, entry: InstalledPlugin, timeout: float) -> UpdateResult:
    key = entry.key
    plugin_path = plugins_dir.joinpath(*key.split("/"))
    if entry.tree_sha256 and plugin_path.is_dir():
        if _tree_hash(plugin_path, entry.created_files) != entry.tree_sha256:
            raise InstallError(
                f"{key} has local edits (its files differ from what was installed); update refused so they are "
                f"not lost. Reinstall with `plugins install {entry.source} --force` to overwrite them"
            )
    source = InstallSource("dir", entry.location, entry.subdir, entry.source)
    if not Path(entry.location).is_dir():
        raise InstallError(f"{key} was installed from {entry.location}, which no longer exists")
    category = key.split("/")[0] if "/" in key else None
    staged = stage_plugin(plugins_dir, source, category=category, timeout=timeout)
    try:
        if staged.key != key:
            raise InstallError(f"{entry.location} now holds plugin {staged.key!r}, not {key!r}; reinstall it instead")
        old_hash = entry.tree_sha256 or ""
        # keep the operator's copies of *.example files
        for rel in entry.created_files:
            src = plugin_path / rel
            dst = staged.root / rel
            if src.is_file() and not src.is_symlink():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        staged.created_files = list(dict.fromkeys([*entry.created_files, *staged.created_files]))
        new_entry = _entry_from_staged(staged, installed_at=entry.installed_at)
        if new_entry.tree_sha256 == old_hash:
            return UpdateResult(key, old_hash, old_hash, False)
        committed = commit_staged(staged, force=True, installed_at=entry.installed_at)
        return UpdateResult(key, old_hash, committed.tree_sha256, True)
    finally:
        discard_staged(staged)


# --------------------------------------------------------------------------- remove


@dataclass(frozen=True)
class RemoveResult:
    key: str
    removed_paths: tuple[str, ...]
    had_metadata: bool
    data_moved_to: str | None = None  # where its plugin-data/<key>/ went (None: it had none, or keep_data)


def remove_plugin(home: Path, name: str, *, force: bool = False, timeout: float = DEFAULT_GIT_TIMEOUT,
                  keep_data: bool = False) -> RemoveResult:
    """Delete a user plugin's directory (and its clone) and its metadata entry, together.

    A git install with local edits is refused unless ``force``. A symlink that
    plugin-llm did not create is unlinked, never followed. Its private data
    (``plugin-data/<key>/``) is moved aside to ``plugin-data/.removed/`` unless
    ``keep_data``.
    """
    plugins_dir = Path(home) / "plugins"
    key = resolve_installed(plugins_dir, name)
    with _plugins_lock(plugins_dir):
        entries = read_metadata(plugins_dir)
        entry = entries.get(key)
        target = plugins_dir.joinpath(*key.split("/"))
        if _occupied(target) and not target.is_symlink():
            problem = _occupant_problem(plugins_dir, key, target, entry)
            if problem is not None:
                raise InstallError(f"{problem}; refusing to delete it (nothing was removed)")
        elif not _occupied(target) and entry is None:
            raise InstallError(
                f"{escape_unsafe(key, 100)} is not in {target} (a plugin placed by hand in a directory named "
                "otherwise); delete its directory by hand (see `plugin-llm plugins info`)"
            )
        paths = [p for p in _existing_paths(plugins_dir, key, entry) if _occupied(p)]
        for path in paths:
            if not path.is_symlink() and not _within(path, plugins_dir):  # pragma: no cover - defensive
                raise InstallError(f"{path} resolves outside {plugins_dir}; refusing to delete it")
        if entry is not None and entry.kind == "git" and not force:
            repo = plugins_dir / entry.repo if entry.repo else plugins_dir.joinpath(*key.split("/"))
            if (repo / ".git").exists():
                edits = _local_edits(repo, timeout)
                if edits:
                    raise InstallError(
                        f"{key} has local edits ({', '.join(edits[:5])}); use --force to remove it anyway"
                    )
        trash = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX + "remove-", dir=plugins_dir))
        moved: list[tuple[Path, Path]] = []
        data_aside: Path | None = None
        try:
            if not keep_data:
                data_aside = quarantine_plugin_data(Path(home), key)
            for i, path in enumerate(paths):
                dest = trash / str(i)
                os.rename(path, dest)  # a symlink is moved as a link: its target is untouched
                moved.append((dest, path))
            if entry is not None:
                del entries[key]
                _write_metadata(plugins_dir, entries)
        except BaseException:
            for dest, path in reversed(moved):
                with contextlib.suppress(OSError):
                    os.rename(dest, path)
            if data_aside is not None:
                with contextlib.suppress(OSError):
                    os.rename(data_aside, plugin_data_path(Path(home), key))
            shutil.rmtree(trash, ignore_errors=True)
            raise
        _rmtree_no_follow(trash)
        _prune_empty(plugins_dir, key)
    return RemoveResult(key, tuple(str(p) for p in paths), entry is not None,
                        str(data_aside) if data_aside is not None else None)
