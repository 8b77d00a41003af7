"""Finding plugins: directories and entry points -> :class:`PluginCandidate` values.

Sources: the user's ``$HERMES_HOME/plugins/``; ``<project>/.hermes/plugins/`` only when
``HERMES_ENABLE_PROJECT_PLUGINS`` is 1/true/yes/on (project code is untrusted by default); entry
points in the ``hermes_agent.plugins`` group. Keys are Hermes's: ``<dir>/plugin.yaml`` has its
manifest ``name`` (else the directory name); a directory without a manifest is a category, and
``<cat>/<dir>/plugin.yaml`` has key ``<cat>/<dir>`` (the path, not the manifest name). Nothing
deeper is looked at, and nothing is imported here.

The key is the plugin's identity (its trust block, its enable entry, its audit ``plugin_id``), so
no source may take over another's: when two plugins claim one key, *every* claimant fails with an
error naming them all, and none is loaded. Names with control or invisible characters (see
:mod:`plugin_llm.hardened.terminal_text`) fail too.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from plugin_llm.hardened.terminal_text import escape_unsafe, unsafe_characters

from dataclasses import replace

from .manifest import (
    KIND_EXCLUSIVE,
    KIND_MODEL_PROVIDER,
    KIND_STANDALONE,
    ManifestError,
    PluginManifest,
    find_manifest,
    load_manifest,
    validate_plugin_name,
)

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
    "discover_all_candidates",
    "candidate_location",
    "dependency_order",
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
    a key claimed by another plugin, a name with control characters); such a
    candidate is listed as failed and never imported. ``key`` is always the key
    the plugin claims, also when another plugin claims it too.
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


def _shown(path: Path | str) -> str:
    """A path as it goes into an error message (directory names are untrusted text)."""
    return escape_unsafe(str(path), 300)


def _unsafe_name(value: str, where: str, what: str, fix: str) -> str | None:
    """The error for a name with control or invisible characters, else None."""
    codes = unsafe_characters(value)
    if not codes:
        return None
    return (
        f"{where}: {what} '{escape_unsafe(value, 100)}' contains control or invisible characters "
        f"({', '.join(codes[:5])}); a plugin name must be printable text: {fix}"
    )


#: bytes of ``__init__.py`` read to classify a manifest without ``kind:`` (Hermes reads 8192 characters)
_SNIFF_BYTES = 8192
#: Hermes's plugin category directories (a package there is a category, never a plugin without a manifest)
HERMES_CATEGORY_DIRS = frozenset({
    "context_engine", "memory", "image_gen", "video_gen", "platforms", "model-providers", "browser", "web",
    "dashboard_auth", "observability", "cron_providers", "tts", "stt",
})


def _file_head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of a regular file (b"" for anything else: never blocks on a FIFO)."""
    import stat as _stat

    try:
        if not _stat.S_ISREG(os.stat(path).st_mode):
            return b""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return b""  # loading says what is wrong with it
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, size)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _sniffed_kind(directory: Path, manifest: PluginManifest) -> PluginManifest:
    """Hermes's heuristic for a manifest that declares no kind: the source of its
    ``__init__.py`` says whether it is a memory provider or a model provider."""
    if manifest.declared_kind or manifest.kind != KIND_STANDALONE:
        return manifest
    head = _file_head(directory / "__init__.py", _SNIFF_BYTES)
    if not head:
        return manifest
    text = head.decode("utf-8", "replace")
    if "register_memory_provider" in text or "MemoryProvider" in text:
        return replace(manifest, kind=KIND_EXCLUSIVE)
    if "register_provider" in text and "ProviderProfile" in text:
        return replace(manifest, kind=KIND_MODEL_PROVIDER)
    return manifest


def _candidate(directory: Path, manifest_path: Path, source: str, category: str | None) -> PluginCandidate:
    fallback_key = f"{category}/{directory.name}" if category else directory.name
    try:
        manifest = load_manifest(manifest_path, category=category)
    except ManifestError as exc:
        error = escape_unsafe(str(exc), 1000)
        _log.warning("plugin %s skipped: %s", escape_unsafe(fallback_key, 200), error)
        return PluginCandidate(fallback_key, directory.name, source, directory, None, error)
    error = _unsafe_name(
        manifest.name, _shown(manifest_path), "the 'name' field",
        "change name: in the manifest (or rename the directory when the manifest has no name:)",
    )
    if error is None and category:
        error = _unsafe_name(directory.name, _shown(directory), "directory name", "rename the directory")
    if error is not None:
        _log.warning("plugin %s skipped: %s", escape_unsafe(manifest.key, 200), error)
        return PluginCandidate(manifest.key, manifest.name, source, directory, None, error)
    return PluginCandidate(manifest.key, manifest.name, source, directory, _sniffed_kind(directory, manifest))


