"""Findings about the ``plugins:`` section, the limits and the top-level keys of ``config.yaml``."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from plugin_llm.capabilities import parse_grant
from plugin_llm.config import HOST_SECTIONS, unknown_sections
from plugin_llm.hardened.bounded_repr import short_repr
from plugin_llm.limits import check_limits, parse_limit_settings
from plugin_llm.provider_names import closest_provider, provider_fix, unknown_provider_problem
from plugin_llm.trust import TRUST_KEYS

from .model_names import _model_unchecked, litellm_knows_model, litellm_model_names
from .policy import _LIST_FLAG, _POLICY_ORDER
from .view import (ENTRY_KEYS, ERROR, PLUGINS_KEYS, WARNING, ConfigView, Finding, _did_you_mean, _flow_list, _path,
                   _type_name, entry_key, legacy_key_of)


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
