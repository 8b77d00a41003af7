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

from plugin_llm.hardened.bounded_repr import short_repr
from plugin_llm.capabilities import LEGACY_KEYS
from plugin_llm.hardened.safe_files import UnsafeFileError, read_home_text

__all__ = [
    "MANIFEST_FILENAMES",
    "EnvRequirement",
    "PluginManifest",
    "PluginDependency",
    "ManifestError",
    "HERMES_API_VERSION",
    "requires_hermes_error",
    "version_satisfies",
    "config_schema_warnings",
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
#: Hermes 0.21.3's known manifest fields, plus this host's ``isolation``
KNOWN_FIELDS = frozenset(
    {"name", "version", "description", "author", "requires_env", "provides_tools", "provides_hooks", "kind",
     "hooks", "label", "optional_env", "platforms", "external_dependencies", "pip_dependencies",
     "provides_browser_providers", "provides_web_providers", "manifest_version", "api_version",
     "requires_plugins", "python_dependencies", "config_schema", "license", "homepage", "tags", "capabilities",
     "emits", "listens", "hermes", "depends", "requires_hermes", "isolation"}
)
#: The Hermes plugin API version this host implements (``requires_hermes`` is checked against it).
HERMES_API_VERSION = "0.21.3"
#: The highest manifest format version understood (a newer one warns and still loads).
SUPPORTED_MANIFEST_VERSION = 2
#: Hermes's capability ids (``hermes_cli/plugin_capabilities.py``); others are dropped with a warning.
KNOWN_CAPABILITIES = frozenset(LEGACY_KEYS)
#: ``config_schema`` types Hermes checks (others warn and are not checked)
CONFIG_SCHEMA_TYPES: Mapping[str, tuple[type, ...]] = {
    "str": (str,), "string": (str,), "int": (int,), "integer": (int,), "float": (int, float),
    "number": (int, float), "bool": (bool,), "boolean": (bool,), "list": (list,), "array": (list,),
    "dict": (dict,), "object": (dict,),
}
#: entries a list-valued v2 field may have (a real manifest has a few)
MAX_LIST_ITEMS = 64
#: characters a v2 string value may have
MAX_FIELD_CHARS = 500
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
class PluginDependency:
    """A ``requires_plugins`` entry: another plugin's key or name (advisory: orders the load)."""

    id: str
    version_range: str | None = None


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
    #: ``requires_hermes`` (``">=0.19"``-style clauses); unsatisfied -> not loaded (see :func:`requires_hermes_error`)
    requires_hermes: str = ""
    #: manifest format version (absent: 1) and the plugin API generation it targets (None: current)
    manifest_version: int = 1
    api_version: int | None = None
    #: advisory dependencies: they load first; a missing one warns
    requires_plugins: tuple[PluginDependency, ...] = ()
    #: requirement strings, reported when missing, never installed
    python_dependencies: tuple[str, ...] = ()
    #: ``key: {type, default, description, required}`` for ``plugins.entries.<key>.settings`` (warnings only)
    config_schema: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False)
    license: str = ""
    homepage: str = ""
    tags: tuple[str, ...] = ()
    #: advisory event-bus declarations
    emits: tuple[str, ...] = ()
    listens: tuple[str, ...] = ()
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


def _author(data: Mapping[str, Any], where: str) -> str:
    """``author``: a string, or Hermes's mapping shown as "name, email, url"."""
    value = data.get("author")
    if isinstance(value, Mapping):
        return ", ".join(str(value[f]).strip()[:MAX_FIELD_CHARS] for f in ("name", "email", "url")
                         if isinstance(value.get(f), (str, int, float)) and str(value[f]).strip())
    return _text(data, "author", where)


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


