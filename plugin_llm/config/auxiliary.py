"""``auxiliary:``: the routes of auxiliary tasks (``ctx.llm(..., task=<key>)``), as routes of the catalog.

Pure: takes the parsed YAML value, the catalog and the default route; returns frozen slots and warnings.
A slot is a route name of ``models:``, ``{route: <name>, fallbacks: [...]}``, or Hermes's inline shape
``{provider, model, base_url, timeout, fallback_chain}``. A task without a slot (or ``provider: auto``
without a model) takes the default route, as in Hermes. Keys never live here: ``api_key`` is ignored
with a warning (auth.json holds them). The rules and examples: docs/operators.md.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from plugin_llm.hardened.bounded_repr import short_repr
from plugin_llm.config.values import did_you_mean
from plugin_llm.config.routes import (
    MAX_ATTEMPT_SECONDS,
    MAX_FALLBACKS,
    RouteConfig,
    _fallbacks,
    _profile,
    _route_fields,
)

__all__ = ["TASK_KEY", "MAX_TASKS", "TaskSlot", "parse_auxiliary"]

#: a task's key: what ``ctx.register_auxiliary_task`` accepts and ``task=`` names
TASK_KEY = re.compile(r"^[A-Za-z0-9_]{1,64}$")
#: slots a config may hold (Hermes has about a dozen built-in ones)
MAX_TASKS = 256
#: keys of an inline slot
INLINE_KEYS = ("provider", "model", "base_url", "timeout", "fallback_chain", "fallbacks", "profile",
               "supports_json_schema", "api_key")
#: keys of a slot that names a route of the catalog
ROUTE_KEYS = ("route", "fallbacks", "timeout")
#: Hermes's request options of a slot: not applied here (said once when set)
_HERMES_OPTIONS = ("extra_body", "api_mode", "reasoning_effort", "max_tokens", "temperature")


@dataclass(frozen=True)
class TaskSlot:
    """``auxiliary.<task>``: the route its calls take (None: the default route, with its fallbacks), the
    routes tried after it, and the call's deadline when the plugin passes no ``timeout=`` (Hermes's
    ``auxiliary.<task>.timeout``)."""

    task: str
    route: RouteConfig | None
    fallbacks: tuple[RouteConfig, ...] = ()
    timeout: float | None = None


def parse_auxiliary(raw: Any, models: Mapping[str, RouteConfig], default: RouteConfig,
                    warnings: list[str]) -> Mapping[str, TaskSlot]:
    """``auxiliary:``: task key -> slot (empty when absent or unusable). ``default`` is the route
    ``model:`` names: ``provider: auto`` with a model is that route's provider with that model."""
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping):
        warnings.append(f"auxiliary: expected a mapping of task -> route, got {type(raw).__name__}; every task "
                        "takes the default route")
        return MappingProxyType({})
    slots: dict[str, TaskSlot] = {}
    for task, entry in raw.items():
        if not isinstance(task, str) or not TASK_KEY.match(task):
            warnings.append(f"auxiliary.{short_repr(task)}: a task is letters, digits and '_' (at most 64); this "
                            "slot is ignored")
            continue
        where = f"auxiliary.{task}"
        if len(slots) == MAX_TASKS:
            warnings.append(f"auxiliary: more than {MAX_TASKS} tasks; {where} and the ones after it are ignored")
            break
        slot = _slot(task, entry, where, models, default, warnings)
        if slot is not None:
            slots[task] = slot
    return MappingProxyType(slots)


def _slot(task: str, entry: Any, where: str, models: Mapping[str, RouteConfig], default: RouteConfig,
          warnings: list[str]) -> TaskSlot | None:
    if entry is None or (isinstance(entry, str) and entry.strip().lower() in ("", "auto")):
        return None
    if isinstance(entry, str):
        return TaskSlot(task, _named(entry, where, models, warnings))
    if not isinstance(entry, Mapping):
        warnings.append(f"{where}: expected a route name of models: or a mapping like {{route: <name>}}, got "
                        f"{short_repr(entry)}; the task takes the default route")
        return None
    timeout = _timeout(entry.get("timeout"), f"{where}.timeout", warnings)
    if "route" in entry:
        _unknown(entry, where, ROUTE_KEYS, warnings)
        route = _named(entry.get("route"), f"{where}.route", models, warnings)
        fallbacks = route.fallbacks if "fallbacks" not in entry else _fallbacks(
            entry.get("fallbacks"), f"{where}.fallbacks", route.name, models, warnings)
        return TaskSlot(task, route, tuple(models[name] for name in fallbacks), timeout)
    _unknown(entry, where, INLINE_KEYS, warnings)
    if entry.get("api_key"):
        warnings.append(f"{where}.api_key: ignored: keys live in auth.json only ('plugin-llm auth add <provider>'; "
                        f"{where}.profile picks a key profile of it)")
    route = _inline(entry, where, default, warnings)
    chain = entry.get("fallbacks", entry.get("fallback_chain"))
    fallbacks = _inline_fallbacks(chain, f"{where}.fallbacks", models, default, warnings)
    if route is None:
        if fallbacks:
            warnings.append(f"{where}: fallbacks without a provider or model are ignored: the task takes the "
                            "default route and its fallbacks")
        return TaskSlot(task, None, (), timeout) if timeout is not None else None
    return TaskSlot(task, route, fallbacks, timeout)


