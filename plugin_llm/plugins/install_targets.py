"""Where an install goes under ``plugins/``, and what install, update and remove may replace or delete.

Only ever the one directory of one plugin (and its clone under ``.repos/``): never a category
directory, a file, a directory without a manifest that plugin-llm did not install, or a directory
holding another plugin, even with ``--force``. Symlinks are unlinked, never followed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from plugin_llm.hardened.terminal_text import escape_unsafe

from .discovery import SOURCE_USER, scan_directory
from .install_records import InstalledPlugin
from .install_sources import InstallError, _within, validate_install_name
from .manifest import find_manifest

REPOS_DIRNAME = ".repos"


def _target_for(plugins_dir: Path, key: str) -> Path:
    """``plugins/<key>``, refusing anything that would land outside ``plugins/``."""
    parts = key.split("/")
    for part in parts:
        validate_install_name(part, what="category" if len(parts) > 1 and part == parts[0] else "plugin name")
    target = plugins_dir.joinpath(*parts)
    parent = target.parent
    if len(parts) > 1 and find_manifest(parent) is not None:
        raise InstallError(f"{parent} is a plugin, not a category directory; choose another --category")
    if parent.is_symlink() or (parent.exists() and not _within(parent, plugins_dir)):
        raise InstallError(f"{parent} resolves outside {plugins_dir}; refusing to install there")
    if not _within(parent, plugins_dir) and parent.exists():  # pragma: no cover - covered above
        raise InstallError(f"{target} resolves outside {plugins_dir}")
    return target


def _existing_paths(plugins_dir: Path, key: str, entry: InstalledPlugin | None) -> list[Path]:
    """What an install of ``key`` occupies: the plugin path, and its clone when separate."""
    paths = [plugins_dir.joinpath(*key.split("/"))]
    if entry is not None and entry.repo:
        repo = plugins_dir / entry.repo
        if _within(repo, plugins_dir / REPOS_DIRNAME):
            paths.append(repo)
    return paths


def _occupied(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _plugin_dirs_in(directory: Path, plugins_dir: Path) -> list[str]:
    """The plugins directly inside ``directory`` (what makes it a category), relative to plugins/."""
    try:
        children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    return [os.path.relpath(p, plugins_dir) for p in children if find_manifest(p) is not None]


def _discovered_key(plugins_dir: Path, path: Path) -> str | None:
    """The key discovery gives the plugin in ``path`` (None when it finds none there)."""
    for cand in scan_directory(plugins_dir, SOURCE_USER):
        if cand.path is not None and cand.path == path:
            return cand.key
    return None


def _occupant_problem(plugins_dir: Path, key: str, path: Path, entry: InstalledPlugin | None) -> str | None:
    """Why ``path`` — where plugin ``key`` lives — is not that plugin's directory (None when it is).

    Install, update and remove only ever delete or replace the one directory of one
    plugin: never a category directory, a file, a directory without a manifest that
    plugin-llm did not install, or a directory holding another plugin. Symlinks are
    the callers' business (unlinked, never followed).
    """
    shown = escape_unsafe(str(path), 300)
    if not path.is_dir():
        return f"{shown} already exists and is a file, not a plugin directory"
    if find_manifest(path) is None:
        nested = _plugin_dirs_in(path, plugins_dir)
        if nested:
            listed = ", ".join(escape_unsafe(n, 100) for n in nested[:5]) + (f" (+{len(nested) - 5} more)" if len(nested) > 5 else "")
            return f"{shown} is a category directory (it holds {listed}), not a plugin"
        if entry is not None:  # a recorded install whose manifest went missing: still that install
            return None
        return f"{shown} already exists and is not a plugin directory (no plugin.yaml); move it away by hand"
    holder = _discovered_key(plugins_dir, path)
    if holder is not None and holder != key:
        return (
            f"{shown} holds the plugin '{escape_unsafe(holder, 100)}' (its manifest name:), "
            f"not '{escape_unsafe(key, 100)}'"
        )
    return None


def _check_replace(plugins_dir: Path, key: str, entry: InstalledPlugin | None, force: bool) -> tuple[Path, list[Path]]:
    """The install target of ``key`` and the paths an install would replace; InstallError
    when it must not replace them (never a category or a non-plugin, even with force)."""
    target = _target_for(plugins_dir, key)
    old_paths = [p for p in _existing_paths(plugins_dir, key, entry) if _occupied(p)]
    if target.is_symlink() and (entry is None or not (entry.repo or entry.kind == "link")):
        raise InstallError(
            f"{target} is a symlink not made by plugin-llm (it resolves to {os.path.realpath(target)}); "
            "remove it by hand first"
        )
    if _occupied(target) and not target.is_symlink():
        problem = _occupant_problem(plugins_dir, key, target, entry)
        if problem is not None:
            raise InstallError(f"{problem}; refusing to replace it, even with --force (choose another name or --category)")
    if old_paths and not force:
        raise InstallError(f"{target} already exists; use --force to replace it (or `plugins update {key}`)")
    return target, old_paths


def _rmtree_no_follow(path: Path) -> None:
    def onerror(func, p, exc_info):  # read-only files in .git/objects
        with contextlib.suppress(OSError):
            os.chmod(p, stat.S_IWRITE | stat.S_IREAD)
            func(p)

    shutil.rmtree(path, onerror=onerror)


def _prune_empty(plugins_dir: Path, key: str) -> None:
    """Remove an emptied category directory, .repos/<category> and .repos itself."""
    candidates = [plugins_dir / REPOS_DIRNAME]
    if "/" in key:
        category = key.split("/")[0]
        candidates = [plugins_dir / category, plugins_dir / REPOS_DIRNAME / category, *candidates]
    for directory in candidates:
        with contextlib.suppress(OSError):
            directory.rmdir()