def scan_directory(root: Path, source: str) -> list[PluginCandidate]:
    """Plugins under one root (depth 2 at most), in a stable (sorted) order; directories
    claiming one key all fail (:func:`discover_all_candidates` also checks across sources)."""
    return _mark_conflicts(_scan(root, source))


def _scan(root: Path, source: str) -> list[PluginCandidate]:
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
                category = validate_plugin_name(child.name, _shown(child))
            except ManifestError as exc:
                category, error = None, escape_unsafe(str(exc), 1000)
            else:
                error = _unsafe_name(category, _shown(child), "category directory name", "rename the directory")
            if error is not None:
                for grandchild, _ in nested:
                    key = f"{child.name}/{grandchild.name}"
                    found.append(PluginCandidate(key, grandchild.name, source, grandchild, None, error))
                continue
            found.extend(_candidate(g, m, source, category) for g, m in nested)
        elif child.name in HERMES_CATEGORY_DIRS:
            # Hermes keeps a discovery package (an __init__.py) in some category directories
            # (plugins/context_engine/): a category with no plugins yet, not a plugin.
            _log.debug("%s: a category directory without plugins; ignored", _shown(child))
        elif (child / "__init__.py").is_file():
            # Looks like a plugin whose author forgot the manifest: say so rather than ignore it.
            found.append(
                PluginCandidate(
                    child.name, child.name, source, child, None,
                    f"{_shown(child)}: no plugin.yaml (a directory plugin needs a manifest next to its __init__.py)",
                )
            )
        else:
            _log.debug("%s: no plugin.yaml and no nested plugins; ignored", _shown(child))
    return found


def candidate_location(cand: PluginCandidate) -> str:
    """Where a candidate comes from, for messages: its directory, or its entry point."""
    if cand.path is not None:
        return _shown(cand.path)
    ep = cand.entry_point
    if ep is None:  # pragma: no cover - every candidate has one or the other
        return f"{cand.source} plugin"
    dist = getattr(getattr(ep, "dist", None), "name", None)
    text = f"entry point {ep.name} = {ep.value}" + (f" (distribution {dist})" if dist else "")
    return escape_unsafe(text, 300)


def _conflict_message(key: str, claimants: list[PluginCandidate]) -> str:
    places = [candidate_location(c) for c in claimants]
    listed = ", ".join(places[:-1]) + " and " + places[-1]
    fix = "rename one (manifest name:)" if len(places) == 2 else "rename all but one (manifest name:)"
    if any(c.source == SOURCE_ENTRY_POINT for c in claimants):
        fix += ", or uninstall the pip distribution"
    none = "neither is loaded" if len(places) == 2 else "none is loaded"
    return f"key '{escape_unsafe(key, 200)}' is claimed by {listed}: {fix} — {none}"


def _mark_conflicts(found: list[PluginCandidate]) -> list[PluginCandidate]:
    """Every candidate whose key another candidate claims too gets the same error naming
    all of them, so none can take the identity (and the trust grants) of another."""
    by_key: dict[str, list[PluginCandidate]] = {}
    for cand in found:
        by_key.setdefault(cand.key, []).append(cand)
    errors: dict[str, str] = {}
    for key, claimants in by_key.items():
        if len(claimants) > 1:
            errors[key] = _conflict_message(key, claimants)
            _log.debug("%s", errors[key])  # the manager logs (and audits) each claimant as failed
    if not errors:
        return found
    out = []
    for cand in found:
        error = errors.get(cand.key)
        if error is None:
            out.append(cand)
            continue
        if cand.error:
            error = f"{error} (besides: {cand.error})"
        out.append(PluginCandidate(cand.key, cand.name, cand.source, cand.path, cand.manifest, error, cand.entry_point))
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
    return _mark_conflicts(_entry_points(entry_points))


