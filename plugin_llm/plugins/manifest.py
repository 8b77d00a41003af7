"""``plugin.yaml`` manifests: the value type and its (pure) parser.

Fields: ``name`` (defaults to the directory name), ``version``, ``description``, ``author``,
``requires_env`` (strings or ``{name, description}``), ``provides_tools``, ``provides_hooks``,
``kind``, ``capabilities`` (what the plugin asks the operator to grant) and ``isolation``
(``process`` asks to run out of process; never less isolation than the operator set). Example:
docs/plugin-authors.md.

``kind`` has Hermes's meanings: ``standalone`` (default), ``backend``, ``exclusive`` (one active
at a time, chosen by ``<category>.provider``), ``platform`` and ``model-provider`` (recognised,
never loaded here). Any other value is kept as ``declared_kind``, noted and treated as
``standalone``. Unknown fields are kept in ``extra``. A manifest that is not valid YAML, not a
mapping, has a field of the wrong type or a name that is not a plain name raises
:class:`ManifestError`; the manager records that plugin as failed and carries on.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from plugin_llm.bounded_repr import short_repr

__all__ = [
    "MANIFEST_FILENAMES",
    "EnvRequirement",
    "PluginManifest",
    "ManifestError",
    "parse_manifest",
    "load_manifest",
    "find_manifest",
    "validate_plugin_name",
    "PLUGIN_KINDS",
    "KIND_STANDALONE",
    "KIND_BACKEND",
    "KIND_EXCLUSIVE",
    "KIND_PLATFORM",
    "KIND_MODEL_PROVIDER",
]

_log = logging.getLogger("plugin_llm.plugins")

MANIFEST_FILENAMES = ("plugin.yaml", "plugin.yml")
KNOWN_FIELDS = frozenset(
    {"name", "version", "description", "author", "requires_env", "provides_tools", "provides_hooks", "kind",
     "capabilities", "isolation"}
)
KIND_STANDALONE = "standalone"
KIND_BACKEND = "backend"
KIND_EXCLUSIVE = "exclusive"
KIND_PLATFORM = "platform"
KIND_MODEL_PROVIDER = "model-provider"
#: Hermes's manifest kinds (hermes_cli/plugins.py ``_VALID_PLUGIN_KINDS``)
PLUGIN_KINDS = frozenset({KIND_STANDALONE, KIND_BACKEND, KIND_EXCLUSIVE, KIND_PLATFORM, KIND_MODEL_PROVIDER})
_CAPABILITY = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$")
#: the capability names a manifest may list at most (a real one lists a few)
MAX_CAPABILITIES = 64
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: a manifest is a handful of fields: anything bigger is refused unread
MANIFEST_MAX_BYTES = 256 * 1024
#: values YAML aliases may add to a manifest (a real one has none)
MANIFEST_ALIAS_BUDGET = 1_000


class ManifestError(ValueError):
    """A ``plugin.yaml`` that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class EnvRequirement:
    """An environment variable the plugin needs (``requires_env``)."""

    name: str
    description: str = ""


@dataclass(frozen=True)
class PluginManifest:
    """A plugin as described by its manifest (or synthesised for an entry point).

    ``key`` is the plugin's identity everywhere (trust block, enable lists,
    audit ``plugin_id``): the name, or ``<category>/<name>`` when nested.
    """

    name: str
    key: str
    version: str = ""
    description: str = ""
    author: str = ""
    requires_env: tuple[EnvRequirement, ...] = ()
    provides_tools: tuple[str, ...] = ()
    provides_hooks: tuple[str, ...] = ()
    kind: str = KIND_STANDALONE
    #: The ``kind:`` text as written ("" when absent); ``kind`` is what it means here.
    declared_kind: str = ""
    #: ``capabilities:`` the plugin requests (granted per plugin in ``plugins.entries.<key>``).
    capabilities: tuple[str, ...] = ()
    #: ``isolation: process`` when the manifest asks to run out of process ("" otherwise).
    isolation: str = ""
    #: Things worth telling the operator about this manifest (an unknown kind, ...).
    notes: tuple[str, ...] = field(default=(), compare=False)
    #: Unknown manifest fields, kept for display and forward compatibility.
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def required_env_names(self) -> tuple[str, ...]:
        return tuple(req.name for req in self.requires_env)


