"""What ``task=`` does for one plugin: whether it may name a built-in task, and where each
``auxiliary.<task>`` slot sends its calls (the gateway's own :func:`plugin_llm.trust.decide_task` and
:func:`plugin_llm.routing.resolve_chain`). No plugin is loaded: a task a plugin registers with
``ctx.register_auxiliary_task`` is known only at run time, so it is said to be that plugin's alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from plugin_llm.trust import (BUILTIN_TASKS, DENY_ALL, TASK_CAPABILITY, TASK_FLAG, Decision, TrustPolicy, config_path,
                              decide_task)

from .policy import _source
from .routes import route_view
from .view import ConfigView

__all__ = ["SlotRoute", "TaskAccess", "task_access", "explain_task"]

#: who may send ``task=<key>`` of a slot
YES, NO, REGISTERED = "yes", "no", "only the plugin that registers it"


@dataclass(frozen=True)
class SlotRoute:
    """One ``auxiliary.<task>`` slot: whether the plugin may use it, and the route its calls take."""

    task: str
    builtin: bool
    #: :data:`YES`, :data:`NO` (a built-in task the plugin is not granted) or :data:`REGISTERED`
    usable: str
    #: the first route's fields and its ``fallbacks`` (see :func:`.routes.route_view`); None on an error
    route: Mapping[str, Any] | None
    #: the slot names no route: its calls take the default route (with ``timeout`` when it sets one)
    default: bool
    timeout: float | None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "builtin": self.builtin, "usable": self.usable,
                "route": dict(self.route) if self.route is not None else None, "default_route": self.default,
                "timeout": self.timeout, "error": self.error}


@dataclass(frozen=True)
class TaskAccess:
    """Whether a plugin may name a built-in task (``task=``), what allows it, and the configured slots."""

    plugin_id: str
    #: ``allow_task_override``, ``capability llm.task_override`` or None (not allowed)
    granted_by: str | None
    #: where ``allow_task_override`` came from (``config.yaml line N`` or the fail-closed default)
    source: str
    config_key: str
    slots: tuple[SlotRoute, ...] = ()

    @property
    def summary(self) -> str:
        if self.granted_by is not None:
            how = self.granted_by if self.granted_by != TASK_FLAG else f"{TASK_FLAG}: true, {self.source}"
            return f"built-in tasks allowed (by {how}); a task the plugin registers needs nothing"
        return (f"built-in tasks refused: {TASK_FLAG} is false, {self.source}, and the capability "
                f"{TASK_CAPABILITY} is not granted; a task the plugin registers needs nothing")

    def as_dict(self) -> dict[str, Any]:
        return {"builtin_tasks_allowed": self.granted_by is not None, "granted_by": self.granted_by,
                "source": self.source, "config_key": self.config_key, "summary": self.summary,
                "slots": [slot.as_dict() for slot in self.slots]}


def _policy(view: ConfigView, plugin_id: str) -> TrustPolicy:
    return view.config.trust_for(plugin_id) if view.error is None else DENY_ALL


def _flag_source(view: ConfigView, plugin_id: str) -> str:
    if view.error is not None:
        return f"fail closed ({view.path.name} does not parse)"
    return _source(view, ("plugins", "entries", plugin_id, "llm", TASK_FLAG))


def task_access(view: ConfigView, plugin_id: str) -> TaskAccess:
    """``plugin_id``'s access to tasks and every ``auxiliary.<task>`` slot with its route."""
    policy = _policy(view, plugin_id)
    granted = policy.grants_task()
    slots = []
    if view.error is None:
        for task, slot in view.config.auxiliary.items():
            builtin = task in BUILTIN_TASKS
            usable = (YES if granted is not None else NO) if builtin else REGISTERED
            route, error = route_view(view.config, task=task)
            slots.append(SlotRoute(task, builtin, usable, route, slot.route is None, slot.timeout, error))
    return TaskAccess(plugin_id, granted, _flag_source(view, plugin_id), config_path(plugin_id, TASK_FLAG),
                      tuple(slots))


def explain_task(view: ConfigView, plugin_id: str, task: str) -> tuple[Decision, list[str], dict[str, Any]]:
    """The task gate's decision for ``task=<task>`` (a plugin's own task assumed registered by it), the rule
    behind it, and the trust key that would allow a refused one."""
    policy = _policy(view, plugin_id)
    if task not in BUILTIN_TASKS:
        decision = decide_task(plugin_id, policy, task, plugin_id)
        return decision, [f"task={task!r}: not a built-in task: only the plugin that registers it "
                          f"(ctx.register_auxiliary_task) may use it; assumed here to be {plugin_id!r} "
                          "(trust explain loads no plugin)"], {}
    decision = decide_task(plugin_id, policy, task, None)
    if decision.allowed:
        granted = policy.grants_task()
        if granted == TASK_FLAG:
            how = f"{TASK_FLAG} is true, {_flag_source(view, plugin_id)}"
        else:
            how = f"allowed by the granted {granted}; {TASK_FLAG} is false"
        return decision, [f"task={task!r}: a built-in task: {how}"], {}
    rule = (f"task={task!r}: refused: a built-in task needs {TASK_FLAG}, which is false, "
            f"{_flag_source(view, plugin_id)}, and the capability {TASK_CAPABILITY} is not granted")
    return decision, [rule], {TASK_FLAG: True}
