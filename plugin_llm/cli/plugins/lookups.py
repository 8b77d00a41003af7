"""Read-only lookups the ``plugins`` actions share: what config.yaml and the install records say of a plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from plugin_llm.config import get_config_source
from plugin_llm.plugins.install import InstallError, read_metadata
from plugin_llm.timefmt import utc_iso_text


def config_parse_error(home: Path) -> str | None:
    try:
        return get_config_source(home).current().error
    except Exception as exc:  # pragma: no cover - defensive
        return str(exc)


def closed_reason(home: Path) -> str | None:
    """Why config.yaml cannot be read (``HostConfig.closed_reason``), None when it parses."""
    try:
        return get_config_source(home).current().closed_reason
    except Exception as exc:  # pragma: no cover - defensive
        return str(exc)


def config_mentions(home: Path, key: str) -> list[str]:
    try:
        raw = get_config_source(home).current().raw
    except Exception:  # pragma: no cover - defensive
        return []
    plugins = raw.get("plugins") if isinstance(raw, Mapping) else None
    if not isinstance(plugins, Mapping):
        return []
    out = []
    for section in ("enabled", "disabled"):
        value = plugins.get(section)
        if isinstance(value, list) and key in value:
            out.append(f"plugins.{section}")
    if isinstance(plugins.get("entries"), Mapping) and key in plugins["entries"]:
        out.append(f"plugins.entries.{key}")
    return out


def read_install_record(home: Path, key: str) -> dict[str, Any] | None:
    try:
        entry = read_metadata(home / "plugins").get(key)
    except InstallError as exc:
        return {"error": str(exc)}
    if entry is None:
        return None

    record = entry.to_json()
    for name in ("installed_at", "updated_at"):  # stored with microseconds and +00:00: shown in the one format
        if name in record:
            record[name] = utc_iso_text(record[name])
    return record


def read_trust_entry(home: Path, key: str) -> Any:
    """The raw ``plugins.entries.<key>.llm`` block as written (None when absent)."""
    try:
        raw = get_config_source(home).current().raw
    except Exception:  # pragma: no cover - reported by the listing already
        return None
    plugins = raw.get("plugins") if isinstance(raw, Mapping) else None
    entries = plugins.get("entries") if isinstance(plugins, Mapping) else None
    entry = entries.get(key) if isinstance(entries, Mapping) else None
    return entry.get("llm") if isinstance(entry, Mapping) else None