def _capabilities(data: Mapping[str, Any], where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(capability ids, notes), parsed as tolerantly as Hermes: a non-list is ignored, non-strings are
    skipped, unknown ids are dropped, duplicates are merged; each with a warning, never a failure."""
    value = data.get("capabilities")
    if value is None:
        return (), ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return (), (f"{where}: 'capabilities' must be a list of capability ids, got {type(value).__name__}; ignored",)
    out: list[str] = []
    notes: list[str] = []
    for item in value[:MAX_CAPABILITIES]:
        if not isinstance(item, str):
            notes.append(f"{where}: capability {short_repr(item)} is not a string; skipped")
        elif item.strip() not in KNOWN_CAPABILITIES:
            notes.append(f"{where}: unknown capability {short_repr(item)} dropped "
                         f"(known: {', '.join(sorted(KNOWN_CAPABILITIES))})")
        elif item.strip() not in out:
            out.append(item.strip())
    if len(value) > MAX_CAPABILITIES:
        notes.append(f"{where}: more than {MAX_CAPABILITIES} capabilities; the rest are ignored")
    return tuple(out), tuple(notes)


def _v2_int(data: Mapping[str, Any], key: str, where: str, default: int | None, notes: list[str]) -> int | None:
    raw = data.get(key)
    if raw is None:
        return default
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().isdigit() and len(raw.strip()) < 10:
        return int(raw.strip())
    notes.append(f"{where}: {key} {short_repr(raw)} is not an integer; "
                 + (f"treated as {default}" if default is not None else "ignored"))
    return default


def _v2_strings(data: Mapping[str, Any], key: str, where: str, notes: list[str]) -> tuple[str, ...]:
    raw = data.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, list):
        notes.append(f"{where}: {key} must be a list of strings, got {type(raw).__name__}; ignored")
        return ()
    out = []
    for item in raw[:MAX_LIST_ITEMS]:
        if isinstance(item, (str, int, float)) and not isinstance(item, bool) and str(item).strip():
            out.append(str(item).strip()[:MAX_FIELD_CHARS])
        else:
            notes.append(f"{where}: {key} entry {short_repr(item)} must be a non-empty string; skipped")
    return tuple(out)


def _v2_text(data: Mapping[str, Any], key: str, where: str, notes: list[str]) -> str:
    raw = data.get(key)
    if raw is None:
        return ""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        notes.append(f"{where}: {key} must be a string, got {type(raw).__name__}; ignored")
        return ""
    return str(raw).strip()[:MAX_FIELD_CHARS]


def _requires_plugins(data: Mapping[str, Any], where: str, notes: list[str]) -> tuple[PluginDependency, ...]:
    raw = data.get("requires_plugins")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        notes.append(f"{where}: requires_plugins must be a list, got {type(raw).__name__}; ignored")
        return ()
    out: list[PluginDependency] = []
    for item in raw[:MAX_LIST_ITEMS]:
        if isinstance(item, str) and item.strip():
            dep = PluginDependency(item.strip()[:MAX_FIELD_CHARS])
        elif isinstance(item, Mapping) and isinstance(item.get("id"), str) and item["id"].strip():
            version_range = item.get("version_range")
            dep = PluginDependency(item["id"].strip()[:MAX_FIELD_CHARS],
                                   None if version_range is None else str(version_range)[:MAX_FIELD_CHARS])
        else:
            notes.append(f"{where}: requires_plugins entry {short_repr(item)} must be a plugin id or "
                         "{id, version_range}; skipped")
            continue
        if dep.id not in (d.id for d in out):
            out.append(dep)
    return tuple(out)


def _config_schema(data: Mapping[str, Any], where: str, notes: list[str]) -> dict[str, dict[str, Any]]:
    raw = data.get("config_schema")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        notes.append(f"{where}: config_schema must be a mapping, got {type(raw).__name__}; ignored")
        return {}
    schema: dict[str, dict[str, Any]] = {}
    for key, spec in list(raw.items())[:128]:
        if not isinstance(spec, Mapping):
            notes.append(f"{where}: config_schema entry {short_repr(key)} must be a mapping (e.g. {{type: str}}); skipped")
            continue
        kind = spec.get("type")
        if kind is not None and str(kind).lower() not in CONFIG_SCHEMA_TYPES:
            notes.append(f"{where}: config_schema key {short_repr(key)} declares unknown type {short_repr(kind)} "
                         f"(known: {', '.join(sorted(CONFIG_SCHEMA_TYPES))}); its type is not checked")
        schema[str(key)[:MAX_FIELD_CHARS]] = dict(spec)
    return schema


def _v2_fields(data: Mapping[str, Any], where: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Hermes's manifest v2 fields as PluginManifest keywords, and the notes about them (never failures)."""
    notes: list[str] = []
    version = _v2_int(data, "manifest_version", where, 1, notes) or 1
    if version > SUPPORTED_MANIFEST_VERSION:
        notes.append(f"{where}: manifest_version {version} is newer than this host supports "
                     f"({SUPPORTED_MANIFEST_VERSION}); loading anyway and ignoring unknown fields")
    requires_hermes = data.get("requires_hermes")
    if requires_hermes is not None and not isinstance(requires_hermes, (str, int, float)):
        notes.append(f"{where}: requires_hermes must be a version spec such as '>=0.19'; ignored")
        requires_hermes = None
    fields = dict(
        requires_hermes=str(requires_hermes or "").strip()[:MAX_FIELD_CHARS],
        manifest_version=version,
        api_version=_v2_int(data, "api_version", where, None, notes),
        requires_plugins=_requires_plugins(data, where, notes),
        python_dependencies=_v2_strings(data, "python_dependencies", where, notes),
        config_schema=_config_schema(data, where, notes),
        license=_v2_text(data, "license", where, notes),
        homepage=_v2_text(data, "homepage", where, notes),
        tags=_v2_strings(data, "tags", where, notes),
        emits=_v2_strings(data, "emits", where, notes),
        listens=_v2_strings(data, "listens", where, notes),
    )
    return fields, tuple(notes)


_COMPARATOR = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(.+?)\s*$")


def _version_tuple(text: str) -> tuple[int, int, int] | None:
    """``v1.2.3-rc1`` -> (1, 2, 3); None when a part is not a number."""
    parts = re.split(r"[-+]", text.strip().lstrip("v"), maxsplit=1)[0].split(".")
    parts += ["0"] * (3 - len(parts))
    if not all(p.isdigit() and len(p) < 10 for p in parts[:3]):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def version_satisfies(spec: str, current: str) -> bool:
    """Hermes's ``requires_hermes`` check: clauses joined by ``,`` (AND), a bare version means ``>=``;
    a clause whose version cannot be read is ignored (as in Hermes)."""
    now = _version_tuple(current)
    if now is None:
        return True
    checks = {">=": now.__ge__, "<=": now.__le__, "==": now.__eq__, "!=": now.__ne__, ">": now.__gt__, "<": now.__lt__}
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        match = _COMPARATOR.match(clause)
        if match is None:
            continue
        target = _version_tuple(match.group(2))
        if target is not None and not checks[match.group(1) or ">="](target):
            return False
    return True


def requires_hermes_error(manifest: PluginManifest, current: str = HERMES_API_VERSION) -> str | None:
    """Why the manifest's ``requires_hermes`` refuses this host (None when it accepts it)."""
    if not manifest.requires_hermes or version_satisfies(manifest.requires_hermes, current):
        return None
    return (f"requires hermes {manifest.requires_hermes}, running {current} (the Hermes plugin API this host "
            "implements); not loaded")


def config_schema_warnings(key: str, schema: Mapping[str, Any], settings: Any) -> list[str]:
    """Mismatches between ``plugins.entries.<key>.settings`` and the manifest's ``config_schema``
    (warnings only: a mismatch never blocks the load)."""
    if not isinstance(settings, Mapping):
        settings = {}
    warnings: list[str] = []
    for name, spec in schema.items():
        if name not in settings:
            if spec.get("required") and "default" not in spec:
                warnings.append(f"plugins.entries.{key}.settings.{name} is required by the plugin's config_schema "
                                "but is not set")
            continue
        kind = spec.get("type")
        expected = CONFIG_SCHEMA_TYPES.get(str(kind).lower()) if kind is not None else None
        value = settings[name]
        if expected is not None and (not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)):
            warnings.append(f"plugins.entries.{key}.settings.{name} should be {kind} (got {type(value).__name__})")
    return warnings


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

    from plugin_llm.hardened.safe_yaml import load_yaml  # on first use: it loads PyYAML

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
    key = f"{category}/{validate_plugin_name(default_name, where)}" if category else name
    kind, declared_kind, notes = _kind(data, key, category, where)
    isolation, isolation_notes = _isolation(data, where)
    v2, v2_notes = _v2_fields(data, where)
    capabilities, capability_notes = _capabilities(data, where)
    if unknown:
        text = f"{where}: unknown manifest fields ignored: {', '.join(sorted(map(str, unknown)))[:300]}"
        if v2["manifest_version"] >= 2:  # Hermes: a warning for v2 manifests, debug for v1
            v2_notes += (text,)
        else:
            _log.debug("%s", text)
    return PluginManifest(
        name=name,
        key=key,
        version=_text(data, "version", where),
        description=_text(data, "description", where),
        author=_author(data, where),
        requires_env=_requires_env(data, where),
        provides_tools=_string_list(data, "provides_tools", where),
        provides_hooks=_string_list(data, "provides_hooks", where),
        kind=kind,
        declared_kind=declared_kind,
        capabilities=capabilities,
        isolation=isolation,
        notes=notes + isolation_notes + capability_notes + v2_notes,
        extra=unknown,
        **v2,
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

    Read with :func:`plugin_llm.hardened.safe_files.read_home_text`: a FIFO or a device
    is refused without blocking, and the size is bounded.
    """
    try:
        text = read_home_text(path, max_bytes=MANIFEST_MAX_BYTES)
    except UnsafeFileError as exc:
        raise ManifestError(f"cannot read manifest: {exc}") from None
    if text is None:
        raise ManifestError(f"{path}: cannot read manifest: it does not exist (a dangling symlink?)")
    return parse_manifest(text, default_name=path.parent.name, category=category, where=str(path))