def validate_plugin_name(name: Any, where: str) -> str:
    """A plugin (or category) name: a non-empty string that cannot escape its directory."""
    if not isinstance(name, str) or not name.strip():
        raise ManifestError(f"{where}: 'name' must be a non-empty string, got {short_repr(name)}")
    name = name.strip()
    if "/" in name or "\\" in name or "\0" in name or name in {".", ".."}:
        raise ManifestError(
            f"{where}: plugin name {short_repr(name)} must be a plain name without path separators "
            "(nested plugins get their '<category>/' prefix from the directory layout)"
        )
    if ":" in name:
        raise ManifestError(f"{where}: plugin name {short_repr(name)} must not contain ':' (it separates plugin and skill names)")
    if any(ch.isspace() for ch in name):
        raise ManifestError(f"{where}: plugin name {short_repr(name)} must not contain whitespace")
    return name


def _text(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if isinstance(value, bool):
        raise ManifestError(f"{where}: {key!r} must be a string, got a boolean")
    if isinstance(value, (int, float)):  # `version: 1.0` is common; keep it readable
        return str(value)
    if not isinstance(value, str):
        raise ManifestError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
    return value.strip()


def _string_list(data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = data.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ManifestError(f"{where}: {key!r} must be a list of non-empty strings, got {short_repr(value)}")
    return tuple(v.strip() for v in value)


def _requires_env(data: Mapping[str, Any], where: str) -> tuple[EnvRequirement, ...]:
    value = data.get("requires_env")
    if value is None:
        return ()
    if isinstance(value, (str, Mapping)):
        value = [value]
    if not isinstance(value, list):
        raise ManifestError(f"{where}: 'requires_env' must be a list, got {type(value).__name__}")
    out: list[EnvRequirement] = []
    for item in value:
        if isinstance(item, str):
            name, description = item.strip(), ""
        elif isinstance(item, Mapping) and isinstance(item.get("name"), str):
            name = item["name"].strip()
            description = item.get("description") or ""
            if not isinstance(description, str):
                raise ManifestError(f"{where}: requires_env {short_repr(name)}: 'description' must be a string")
        else:
            raise ManifestError(
                f"{where}: each 'requires_env' entry must be a variable name or {{name, description}}, got {short_repr(item)}"
            )
        if not _ENV_NAME.match(name):
            raise ManifestError(f"{where}: requires_env entry {short_repr(name)} is not a valid environment variable name")
        out.append(EnvRequirement(name, description.strip()))
    return tuple(out)


def _kind(data: Mapping[str, Any], key: str, category: str | None, where: str) -> tuple[str, str, tuple[str, ...]]:
    """(kind, declared kind, notes): Hermes's meaning of ``kind:``; a plugin under ``memory/`` is exclusive."""
    raw = data.get("kind")
    declared = raw.strip() if isinstance(raw, str) else ""
    notes: list[str] = []
    if raw is None:
        kind = KIND_STANDALONE
    elif not isinstance(raw, str):
        kind = KIND_STANDALONE
        notes.append(f"{where}: 'kind' must be a string, got {type(raw).__name__}; treated as 'standalone'")
    else:
        kind = declared.lower()
        if kind not in PLUGIN_KINDS:
            if kind:
                notes.append(
                    f"{where}: unknown kind {short_repr(declared)} (valid: {', '.join(sorted(PLUGIN_KINDS))}); "
                    "treated as 'standalone'"
                )
            kind = KIND_STANDALONE
    if category in ("memory", "context_engine") and kind != KIND_EXCLUSIVE:
        # Hermes: memory/ and context_engine/ plugins have their own selection (memory.provider,
        # context.engine): exclusive whatever they say
        kind = KIND_EXCLUSIVE
    return kind, declared, tuple(notes)


def _capabilities(data: Mapping[str, Any], where: str) -> tuple[str, ...]:
    value = data.get("capabilities")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) > MAX_CAPABILITIES:
        raise ManifestError(
            f"{where}: 'capabilities' must be a list of at most {MAX_CAPABILITIES} capability names "
            f"(e.g. [llm.model_override]), got {short_repr(value)}"
        )
    out: list[str] = []
    for item in value:
        if not isinstance(item, str) or not _CAPABILITY.match(item.strip()) or len(item) > 100:
            raise ManifestError(
                f"{where}: capability {short_repr(item)} is not a capability name "
                "(dotted lowercase words, e.g. llm.model_override)"
            )
        if item.strip() not in out:
            out.append(item.strip())
    return tuple(out)


def _isolation(data: Mapping[str, Any], where: str) -> tuple[str, tuple[str, ...]]:
    """``process`` when the manifest asks for it; ``in_process`` asks for nothing; anything else is
    noted and read as ``process`` (a manifest can only ask for more isolation)."""
    raw = data.get("isolation")
    if raw is None:
        return "", ()
    text = raw.strip().lower().replace("-", "_") if isinstance(raw, str) else None
    if text == "process":
        return "process", ()
    if text == "in_process":
        return "", ()
    return "process", (f"{where}: unknown isolation {short_repr(raw)} (valid: process, in_process); "
                       "treated as 'process'",)


def parse_manifest(text: str, *, default_name: str, category: str | None = None, where: str = "plugin.yaml") -> PluginManifest:
    """Parse manifest text (pure). ``default_name`` is the directory name.

    The key is Hermes's: the manifest ``name`` for a top-level plugin, and
    ``<category>/<directory name>`` for a nested one (the path, never the
    manifest name: ``browser/browser_use`` even with ``name: browser-browser-use``).

    Raises :class:`ManifestError` with ``where`` (usually the file path) in the message.
    """
    import yaml  # deferred: `import plugin_llm.plugins` stays cheap

    from plugin_llm.safe_yaml import load_yaml

    try:  # the host's bounded loader: an alias bomb or a recursive alias is refused with its line
        data = load_yaml(text, alias_budget=MANIFEST_ALIAS_BUDGET)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(f"{where}: invalid YAML{at}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ManifestError(f"{where}: the manifest must be a mapping of fields, got {type(data).__name__}")
    name = validate_plugin_name(data.get("name", default_name), where)
    unknown = {k: v for k, v in data.items() if k not in KNOWN_FIELDS}
    if unknown:
        _log.debug("%s: unknown manifest fields ignored: %s", where, ", ".join(sorted(map(str, unknown))))
    key = f"{category}/{validate_plugin_name(default_name, where)}" if category else name
    kind, declared_kind, notes = _kind(data, key, category, where)
    isolation, isolation_notes = _isolation(data, where)
    return PluginManifest(
        name=name,
        key=key,
        version=_text(data, "version", where),
        description=_text(data, "description", where),
        author=_text(data, "author", where),
        requires_env=_requires_env(data, where),
        provides_tools=_string_list(data, "provides_tools", where),
        provides_hooks=_string_list(data, "provides_hooks", where),
        kind=kind,
        declared_kind=declared_kind,
        capabilities=_capabilities(data, where),
        isolation=isolation,
        notes=notes + isolation_notes,
        extra=unknown,
    )


def find_manifest(directory: Path) -> Path | None:
    """``plugin.yaml`` (preferred) or ``plugin.yml`` in ``directory``, if present.

    Present means anything by that name (a FIFO, a directory, a dangling
    symlink too): :func:`load_manifest` then says what is wrong with it,
    rather than the plugin silently turning into a category.
    """
    for filename in MANIFEST_FILENAMES:
        candidate = directory / filename
        if os.path.lexists(candidate):
            return candidate
    return None


def load_manifest(path: Path, *, category: str | None = None) -> PluginManifest:
    """Read and parse a manifest file; unreadable files raise :class:`ManifestError` too.

    Read with :func:`plugin_llm.safe_files.read_home_text`: a FIFO or a device
    is refused without blocking, and the size is bounded.
    """
    from plugin_llm.safe_files import UnsafeFileError, read_home_text

    try:
        text = read_home_text(path, max_bytes=MANIFEST_MAX_BYTES)
    except UnsafeFileError as exc:
        raise ManifestError(f"cannot read manifest: {exc}") from None
    if text is None:
        raise ManifestError(f"{path}: cannot read manifest: it does not exist (a dangling symlink?)")
    return parse_manifest(text, default_name=path.parent.name, category=category, where=str(path))
