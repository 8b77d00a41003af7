"""Listing plugins (``list_plugins()``, ``get_plugin()``) and what each is granted.

One dict per plugin found, loaded or not, with its registrations, manifest fields, failure and
isolation; ``granted_capabilities`` and ``profile_name`` answer the consent and identity questions
a plugin's ``ctx`` asks. A mixin of :class:`.manager.PluginManager`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from plugin_llm.trust import CAPABILITY_FOR, FLAG_KEYS
from .loading import STATUS_DISABLED, STATUS_ENABLED, STATUS_NOT_ENABLED, PluginRecord
from .manifest import KIND_EXCLUSIVE, KIND_STANDALONE


def _home_profile_name(home: Path) -> str:
    """Hermes's profile name of a home directory (``hermes_cli.profiles.get_active_profile_name``)."""
    try:
        resolved = home.expanduser().resolve()
        default = (Path.home() / ".hermes").resolve()
    except (OSError, RuntimeError):
        return "custom"
    if resolved == default:
        return "default"
    if resolved.parent == default / "profiles" and re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", resolved.name):
        return resolved.name
    return "custom"


def _manifest_v2_fields(manifest: Any) -> dict[str, Any]:
    """The manifest v2 fields of a listing (empty values without a manifest)."""
    if manifest is None:
        return {"manifest_version": 1, "api_version": None, "requires_hermes": "", "requires_plugins": [],
                "python_dependencies": [], "config_schema": {}, "license": "", "homepage": "", "tags": [],
                "emits": [], "listens": []}
    return {
        "manifest_version": manifest.manifest_version, "api_version": manifest.api_version,
        "requires_hermes": manifest.requires_hermes,
        "requires_plugins": [{"id": d.id, "version_range": d.version_range} for d in manifest.requires_plugins],
        "python_dependencies": list(manifest.python_dependencies),
        "config_schema": {k: dict(v) for k, v in manifest.config_schema.items()},
        "license": manifest.license, "homepage": manifest.homepage, "tags": list(manifest.tags),
        "emits": list(manifest.emits), "listens": list(manifest.listens),
    }


