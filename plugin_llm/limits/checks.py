"""Findings about limits for ``plugin-llm trust check`` and ``doctor``.

Beyond the parse problems (:func:`plugin_llm.limits.parse_limit_settings`
returns those), these are the configurations that parse but will refuse
calls or fail open: a budget on a model with no price, a per-minute token
limit smaller than one call's worst case, a zero limit, ``on_store_error:
allow``, the redis store without the redis package. Reads litellm's price
map as JSON; never imports litellm or redis, never contacts a store.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Iterable, Mapping

from plugin_llm.limits.pricing import find_price, input_token_bound
from plugin_llm.provider_names import unknown_provider_problem
from plugin_llm.limits.settings import ERROR, WARNING, LimitIssue, LimitSettings, PluginLimits, plugin_phrase

__all__ = ["check_limits"]


def _model_name(provider: str | None, model: str) -> tuple[str, str]:
    provider = (provider or "").strip().lower()
    model = model.strip()
    if not provider and "/" in model:
        provider, _, model = model.partition("/")
    return provider, model


def _plugin_findings(plugin_id: str | None, limits: PluginLimits, settings: LimitSettings,
                     models: Iterable[tuple[str, str]]) -> list[LimitIssue]:
    found: list[LimitIssue] = []
    who = plugin_phrase(plugin_id) if plugin_id is not None else "every plugin without its own limits block"
    for key, value in (("requests_per_minute", limits.requests_per_minute), ("max_concurrent", limits.max_concurrent),
                       ("tokens_per_minute", limits.tokens_per_minute)):
        if value == 0:
            found.append(LimitIssue(WARNING, limits.key(key), f"is 0: every call of {who} is refused",
                                    "raise it, or remove the key for no limit", plugin_id))
    seen: set[str] = set()
    for provider, model in models:
        name = f"{provider}/{model}"
        if name in seen or not provider or not model or model == "*" or unknown_provider_problem(provider):
            continue  # an unknown provider is its own error; a price for it would repeat the typo
        seen.add(name)
        price = find_price(provider, model, settings.prices)
        if limits.has_budget and price is None:
            quoted = json.dumps(name[:100])
            found.append(LimitIssue(
                ERROR, f"limits.prices.{quoted}",
                f"{who} has a budget ({limits.key('budget_usd')}) but {quoted} has no known price, so its calls are refused",
                f"set limits.prices.{quoted}: {{input_per_mtok: ..., output_per_mtok: ...}} (US dollars per million tokens)",
                plugin_id))
        output = (price.max_output_tokens if price is not None and price.max_output_tokens else
                  settings.default_max_output_tokens)
        worst = output + input_token_bound([{"role": "user", "content": ""}])
        if limits.tokens_per_minute and worst > limits.tokens_per_minute:
            found.append(LimitIssue(
                WARNING, limits.key("tokens_per_minute"),
                f"{limits.tokens_per_minute} is less than one call to {name} without max_tokens reserves "
                f"({output} output tokens), so such calls of {who} are refused",
                "raise it, or have the plugin pass max_tokens", plugin_id))
    return found


def check_limits(
    settings: LimitSettings,
    *,
    provider: str | None,
    model: str,
    plugin_models: Mapping[str, Iterable[str]] | None = None,
) -> list[LimitIssue]:
    """Findings for the configured route (``provider``/``model``) and, per plugin, the extra
    models it may pick (its ``allowed_models``, as ``provider/model`` names)."""
    found: list[LimitIssue] = []
    if settings.on_store_error == "allow":
        found.append(LimitIssue(WARNING, "limits.on_store_error",
                                "is allow: while the store is down or slow, limited plugins' calls go through unmetered",
                                "set it to deny (the default) to fail closed"))
    if settings.store == "redis" and importlib.util.find_spec("redis") is None:
        found.append(LimitIssue(ERROR, "limits.store", "is redis but the redis package is not installed, so calls of "
                                "plugins with limits are refused", "pip install 'redis>=5' (or use store: local)"))
    route = _model_name(provider, model)
    plugin_models = plugin_models or {}
    targets: list[tuple[str | None, PluginLimits]] = []
    if not settings.defaults.empty:
        targets.append((None, settings.defaults))
    targets.extend((pid, lim) for pid, lim in sorted(settings.plugins.items()) if not lim.empty and lim.error is None)
    for plugin_id, limits in targets:
        extra = [_model_name(None, m) if "/" in m else (route[0], m) for m in plugin_models.get(plugin_id or "", ())]
        found.extend(_plugin_findings(plugin_id, limits, settings, [route, *extra]))
    return found
