"""What ``plugin-llm trust`` and ``doctor`` report about the trust policy.

Reads ``config.yaml`` once (:func:`read_config`: the same
:func:`plugin_llm.config.parse_config` the gateway uses, plus PyYAML's
``compose`` for the line of every key) and derives, without side effects:

- :func:`effective_policies`: every plugin's effective policy, each value
  with its provenance (``config.yaml line N`` or the fail-closed default);
- :func:`check_plugins`: findings about the whole ``plugins:`` section, each
  with a severity, the config path, the problem and the fix;
- :func:`explain`: a dry run of the gate (:func:`plugin_llm.trust.decide`,
  the gateway's own function) with the YAML that would allow a denied call.

Never imports litellm: model names are checked against litellm's bundled
price map, read as a JSON file.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from plugin_llm.hardened.bounded_repr import short_repr
from plugin_llm.capabilities import parse_grant
from plugin_llm.config import (
    CONFIG_MAX_BYTES,
    HOST_SECTIONS,
    HostConfig,
    describe_yaml_error,
    parse_config,
    shown_url,
    unknown_sections,
)
from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.limits import check_limits, parse_limit_settings
from plugin_llm.plugins.discovery import discover_candidates
from plugin_llm.provider_names import closest_provider, provider_fix, unknown_provider_problem
from plugin_llm.routing import resolve_chain
from plugin_llm.hardened.safe_files import UnsafeFileError, read_home_text
from plugin_llm.hardened.safe_yaml import compose_yaml
from plugin_llm.trust import (CAPABILITY_FOR, DENY_ALL, FLAG_KEYS, LIST_KEYS, TASK_FLAG, TRUST_KEYS, Decision,
                              Overrides, TrustPolicy, decide)

__all__ = [
    "ERROR",
    "WARNING",
    "OVERRIDES",
    "PLUGINS_KEYS",
    "ENTRY_KEYS",
    "Finding",
    "ConfigView",
    "Setting",
    "PluginTrust",
    "Explanation",
    "read_config",
    "installed_plugins",
    "resolve_plugin_id",
    "configured_plugin_ids",
    "effective_policy",
    "effective_policies",
    "check_plugins",
    "limit_parse_issues",
    "explain",
    "yaml_snippet",
    "entry_key",
    "litellm_model_names",
    "litellm_knows_model",
]

ERROR = "error"
WARNING = "warning"
#: the four overrides, in the order TrustPolicy lists them
OVERRIDES = tuple(FLAG_KEYS)
#: keys the host understands directly under ``plugins:``
PLUGINS_KEYS = ("enabled", "disabled", "hook_timeout", "hook_callback_timeout", "entries", "isolation_limits")
#: keys the host understands under ``plugins.entries.<id>``
ENTRY_KEYS = ("llm", "limits", "allow_tool_override", "granted_capabilities", "capabilities_sha256", "isolation",
              "isolation_limits", "isolation_network", "mcp_allowlist",
              # written by Hermes: its consent record and the older keys of its chat-platform capabilities
              "capabilities_consent", "allow_platform_actions", "allow_plugin_status")
_POLICY_ORDER = tuple(TrustPolicy.__dataclass_fields__)
_LIST_FLAG = {lst: FLAG_KEYS[name] for name, lst in LIST_KEYS.items()}
_DEFAULT_FLAG = "default (fail closed)"
_DEFAULT_LIST = "default (no allowlist)"
_PLAIN_SCALAR = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/@+]*")
#: model names served by the embedded model (any ``local-*`` name) or an operator endpoint
_UNCHECKED_PROVIDERS = frozenset({"local", "custom"})
_PRICE_MAP = "model_prices_and_context_window_backup.json"


# ------------------------------------------------------------------ values
@dataclass(frozen=True)
class Finding:
    """One problem in config.yaml: what is wrong, where, and how to fix it."""

    severity: str  # ERROR | WARNING
    path: str  # dotted config path, e.g. plugins.entries."image_gen/openai".llm.allowed_models
    problem: str
    fix: str
    line: int | None = None
    plugin_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "path": self.path,
            "line": self.line,
            "problem": self.problem,
            "fix": self.fix,
            "plugin_id": self.plugin_id,
        }


@dataclass(frozen=True)
class ConfigView:
    """One read of ``config.yaml``: the gateway's parse plus the line of every key.

    When the file cannot be read or parsed, ``error`` says where and why
    (``file:line:col: problem``) and ``config`` is the fail-closed snapshot:
    no plugin has any override.
    """

    home: Path
    path: Path
    exists: bool
    config: HostConfig
    lines: Mapping[tuple[Any, ...], int] = field(default_factory=dict)
    duplicates: tuple[tuple[tuple[Any, ...], int], ...] = ()
    error: str | None = None
    error_line: int | None = None

    @property
    def raw(self) -> Mapping[str, Any]:
        return self.config.raw if self.error is None else {}

    def line(self, *keys: Any) -> int | None:
        return self.lines.get(tuple(keys))

    def line_of_path(self, path: str) -> int | None:
        """The line of a dotted config path (``plugins.entries."image_gen/openai".limits.budget_usd.day``):
        that of its longest prefix written in the file, e.g. the block's when the key itself is missing.
        A key is matched exactly first, then ignoring case and surrounding blanks (``limits.prices``
        paths carry the model name lower-cased)."""
        keys = _path_keys(path)
        folded: dict[tuple[str, ...], int] | None = None
        for end in range(len(keys), 0, -1):
            line = self.lines.get(keys[:end])
            if line is not None:
                return line
            if folded is None:
                folded = {}
                for written, at in self.lines.items():
                    folded.setdefault(tuple(str(k).strip().lower() for k in written), at)
            line = folded.get(tuple(k.strip().lower() for k in keys[:end]))
            if line is not None:
                return line
        return None

    def source(self, *keys: Any, default: str = _DEFAULT_FLAG) -> str:
        line = self.line(*keys)
        return f"{self.path.name} line {line}" if line is not None else default


@dataclass(frozen=True)
class Setting:
    """One trust key of one plugin: its effective value and where it came from."""

    key: str
    value: Any  # bool for flags; tuple of names or None (no allowlist) for lists
    source: str
    line: int | None = None
    #: the value as written, when it was not understood as is (e.g. ``"yes"``)
    written: Any = None

    def display(self) -> str:
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        if self.value is None:
            return "(no allowlist: any value once the flag is on)"
        if not self.value:
            return "[] (nothing allowed)"
        return "[" + ", ".join(self.value) + "]"

    def as_dict(self) -> dict[str, Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        out = {"key": self.key, "value": value, "source": self.source, "line": self.line}
        if self.written is not None:
            out["written"] = self.written
        return out


@dataclass(frozen=True)
class PluginTrust:
    """The effective policy of one plugin, with provenance and its findings."""

    plugin_id: str
    installed: bool
    has_entry: bool  # a ``plugins.entries.<id>`` entry exists
    entry_line: int | None
    policy: TrustPolicy
    settings: tuple[Setting, ...]
    findings: tuple[Finding, ...] = ()

    #: config.yaml does not parse: every override is refused
    fail_closed: bool = False

    @property
    def summary(self) -> str:
        if self.fail_closed:
            return "fail closed: config.yaml does not parse, no overrides"
        if not self.has_entry:
            return "no entry: no overrides"
        granted = []
        for name, flag in FLAG_KEYS.items():
            by = self.policy.grants(name)
            if by is not None:
                via = f" (by {by})" if by != flag else ""
                allowlist = getattr(self.policy, LIST_KEYS[name]) if name in LIST_KEYS else None
                if allowlist is None:
                    granted.append(name + via)
                elif not allowlist:
                    granted.append(f"{name}{via} (allowlist empty: nothing)")
                else:
                    granted.append(f"{name}{via} in [{', '.join(allowlist)}]")
        by = self.policy.grants_task()
        if by is not None:
            granted.append("task (built-in tasks)" + (f" (by {by})" if by != TASK_FLAG else ""))
        return "may override " + "; ".join(granted) if granted else "no overrides granted"

    def as_dict(self) -> dict[str, Any]:
        return {
            "plugin_id": self.plugin_id,
            "installed": self.installed,
            "entry": self.has_entry,
            "entry_line": self.entry_line,
            "fail_closed": self.fail_closed,
            "summary": self.summary,
            "policy": {s.key: (list(s.value) if isinstance(s.value, tuple) else s.value) for s in self.settings},
            "settings": [s.as_dict() for s in self.settings],
            "granted_capabilities": list(self.policy.granted_capabilities),
            "granted_by": {**{name: self.policy.grants(name) for name in FLAG_KEYS if self.policy.grants(name)},
                           **({"task": self.policy.grants_task()} if self.policy.grants_task() else {})},
            "warnings": [f.as_dict() for f in self.findings],
        }


@dataclass(frozen=True)
class Explanation:
    """A dry run of the gate for one plugin and a set of requested overrides."""

    plugin_id: str
    installed: bool
    overrides: Overrides
    decision: Decision
    #: why, one line per requested override (or "no overrides requested")
    rules: tuple[str, ...]
    #: trust keys (under ``plugins.entries.<id>.llm``) that would allow the call -> value
    changes: Mapping[str, Any] = field(default_factory=dict)
    snippet: str | None = None
    #: equivalent ``plugin-llm trust grant`` commands
    commands: tuple[str, ...] = ()
    #: broader grants that would allow the call too, second choice: ``(command, what it allows)``
    broader: tuple[tuple[str, str], ...] = ()
    route: Mapping[str, Any] | None = None
    route_error: str | None = None
    config_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "plugin_id": self.plugin_id,
            "installed": self.installed,
            "requested": self.overrides.requested(),
            "active_provider": self.overrides.active_provider,
            "allowed": self.decision.allowed,
            "reason": self.decision.reason,
            "config_key": self.decision.config_key,
            "override": self.decision.override,
            "rules": list(self.rules),
            "changes": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in self.changes.items()},
            "snippet": self.snippet,
            "commands": list(self.commands),
            "broader": [{"command": c, "allows": a} for c, a in self.broader],
            "route": dict(self.route) if self.route is not None else None,
            "route_error": self.route_error,
            "config_error": self.config_error,
        }


# ------------------------------------------------------------------ reading
def _index_lines(
    node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int], dups: list[tuple[tuple[Any, ...], int]]
) -> None:
    """1-based line of every mapping key and sequence item under ``node``."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node.value)
            here = path + (str(key),)
            if here in out:  # the last one wins, like the parser
                dups.append((here, out[here]))
            out[here] = key_node.start_mark.line + 1
            _index_lines(value_node, here, out, dups)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[path + (i,)] = item.start_mark.line + 1
            _index_lines(item, path + (i,), out, dups)