def _named(name: Any, where: str, models: Mapping[str, RouteConfig], warnings: list[str]) -> RouteConfig:
    """A route of the catalog by name; one that is not there is a route whose calls are refused."""
    if isinstance(name, str) and name.strip() in models:
        return models[name.strip()]
    known = ", ".join(sorted(models)[:10]) or "none: models: is empty"
    hint = did_you_mean(name, models) if isinstance(name, str) else ""
    problem = f"{where} {short_repr(name)} is not a route of models:{hint} (routes: {known}); fix {where} in config.yaml"
    warnings.append(problem + "; every call of this task is refused until it is fixed")
    return RouteConfig(provider=None, model="", problem=problem)


def _inline(entry: Mapping[str, Any], where: str, default: RouteConfig, warnings: list[str]) -> RouteConfig | None:
    """Hermes's ``{provider, model, base_url}``: ``provider: auto`` (or none) means the default route's
    provider - with ``model:`` another model of it, without one the default route itself (None) - and
    an endpoint without a provider is an OpenAI-compatible one (``custom``)."""
    provider = entry.get("provider")
    auto = provider is None or (isinstance(provider, str) and provider.strip().lower() in ("", "auto"))
    base_url = entry.get("base_url")
    profile = _profile(entry.get("profile"), f"{where}.profile", warnings)
    if auto and not (isinstance(base_url, str) and base_url.strip()):
        model = entry.get("model")
        if model is None or (isinstance(model, str) and not model.strip()):
            return None
        if not isinstance(model, str):
            warnings.append(f"{where}.model: expected a string, got {short_repr(model)}; the task takes the "
                            "default route")
            return None
        return dataclasses.replace(default, model=model.strip(), name=None, fallbacks=(), timeout=None,
                                   profile=profile if profile is not None else default.profile)
    fields = dict(entry)
    if auto:
        fields["provider"] = "custom"
    fields = _route_fields(fields, where, warnings)
    return RouteConfig(**fields, profile=profile)


def _inline_fallbacks(value: Any, where: str, models: Mapping[str, RouteConfig], default: RouteConfig,
                      warnings: list[str]) -> tuple[RouteConfig, ...]:
    """Route names of ``models:`` and inline ``{provider, model, base_url}`` entries, in order."""
    if value is None:
        return ()
    if isinstance(value, (str, Mapping)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        warnings.append(f"{where}: expected a list of route names or {{provider, model}} entries, got "
                        f"{short_repr(value)}; no fallback")
        return ()
    out: list[RouteConfig] = []
    for index, item in enumerate(value):
        if len(out) == MAX_FALLBACKS:
            warnings.append(f"{where}: more than {MAX_FALLBACKS} fallbacks; only the first {MAX_FALLBACKS} are tried")
            break
        if isinstance(item, Mapping):
            _unknown(item, f"{where}[{index}]", ("provider", "model", "base_url", "profile", "api_key"), warnings)
            if item.get("api_key"):
                warnings.append(f"{where}[{index}].api_key: ignored: keys live in auth.json only")
            route = _inline(item, f"{where}[{index}]", default, warnings)
            if route is not None:
                out.append(route)
            continue
        names = _fallbacks([item], where, None, models, warnings)
        out.extend(models[name] for name in names)
    return tuple(out)


def _timeout(value: Any, where: str, warnings: list[str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_ATTEMPT_SECONDS:
        warnings.append(f"{where}: expected seconds between 0 and {MAX_ATTEMPT_SECONDS:.0f}, got {short_repr(value)}; "
                        "the task's calls take llm.timeout")
        return None
    return float(value)


def _unknown(entry: Mapping[Any, Any], where: str, known: tuple[str, ...], warnings: list[str]) -> None:
    for key in entry:
        if key in known:
            continue
        if key in _HERMES_OPTIONS:
            if entry[key] not in (None, "", {}, []):
                warnings.append(f"{where}.{key}: Hermes's request option is not applied here; it is ignored")
            continue
        warnings.append(f"{where}.{short_repr(key)}: unknown key, ignored{did_you_mean(str(key), known)}")
