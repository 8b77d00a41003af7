"""Finding plugins: directories and entry points -> :class:`PluginCandidate` values.

Sources, later overriding earlier for the same key:

1. user      ``$HERMES_HOME/plugins/``
2. project   ``<project>/.hermes/plugins/`` — only when ``HERMES_ENABLE_PROJECT_PLUGINS``
             is 1/true/yes/on (project code is untrusted by default)
3. entry points in the ``hermes_agent.plugins`` group (pip-installed plugins)

In a plugin root, ``<name>/plugin.yaml`` is a plugin with key ``<name>``; a
directory without a manifest is a category, and ``<cat>/<name>/plugin.yaml`` has
key ``<cat>/<name>``. Nothing deeper is looked at. Nothing is imported here.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from .manifest import ManifestError, PluginManifest, find_manifest, load_manifest, validate_plugin_name

__all__ = [
    "ENTRY_POINT_GROUP",
    "PROJECT_PLUGINS_ENV",
    "SOURCE_USER",
    "SOURCE_PROJECT",
    "SOURCE_ENTRY_POINT",
    "PluginCandidate",
    "project_plugins_enabled",
    "scan_directory",
    "entry_point_candidates",
    "discover_candidates",
]

_log = logging.getLogger("plugin_llm.plugins")

ENTRY_POINT_GROUP = "hermes_agent.plugins"
PROJECT_PLUGINS_ENV = "HERMES_ENABLE_PROJECT_PLUGINS"
SOURCE_USER = "user"
SOURCE_PROJECT = "project"
SOURCE_ENTRY_POINT = "entrypoint"
_TRUTHY = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class PluginCandidate:
    """One plugin found by discovery, not yet loaded.

    ``error`` is set when the plugin cannot even be considered (broken manifest,
    duplicate key); such a candidate is listed as failed and never imported.
    """

    key: str
    name: str
    source: str
    path: Path | None = None  # the plugin directory (None for entry points)
    manifest: PluginManifest | None = None
    error: str | None = None
    entry_point: Any = None  # importlib.metadata.EntryPoint for pip plugins


def project_plugins_enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(PROJECT_PLUGINS_ENV, "").strip().lower() in _TRUTHY


def _is_candidate_dir(path: Path) -> bool:
    return not path.name.startswith((".", "_")) and path.is_dir()


def _sorted_children(directory: Path) -> list[Path]:
    try:
        return sorted((p for p in directory.iterdir() if _is_candidate_dir(p)), key=lambda p: p.name)
    except OSError as exc:
        _log.warning("cannot list plugin directory %s: %s", directory, exc)
        return []


def _candidate(directory: Path, manifest_path: Path, source: str, category: str | None) -> PluginCandidate:
    fallback_key = f"{category}/{directory.name}" if category else directory.name
    try:
        manifest = load_manifest(manifest_path, category=category)
    except ManifestError as exc:
        _log.warning("plugin %s skipped: %s", fallback_key, exc)
        return PluginCandidate(fallback_key, directory.name, source, directory, None, str(exc))
    return PluginCandidate(manifest.key, manifest.name, source, directory, manifest)


def scan_directory(root: Path, source: str) -> list[PluginCandidate]:
    """Plugins under one root (depth 2 at most), in a stable (sorted) order."""
    if not root.is_dir():
        return []
    found: list[PluginCandidate] = []
    for child in _sorted_children(root):
        manifest_path = find_manifest(child)
        if manifest_path is not None:
            found.append(_candidate(child, manifest_path, source, None))
            continue
        nested = [(g, find_manifest(g)) for g in _sorted_children(child)]
        nested = [(g, m) for g, m in nested if m is not None]
        if nested:
            try:
                category = validate_plugin_name(child.name, str(child))
            except ManifestError as exc:
                for grandchild, _ in nested:
                    key = f"{child.name}/{grandchild.name}"
                    found.append(PluginCandidate(key, grandchild.name, source, grandchild, None, str(exc)))
                continue
            found.extend(_candidate(g, m, source, category) for g, m in nested)
        elif (child / "__init__.py").is_file():
            # Looks like a plugin whose author forgot the manifest: say so rather than ignore it.
            found.append(
                PluginCandidate(
                    child.name, child.name, source, child, None,
                    f"{child}: no plugin.yaml (a directory plugin needs a manifest next to its __init__.py)",
                )
            )
        else:
            _log.debug("%s: no plugin.yaml and no nested plugins; ignored", child)
    return _dedupe(found)


def _dedupe(found: list[PluginCandidate]) -> list[PluginCandidate]:
    """Two directories of one source claiming the same key: the first wins, the second fails."""
    seen: dict[str, PluginCandidate] = {}
    out: list[PluginCandidate] = []
    for cand in found:
        first = seen.get(cand.key)
        if first is None:
            seen[cand.key] = cand
            out.append(cand)
        else:
            message = f"{cand.path}: duplicate plugin key {cand.key!r} (already provided by {first.path})"
            _log.warning("%s", message)
            out.append(PluginCandidate(cand.key + f"@{cand.path.name if cand.path else '?'}", cand.name,
                                       cand.source, cand.path, cand.manifest, message))
    return out


def _entry_point_manifest(ep: Any, name: str) -> PluginManifest:
    version = description = author = ""
    dist = getattr(ep, "dist", None)
    if dist is not None:
        try:
            version = dist.version or ""
            meta = dist.metadata
            description = meta.get("Summary") or ""
            author = meta.get("Author") or meta.get("Author-email") or ""
        except Exception:  # broken metadata must not break discovery
            pass
    return PluginManifest(name=name, key=name, version=version, description=description, author=author)


def entry_point_candidates(entry_points: Iterable[Any] | None = None) -> list[PluginCandidate]:
    """Pip-installed plugins (``hermes_agent.plugins``); nothing is imported until load."""
    if entry_points is None:
        from importlib.metadata import entry_points as _entry_points

        try:
            entry_points = _entry_points(group=ENTRY_POINT_GROUP)
        except Exception as exc:  # a broken distribution on sys.path
            _log.warning("cannot read entry points %s: %s", ENTRY_POINT_GROUP, exc)
            return []
    else:
        entry_points = [ep for ep in entry_points if getattr(ep, "group", ENTRY_POINT_GROUP) == ENTRY_POINT_GROUP]
    found: list[PluginCandidate] = []
    for ep in sorted(entry_points, key=lambda e: e.name):
        try:
            name = validate_plugin_name(ep.name, f"entry point {ep.name!r} ({ENTRY_POINT_GROUP})")
        except ManifestError as exc:
            found.append(PluginCandidate(str(ep.name), str(ep.name), SOURCE_ENTRY_POINT, None, None, str(exc), ep))
            continue
        found.append(PluginCandidate(name, name, SOURCE_ENTRY_POINT, None, _entry_point_manifest(ep, name), None, ep))
    return _dedupe(found)


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def discover_candidates(
    home: Path,
    project_dir: Path | None = None,
    entry_points: Iterable[Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, PluginCandidate]:
    """All sources merged by key (user < project < entry points), in discovery order."""
    sources: list[list[PluginCandidate]] = [scan_directory(home / "plugins", SOURCE_USER)]
    if project_plugins_enabled(environ):
        project_root = Path.cwd() if project_dir is None else project_dir
        project_plugins = project_root / ".hermes" / "plugins"
        if _same_dir(project_plugins, home / "plugins"):  # cwd is the home's parent: not a project
            _log.debug("%s is the user plugin directory; not scanned twice", project_plugins)
        else:
            sources.append(scan_directory(project_plugins, SOURCE_PROJECT))
    sources.append(entry_point_candidates(entry_points))
    merged: dict[str, PluginCandidate] = {}
    for candidates in sources:
        for cand in candidates:
            previous = merged.get(cand.key)
            if previous is not None:
                _log.debug("plugin %s from %s overrides the one from %s", cand.key, cand.source, previous.source)
                del merged[cand.key]  # re-insert: the winner takes its own source's position
            merged[cand.key] = cand
    return merged