def read_config(home: Path) -> ConfigView:
    """Read and parse ``<home>/config.yaml`` the way the gateway does (never raises)."""
    home = Path(home)
    path = home / "config.yaml"
    fail_closed = HostConfig(home=home)
    try:
        text = read_home_text(path, max_bytes=CONFIG_MAX_BYTES)  # never blocks on a FIFO, bounded
    except UnsafeFileError as exc:
        error = str(exc)
        return ConfigView(home, path, True, replace(fail_closed, error=error), error=error)
    if text is None:
        return ConfigView(home, path, False, fail_closed)
    try:
        config = parse_config(home, text)
        node = compose_yaml(text)  # the same bounded loader: checked before any walk below
    except yaml.YAMLError as exc:
        error = describe_yaml_error(path, exc)
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        return ConfigView(home, path, True, replace(fail_closed, error=error), error=error, error_line=line)
    except ValueError as exc:
        error = f"{path}: {exc}"
        return ConfigView(home, path, True, replace(fail_closed, error=error), error=error, error_line=1)
    lines: dict[tuple[Any, ...], int] = {}
    dups: list[tuple[tuple[Any, ...], int]] = []
    if node is not None:
        _index_lines(node, (), lines, dups)
    return ConfigView(home, path, True, config, lines, tuple(dups))


