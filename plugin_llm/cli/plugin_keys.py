"""The plugin a service token or a ``try --as`` call is made as: a key this home knows, or refused.

Known: a plugin installed here (discovery: user, project, entry points; nothing is
imported), a key under ``plugins.entries`` or a name in ``plugins.enabled``. A manifest
name or unique leaf resolves to its key (tokens and trust entries are per key). Anything
else is refused with a "did you mean" unless the operator passes ``--force`` (a plugin
that runs on another machine).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from plugin_llm.cli._common import printable
from plugin_llm.cli.main import CliError, debug_enabled
from plugin_llm.config import get_config_source
from plugin_llm.plugins.discovery import discover_candidates
from plugin_llm.plugins.install import InstallError, resolve_name
from plugin_llm.plugins.settings import settings_from_raw

__all__ = ["PluginKey", "plugin_key_for"]


@dataclass(frozen=True)
class PluginKey:
    key: str
    known: bool  # installed here, or configured in config.yaml
    disabled: bool  # in plugins.disabled: the service refuses its tokens, the manager never loads it


def _installed(home: Path) -> dict[str, str]:
    """``{key: manifest name}`` of the plugins discovery finds; its warnings are `plugins list`'s to report."""
    logger = logging.getLogger("plugin_llm.plugins")

    def quiet(record: logging.LogRecord) -> bool:
        return False

    if not debug_enabled():
        logger.addFilter(quiet)
    try:
        return {key: c.name for key, c in discover_candidates(Path(home)).items()}
    except Exception:  # noqa: BLE001 - an unreadable plugins directory: the configured names still count
        return {}
    finally:
        logger.removeFilter(quiet)


def _configured(raw: Any) -> list[str]:
    plugins = raw.get("plugins") if isinstance(raw, Mapping) else None
    if not isinstance(plugins, Mapping):
        return []
    names: list[str] = []
    entries = plugins.get("entries")
    if isinstance(entries, Mapping):
        names += [k for k in entries if isinstance(k, str)]
    enabled = plugins.get("enabled")
    if isinstance(enabled, list):
        names += [n for n in enabled if isinstance(n, str)]
    return [n.strip() for n in names if n.strip()]


def plugin_key_for(home: Path, name: str, *, force: bool, doing: str) -> PluginKey:
    """The key ``name`` stands for; :class:`CliError` with a "did you mean" when no plugin here has it
    and not ``force``. ``doing`` completes the refusal (e.g. "no token was created")."""
    raw = get_config_source(Path(home)).current().raw
    settings = settings_from_raw(raw if isinstance(raw, Mapping) else None)
    installed = _installed(home)
    configured = _configured(raw)
    plugins = {**{k: k.rsplit("/", 1)[-1] for k in configured}, **installed}
    wanted = name.strip() if isinstance(name, str) else ""
    if force:
        key = wanted
    else:
        try:
            key = resolve_name(wanted, plugins, where=f" installed in {home} or named in its config.yaml "
                                                      "(plugins.entries, plugins.enabled)")
        except InstallError as exc:
            raise CliError(printable(f"{exc}; {doing}. A plugin that runs on another machine: use --force",
                                     limit=2000)) from None
    leaf = installed.get(key) or key.rsplit("/", 1)[-1]
    return PluginKey(key, key in plugins, settings.is_disabled(key, leaf))
