"""The route a call takes, as ``trust explain`` shows it: provider, model, endpoint (shown without its
secrets), profile, fallbacks and their circuit breakers."""

from __future__ import annotations

from typing import Any, Mapping

from plugin_llm.config import HostConfig, shown_url
from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.routing import resolve_chain
from plugin_llm.trust import Overrides

__all__ = ["route_view"]


def route_view(config: HostConfig, overrides: Overrides = Overrides(),
               task: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """The route a call with ``overrides`` (and ``task=``) takes and its fallbacks, each with its breaker's
    state, or why it cannot be resolved: what :func:`plugin_llm.routing.resolve_chain` gives the call."""
    try:
        chain = resolve_chain(config, provider=overrides.provider, model=overrides.model, profile=overrides.profile,
                              task=task)
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