class ListingMixin:
    """``list_plugins()``, ``get_plugin()``, and a plugin's granted capabilities and profile name.

    The state it uses (made by ``PluginManager.__init__``): ``_discover_lock``, ``_hooks``, ``_records``,
    ``_registry``, ``_registry_lock``, ``_settings``, ``home``.
    """

    def list_plugins(self) -> list[dict[str, Any]]:
        """One dict per plugin found (enabled or not, loaded or failed), in discovery order."""
        with self._discover_lock:  # a concurrent forced re-discovery must not tear the listing
            self.discover_plugins()
            records = list(self._records.values())
        return [self._describe(r, list(dict.fromkeys(self._hooks.hooks_of(r.key)))) for r in records]

    def get_plugin(self, name: str) -> dict[str, Any] | None:
        """``list_plugins()`` entry for a key, or for a bare name when it is unambiguous."""
        plugins = self.list_plugins()
        for p in plugins:
            if p["key"] == name:
                return p
        matches = [p for p in plugins if p["name"] == name]
        return matches[0] if len(matches) == 1 else None

    def _describe(self, record: PluginRecord, hooks: list[str]) -> dict[str, Any]:
        candidate, manifest = record.candidate, record.candidate.manifest
        with self._registry_lock:
            owned = self._registry.owned_by(record.key)
        required = list(manifest.required_env_names) if manifest else []
        missing = [name for name in required if not os.environ.get(name)]
        status = record.status
        hint = f"plugin-llm plugins enable {record.key}" if status in (STATUS_NOT_ENABLED, STATUS_DISABLED) else None
        settings = self._settings.current()
        kind = manifest.kind if manifest else KIND_STANDALONE
        # what the operator configured (loaded or not): plugins.enabled, or <category>.provider for an
        # exclusive plugin, and not plugins.disabled (the CLI reports this as `enabled`)
        wanted = not settings.is_disabled(record.key, candidate.name) and (
            settings.is_enabled(record.key, candidate.name)
            or (kind == KIND_EXCLUSIVE and settings.is_selected(record.key, candidate.name)))
        return {
            "name": manifest.name if manifest else candidate.name,
            "key": record.key,
            "version": manifest.version if manifest else "",
            "description": manifest.description if manifest else "",
            "author": manifest.author if manifest else "",
            "kind": manifest.kind if manifest else "",
            "declared_kind": manifest.declared_kind if manifest else "",
            "capabilities": list(manifest.capabilities) if manifest else [],
            "granted_capabilities": self.granted_capabilities(record.key),
            "note": record.note,
            "source": candidate.source,
            "path": str(candidate.path) if candidate.path else None,
            "module": record.module_name,
            "entry_point": candidate.entry_point.value if candidate.entry_point is not None else None,
            "enabled": status == STATUS_ENABLED,
            "enabled_in_config": wanted,
            "status": status,
            "tools": owned["tools"],
            "hooks": hooks,
            "middleware": self.middleware_of(record.key),
            "commands": owned["commands"],
            "cli_commands": owned["cli_commands"],
            "skills": owned["skills"],
            "platforms": owned["platforms"],
            "memory_providers": owned["memory_providers"],
            "context_engines": owned["context_engines"],
            "image_gen_providers": owned["image_gen_providers"],
            "auxiliary_tasks": owned["auxiliary_tasks"],
            "provides_tools": list(manifest.provides_tools) if manifest else [],
            "provides_hooks": list(manifest.provides_hooks) if manifest else [],
            "requires_env": required,
            "missing_env": missing,
            **_manifest_v2_fields(manifest),
            "error": record.error,
            "error_frames": list(record.frames),
            "warnings": list(record.warnings),
            "enable_hint": hint,
            "load_ms": round(record.load_ms, 3) if record.load_ms is not None else None,
            **self._isolation_fields(record),
        }

    def _isolation_fields(self, record: PluginRecord) -> dict[str, Any]:
        """``isolation`` (process | in_process) and, out of process, ``confinement`` (bubblewrap | process),
        ``pid``, ``restarts`` and the last fault of its process."""
        isolation = self.isolation_of(record) if record.candidate.manifest is not None else "in_process"
        fields: dict[str, Any] = {"isolation": isolation, "confinement": None}
        remote = record.remote
        if remote is not None:
            info = remote.describe()
            fields.update(confinement=info["confinement"], confinement_reason=info["confinement_reason"],
                          pid=info["pid"], restarts=info["restarts"], process_state=info["state"],
                          last_fault=info["last_fault"], isolation_limits=info["limits"],
                          isolation_network=info["network"], data_dir=info["data_dir"])
        return fields

    def granted_capabilities(self, key: str) -> list[str]:
        """The capabilities plugin ``key`` has, as Hermes's ``plugin_capability_granted`` counts them: requested
        by its manifest and granted by ``plugins.entries.<key>.granted_capabilities`` (bound by this host's
        consent, or written by Hermes), or whose older ``allow_*`` key is true. An unreadable config: none."""
        record = self._records.get(key)
        manifest = record.candidate.manifest if record is not None else None
        try:
            from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

            policy = get_config_source(self.home).current().trust_for(key)
            entry = self.settings.entry(key)
        except Exception:  # an unreadable config grants nothing
            return []
        out = [c for c in (manifest.capabilities if manifest is not None else ()) if c in policy.granted_capabilities]
        legacy = set(entry.legacy_capabilities) | ({"tools.override"} if entry.allow_tool_override else set())
        legacy |= {CAPABILITY_FOR[name] for name, flag in FLAG_KEYS.items() if getattr(policy, flag)}
        return out + sorted(legacy - set(out))

    def profile_name(self) -> str:
        """The active credential profile's name (``auth.json`` ``default_profile``), else Hermes's name
        of the home: ``default`` for ``~/.hermes``, ``<name>`` for ``~/.hermes/profiles/<name>``, ``custom``
        for any other home."""
        try:
            from auth.authfile import load_auth  # on first use: the isolated child starts light

            spec, _ = load_auth(self.home / "auth.json")
            name = spec.default_profile
        except Exception:
            name = None
        return name if isinstance(name, str) and name else _home_profile_name(self.home)
