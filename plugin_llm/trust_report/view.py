"""One read of ``config.yaml`` for the trust report: the gateway's parse plus the line of every key.

:func:`read_config` never raises (a file that cannot be read or parsed is a fail-closed view with
its error); the helpers here name plugins (:func:`resolve_plugin_id`) and write config paths and
YAML scalars the way the findings and snippets show them.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from plugin_llm.config import CONFIG_MAX_BYTES, HostConfig, describe_yaml_error, parse_config
from plugin_llm.hardened.safe_files import UnsafeFileError, read_home_text
from plugin_llm.hardened.safe_yaml import compose_yaml
from plugin_llm.plugins.discovery import discover_candidates
from plugin_llm.trust import FLAG_KEYS

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

_DEFAULT_FLAG = "default (fail closed)"

_PLAIN_SCALAR = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/@+]*")

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