def _entry_points(entry_points: Iterable[Any] | None) -> list[PluginCandidate]:
    if entry_points is None:
        from importlib.metadata import entry_points as _entry_points

        try:
            entry_points = _entry_points(group=ENTRY_POINT_GROUP)
        except Exception as exc:  # a broken distribution on sys.path
            _log.warning("cannot read entry points %s: %s", ENTRY_POINT_GROUP, escape_unsafe(exc))
            return []
    else:
        entry_points = [ep for ep in entry_points if getattr(ep, "group", ENTRY_POINT_GROUP) == ENTRY_POINT_GROUP]
    found: list[PluginCandidate] = []
    for ep in sorted(entry_points, key=lambda e: e.name):
        where = f"entry point '{escape_unsafe(ep.name, 100)}' ({ENTRY_POINT_GROUP})"
        try:
            name = validate_plugin_name(ep.name, where)
        except ManifestError as exc:
            found.append(PluginCandidate(str(ep.name), str(ep.name), SOURCE_ENTRY_POINT, None, None,
                                         escape_unsafe(str(exc), 1000), ep))
            continue
        error = _unsafe_name(name, where, "name", "the distribution must use another entry-point name")
        if error is not None:
            found.append(PluginCandidate(name, name, SOURCE_ENTRY_POINT, None, None, error, ep))
            continue
        found.append(PluginCandidate(name, name, SOURCE_ENTRY_POINT, None, _entry_point_manifest(ep, name), None, ep))
    return found


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def discover_all_candidates(
    home: Path,
    project_dir: Path | None = None,
    entry_points: Iterable[Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[PluginCandidate]:
    """Every plugin of every source (user, project, entry points), in discovery order.

    One key claimed by several plugins, in one source or across sources: all of
    them are returned, each failed with an error naming every claimant.
    """
    found = _scan(home / "plugins", SOURCE_USER)
    if project_plugins_enabled(environ):
        project_root = Path.cwd() if project_dir is None else project_dir
        project_plugins = project_root / ".hermes" / "plugins"
        if _same_dir(project_plugins, home / "plugins"):  # cwd is the home's parent: not a project
            _log.debug("%s is the user plugin directory; not scanned twice", project_plugins)
        else:
            found += _scan(project_plugins, SOURCE_PROJECT)
    found += _entry_points(entry_points)
    return _mark_conflicts(found)


def discover_candidates(
    home: Path,
    project_dir: Path | None = None,
    entry_points: Iterable[Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, PluginCandidate]:
    """The plugins by key, in discovery order. A key several plugins claim maps to the
    first claimant, failed (:func:`discover_all_candidates` lists them all)."""
    merged: dict[str, PluginCandidate] = {}
    for cand in discover_all_candidates(home, project_dir, entry_points, environ):
        merged.setdefault(cand.key, cand)
    return merged


def dependency_order(candidates: list[PluginCandidate]) -> tuple[list[PluginCandidate], list[str]]:
    """``candidates`` reordered so that every plugin loads after the ones its ``requires_plugins``
    names (matched by key, else manifest name), otherwise keeping the given order; and the warnings
    (a dependency on itself, a cycle: then the given order is kept for all). A dependency nobody
    provides is the loader's to report (it knows what loaded)."""
    usable = [c for c in candidates if c.error is None and c.manifest is not None]
    by_id: dict[str, PluginCandidate] = {}
    for c in usable:
        by_id.setdefault(c.key, c)
    for c in usable:
        by_id.setdefault(c.manifest.name, c)  # type: ignore[union-attr]
    edges: dict[int, set[int]] = {id(c): set() for c in candidates}
    warnings: list[str] = []
    for c in usable:
        for dep in c.manifest.requires_plugins:  # type: ignore[union-attr]
            target = by_id.get(dep.id)
            if target is c:
                warnings.append(f"plugin {c.key} declares a dependency on itself; ignored")
            elif target is not None:
                edges[id(c)].add(id(target))
    if not any(edges.values()):
        return list(candidates), warnings
    ordered: list[PluginCandidate] = []
    placed: set[int] = set()
    pending = list(candidates)
    while pending:
        ready = [c for c in pending if edges[id(c)] <= placed]
        if not ready:
            cycle = ", ".join(c.key for c in pending if edges[id(c)])
            warnings.append(f"plugin dependency cycle among {cycle}; they load in discovery order")
            return list(candidates), warnings
        first = ready[0]  # the earliest one in the given order whose dependencies are placed
        ordered.append(first)
        placed.add(id(first))
        pending.remove(first)
    return ordered, warnings
