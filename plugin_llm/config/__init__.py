"""The host's home directory and ``config.yaml``.

``ConfigSource.current()`` is called on every gateway call. It costs one
``stat`` when nothing changed (none at all within ``check_interval`` of the
last one, which the service sets): the YAML is parsed once per change of the
file's (mtime, size, inode). A file that cannot be read or parsed fails
closed: every plugin loses every override, the last good model route stays in
use, and one error is logged per change. Nothing else in the project parses
config.yaml.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from audit.settings import AuditSettings, parse_audit_settings
from plugin_llm.hardened.safe_files import MIB, UnsafeFileError, read_home_text
from plugin_llm.hardened.bounded_repr import short_repr
from plugin_llm.config.values import did_you_mean, parse_bool
from plugin_llm.limits.settings import LimitSettings, parse_limit_settings
from plugin_llm.hardened.safe_yaml import load_yaml
from plugin_llm.config.auxiliary import TaskSlot, parse_auxiliary
from plugin_llm.config.breakers import BreakerPolicy, parse_breaker_policy
from plugin_llm.config.routes import (
    DEFAULT_LOCAL_MODEL,
    LOCAL_PROVIDER,
    RouteConfig,
    parse_default_route,
    parse_models,
    register_url_secrets,
    shown_url,
)
from plugin_llm.config.service import ServiceSettings, parse_service_settings
from plugin_llm.config.telemetry import TelemetrySettings, parse_telemetry_settings
from plugin_llm.trust import DENY_ALL, LIST_KEYS, TRUST_KEYS, TrustPolicy, config_path

__all__ = [
    "hermes_home",
    "ModelConfig",
    "LlmSettings",
    "HostConfig",
    "ConfigSource",
    "get_config_source",
    "parse_config",
    "parse_bool",
    "GOVERNED_SECTIONS",
    "HOST_SECTIONS",
    "unknown_sections",
    "top_level_warnings",
    "LOCAL_PROVIDER",
    "DEFAULT_LOCAL_MODEL",
    "RouteConfig",
    "shown_url",
    "register_url_secrets",
]

log = logging.getLogger("plugin_llm.config")

#: config.yaml is refused beyond this size (a real one is a few KiB)
CONFIG_MAX_BYTES = 4 * MIB

#: the default route (``model:``) is a route like those of the catalog
ModelConfig = RouteConfig


def hermes_home(env: Mapping[str, str] | None = None) -> Path:
    """``$HERMES_HOME``, else ``~/.hermes`` (not created here)."""
    env = os.environ if env is None else env
    raw = env.get("HERMES_HOME", "").strip()
    return Path(raw).expanduser() if raw else Path("~/.hermes").expanduser()


@dataclass(frozen=True)
class LlmSettings:
    """Host-wide call settings (``llm:``)."""

    timeout: float = 30.0
    max_timeout: float = 300.0
    max_retries: int = 2
    structured_repair_attempts: int = 1
    #: when a route of a chain is skipped after repeated failures (``llm.breaker``)
    breaker: BreakerPolicy = BreakerPolicy()


@dataclass(frozen=True)
class HostConfig:
    """One parsed, validated snapshot of config.yaml."""

    home: Path
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)  # model.base_url may hold a password
    model: ModelConfig = ModelConfig()
    #: the model catalog (``models:``): named routes plugins may ask for by name
    models: Mapping[str, RouteConfig] = field(default_factory=lambda: MappingProxyType({}))
    #: the auxiliary tasks' routes (``auxiliary:``): task key -> slot
    auxiliary: Mapping[str, TaskSlot] = field(default_factory=lambda: MappingProxyType({}))
    llm: LlmSettings = LlmSettings()
    audit: AuditSettings = AuditSettings()
    trust: Mapping[str, TrustPolicy] = field(default_factory=dict)
    #: budgets and rate limits (``limits:`` and ``plugins.entries.<id>.limits``)
    limits: LimitSettings = LimitSettings()
    #: ``plugin-llm serve``'s settings (``service:``)
    service: ServiceSettings = ServiceSettings()
    #: live OpenTelemetry traces and metrics (``telemetry:``; off unless an endpoint is set)
    telemetry: TelemetrySettings = TelemetrySettings()
    warnings: tuple[str, ...] = ()
    #: set when the file could not be read or parsed (fail-closed snapshot)
    error: str | None = None

    @property
    def path(self) -> Path:
        return self.home / "config.yaml"

    @property
    def closed_reason(self) -> str | None:
        """Why every override is refused when config.yaml is unusable (None when it is fine): the
        words every denial and every command use, so nobody chases a flag that *is* set."""
        if self.error is None:
            return None
        return f"config.yaml does not parse ({self.error}): the trust gate is closed until it is fixed"

    def trust_for(self, plugin_id: str) -> TrustPolicy:
        return self.trust.get(plugin_id, DENY_ALL)

    def trust_sha256(self) -> str:
        """SHA-256 of the effective trust policy (audited on reloads)."""
        blob = {k: vars(v) for k, v in sorted(self.trust.items())}
        return hashlib.sha256(json.dumps(blob, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --------------------------------------------------------------- value parsing

def _number(section: Mapping[str, Any], key: str, default: float, where: str, warnings: list[str], *, integer: bool = False) -> Any:
    value = section.get(key, default)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value < 0 or (not integer and value == 0):
        warnings.append(f"{where}.{key}: expected a {'non-negative integer' if integer else 'positive number'}, got {short_repr(value)}; using {default}")
        return default
    return value



def _parse_llm(raw: Any, warnings: list[str]) -> LlmSettings:
    if raw is None:
        return LlmSettings()
    if not isinstance(raw, Mapping):
        warnings.append("llm: expected a mapping; using defaults")
        return LlmSettings()
    d = LlmSettings()
    known = set(vars(d))
    for key in raw:
        if key not in known:
            warnings.append(f"llm.{key}: unknown setting{did_you_mean(str(key), known)}")
    timeout = _number(raw, "timeout", d.timeout, "llm", warnings)
    max_timeout = _number(raw, "max_timeout", d.max_timeout, "llm", warnings)
    return LlmSettings(
        timeout=min(timeout, max_timeout),
        max_timeout=max_timeout,
        max_retries=_number(raw, "max_retries", d.max_retries, "llm", warnings, integer=True),
        structured_repair_attempts=_number(raw, "structured_repair_attempts", d.structured_repair_attempts, "llm", warnings, integer=True),
        breaker=parse_breaker_policy(raw.get("breaker"), "llm.breaker", warnings),
    )


def _audit_settings(raw: Any, warnings: list[str]) -> AuditSettings:
    settings, problems = parse_audit_settings(raw)  # audit/ owns its section's rules
    warnings.extend(problems)
    return settings


def _parse_allowlist(value: Any, where: str, warnings: list[str]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value if isinstance(v, (str, int, float)) and str(v).strip()]
        if len(items) != len(value):
            warnings.append(f"{where}: non-string or blank entries ignored")
        return tuple(items)
    example = value if isinstance(value, str) and len(value) <= 60 else "a, b"
    warnings.append(f"{where}: expected a list, got {type(value).__name__} {short_repr(value)}; nothing is allowed until it is a list (e.g. [{example}])")
    return ()


def _parse_trust(plugins: Any, warnings: list[str]) -> dict[str, TrustPolicy]:
    if plugins is None:
        return {}
    if not isinstance(plugins, Mapping):
        warnings.append("plugins: expected a mapping; no plugin has any LLM override")
        return {}
    entries = plugins.get("entries") or {}
    if not isinstance(entries, Mapping):
        warnings.append("plugins.entries: expected a mapping of plugin id -> settings; no plugin has any LLM override")
        return {}
    policies: dict[str, TrustPolicy] = {}
    for plugin_id, entry in entries.items():
        plugin_id = str(plugin_id)
        if entry is None:
            continue
        block = entry.get("llm") if isinstance(entry, Mapping) else None
        granted = _granted_capabilities(plugin_id, entry, warnings)
        if block is None:
            if granted:
                policies[plugin_id] = TrustPolicy(granted_capabilities=granted)
            continue
        if not isinstance(block, Mapping):
            warnings.append(f"{config_path(plugin_id, '')[:-1]}: expected a mapping; no override granted")
            continue
        values: dict[str, Any] = {}
        for key, value in block.items():
            key = str(key)
            where = config_path(plugin_id, key)
            if key not in TRUST_KEYS:
                warnings.append(f"{where}: unknown key, ignored{did_you_mean(key, TRUST_KEYS)}")
            elif key in LIST_KEYS.values():
                values[key] = _parse_allowlist(value, where, warnings)
            else:
                values[key] = parse_bool(value, where, warnings)
        policies[plugin_id] = TrustPolicy(**values, granted_capabilities=granted)
    return policies


def _granted_capabilities(plugin_id: str, entry: Any, warnings: list[str]) -> tuple[str, ...]:
    """What ``granted_capabilities`` grants (see :func:`plugin_llm.capabilities.parse_grant`)."""
    from plugin_llm.capabilities import parse_grant

    grant = parse_grant(plugin_id, entry)
    warnings.extend(grant.problems)
    return grant.granted


def parse_config(home: Path, text: str) -> HostConfig:
    """Parse config.yaml text into a snapshot; raises ``yaml.YAMLError`` or ``ValueError``.

    Parsed by :func:`plugin_llm.hardened.safe_yaml.load_yaml`: alias bombs, recursive
    aliases, absurd nesting and a duplicate key in :data:`GOVERNED_SECTIONS`
    are refused (a ``yaml.YAMLError`` with the line).
    """
    data = load_yaml(text, unique_keys=GOVERNED_SECTIONS)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ValueError(f"the top level must be a mapping, got {type(data).__name__}")
    warnings: list[str] = []
    _check_top_level(data, warnings)
    plugins = data.get("plugins")
    limits, limit_issues = parse_limit_settings(data.get("limits"), plugins)
    models = parse_models(data.get("models"), warnings)
    default = parse_default_route(data.get("model"), models, warnings)
    return HostConfig(
        home=home,
        raw=MappingProxyType(dict(data)),
        model=default,
        models=models,
        auxiliary=parse_auxiliary(data.get("auxiliary"), models, default, warnings),
        llm=_parse_llm(data.get("llm"), warnings),
        audit=_audit_settings(data.get("audit"), warnings),
        trust=MappingProxyType(_parse_trust(plugins, warnings)),
        limits=limits,
        service=parse_service_settings(data.get("service"), warnings),
        telemetry=parse_telemetry_settings(data.get("telemetry"), warnings),
        warnings=(*warnings, *map(str, limit_issues)),
    )


#: the top-level sections this host reads
HOST_SECTIONS = ("model", "models", "auxiliary", "llm", "audit", "plugins", "limits", "memory", "image_gen", "context",
                 "service", "telemetry")
#: sections that decide trust, routing, limits, the service and auditing: a key written twice in them (at any
#: depth), or one of them written twice, makes the file unusable (fail closed), never "the last one wins"
GOVERNED_SECTIONS = frozenset(("plugins", "limits", "service", "audit", "model", "models", "auxiliary", "llm"))
#: top-level sections of a Hermes config.yaml this host ignores (an operator's existing file is not "wrong"):
#: Hermes 0.19's DEFAULT_CONFIG and _EXTRA_KNOWN_ROOT_KEYS (hermes_cli/config.py), the legacy root keys it
#: migrates (provider, base_url, api_base, context_length, max_turns) and the older flat terminal keys
_HERMES_SECTIONS = frozenset((
    "_config_version agent always_log_local api_base approvals backend base_url bedrock browser checkpoints "
    "code_execution command_allowlist compression computer_use container_cpu container_disk container_memory "
    "container_persistent context_file_max_chars context_length credential_pool_strategies cron curator "
    "custom_providers cwd dashboard daytona_image delegation desktop discord display docker_env docker_extra_args "
    "docker_forward_env docker_image docker_mount_cwd_to_workspace docker_network docker_orphan_reaper "
    "docker_persist_across_processes docker_run_as_host_user docker_volumes fallback_model fallback_providers "
    "file_read_max_chars filter_silence_narration gateway goals group_sessions_per_user honcho hooks "
    "hooks_auto_accept human_delay kanban known_plugin_toolsets lifetime_seconds logging lsp matrix mattermost "
    "max_concurrent_sessions max_live_sessions max_turns mcp mcp_discovery_timeout mcp_servers moa modal_image "
    "modal_mode model_catalog multiplex_profiles network onboarding openrouter paste_collapse_char_threshold "
    "paste_collapse_threshold paste_collapse_threshold_fallback persistent_shell personalities platform_hints "
    "platform_toolsets platforms prefill_messages_file privacy profile_routes prompt_caching provider providers "
    "quick_commands require_mention reset_triggers sandbox_dir secrets security session_reset sessions signal "
    "singularity_image skills slack smart_model_routing ssh_host ssh_key ssh_port ssh_user streaming stt "
    "stt_echo_transcripts telegram terminal thread_sessions_per_user timeout timezone tool_loop_guardrails "
    "tool_output tools toolsets tts unauthorized_dm_behavior updates vertex video_gen voice web whatsapp x_search"
).split())


def unknown_sections(data: Mapping[Any, Any]) -> list[tuple[Any, str | None]]:
    """Each top-level key that is neither this host's nor Hermes's, with the host section it is closest to
    (``limts`` -> ``limits``; None when none is close): a typo silently drops that section."""
    out: list[tuple[Any, str | None]] = []
    for key in data:
        if isinstance(key, str) and (key in HOST_SECTIONS or key in _HERMES_SECTIONS):
            continue
        close = difflib.get_close_matches(key.strip().lower(), HOST_SECTIONS, n=1, cutoff=0.7) if isinstance(key, str) else []
        out.append((key, close[0] if close else None))
    return out


def top_level_warnings(data: Mapping[Any, Any]) -> list[str]:
    """The config warnings of :func:`unknown_sections` (the gateway logs them; ``trust check`` and
    ``doctor`` report them as errors)."""
    out = []
    for key, close in unknown_sections(data):
        hint = f" (did you mean {close!r}?)" if close else " (neither this host's nor a Hermes section)"
        out.append(f"{short_repr(key)}: unknown top-level section{hint}; it is ignored")
    return out


def _check_top_level(data: Mapping[str, Any], warnings: list[str]) -> None:
    """An unknown top-level key is a typo until shown otherwise (``limts:`` silently drops every budget)."""
    warnings.extend(top_level_warnings(data))


def describe_yaml_error(path: Path, exc: Exception) -> str:
    """``<file>:<line>:<col>: <problem>`` for the CLI and the log."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"{path}:{mark.line + 1}:{mark.column + 1}: {problem}"
    return f"{path}: {problem}"


