"""The per-plugin trust gate. Pure: no I/O, no config parsing.

A plugin may ask ``ctx.llm`` for four overrides: ``provider=``, ``model=``,
``agent_id=`` and ``profile=``. Each is refused unless the operator turned on
its own flag under ``plugins.entries.<plugin_id>.llm`` in config.yaml, and,
for provider and model, the value is on the optional allowlist (``task=`` is
decided first, by :func:`decide_task`). Everything is fail-closed: a missing
entry, block, flag or a malformed value grants nothing.

Capability consent feeds the same gate: a plugin whose manifest requests
``capabilities: [llm.model_override]`` and to which the operator consented
(``plugins.entries.<plugin_id>.granted_capabilities``, bound by a matching
``capabilities_sha256`` or as Hermes writes it, see :mod:`plugin_llm.capabilities`) may override the model as
if ``allow_model_override`` were set: the flag or the matching granted capability allows an override, the
allowlists apply either way, and :class:`Decision` says which one granted it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from plugin_llm.errors import PluginLlmTrustError

__all__ = [
    "FLAG_KEYS",
    "LIST_KEYS",
    "TRUST_KEYS",
    "TASK_FLAG",
    "TASK_CAPABILITY",
    "BUILTIN_TASKS",
    "TrustPolicy",
    "Overrides",
    "Decision",
    "CAPABILITY_FOR",
    "consent_digest",
    "config_path",
    "decide",
    "decide_task",
    "enforce",
]

#: flag key per override
FLAG_KEYS = {
    "provider": "allow_provider_override",
    "model": "allow_model_override",
    "agent_id": "allow_agent_id_override",
    "profile": "allow_profile_override",
}
#: allowlist key per override (agent_id and profile have no allowlist)
LIST_KEYS = {"provider": "allowed_providers", "model": "allowed_models"}
#: the flag (and capability) that lets a plugin route ``task=`` to a built-in auxiliary task
TASK_FLAG = "allow_task_override"
TASK_CAPABILITY = "llm.task_override"
TRUST_KEYS = frozenset(FLAG_KEYS.values()) | frozenset(LIST_KEYS.values()) | {TASK_FLAG}
#: Hermes's built-in auxiliary tasks: reserved (no plugin registers them), reached with ``task=`` only
#: under :data:`TASK_FLAG`
BUILTIN_TASKS = frozenset({
    "vision", "compression", "web_extract", "approval", "mcp", "title_generation", "memory_query_rewrite",
    "tts_audio_tags", "skills_hub", "triage_specifier", "kanban_decomposer", "profile_describer", "curator",
})
#: capability (manifest ``capabilities:``) per override
CAPABILITY_FOR = {
    "provider": "llm.provider_override",
    "model": "llm.model_override",
    "agent_id": "llm.agent_id_override",
    "profile": "llm.profile_override",
}


def consent_digest(plugin_id: str, capabilities: "tuple[str, ...] | list[str] | frozenset[str]") -> str:
    """SHA-256 of what the operator consented to: the plugin id and the sorted capabilities."""
    blob = json.dumps({"plugin": plugin_id, "capabilities": sorted(set(capabilities))}, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TrustPolicy:
    """The effective policy of one plugin. ``None`` allowlist = no allowlist."""

    allow_provider_override: bool = False
    allowed_providers: tuple[str, ...] | None = None
    allow_model_override: bool = False
    allowed_models: tuple[str, ...] | None = None
    allow_agent_id_override: bool = False
    allow_profile_override: bool = False
    #: ``task=`` may name a built-in auxiliary task (a task the plugin registered needs nothing)
    allow_task_override: bool = False
    #: capabilities the operator consented to (sorted; already checked against their digest)
    granted_capabilities: tuple[str, ...] = ()

    def grants(self, name: str) -> str | None:
        """What allows override ``name``: its flag key, ``capability <name>``, or None."""
        if getattr(self, FLAG_KEYS[name]):
            return FLAG_KEYS[name]
        if CAPABILITY_FOR[name] in self.granted_capabilities:
            return f"capability {CAPABILITY_FOR[name]}"
        return None

    def grants_task(self) -> str | None:
        """What lets ``task=`` name a built-in task: :data:`TASK_FLAG`, ``capability llm.task_override``, or None."""
        if self.allow_task_override:
            return TASK_FLAG
        if TASK_CAPABILITY in self.granted_capabilities:
            return f"capability {TASK_CAPABILITY}"
        return None


DENY_ALL = TrustPolicy()


@dataclass(frozen=True)
class Overrides:
    """What a plugin asked for (``None`` = not asked).

    ``active_provider`` is the provider the call would use (the override or
    the configured one); it lets ``allowed_models: [openai/gpt-4o-mini]``
    match a bare ``model="gpt-4o-mini"`` on the openai route.
    """

    provider: str | None = None
    model: str | None = None
    agent_id: str | None = None
    profile: str | None = None
    active_provider: str | None = None
    #: the provider of the catalog route ``model=`` names (None: a raw model name)
    route_provider: str | None = None

    def requested(self) -> dict[str, str]:
        return {k: v for k in FLAG_KEYS if (v := getattr(self, k)) is not None}


@dataclass(frozen=True)
class Decision:
    """Outcome of the gate. ``config_key`` names the key that decided a denial."""

    allowed: bool
    reason: str
    config_key: str | None = None
    override: str | None = None


def config_path(plugin_id: str, key: str) -> str:
    """The dotted config path of a trust key, quoting plugin ids like ``image_gen/openai``."""
    entry = plugin_id if plugin_id.replace("-", "").replace("_", "").isalnum() else f'"{plugin_id}"'
    return f"plugins.entries.{entry}.llm.{key}"


def _norm(value: str) -> str:
    return value.strip().lower()


def _listed(value: str, allowlist: tuple[str, ...], *, prefix: str | None = None) -> bool:
    """``prefix`` is the route's provider: ``gpt-4o`` and ``<prefix>/gpt-4o`` are then the same model
    (the route drops its own prefix); another provider's prefix stays part of the name."""
    wanted = {_norm(value)}
    if prefix:
        prefix = _norm(prefix)
        wanted.add(f"{prefix}/{_norm(value)}")
        if _norm(value).startswith(prefix + "/"):
            wanted.add(_norm(value)[len(prefix) + 1:].strip())
    for item in allowlist:
        item = _norm(item)
        if item == "*" or item in wanted:
            return True
    return False