def installed_plugins(home: Path) -> dict[str, str]:
    """``{key: name}`` of every plugin discovery finds (nothing is imported or loaded)."""
    return {key: cand.name for key, cand in discover_candidates(Path(home)).items()}


def legacy_key_of(name: str, installed: Mapping[str, str]) -> str | None:
    """The key of the nested plugin that ``name`` named under the old ``<category>/<manifest name>``
    scheme (``browser/browser-browser-use`` -> ``browser/browser_use``), or None."""
    category, sep, leaf = name.partition("/")
    if not sep:
        return None
    matches = [k for k, n in installed.items() if "/" in k and k.split("/", 1)[0] == category and n == leaf
               and k != name]
    return matches[0] if len(matches) == 1 else None


def resolve_plugin_id(name: str, installed: Mapping[str, str], configured: Iterable[str] = ()) -> tuple[str, str | None]:
    """The trust identity for what the operator typed, and a note when it was resolved.

    An exact key (installed or already configured) is used as is; otherwise a
    unique manifest name or bare leaf (``openai`` for ``image_gen/openai``)
    resolves to its key, since an entry under the wrong id grants nothing.
    """
    name = name.strip()
    if name in installed or name in set(configured):
        return name, None
    matches = sorted({k for k, n in installed.items() if n == name or k.rsplit("/", 1)[-1] == name})
    if len(matches) == 1:
        return matches[0], f"{name!r} is the plugin {matches[0]!r} (its trust identity is the key)"
    return name, None


# ------------------------------------------------------------------ effective policy
def entry_key(plugin_id: str) -> str:
    """The plugin id as written in a dotted path or YAML key: quoted like
    :func:`plugin_llm.trust.config_path` does (``"image_gen/openai"``), and
    whenever YAML would read the bare word as something else (``null``, ``123``)."""
    plain = plugin_id.replace("-", "").replace("_", "").isalnum() and _scalar(plugin_id) == plugin_id
    return plugin_id if plain else json.dumps(plugin_id)


def _path(*keys: Any) -> str:
    parts = []
    for i, key in enumerate(keys):
        if isinstance(key, int):
            parts[-1] += f"[{key}]"
        elif i == 2 and keys[:2] == ("plugins", "entries"):
            parts.append(entry_key(str(key)))
        else:
            parts.append(str(key))
    return ".".join(parts)


#: one segment of a dotted path: a double-quoted key (``"image_gen/openai"``) or a plain one
_PATH_SEGMENT = re.compile(r'"((?:[^"\\]|\\.)*)"(?=\.|$)|([^.]+)')


def _path_keys(path: str) -> tuple[str, ...]:
    """``plugins.entries."image_gen/openai".limits`` -> ``("plugins", "entries", "image_gen/openai", "limits")``:
    the key tuple of a dotted path as :func:`_path` and :func:`plugin_llm.limits.limits_path` write it."""
    keys: list[str] = []
    for match in _PATH_SEGMENT.finditer(path):
        quoted, plain = match.groups()
        if plain is not None:
            keys.append(plain)
            continue
        try:
            keys.append(json.loads(f'"{quoted}"'))
        except ValueError:  # quoted without JSON escapes: the text between the quotes
            keys.append(quoted)
    return tuple(keys)


def _entries(raw: Mapping[str, Any]) -> Mapping[Any, Any]:
    plugins = raw.get("plugins")
    entries = plugins.get("entries") if isinstance(plugins, Mapping) else None
    return entries if isinstance(entries, Mapping) else {}


def configured_plugin_ids(view: ConfigView) -> list[str]:
    """The plugin ids under ``plugins.entries``, in file order."""
    return [str(k) for k in _entries(view.raw)]


