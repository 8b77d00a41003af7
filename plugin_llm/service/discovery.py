"""The service's discovery answers: the models a token's plugin may use, and its own limits."""

from __future__ import annotations

from typing import Any

from plugin_llm.trust import Overrides, decide

__all__ = ["DEFAULT_ROUTE", "model_ids", "models_for", "limits_for"]

#: the id of the host's route (``model: default`` or no model in a request)
DEFAULT_ROUTE = "default"
#: what ``owned_by`` says when the route names no provider
_NO_PROVIDER = "plugin-llm"


def model_ids(config: Any, plugin: str) -> list[tuple[str, str]]:
    """``(id, owned_by)`` of every model ``plugin`` may name: ``default`` and the default route's catalog name,
    each route of the catalog the trust gate would let it ask for, then the configured model and each
    ``allowed_models`` entry the gate itself would let through (``*`` lists nothing it does not know)."""
    provider = (config.model.provider or "").lower() or None
    out = [(DEFAULT_ROUTE, provider or _NO_PROVIDER)]
    seen = {DEFAULT_ROUTE}
    if config.model.name:
        out.append((config.model.name, provider or _NO_PROVIDER))
        seen.add(config.model.name.lower())
    policy = config.trust_for(plugin)
    for name, route in config.models.items():
        if name.lower() in seen:
            continue
        asked = Overrides(model=name, active_provider=provider, route_provider=route.provider or "")
        if decide(plugin, policy, asked).allowed:
            seen.add(name.lower())
            out.append((name, route.provider or _NO_PROVIDER))
    candidates = [*(() if config.model.name else (config.model.model,)), *(policy.allowed_models or ())]
    for model in candidates:
        if not isinstance(model, str) or not model.strip() or model.strip() == "*" or model.strip().lower() in seen:
            continue
        if model.strip() in config.models:  # a route's name: listed above when the gate lets it through
            continue
        if not decide(plugin, policy, Overrides(model=model, active_provider=provider)).allowed:
            continue
        seen.add(model.strip().lower())
        prefix, slash, _ = model.partition("/")
        out.append((model, prefix.lower() if slash else (provider or _NO_PROVIDER)))
    return out


def models_for(config: Any, plugin: str, created: int) -> list[dict[str, Any]]:
    """OpenAI's model objects for ``GET /v1/models``."""
    return [{"id": mid, "object": "model", "created": created, "owned_by": owner} for mid, owner in model_ids(config, plugin)]


def limits_for(config: Any, plugin: str) -> tuple[dict[str, Any], str | None]:
    """``plugin``'s row of ``limits show --json`` and the store's own error (for the log, never the answer)."""
    from plugin_llm.limits.views import show

    [row] = show(config.limits, config.home, [plugin])
    body = row.as_dict()
    problem = row.error
    if problem is not None:
        body["error"] = "the limits store is unavailable; usage is unknown (the operator's log says why)"
    return body, problem