def decide(plugin_id: str, policy: TrustPolicy, overrides: Overrides) -> Decision:
    """Check every requested override; the first refusal decides."""
    requested = overrides.requested()
    for name, value in requested.items():
        flag = FLAG_KEYS[name]
        if policy.grants(name) is None:
            key = config_path(plugin_id, flag)
            list_key = LIST_KEYS.get(name)
            only = f"; to allow only this {name}, set it with {list_key}: [{value}]" if list_key else ""
            return Decision(
                False,
                f"plugin '{plugin_id}' may not override {name} (asked for {value!r}): "
                f"the operator has not set {key}: true in config.yaml "
                f"(nor granted the capability {CAPABILITY_FOR[name]}){only}",
                key,
                name,
            )
        list_key = LIST_KEYS.get(name)
        allowlist = getattr(policy, list_key) if list_key else None
        if name == "model" and overrides.route_provider is not None:
            refused = _route_refused(plugin_id, policy, overrides, value)
            if refused is not None:
                return refused
        elif allowlist is not None:
            prefix = overrides.active_provider if name == "model" else None
            if not _listed(value, allowlist, prefix=prefix):
                key = config_path(plugin_id, list_key)
                shown = ", ".join(allowlist) if allowlist else "empty: nothing is allowed"
                return Decision(
                    False,
                    f"plugin '{plugin_id}' may not use {name} {value!r}: it is not in {key} "
                    f"[{shown}]; add it to that list in config.yaml to allow it",
                    key,
                    name,
                )
    if not requested:
        return Decision(True, "no overrides requested")
    granted = ", ".join(f"{policy.grants(n)}" for n in requested)
    return Decision(True, f"overrides granted by {granted}")


def _route_refused(plugin_id: str, policy: TrustPolicy, overrides: Overrides, name: str) -> Decision | None:
    """``model=`` naming a route of the catalog: allowed when ``allowed_models`` lists the route by
    name, or admits any model (``*`` or no list) and the route stays on the call's provider - a route
    on another provider also needs that provider granted, as ``provider=`` would."""
    allowlist = policy.allowed_models
    list_key = config_path(plugin_id, "allowed_models")
    if allowlist is not None and _norm(name) in {_norm(item) for item in allowlist}:
        return None
    if allowlist is not None and "*" not in {_norm(item) for item in allowlist}:
        shown = ", ".join(allowlist) if allowlist else "empty: nothing is allowed"
        return Decision(False, f"plugin '{plugin_id}' may not use the route {name!r}: it is not in {list_key} "
                        f"[{shown}]; add {name} to that list in config.yaml to allow it", list_key, "model")
    provider = overrides.route_provider
    if _norm(provider) == _norm(overrides.active_provider or ""):
        return None
    providers = policy.allowed_providers
    if policy.grants("provider") is not None and (providers is None or _listed(provider, providers)):
        return None
    return Decision(False, f"plugin '{plugin_id}' may not use the route {name!r}: it goes to provider {provider!r}, "
                    f"and {list_key} admits it only as any model of the call's provider; list {name} in {list_key} "
                    "to allow this route", list_key, "model")


def decide_task(plugin_id: str, policy: TrustPolicy, task: str, owner: str | None) -> Decision:
    """``task=`` (a key, neither empty nor ``auto``): allowed when the plugin registered it (``owner`` is
    who did), or when it is a built-in task and :meth:`TrustPolicy.grants_task`; anything else is refused."""
    shown = task if len(task) <= 64 else task[:64] + "..."
    if owner is not None and owner == plugin_id:
        return Decision(True, f"task {shown!r} registered by the plugin", override="task")
    if task in BUILTIN_TASKS:
        granted = policy.grants_task()
        if granted is not None:
            return Decision(True, f"built-in task {shown!r} granted by {granted}", override="task")
        key = config_path(plugin_id, TASK_FLAG)
        return Decision(False, f"plugin '{plugin_id}' may not use the built-in task {shown!r}: the operator has not "
                        f"set {key}: true in config.yaml (nor granted the capability {TASK_CAPABILITY})", key, "task")
    why = (f"it is registered by plugin '{owner}', not by this plugin" if owner is not None else
           "no plugin registered it with ctx.register_auxiliary_task, and it is not a built-in task "
           f"({', '.join(sorted(BUILTIN_TASKS))})")
    return Decision(False, f"plugin '{plugin_id}' may not use task {shown!r}: {why}; register it in the plugin's "
                    "register(ctx), or pass task=None for the default route", None, "task")


def enforce(plugin_id: str, policy: TrustPolicy, overrides: Overrides) -> Decision:
    """Like :func:`decide` but raises :class:`PluginLlmTrustError` on a refusal."""
    decision = decide(plugin_id, policy, overrides)
    if not decision.allowed:
        raise PluginLlmTrustError(decision.reason, plugin_id=plugin_id, config_key=decision.config_key or "")
    return decision