def effective_policy(view: ConfigView, plugin_id: str, installed: Mapping[str, str], findings: Iterable[Finding] = ()) -> PluginTrust:
    """The policy the gateway applies to ``plugin_id`` right now, key by key."""
    entries = _entries(view.raw)
    has_entry = view.error is None and plugin_id in {str(k) for k in entries}
    policy = view.config.trust_for(plugin_id)
    entry = next((v for k, v in entries.items() if str(k) == plugin_id), None) if has_entry else None
    block = entry.get("llm") if isinstance(entry, Mapping) else None
    block = block if isinstance(block, Mapping) else {}
    settings = []
    for key in _POLICY_ORDER:
        value = getattr(policy, key)
        keys = ("plugins", "entries", plugin_id, "llm", key)
        written = None
        line = None
        if key == "granted_capabilities":  # written beside llm:, not in it
            keys = keys[:3] + (key,)
            block_of_key: Mapping[Any, Any] = entry if isinstance(entry, Mapping) else {}
        else:
            block_of_key = block
        if view.error is not None:
            source = f"fail closed ({view.path.name} does not parse)"
        elif key in block_of_key:
            line = _written_line(view, keys)
            source = f"{view.path.name} line {line}" if line is not None else view.path.name
            raw = block_of_key[key]
            if key in _LIST_FLAG or key == "granted_capabilities":
                written = raw if raw is not None and not isinstance(raw, list) else None
                if key == "granted_capabilities" and isinstance(raw, list) and raw and not value:
                    written = raw  # its digest does not match, or no capability is known: nothing granted
            elif not isinstance(raw, bool):
                written = raw
        else:
            source = _DEFAULT_LIST if key in _LIST_FLAG else _DEFAULT_FLAG
        settings.append(Setting(key, value, source, line, written))
    mine = tuple(f for f in findings if f.plugin_id == plugin_id)
    return PluginTrust(
        plugin_id, plugin_id in installed, has_entry, view.line("plugins", "entries", plugin_id),
        policy, tuple(settings), mine, fail_closed=view.error is not None,
    )


def _written_line(view: ConfigView, keys: tuple[Any, ...]) -> int | None:
    """The line of a key read from the file: its own, else (merged in by ``<<: *anchor``) the merge key's,
    else its block's."""
    line = view.line(*keys)
    if line is None:
        line = view.line(*keys[:-1], "<<")
    return line if line is not None else view.line(*keys[:-1])


def _source(view: ConfigView, keys: tuple[Any, ...]) -> str:
    """Where a trust key's value came from: its line when it is in the parsed file (merged in or not),
    else the fail-closed default."""
    block: Any = view.raw
    for key in keys[:-1]:
        block = next((v for k, v in block.items() if str(k) == key), None) if isinstance(block, Mapping) else None
    if not isinstance(block, Mapping) or keys[-1] not in block:
        return view.source(*keys)
    line = _written_line(view, keys)
    return f"{view.path.name} line {line}" if line is not None else view.path.name


def effective_policies(view: ConfigView, installed: Mapping[str, str], findings: Iterable[Finding] = ()) -> list[PluginTrust]:
    """Every installed plugin and every configured entry, sorted by plugin id."""
    findings = list(findings)
    ids = set(installed) | {str(k) for k in _entries(view.raw)}
    return [effective_policy(view, pid, installed, findings) for pid in sorted(ids)]


# ------------------------------------------------------------------ litellm's model names
def _price_map_path() -> Path | None:
    spec = importlib.util.find_spec("litellm")  # locates the package, does not import it
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return Path(locations[0]) / _PRICE_MAP if locations else None


#: a top-level key of the price map as litellm writes the file; nested keys are indented deeper
_TOP_LEVEL_KEY = re.compile(rb'\n    "([^"\\]*)": \{')


@functools.lru_cache(maxsize=1)
def _listed_model_names() -> frozenset[str] | None:
    """Top-level keys of the price map found by a regex over the raw file (~10 ms, not ~40).

    None when the file is missing or not laid out as expected (then only the
    JSON parse is used)."""
    path = _price_map_path()
    try:
        data = path.read_bytes().lower() if path is not None else None
    except OSError:
        return None
    if not data or b'\n    "sample_spec": {' not in data:
        return None
    return frozenset(k.decode("utf-8", "replace").strip() for k in _TOP_LEVEL_KEY.findall(data))


@functools.lru_cache(maxsize=1)
def litellm_model_names() -> frozenset[str] | None:
    """Lower-cased model names of litellm's bundled price map, or None without litellm.

    Parsed with :mod:`json` (``find_spec`` locates the package without importing it).
    """
    path = _price_map_path()
    if path is None:
        return None
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return frozenset(str(k).strip().lower() for k in data if k != "sample_spec")


def _candidates(name: str) -> list[str]:
    wanted = name.strip().lower()
    provider, sep, rest = wanted.partition("/")
    return [wanted, rest] if sep and rest else [wanted]


def litellm_knows_model(name: str, names: frozenset[str] | None = None) -> bool | None:
    """Whether litellm knows ``name`` (``provider/model`` or bare); None when it cannot tell.

    A name among the keys found by a regex over the file is known; anything
    else is confirmed against the parsed JSON (once per process), so a change
    of the file's layout can only cost time, never a wrong warning.
    """
    if names is None:
        listed = _listed_model_names()
        if listed is not None and any(c in listed for c in _candidates(name)):
            return True
        names = litellm_model_names()
    if names is None:
        return None
    return any(c in names for c in _candidates(name))


def _model_unchecked(name: str) -> bool:
    lowered = name.strip().lower()
    provider, sep, _ = lowered.partition("/")
    return lowered == "*" or lowered.startswith("local-") or (bool(sep) and provider in _UNCHECKED_PROVIDERS)