class ConfigSource:
    """Hot-reloading view of ``<home>/config.yaml``; thread-safe.

    ``check_interval`` (seconds, 0: every call) is how long a snapshot is used without looking at the file
    again: a change takes effect within it. ``clock`` is a monotonic clock (tests inject one).
    """

    def __init__(self, home: Path | None = None, *, check_interval: float = 0.0, clock=time.monotonic) -> None:
        self.home = Path(home) if home is not None else hermes_home()
        self.path = self.home / "config.yaml"
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._current = HostConfig(home=self.home)
        self._last_good: HostConfig | None = None
        self._listeners: list = []
        self._clock = clock
        self.check_interval = check_interval
        self._checked_at = 0.0

    def set_check_interval(self, seconds: float) -> None:
        """Look at the file at most once per ``seconds`` (a long-running process serving many calls)."""
        self.check_interval = max(0.0, float(seconds))

    def on_reload(self, callback) -> None:
        """Call ``callback(old, new)`` after each (re)load; ``old`` is None for the first load."""
        self._listeners.append(callback)

    def loaded(self) -> HostConfig | None:
        """The snapshot last loaded, without checking the file; None before the first load."""
        return self._current if self._stamp is not None else None

    def current(self) -> HostConfig:
        if self.check_interval:
            now = self._clock()
            if self._stamp is not None and now - self._checked_at < self.check_interval:
                return self._current
            self._checked_at = now
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = (0, -1, 0)
        except OSError as exc:  # unreadable directory etc.: fail closed
            stamp = (-1, -1, -1)
            return self._reload(stamp, error=f"{self.path}: cannot stat: {exc.strerror}")
        if stamp == self._stamp:
            return self._current
        return self._reload(stamp)

    def _reload(self, stamp: tuple[int, int, int], error: str | None = None) -> HostConfig:
        with self._lock:
            if stamp == self._stamp:
                return self._current
            old = self._current if self._stamp is not None else None  # None: first load
            new = self._load(stamp, error)
            self._current, self._stamp = new, stamp
        for callback in list(self._listeners):
            try:
                callback(old, new)
            except Exception:  # a listener never breaks a call
                log.exception("config reload listener failed")
        return new

    def _load(self, stamp: tuple[int, int, int], error: str | None) -> HostConfig:
        if error is None and stamp[1] == -1:
            snapshot = HostConfig(home=self.home)  # no config.yaml: local model, no overrides
        else:
            snapshot = None
            if error is None:
                try:
                    # Bounded, never blocks: a FIFO or a device in its place is an error, not a hang.
                    text = read_home_text(self.path, max_bytes=CONFIG_MAX_BYTES)
                    snapshot = parse_config(self.home, text or "")
                except yaml.YAMLError as exc:
                    error = describe_yaml_error(self.path, exc)
                except UnsafeFileError as exc:
                    error = str(exc)
                except (OSError, UnicodeDecodeError, ValueError) as exc:
                    error = f"{self.path}: {getattr(exc, 'strerror', None) or exc}"
        if snapshot is not None:
            for warning in snapshot.warnings:
                log.warning("config.yaml: %s", warning)
            self._last_good = snapshot
            return snapshot
        # Fail closed: no overrides for anyone; keep the last good route, settings and limits.
        log.error("config.yaml is unusable, every plugin override is refused until it is fixed: %s", error)
        base = self._last_good or HostConfig(home=self.home)
        return HostConfig(
            home=self.home,
            raw=base.raw,
            model=base.model,
            models=base.models,
            auxiliary=base.auxiliary,
            llm=base.llm,
            audit=base.audit,
            trust=MappingProxyType({}),
            limits=base.limits,
            service=base.service,
            telemetry=base.telemetry,
            warnings=(),
            error=error,
        )


_SOURCES: dict[Path, ConfigSource] = {}
_SOURCES_LOCK = threading.Lock()


def get_config_source(home: Path | None = None) -> ConfigSource:
    """The process-wide :class:`ConfigSource` of a home (one per resolved path)."""
    path = (Path(home) if home is not None else hermes_home()).expanduser()
    key = path.resolve()
    with _SOURCES_LOCK:
        source = _SOURCES.get(key)
        if source is None:
            source = _SOURCES[key] = ConfigSource(path)
    from plugin_llm.home_env import load_home_env

    load_home_env(path)  # once per home: <home>/.env, before plugins or credentials need it
    return source
