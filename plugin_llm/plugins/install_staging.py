"""Staging a plugin and moving it into place: fetch, verify, then commit all or nothing.

:func:`stage_plugin` fetches SOURCE into a hidden ``plugins/.install-*`` directory and validates it;
:func:`commit_staged` moves only that validated tree into place with ``os.rename`` (a previous install,
with ``--force``, moved aside and restored if anything fails) and records it. ``--link`` stages
nothing: :func:`stage_link` validates the author's directory, which is then linked.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from plugin_llm.hardened.terminal_text import escape_unsafe, unsafe_characters

from .install_records import InstalledPlugin, _now, _plugins_lock, _write_metadata, read_metadata
from .install_sources import (
    DEFAULT_GIT_TIMEOUT,
    InstallError,
    InstallSource,
    _clone,
    _mask_url,
    _revision,
    _within,
    validate_install_name,
)
from .install_targets import REPOS_DIRNAME, _check_replace, _prune_empty
from .install_tree import _copy_dir, _manifest_has_name, _tree_hash, _validate_tree, copy_example_files
from .isolation.sandbox import plugin_data_path, quarantine_plugin_data
from .manifest import PluginManifest, find_manifest

STAGING_PREFIX = ".install-"
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_HEX = re.compile(r"^[0-9a-fA-F]{4,64}$")


# --------------------------------------------------------------------------- staging


@dataclass
class StagedPlugin:
    """A validated plugin in ``plugins/.install-*/``, ready to be moved into place."""

    staging: Path
    tree: Path  # what moves: the clone, or the copied directory
    root: Path  # the plugin directory inside ``tree``
    manifest: PluginManifest
    key: str
    source: InstallSource
    ref: str | None
    revision: str | None
    created_files: list[str] = field(default_factory=list)
    plugins_dir: Path = Path()
    #: where :func:`commit_staged` moved a data directory left under this key (a new plugin starts empty)
    data_moved_to: Path | None = None

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def target(self) -> Path:
        return self.plugins_dir.joinpath(*self.key.split("/"))

    @property
    def uses_repo_dir(self) -> bool:
        return self.source.kind == "git" and self.source.subdir is not None


def stage_plugin(
    plugins_dir: Path,
    source: InstallSource,
    *,
    ref: str | None = None,
    category: str | None = None,
    timeout: float = DEFAULT_GIT_TIMEOUT,
) -> StagedPlugin:
    """Fetch and validate SOURCE into a staging directory; :class:`InstallError` on any problem
    (the staging directory is removed then)."""
    if ref is not None:
        if source.kind != "git":
            raise InstallError("--ref only applies to git sources")
        if not _REF.match(ref) or ".." in ref:
            raise InstallError(f"--ref {ref!r} is not a commit SHA or ref name")
    if category is not None:
        validate_install_name(category, what="category")
    plugins_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=plugins_dir))
    try:
        revision = None
        if source.kind == "git":
            tree = staging / "repo"
            _clone(source, tree, ref=ref, timeout=timeout)
            revision = _revision(tree, timeout)
            if ref is not None and _HEX.match(ref) and not revision.lower().startswith(ref.lower()):
                raise InstallError(f"--ref {ref} resolved to {revision}, which is not that commit")
            root = tree / source.subdir if source.subdir else tree
            if source.subdir and not _within(root, tree):
                raise InstallError(f"#subdir {source.subdir!r} resolves outside the repository (a symlink?)")
        else:
            origin = Path(source.location)
            origin_root = origin / source.subdir if source.subdir else origin
            if not origin_root.is_dir():
                raise InstallError(f"{origin_root}: no such directory")
            if source.subdir and not _within(origin_root, origin):
                raise InstallError(f"#subdir {source.subdir!r} resolves outside {origin} (a symlink?)")
            tree = root = staging / "plugin"
            _copy_dir(origin_root, tree)
        where = source.display
        manifest = _validate_tree(root, where)
        explicit_name = _manifest_has_name(root)
        if explicit_name and unsafe_characters(manifest.name):
            raise InstallError(
                f"{where}: {find_manifest(root).name}: the 'name' field '{escape_unsafe(manifest.name, 100)}' contains "
                f"control or invisible characters ({', '.join(unsafe_characters(manifest.name)[:5])}); "
                "a plugin name must be printable text: fix name: in the manifest"
            )
        name = manifest.name if explicit_name else source.default_name()
        validate_install_name(name)
        if not explicit_name and name != manifest.name:
            # Discovery names an unnamed plugin after its directory: that is ``name`` once installed.
            manifest = replace(manifest, name=name, key=name)
        key = f"{category}/{name}" if category else name
        created = copy_example_files(root)
        return StagedPlugin(staging, tree, root, manifest, key, source, ref, revision, created, plugins_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def discard_staged(staged: StagedPlugin) -> None:
    shutil.rmtree(staged.staging, ignore_errors=True)


def stage_link(plugins_dir: Path, directory: str | Path, *, category: str | None = None) -> StagedPlugin:
    """``plugins install --link DIR``: validate the plugin in DIR for a link install (development).

    Nothing is copied: :func:`commit_staged` places a symlink ``plugins/<key> -> DIR`` and records
    ``kind: link``, so the author's edits apply on the next load (``update`` is a no-op and
    ``remove`` deletes only the link, never DIR). No ``*.example`` file is created in DIR.
    """
    if category is not None:
        validate_install_name(category, what="category")
    origin = Path(directory).expanduser()
    if not origin.is_dir():
        raise InstallError(f"--link {escape_unsafe(str(directory), 200)}: no such directory")
    root = Path(os.path.realpath(origin))
    if _within(root, plugins_dir):
        raise InstallError(f"--link {root}: the directory is already inside {plugins_dir}")
    manifest = _validate_tree(root, str(root))
    name = manifest.name if _manifest_has_name(root) else root.name
    validate_install_name(name)
    if name != manifest.name:
        manifest = replace(manifest, name=name, key=name)
    key = f"{category}/{name}" if category else name
    plugins_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=plugins_dir))
    source = InstallSource("link", str(root), None, str(directory))
    return StagedPlugin(staging, root, root, manifest, key, source, None, None, [], plugins_dir)


def _entry_from_staged(staged: StagedPlugin, installed_at: str | None = None) -> InstalledPlugin:
    source = staged.source
    return InstalledPlugin(
        key=staged.key,
        source=_mask_url(source.given.strip()),
        kind=source.kind,
        location=_mask_url(source.location),
        subdir=source.subdir,
        ref=staged.ref,
        revision=staged.revision,
        installed_at=installed_at or _now(),
        updated_at=_now() if installed_at else None,
        repo=f"{REPOS_DIRNAME}/{staged.key}" if staged.uses_repo_dir else None,
        created_files=tuple(staged.created_files),
        tree_sha256=_tree_hash(staged.root, tuple(staged.created_files)) if source.kind == "dir" else None,
    )


def check_target(staged: StagedPlugin, *, force: bool = False) -> None:
    """Raise :class:`InstallError` if committing ``staged`` would be refused because of what
    is at its target (so the CLI can say so before asking anything). Nothing is changed."""
    entries = read_metadata(staged.plugins_dir)
    _check_replace(staged.plugins_dir, staged.key, entries.get(staged.key), force)


def commit_staged(
    staged: StagedPlugin,
    *,
    force: bool = False,
    installed_at: str | None = None,
    _metadata_writer: Callable[..., None] | None = None,
) -> InstalledPlugin:
    """Move a staged plugin into place and record it; all or nothing.

    Without ``force`` an existing plugin directory is never touched. With it,
    the old install is moved aside, and put back if any later step fails.
    """
    plugins_dir = staged.plugins_dir
    write_metadata = _metadata_writer or _write_metadata
    with _plugins_lock(plugins_dir):
        entries = read_metadata(plugins_dir)
        target, old_paths = _check_replace(plugins_dir, staged.key, entries.get(staged.key), force)
        entry = _entry_from_staged(staged, installed_at=installed_at)  # hashes the tree before it moves
        aside = staged.staging / "previous"
        aside.mkdir()
        moved: list[tuple[Path, Path]] = []
        placed: list[Path] = []
        data_aside: Path | None = None
        try:
            # whatever is in plugin-data/<key>/ was an earlier plugin's (memory, stored tokens): never inherited
            data_aside = quarantine_plugin_data(plugins_dir.parent, staged.key)
            for i, path in enumerate(old_paths):
                dest = aside / str(i)
                os.rename(path, dest)
                moved.append((dest, path))
            target.parent.mkdir(parents=True, exist_ok=True)
            if staged.source.kind == "link":  # --link: the author's directory itself, never copied
                os.symlink(staged.root, target)
            elif staged.uses_repo_dir:
                repo = plugins_dir / REPOS_DIRNAME / staged.key
                repo.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staged.tree, repo)
                placed.append(repo)
                link_target = os.path.relpath(repo / staged.source.subdir, target.parent)
                tmp_link = target.parent / f".{target.name}.link-{os.getpid()}"
                os.symlink(link_target, tmp_link)
                os.replace(tmp_link, target)
            else:
                os.rename(staged.tree, target)
            placed.append(target)
            entries[staged.key] = entry
            write_metadata(plugins_dir, entries)
        except BaseException:
            for path in reversed(placed):  # undo: remove what was placed, put the old install back
                if path.is_symlink() or path.is_file():
                    with contextlib.suppress(OSError):
                        path.unlink()
                else:
                    shutil.rmtree(path, ignore_errors=True)
            for dest, path in reversed(moved):
                with contextlib.suppress(OSError):
                    os.rename(dest, path)
            if data_aside is not None:
                with contextlib.suppress(OSError):
                    os.rename(data_aside, plugin_data_path(plugins_dir.parent, staged.key))
            _prune_empty(plugins_dir, staged.key)  # directories this attempt created
            raise
        finally:
            shutil.rmtree(staged.staging, ignore_errors=True)
        staged.data_moved_to = data_aside
        return entry
