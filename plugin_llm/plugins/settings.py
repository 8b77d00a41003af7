"""Typed views of the plugin-related parts of ``config.yaml``.

``plugin_llm.config`` parses the file; this module only interprets the already-parsed mapping
(``HostConfig.raw``): ``plugins.enabled`` / ``disabled`` (disabled always wins) /
``hook_timeout`` / ``isolation_limits``, ``memory.provider``, ``context.engine``, any
``<category>.provider`` (selects the one active ``exclusive`` plugin of that category), and per
plugin ``plugins.entries.<key>``: ``allow_tool_override``, ``granted_capabilities`` and
``capabilities_sha256`` (see :mod:`.consent`), ``isolation``, ``isolation_limits``,
``isolation_network``. Every key with an example: docs/operators.md, "Plugins".

Bad values never raise: they fall back to the safe default (nothing enabled, 30 s timeout) and a
warning explains what was ignored.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from plugin_llm.capabilities import LEGACY_KEYS, legacy_granted, parse_grant

__all__ = [
    "DEFAULT_HOOK_TIMEOUT",
    "PluginEntry",
    "PluginSettings",
    "settings_from_raw",
    "default_home",
    "SettingsSource",
    "ISOLATION_PROCESS",
    "ISOLATION_IN_PROCESS",
    "ISOLATION_VALUES",
    "NETWORK_HOST",
    "NETWORK_NONE",
    "NETWORK_VALUES",
]

_log = logging.getLogger("plugin_llm.plugins")

#: Seconds a single hook callback may run before it is abandoned.
DEFAULT_HOOK_TIMEOUT = 30.0

ISOLATION_PROCESS = "process"
ISOLATION_IN_PROCESS = "in_process"
#: ``plugins.entries.<key>.isolation`` values ("in-process" is accepted for ``in_process``)
ISOLATION_VALUES = (ISOLATION_IN_PROCESS, ISOLATION_PROCESS)
NETWORK_HOST = "host"
NETWORK_NONE = "none"
#: ``plugins.entries.<key>.isolation_network`` values: the host's network, or none at all (bubblewrap only).
#: Unset: none where bubblewrap confines the plugin, else the host's (a plain process cannot be cut off).
NETWORK_VALUES = (NETWORK_HOST, NETWORK_NONE)

#: Built-in names meaning "no plugin engine / provider".
BUILTIN_CONTEXT_ENGINES = frozenset({"", "compressor", "builtin", "built-in", "default"})
BUILTIN_MEMORY_PROVIDERS = frozenset({"", "builtin", "built-in", "none"})


@dataclass(frozen=True)
class PluginEntry:
    """``plugins.entries.<key>`` as the plugin manager reads it (the trust gate reads ``llm``)."""

    allow_tool_override: bool = False
    #: what ``granted_capabilities`` grants (see :func:`plugin_llm.capabilities.parse_grant`)
    granted_capabilities: frozenset[str] = frozenset()
    capabilities_sha256: str = ""
    #: capabilities whose older ``allow_*`` key outside ``llm:`` is true (``allow_platform_actions``, ...)
    legacy_capabilities: frozenset[str] = frozenset()
    #: ``process``: the plugin runs in its own process (see :mod:`.isolation.remote`); else ``in_process``
    isolation: str = ISOLATION_IN_PROCESS
    #: its process's resource limits (a ``sandbox.SandboxLimits``); None: the host default
    isolation_limits: Any = None
    #: ``host``: its process uses the host's network; ``none``: it has none (bubblewrap's empty namespace);
    #: None (unset): none under bubblewrap, the host's without it
    isolation_network: str | None = None


@dataclass(frozen=True)
class PluginSettings:
    """What the plugin manager needs from ``config.yaml`` (already validated)."""

    enabled: frozenset[str] = frozenset()
    disabled: frozenset[str] = frozenset()
    hook_timeout: float = DEFAULT_HOOK_TIMEOUT
    #: ``plugins.hook_callback_timeout`` (Hermes's key; at most 600 s): bounds Hermes's hot-path hooks
    #: instead of ``hook_timeout``; None when unset, not a number or <= 0 (``hook_timeout`` applies)
    hook_callback_timeout: float | None = None
    memory_provider: str = ""
    context_engine: str = ""
    image_gen_provider: str = ""
    #: ``<category>.provider`` for every top-level section that has one (memory, image_gen, ...)
    selected: Mapping[str, str] = field(default_factory=dict)
    entries: Mapping[str, PluginEntry] = field(default_factory=dict)
    #: ``plugins.isolation_limits``: default limits of isolated plugins' processes (None: the sandbox's)
    isolation_limits: Any = None
    #: Human-readable problems found while interpreting the config (already logged).
    problems: tuple[str, ...] = field(default=(), compare=False)

    def is_disabled(self, key: str, name: str) -> bool:
        return key in self.disabled or name in self.disabled

    def entry(self, key: str) -> PluginEntry:
        return self.entries.get(key) or PluginEntry()

    def limits_for(self, key: str) -> Any:
        """The resource limits of plugin ``key``'s process: its own, else the host default, else the sandbox's."""
        own = self.entry(key).isolation_limits
        if own is not None:
            return own
        if self.isolation_limits is not None:
            return self.isolation_limits
        from .isolation.sandbox import DEFAULT_LIMITS  # on first use: the isolated child starts light

        return DEFAULT_LIMITS

    def is_selected(self, key: str, name: str) -> bool:
        """An exclusive plugin ``<category>/<dir>`` named by ``<category>.provider`` (its directory
        name, key or manifest name); a top-level one belongs to ``memory``."""
        category, _, tail = key.rpartition("/")
        choice = self.selected.get(category or "memory", "").strip().lower()
        return bool(choice) and choice in {tail.lower(), key.lower(), name.lower()}

    def is_enabled(self, key: str, name: str) -> bool:
        """Opt-in by key or bare name; ``disabled`` always wins."""
        if self.is_disabled(key, name):
            return False
        return key in self.enabled or name in self.enabled


def _name_list(value: Any, where: str, problems: list[str]) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):  # a lone string is an easy mistake: accept it, say so
        problems.append(f"{where} should be a list of plugin names; treating {value!r} as a one-item list")
        value = [value]
    if not isinstance(value, (list, tuple)):
        problems.append(f"{where} must be a list of plugin names, got {type(value).__name__}; ignored")
        return frozenset()
    names = set()
    for item in value:
        if isinstance(item, str) and item.strip():
            names.add(item.strip())
        else:
            problems.append(f"{where}: entry {item!r} is not a plugin name; ignored")
    return frozenset(names)


def _text(raw: Mapping[str, Any], section: str, key: str, problems: list[str]) -> str:
    block = raw.get(section)
    if block is None:
        return ""
    if not isinstance(block, Mapping):
        problems.append(f"{section} must be a mapping; {section}.{key} ignored")
        return ""
    value = block.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        problems.append(f"{section}.{key} must be a string, got {type(value).__name__}; ignored")
        return ""
    return value.strip()


def _timeout(value: Any, problems: list[str]) -> float:
    if value is None:
        return DEFAULT_HOOK_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        problems.append(
            f"plugins.hook_timeout must be a positive number of seconds, got {value!r}; "
            f"using {DEFAULT_HOOK_TIMEOUT:g}"
        )
        return DEFAULT_HOOK_TIMEOUT
    return float(value)


#: Hermes's ceiling for ``plugins.hook_callback_timeout``
MAX_HOOK_CALLBACK_TIMEOUT = 600.0


def _callback_timeout(value: Any, problems: list[str]) -> float | None:
    """Hermes's reading of ``plugins.hook_callback_timeout``; <= 0 disables it (``hook_timeout`` still bounds)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        problems.append(f"plugins.hook_callback_timeout must be a number of seconds, got {value!r}; "
                        "plugins.hook_timeout applies")
        return None
    if value <= 0:
        return None
    return min(float(value), MAX_HOOK_CALLBACK_TIMEOUT)


