"""Checking a plugin's tree before it is installed, copying it, and hashing it.

A plugin is regular files, directories and symlinks that stay inside it, with a valid manifest and
an ``__init__.py``; FIFOs, sockets and devices are refused before anything reads them. The hash of
a directory install is what ``update`` compares to find local edits.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.hardened.safe_files import describe_file_type, read_home_text

from .install_sources import InstallError, _within
from .manifest import MANIFEST_ALIAS_BUDGET, MANIFEST_MAX_BYTES, ManifestError, PluginManifest, find_manifest, load_manifest

_COPY_IGNORE = (".git", "__pycache__")


# --------------------------------------------------------------------------- validation


def _check_special_files(root: Path) -> None:
    """Reject FIFOs, sockets and devices anywhere in a plugin tree: copying or hashing
    one would block or read forever. A plugin is regular files, directories and symlinks."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for entry in dirnames + filenames:
            path = os.path.join(dirpath, entry)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                rel = os.path.relpath(path, root)
                raise InstallError(
                    f"{rel} in {root} is {describe_file_type(mode)}: a plugin may contain only regular files, "
                    "directories and symlinks; remove it"
                )


def _check_symlinks(root: Path) -> None:
    """Reject absolute symlinks and symlinks that resolve outside ``root``."""
    real_root = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if ".git" in dirnames and Path(dirpath) == root:
            dirnames.remove(".git")
        for entry in dirnames + filenames:
            path = os.path.join(dirpath, entry)
            if not os.path.islink(path):
                continue
            target = os.readlink(path)
            rel = os.path.relpath(path, root)
            if os.path.isabs(target):
                raise InstallError(f"symlink {rel} -> {target} is absolute; a plugin may only link inside itself")
            if not _within(os.path.join(dirpath, target), real_root):
                raise InstallError(f"symlink {rel} -> {target} points outside the plugin directory")


def _validate_tree(root: Path, where: str) -> PluginManifest:
    if not root.is_dir():
        raise InstallError(f"{where}: not a directory")
    manifest_path = find_manifest(root)
    if manifest_path is None:
        nested = sorted(
            str(p.parent.relative_to(root)) for p in list(root.glob("*/plugin.y*ml")) + list(root.glob("*/*/plugin.y*ml"))
            if ".git" not in p.parts
        )
        hint = f"; it contains plugins at: {', '.join(nested[:8])} (install one with SOURCE#<path>)" if nested else ""
        raise InstallError(f"{where}: no plugin.yaml, so it is not a plugin{hint}")
    try:
        manifest = load_manifest(manifest_path)
    except ManifestError as exc:
        raise InstallError(f"invalid manifest: {exc}") from None
    if not (root / "__init__.py").is_file():
        raise InstallError(f"{where}: no __init__.py (a plugin needs one defining register(ctx))")
    _check_symlinks(root)
    _check_special_files(root)
    return manifest


def copy_example_files(root: Path) -> list[str]:
    """``x.example`` -> ``x`` wherever ``x`` does not exist yet; returns the created paths (relative)."""
    created = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in _COPY_IGNORE]
        for filename in sorted(filenames):
            if not filename.endswith(".example") or filename == ".example":
                continue
            src = Path(dirpath) / filename
            dst = src.with_name(filename[: -len(".example")])
            if src.is_symlink() or dst.exists() or dst.is_symlink():
                continue
            shutil.copy2(src, dst)
            created.append(dst.relative_to(root).as_posix())
    return created


def _tree_hash(root: Path, skip: tuple[str, ...] = ()) -> str:
    """SHA-256 over the relative paths and contents of a plugin directory."""
    digest = hashlib.sha256()
    skip_set = set(skip)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _COPY_IGNORE)
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            rel = path.relative_to(root).as_posix()
            if rel in skip_set or filename.endswith(".pyc"):
                continue
            digest.update(rel.encode() + b"\0")
            if path.is_symlink():
                digest.update(b"L" + os.readlink(path).encode())
            elif path.is_file():  # never open a FIFO or a device (it would block or never end)
                digest.update(hashlib.sha256(path.read_bytes()).digest())
            else:
                digest.update(b"S")
    return digest.hexdigest()


def _copy_dir(src: Path, dst: Path) -> None:
    _check_special_files(src)
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(*_COPY_IGNORE, "*.pyc"))


def _manifest_has_name(root: Path) -> bool:
    import yaml

    from plugin_llm.hardened.safe_yaml import load_yaml  # on first use: it loads PyYAML

    path = find_manifest(root)
    try:
        text = read_home_text(path, max_bytes=MANIFEST_MAX_BYTES) if path else None
        data = load_yaml(text, alias_budget=MANIFEST_ALIAS_BUDGET) if text else None
    except (PluginLlmConfigError, yaml.YAMLError):  # pragma: no cover - validated just before
        return False
    return isinstance(data, dict) and data.get("name") is not None
