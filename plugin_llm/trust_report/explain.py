"""A dry run of the trust gate (the gateway's own :func:`plugin_llm.trust.decide`) with the YAML and the
``plugin-llm trust grant`` commands that would allow a denied call, and the route an allowed one takes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from plugin_llm.trust import CAPABILITY_FOR, DENY_ALL, FLAG_KEYS, LIST_KEYS, TASK_FLAG, Decision, Overrides, decide

from .policy import _source
from .routes import route_view
from .tasks import TaskAccess, explain_task, task_access
from .view import ConfigView, _flow_list, _scalar, entry_key


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
    #: the ``task=`` dry-run (None: no task)
    task: str | None = None
    #: whether the plugin may name a built-in task, and every ``auxiliary.<task>`` slot with its route
    tasks: TaskAccess | None = None

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
            "task": self.task,
            "tasks": self.tasks.as_dict() if self.tasks is not None else None,
        }


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


def explain(view: ConfigView, plugin_id: str, overrides: Overrides, installed: Mapping[str, str],
            task: str | None = None) -> Explanation:
    """Dry-run the gate exactly as a call would (same policy, same :func:`decide`; ``task=`` first, by
    :func:`plugin_llm.trust.decide_task`, as the pipeline does)."""
    policy = view.config.trust_for(plugin_id) if view.error is None else DENY_ALL
    decision = decide(plugin_id, policy, overrides)
    requested = overrides.requested()
    rules: list[str] = []
    changes: dict[str, Any] = {}
    if task is not None:
        task_decision, task_rules, task_changes = explain_task(view, plugin_id, task)
        rules.extend(task_rules)
        changes.update(task_changes)
        if not task_decision.allowed:  # the task gate first: its refusal is the call's
            decision = task_decision
        elif decision.allowed:
            decision = Decision(True, f"{task_decision.reason}; {decision.reason}", override=decision.override)
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
    if TASK_FLAG in changes:
        commands.insert(0, _grant_command(plugin_id, "task", []))
    if not requested and task is None:
        rules.append("no overrides requested: the call uses the operator's route and is always allowed")
    elif not requested:
        rules.append("no provider, model, agent_id or profile overrides requested")
    snippet = yaml_snippet(plugin_id, changes) if changes and not decision.allowed and view.error is None else None
    route, route_error = None, None
    if decision.allowed and view.error is None:
        route, route_error = route_view(view.config, overrides, task)
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
        task=task,
        tasks=task_access(view, plugin_id),
    )