def _selected(raw: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for section, block in raw.items():
        if isinstance(section, str) and isinstance(block, Mapping):
            value = block.get("provider")
            if isinstance(value, str) and value.strip():
                out[section] = value.strip()
    context = raw.get("context")
    engine = context.get("engine") if isinstance(context, Mapping) else None
    if isinstance(engine, str) and engine.strip():  # Hermes selects a context engine by context.engine
        out["context_engine"] = engine.strip()
    return out


def _entries(plugins: Mapping[str, Any], problems: list[str]) -> dict[str, PluginEntry]:
    block = plugins.get("entries")
    if not isinstance(block, Mapping):
        return {}
    out = {}
    for key, entry in block.items():
        if not isinstance(key, str) or not isinstance(entry, Mapping):
            continue
        allow = entry.get("allow_tool_override", False)
        if not isinstance(allow, bool):
            problems.append(f"plugins.entries.{key}.allow_tool_override must be true or false; treated as false")
            allow = False
        grant = parse_grant(key, entry)
        # its problems are the config loader's warnings (said once, there)
        digest = entry.get("capabilities_sha256")
        legacy = frozenset(c for c, path in LEGACY_KEYS.items() if len(path) == 1 and legacy_granted(entry, c))
        isolation = _isolation(entry.get("isolation"), f"plugins.entries.{key}.isolation", problems)
        limits = _limits(entry.get("isolation_limits"), f"plugins.entries.{key}.isolation_limits", problems)
        network = _network(entry.get("isolation_network"), f"plugins.entries.{key}.isolation_network", problems)
        out[key] = PluginEntry(allow, frozenset(grant.granted), digest.strip() if isinstance(digest, str) else "",
                               legacy, isolation, limits, network)
    return out


def _network(value: Any, where: str, problems: list[str]) -> str | None:
    """``host`` or ``none`` (None when unset); anything else is ``none`` (the safer reading) with a warning."""
    if value is None:
        return None
    if value is False:  # YAML's unquoted ``no`` / ``off``
        return NETWORK_NONE
    text = value.strip().lower() if isinstance(value, str) else None
    if text in NETWORK_VALUES:
        return text
    _unknown_value(value, text, NETWORK_VALUES, where, problems,
                   "expected host or none; the plugin gets no network until it is fixed (the safer choice)")
    return NETWORK_NONE


def _isolation(value: Any, where: str, problems: list[str]) -> str:
    """``process`` or ``in_process``; anything else runs the plugin out of process (the safer reading)."""
    if value is None:
        return ISOLATION_IN_PROCESS
    text = value.strip().lower().replace("-", "_") if isinstance(value, str) else None
    if text in ISOLATION_VALUES:
        return text
    _unknown_value(value, text, ISOLATION_VALUES, where, problems, "expected process or in_process; "
                   "the plugin runs out of process until it is fixed (the safer choice)")
    return ISOLATION_PROCESS


def _unknown_value(value: Any, text: str | None, known, where: str, problems: list[str], fix: str) -> None:
    """One problem line for a value of a closed set: what was found (bounded), a did-you-mean, the fix."""
    import difflib

    close = difflib.get_close_matches(text or "", known, n=1, cutoff=0.5) if text else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    shown = repr(value[:40]) if isinstance(value, str) else type(value).__name__
    problems.append(f"{where}: unknown value {shown}{hint}; {fix}")


def _limits(value: Any, where: str, problems: list[str]) -> Any:
    """Parsed ``isolation_limits`` (None when absent or unusable: the next default applies)."""
    if value is None:
        return None
    from .isolation.sandbox import parse_limits  # on first use: the isolated child starts light

    try:
        return parse_limits(value, where)
    except ValueError as exc:
        problems.append(f"{exc}; the default limits apply until it is fixed")
        return None


def settings_from_raw(raw: Mapping[str, Any] | None) -> PluginSettings:
    """Interpret the parsed ``config.yaml`` mapping (pure; never raises)."""
    raw = raw if isinstance(raw, Mapping) else {}
    problems: list[str] = []
    plugins = raw.get("plugins")
    if plugins is None:
        plugins = {}
    elif not isinstance(plugins, Mapping):
        problems.append("plugins must be a mapping; no plugin is enabled")
        plugins = {}
    return PluginSettings(
        enabled=_name_list(plugins.get("enabled"), "plugins.enabled", problems),
        disabled=_name_list(plugins.get("disabled"), "plugins.disabled", problems),
        hook_timeout=_timeout(plugins.get("hook_timeout"), problems),
        hook_callback_timeout=_callback_timeout(plugins.get("hook_callback_timeout"), problems),
        memory_provider=_text(raw, "memory", "provider", problems),
        context_engine=_text(raw, "context", "engine", problems),
        image_gen_provider=_text(raw, "image_gen", "provider", problems),
        selected=_selected(raw),
        entries=_entries(plugins, problems),
        isolation_limits=_limits(plugins.get("isolation_limits"), "plugins.isolation_limits", problems),
        problems=tuple(problems),
    )


def default_home() -> Path:
    """``$HERMES_HOME`` or ``~/.hermes`` (delegates to ``plugin_llm.config``)."""
    try:
        from plugin_llm.config import hermes_home
    except ImportError:  # pragma: no cover - config.py is part of the core
        return Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes").expanduser()
    return Path(hermes_home())


class SettingsSource:
    """Current :class:`PluginSettings` of one home, re-derived only when config.yaml changes.

    ``plugin_llm.config`` owns the file (stat check, parse once per change); this
    caches the interpretation per ``HostConfig`` object, so the hot path (every
    hook invocation asks for the timeout) is an identity check. A config that
    cannot be read yields the last good settings (or none enabled at all): the
    manager fails closed.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self._source: Any = None
        self._last_config: Any = None
        self._settings = PluginSettings()
        self._reported: set[str] = set()

    def _config_source(self) -> Any:
        if self._source is None:
            from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

            self._source = get_config_source(self.home)
        return self._source

    def current(self) -> PluginSettings:
        try:
            config = self._config_source().current()
        except Exception as exc:  # unreadable/invalid config: keep the last good view
            message = f"cannot read plugin settings from {self.home / 'config.yaml'}: {exc}"
            if message not in self._reported:
                self._reported.add(message)
                _log.error("%s", message)
            return self._settings
        if config is self._last_config:
            return self._settings
        settings = settings_from_raw(getattr(config, "raw", None))
        for problem in settings.problems:
            if problem not in self._reported:
                self._reported.add(problem)
                _log.warning("config.yaml: %s", problem)
        self._settings, self._last_config = settings, config
        return settings