# ------------------------------------------------------------------ check
def _did_you_mean(word: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def _type_name(value: Any) -> str:
    return {str: "a string", int: "a number", float: "a number", dict: "a mapping", bool: "a boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _flow_list(values: Iterable[Any]) -> str:
    return "[" + ", ".join(_scalar(str(v)) for v in values) + "]"


def _scalar(value: str) -> str:
    """A YAML scalar for ``value``: plain when that reads back as the same string, else double-quoted."""
    if _PLAIN_SCALAR.fullmatch(value):
        try:
            if yaml.safe_load(value) == value:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)


class _Checker:
    def __init__(self, view: ConfigView, installed: Mapping[str, str], model_known: Callable[[str], bool | None]) -> None:
        self.view = view
        self.installed = installed
        self.model_known = model_known
        self.findings: list[Finding] = []

    def add(self, severity: str, keys: tuple[Any, ...], problem: str, fix: str, plugin_id: str | None = None) -> None:
        line = None
        probe = keys
        while probe and line is None:  # the closest key that is written in the file
            line = self.view.line(*probe)
            probe = probe[:-1]
        self.findings.append(Finding(severity, _path(*keys), problem, fix, line, plugin_id))

    def unknown_keys(self, mapping: Mapping[Any, Any], keys: tuple[Any, ...], known: Iterable[str], plugin_id: str | None = None) -> None:
        known = tuple(known)
        for key in mapping:
            if str(key) in known:
                continue
            guess = _did_you_mean(str(key), known)
            if guess:
                problem = f"unknown key {str(key)!r}, ignored (did you mean {guess!r}?)"
                fix = f"rename it to {guess}"
            else:
                problem = f"unknown key {str(key)!r}, ignored"
                fix = f"remove it; the keys understood here are {', '.join(known)}"
            self.add(ERROR, keys + (str(key),), problem, fix, plugin_id)

    # --- plugins.enabled / disabled / hook_timeout
    def name_list(self, plugins: Mapping[str, Any], key: str) -> None:
        value = plugins.get(key)
        keys = ("plugins", key)
        if value is None:
            return
        if not isinstance(value, list):
            items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else []
            example = _flow_list(items) if items else "[plugin-a, image_gen/plugin-b]"
            self.add(ERROR, keys, f"expected a list of plugin keys, got {_type_name(value)} {short_repr(value)}",
                     f"write it as a list: {key}: {example}")
            return
        names = set(self.installed.values())
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                self.add(ERROR, keys + (i,), f"entry {short_repr(item)} is not a plugin key; ignored", "write the plugin's key or name as a string")
                continue
            item = item.strip()
            if item in self.installed or item in names:
                continue
            legacy = legacy_key_of(item, self.installed)
            if legacy is not None:
                self.add(WARNING, keys + (i,), f"{short_repr(item)} is the old manifest-name key of {legacy!r} "
                         f"(did you mean {legacy!r}?); it matches no plugin",
                         f"write {legacy} in plugins.{key} (a nested plugin's key is <category>/<directory>)")
                continue
            guess = _did_you_mean(item, list(self.installed) + sorted(names))
            hint = f" (did you mean {guess!r}?)" if guess else ""
            self.add(WARNING, keys + (i,), f"{short_repr(item)} matches no installed plugin{hint}",
                     f"install it, correct the name, or remove it from plugins.{key}")

    def hook_timeout(self, plugins: Mapping[str, Any]) -> None:
        value = plugins.get("hook_timeout")
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
            self.add(ERROR, ("plugins", "hook_timeout"), f"expected a positive number of seconds, got {short_repr(value)}; 30 is used",
                     "hook_timeout: 30")

    def hook_callback_timeout(self, plugins: Mapping[str, Any]) -> None:
        value = plugins.get("hook_callback_timeout")
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value == float("inf"):
            self.add(ERROR, ("plugins", "hook_callback_timeout"),
                     f"expected a number of seconds, got {short_repr(value)}; plugins.hook_timeout is used",
                     "hook_callback_timeout: 30")
        elif value > 600:
            self.add(WARNING, ("plugins", "hook_callback_timeout"), f"{value:g} is above Hermes's ceiling; 600 is used",
                     "hook_callback_timeout: 600")

    # --- plugins.entries
    def entry(self, plugin_id: str, entry: Any) -> None:
        keys = ("plugins", "entries", plugin_id)
        if entry is None:
            return
        if not isinstance(entry, Mapping):
            self.add(ERROR, keys, f"expected a mapping, got {_type_name(entry)} {short_repr(entry)}; no override is granted",
                     f"write it as a mapping: {entry_key(plugin_id)}: {{llm: {{...}}}}", plugin_id)
            return
        self.not_installed(plugin_id)
        self.unknown_keys(entry, keys, ENTRY_KEYS, plugin_id)
        self.unbound_grant(plugin_id, entry)
        mcp = entry.get("mcp_allowlist")
        if mcp is not None and (not isinstance(mcp, list) or not all(isinstance(s, str) for s in mcp)):
            self.add(WARNING, keys + ("mcp_allowlist",), f"expected a list of MCP server names, got {_type_name(mcp)} "
                     f"{short_repr(mcp)}; every ctx.call_mcp of this plugin is denied",
                     "write mcp_allowlist: [server] or [server:tool]", plugin_id)
        block = entry.get("llm")
        if block is None:
            return
        if not isinstance(block, Mapping):
            self.add(ERROR, keys + ("llm",), f"expected a mapping of trust keys, got {_type_name(block)} {short_repr(block)}; no override is granted",
                     "write llm: as a mapping, e.g. llm: {allow_model_override: true}", plugin_id)
            return
        self.unknown_keys(block, keys + ("llm",), [k for k in _POLICY_ORDER], plugin_id)
        for key, value in block.items():
            key = str(key)
            if key in _LIST_FLAG:
                self.allowlist(plugin_id, key, value, block)
            elif key in TRUST_KEYS:
                self.flag(plugin_id, key, value)

    def unbound_grant(self, plugin_id: str, entry: Mapping[Any, Any]) -> None:
        """A grant as Hermes writes it is honoured; say that a consent here would bind it."""
        grant = parse_grant(plugin_id, entry)
        if grant.granted and not grant.bound:
            self.add(WARNING, ("plugins", "entries", plugin_id, "granted_capabilities"),
                     f"grants {', '.join(grant.granted)} as Hermes records it (no capabilities_sha256): honoured, "
                     "but not bound to this plugin key (an edit of the list, or a copy to another plugin, grants "
                     "the same)", f"bind it: plugin-llm plugins consent {plugin_id} --yes", plugin_id)

    def not_installed(self, plugin_id: str) -> None:
        if plugin_id in self.installed:
            return
        keys = ("plugins", "entries", plugin_id)
        legacy = legacy_key_of(plugin_id, self.installed)
        if legacy is not None:  # keys were <category>/<manifest name> in earlier versions
            self.add(ERROR, keys, f"{plugin_id!r} is the old manifest-name key of {legacy!r} (did you mean {legacy!r}?); "
                     "a nested plugin's key is <category>/<directory>: this entry grants nothing",
                     f"rename the entry to {entry_key(legacy)}", plugin_id)
            return
        leaf_matches = [k for k, n in self.installed.items() if plugin_id in (n, k.rsplit("/", 1)[-1])]
        guess = leaf_matches[0] if len(leaf_matches) == 1 else _did_you_mean(plugin_id, self.installed, cutoff=0.75)
        if guess:  # most likely a typo or a bare name: the entry silently grants nothing
            self.add(ERROR, keys, f"no installed plugin has the key {plugin_id!r} (did you mean {guess!r}?); this entry applies to nothing",
                     f"rename the entry to {entry_key(guess)} (a plugin's trust identity is its key)", plugin_id)
        else:
            self.add(WARNING, keys, f"no installed plugin has the key {plugin_id!r}; the entry takes effect once it is installed",
                     "install the plugin, or remove the entry if it is stale", plugin_id)

    def flag(self, plugin_id: str, key: str, value: Any) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return
        self.add(ERROR, ("plugins", "entries", plugin_id, "llm", key),
                 f"expected true or false, got {_type_name(value)} {short_repr(value)}; it counts as false",
                 f"{key}: true  (or false; only YAML booleans are understood)", plugin_id)

    def allowlist(self, plugin_id: str, key: str, value: Any, block: Mapping[str, Any]) -> None:
        keys = ("plugins", "entries", plugin_id, "llm", key)
        flag_on = block.get(_LIST_FLAG[key]) is True or str(block.get(_LIST_FLAG[key])).strip().lower() == "true"
        if value is None:
            self.add(WARNING, keys, "no value (null) means no allowlist: any value is allowed once the flag is on",
                     f"list the allowed values ({key}: [a, b]), write [] to allow nothing, or delete the key", plugin_id)
            return
        if isinstance(value, str):
            items = [v.strip() for v in value.split(",") if v.strip()]
            self.add(ERROR, keys, f"given as a string {short_repr(value)}, not a list; nothing is allowed until it is a list",
                     f"{key}: {_flow_list(items or [value])}", plugin_id)
            return
        if not isinstance(value, list):
            self.add(ERROR, keys, f"expected a list, got {_type_name(value)} {short_repr(value)}; nothing is allowed until it is a list",
                     f"{key}: [a, b]", plugin_id)
            return
        if not value and flag_on:
            self.add(WARNING, keys, f"the list is empty: {_LIST_FLAG[key]} is on but nothing is allowed",
                     f"add the allowed values, or set {_LIST_FLAG[key]}: false", plugin_id)
        for i, item in enumerate(value):
            if not isinstance(item, (str, int, float)) or isinstance(item, bool) or not str(item).strip():
                self.add(ERROR, keys + (i,), f"entry {short_repr(item)} is not a name; ignored", "write each entry as a string", plugin_id)
                continue
            item = str(item).strip()
            if item == "*":
                what = "provider" if key == "allowed_providers" else "model"
                self.add(WARNING, keys + (i,), f"'*' allows any {what}: this allowlist restricts nothing",
                         f"list the allowed {what}s instead, or delete {key} if any {what} is really fine", plugin_id)
            elif key == "allowed_providers" and self._unknown_provider(item):
                self.add(WARNING, keys + (i,), f"{unknown_provider_problem(item)}; allowing it allows nothing",
                         provider_fix(item, f"{key}[{i}]"), plugin_id)
            elif key == "allowed_models" and item.strip() in self.view.config.models:
                continue  # a route of the catalog, by name (its own entry is checked where it is declared)
            elif key == "allowed_models" and not _model_unchecked(item) and self.model_known(item) is False:
                names = litellm_model_names() or frozenset()
                guess = _did_you_mean(item.lower(), names, cutoff=0.85) if len(names) else None
                hint = f" (did you mean {guess!r}?)" if guess else ""
                self.add(WARNING, keys + (i,), f"litellm does not know the model {short_repr(item)}{hint}",
                         "check the spelling; a model served by a custom or local endpoint is fine to keep", plugin_id)

    @staticmethod
    def _unknown_provider(name: str) -> bool:
        return unknown_provider_problem(name) is not None

    def duplicates(self) -> None:
        """Duplicates outside GOVERNED_SECTIONS (those make the file unusable: a parse error above)."""
        for keys, line in self.view.duplicates:
            if keys:
                plugin_id = str(keys[2]) if len(keys) > 2 and keys[:2] == ("plugins", "entries") else None
                self.findings.append(Finding(
                    WARNING, _path(*keys), f"duplicate key (also at line {line}); only the last one counts",
                    "keep one of them", self.view.line(*keys), plugin_id,
                ))

    def top_level(self) -> None:
        """A top-level key that is neither this host's nor Hermes's: a misspelt section is silently ignored."""
        for key, close in unknown_sections(self.view.raw):
            name = str(key)
            if close is not None:
                problem = (f"unknown top-level section {short_repr(key)} (did you mean {close!r}?); it is ignored, "
                           f"so nothing in it applies")
                fix = f"rename it to {close}"
            else:
                problem = f"unknown top-level section {short_repr(key)}: neither this host's nor a Hermes section; ignored"
                fix = "remove it, or correct its name (this host reads " + ", ".join(HOST_SECTIONS) + ")"
            self.add(ERROR, (name,), problem, fix)

    def provider(self) -> None:
        """An unknown ``model.provider`` refuses every call: reported before what it causes (no price,
        no key), whose fixes would repeat the typo."""
        provider = self.view.config.model.provider
        problem = unknown_provider_problem(provider) if provider else None
        if problem is None:
            return
        if isinstance(self.view.raw.get("model"), Mapping):
            keys: tuple[str, ...] = ("model", "provider")
            fix = provider_fix(provider)
        else:  # the short form, model: <provider>/<model>
            keys = ("model",)
            close = closest_provider(provider)
            fix = f"model: {close}/{self.view.config.model.model}" if close else provider_fix(provider, "model")
        self.add(ERROR, keys, f"{problem}; every call is refused until it is fixed", fix)

    def run(self) -> list[Finding]:
        view = self.view
        if view.error is not None:
            self.findings.append(Finding(
                ERROR, view.path.name, f"does not parse: {view.error}",
                "fix the YAML at that position; until then every plugin override is refused (fail closed)", view.error_line,
            ))
            return self.findings
        self.provider()
        self.top_level()
        self.duplicates()
        plugins = view.raw.get("plugins")
        if plugins is None:
            return self.findings
        if not isinstance(plugins, Mapping):
            self.add(ERROR, ("plugins",), f"expected a mapping, got {_type_name(plugins)}; no plugin is enabled and none has overrides",
                     "write plugins: as a mapping with enabled:, disabled: and entries:")
            return self.findings
        self.unknown_keys(plugins, ("plugins",), PLUGINS_KEYS)
        self.name_list(plugins, "enabled")
        self.name_list(plugins, "disabled")
        self.hook_timeout(plugins)
        self.hook_callback_timeout(plugins)
        entries = plugins.get("entries")
        if entries is not None and not isinstance(entries, Mapping):
            self.add(ERROR, ("plugins", "entries"), f"expected a mapping of plugin key -> settings, got {_type_name(entries)}; no override is granted",
                     "entries:\n  my-plugin:\n    llm: {allow_model_override: true}")
        elif entries:
            for plugin_id, entry in entries.items():
                self.entry(str(plugin_id), entry)
        return self.findings


def check_plugins(
    view: ConfigView,
    installed: Mapping[str, str],
    model_known: Callable[[str], bool | None] = litellm_knows_model,
) -> list[Finding]:
    """Every problem in the ``plugins:`` section, the limits and the top-level keys (and a parse error)."""
    findings = _Checker(view, installed, model_known).run() + _limit_findings(view)
    order = {ERROR: 0, WARNING: 1}
    # the route's provider first: every call depends on it
    return sorted(findings, key=lambda f: (f.path not in ("model.provider", "model"), order.get(f.severity, 2),
                                           f.line if f.line is not None else 0))


def _limit_findings(view: ConfigView) -> list[Finding]:
    """Every parse problem of the limits (the ``limits:`` section, ``limits.defaults``, ``limits.prices``
    and the blocks under ``plugins.entries``) and what the limits mean for the routes (a budget on an
    unpriced model, a token limit below one call, ...), as trust findings, each with its line.

    An error in the ``limits:`` section or in ``limits.defaults`` refuses the calls of many plugins
    at once, so it is an error here too (``trust check`` exits 1), not just a config warning."""
    if view.error is not None:
        return []

    raw = view.config.raw
    issues = limit_parse_issues(raw)
    route_provider = view.config.model.provider  # an unqualified model override stays on the route's provider
    models = {pid: [m if "/" in m else f"{route_provider}/{m}" for m in policy.allowed_models or () if m != "*"]
              for pid, policy in view.config.trust.items()}
    issues += check_limits(view.config.limits, provider=view.config.model.provider, model=view.config.model.model,
                           plugin_models=models)
    return [Finding(i.severity, i.path, i.problem, i.fix, view.line_of_path(i.path), i.plugin_id) for i in issues]


def limit_parse_issues(raw: Mapping[str, Any]) -> list[Any]:
    """The :class:`plugin_llm.limits.LimitIssue` values parsing the limits of ``raw`` (a parsed
    config.yaml) gives: what the gateway logs as config warnings and folds into refusals."""
    return parse_limit_settings(raw.get("limits"), raw.get("plugins"))[1]


# ------------------------------------------------------------------ explain
def yaml_snippet(plugin_id: str, changes: Mapping[str, Any]) -> str:
    """The minimal YAML that sets ``changes`` under ``plugins.entries.<plugin_id>.llm``."""
    lines = ["plugins:", "  entries:", f"    {entry_key(plugin_id)}:", "      llm:"]
    for key, value in changes.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            text = _flow_list(value)
        else:
            text = _scalar(str(value))
        lines.append(f"        {key}: {text}")
    return "\n".join(lines) + "\n"


def _grant_command(plugin_id: str, override: str, values: Iterable[str]) -> str:
    import shlex

    parts = ["plugin-llm", "trust", "grant", plugin_id, override, *values]
    return " ".join(shlex.quote(p) for p in parts)


def explain(view: ConfigView, plugin_id: str, overrides: Overrides, installed: Mapping[str, str]) -> Explanation:
    """Dry-run the gate exactly as a call would (same policy, same :func:`decide`)."""
    policy = view.config.trust_for(plugin_id) if view.error is None else DENY_ALL
    decision = decide(plugin_id, policy, overrides)
    requested = overrides.requested()
    rules: list[str] = []
    changes: dict[str, Any] = {}
    commands: list[str] = []
    broader: list[tuple[str, str]] = []
    for name, value in requested.items():
        flag = FLAG_KEYS[name]
        flag_keys = ("plugins", "entries", plugin_id, "llm", flag)
        alone = Overrides(**{name: value}, active_provider=overrides.active_provider,
                          route_provider=overrides.route_provider if name == "model" else None)
        capability = CAPABILITY_FOR[name]
        if not getattr(policy, flag) and capability in policy.granted_capabilities:
            rules.append(f"{name}={value!r}: allowed by the granted capability {capability} "
                         f"(plugins.entries.{entry_key(plugin_id)}.granted_capabilities, consented); {flag} is false")
            with_flag = policy
        elif not getattr(policy, flag):
            where = _source(view, flag_keys) if view.error is None else f"fail closed ({view.path.name} does not parse)"
            rules.append(f"{name}={value!r}: refused: {flag} is false, {where}, and the capability {capability} "
                         "is not granted")
            changes[flag] = True
            with_flag = replace(policy, **{flag: True})
        else:
            rules.append(f"{name}={value!r}: {flag} is true, {_source(view, flag_keys)}")
            with_flag = policy
        list_key = LIST_KEYS.get(name)
        allowlist = getattr(policy, list_key) if list_key else None
        if list_key is None or view.error is not None:
            add: list[str] = []
        elif allowlist is None and flag in changes:
            # least privilege first: the flag with a list of this one value; the flag alone allows any value
            rules.append(f"  no {list_key} list: any {name} would be allowed once the flag is on")
            changes[list_key] = [value]
            add = [value]
            broader.append((_grant_command(plugin_id, name, []), f"any {name}, not only {value!r}"))
        elif allowlist is None:
            rules.append(f"  no {list_key} list: any {name} is allowed once the flag is on")
            add = []
        elif decide(plugin_id, with_flag, alone).allowed:
            rules.append(f"  {value!r} is on {list_key}, {_source(view, flag_keys[:-1] + (list_key,))}")
            add = []
        else:
            shown = ", ".join(allowlist) if allowlist else "empty: nothing is allowed"
            rules.append(f"  {value!r} is not on {list_key} [{shown}], "
                         f"{_source(view, flag_keys[:-1] + (list_key,))}")
            changes[list_key] = [*allowlist, value]
            add = [value]
        if flag in changes or add:
            commands.append(_grant_command(plugin_id, name, add))
    if not requested:
        rules.append("no overrides requested: the call uses the operator's route and is always allowed")
    snippet = yaml_snippet(plugin_id, changes) if changes and not decision.allowed and view.error is None else None
    route, route_error = None, None
    if decision.allowed and view.error is None:
        route, route_error = _route(view.config, overrides)
    elif decision.allowed:
        route_error = "unknown while config.yaml does not parse (a running gateway keeps its last good route)"
    return Explanation(
        plugin_id=plugin_id,
        installed=plugin_id in installed,
        overrides=overrides,
        decision=decision,
        rules=tuple(rules),
        changes=changes if not decision.allowed else {},
        snippet=snippet,
        commands=tuple(commands) if not decision.allowed and view.error is None else (),
        broader=tuple(broader) if not decision.allowed and view.error is None else (),
        route=route,
        route_error=route_error,
        config_error=view.error,
    )


def _route(config: HostConfig, overrides: Overrides) -> tuple[dict[str, Any] | None, str | None]:
    try:
        chain = resolve_chain(config, provider=overrides.provider, model=overrides.model, profile=overrides.profile)
    except PluginLlmConfigError as exc:
        return None, str(exc)
    held = _breakers(config) if len(chain) > 1 else None
    first = _route_fields(chain[0], held)
    first.update({"agent_id": overrides.agent_id, "timeout": chain[0].timeout, "max_retries": chain[0].max_retries,
                  "fallbacks": [_route_fields(route, held) for route in chain[1:]]})
    return first, None


def _route_fields(route: Any, held: Mapping[str, Any] | None) -> dict[str, Any]:
    breaker = held.get(route.label) if held is not None else None
    return {
        "name": route.name,
        "provider": route.provider,
        "model": route.model,
        "litellm_model": route.litellm_model,
        "base_url": shown_url(route.base_url),
        "profile": route.profile,
        "breaker": (breaker.as_dict() if breaker is not None else {"state": "closed"}) if held is not None else None,
    }


def _breakers(config: HostConfig) -> dict[str, Any] | None:
    """The routes' breaker states from the store; None when the breaker is off or the store cannot tell."""
    import time

    from plugin_llm.limits import breakers
    from plugin_llm.limits.store import StoreError

    if not config.llm.breaker.failures:
        return None
    try:
        return breakers.states(config.limits, config.home, time.time())
    except StoreError:
        return None
