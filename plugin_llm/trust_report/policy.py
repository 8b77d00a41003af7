"""Every plugin's effective trust policy, key by key, with where each value came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from plugin_llm.trust import FLAG_KEYS, LIST_KEYS, TASK_FLAG, TrustPolicy

from .view import _DEFAULT_FLAG, ConfigView, Finding, _entries

_POLICY_ORDER = tuple(TrustPolicy.__dataclass_fields__)
_LIST_FLAG = {lst: FLAG_KEYS[name] for name, lst in LIST_KEYS.items()}

_DEFAULT_LIST = "default (no allowlist)"


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
