"""Pure routing: (HostConfig, granted overrides) -> Route.

The route says which provider and model a call goes to, the litellm model
string, the operator's endpoint (plugins can never set one), the call's total
timeout and retry budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from plugin_llm.config import DEFAULT_LOCAL_MODEL, LOCAL_PROVIDER, HostConfig, shown_url
from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.provider_names import provider_fix, unknown_provider_problem

__all__ = ["Route", "resolve_route", "call_timeout"]


@dataclass(frozen=True)
class Route:
    provider: str
    model: str
    litellm_model: str
    base_url: str | None
    profile: str | None
    timeout: float
    max_retries: int
    supports_json_schema: bool | None

    def __repr__(self) -> str:  # the endpoint's userinfo is a secret
        return (f"Route(provider={self.provider!r}, model={self.model!r}, litellm_model={self.litellm_model!r}, "
                f"base_url={shown_url(self.base_url)!r}, profile={self.profile!r}, timeout={self.timeout!r}, "
                f"max_retries={self.max_retries!r}, supports_json_schema={self.supports_json_schema!r})")


def call_timeout(config: HostConfig, requested: float | None) -> float:
    """Explicit ``timeout=`` capped by ``llm.max_timeout``, else ``llm.timeout``."""
    if requested is None:
        return config.llm.timeout
    if isinstance(requested, bool) or not isinstance(requested, (int, float)) or requested <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {requested!r}")
    return min(float(requested), config.llm.max_timeout)


def _litellm_model(provider: str, model: str) -> str:
    if provider == "custom":  # any OpenAI-compatible endpoint at model.base_url
        return f"openai/{model}"
    return f"{provider}/{model}"


def resolve_route(
    config: HostConfig,
    *,
    provider: str | None = None,
    model: str | None = None,
    profile: str | None = None,
    timeout: float | None = None,
) -> Route:
    """Route for a call whose overrides already passed the trust gate.

    The provider is the granted ``provider=`` override or the one config.py
    decided for ``model:``; a ``model=`` override is a model name *within*
    that provider (``openai/gpt-4o`` asked of a custom endpoint is sent to that
    endpoint under that name), so it never changes provider, endpoint or key.
    """
    base = config.model
    chosen_provider = (provider or base.provider or "").strip().lower()
    if not chosen_provider:
        raise PluginLlmConfigError(
            f"cannot tell which provider serves model {base.model!r}: set model.provider in {config.path}"
        )
    problem = unknown_provider_problem(chosen_provider)
    if problem is not None:  # refused before prices and keys: their fixes would repeat the typo
        if provider:
            raise PluginLlmConfigError(f"provider override: {problem}; the call was not sent")
        raise PluginLlmConfigError(f"model.provider in {config.path}: {problem}. Fix: {provider_fix(chosen_provider)}")
    chosen_model = (model if model is not None else base.model).strip()
    if chosen_model.lower().startswith(chosen_provider + "/"):
        chosen_model = chosen_model[len(chosen_provider) + 1 :]
    if chosen_provider == LOCAL_PROVIDER and not chosen_model:
        chosen_model = DEFAULT_LOCAL_MODEL
    if not chosen_model:
        raise PluginLlmConfigError(f"no model configured for provider {chosen_provider!r}: set model.model in {config.path}")
    # The operator's base_url belongs to the operator's provider; an overridden
    # provider goes to that provider's own endpoint.
    base_url = base.base_url if chosen_provider == (base.provider or "") else None
    if chosen_provider == "custom" and not base_url:
        raise PluginLlmConfigError(
            f"provider 'custom' needs an endpoint: set model.base_url in {config.path} (e.g. http://127.0.0.1:8080/v1)"
        )
    supports = base.supports_json_schema if chosen_provider == (base.provider or "") else None
    if chosen_provider == LOCAL_PROVIDER:
        supports = True
    return Route(
        provider=chosen_provider,
        model=chosen_model,
        litellm_model=_litellm_model(chosen_provider, chosen_model),
        base_url=base_url,
        profile=profile,
        timeout=call_timeout(config, timeout),
        max_retries=config.llm.max_retries,
        supports_json_schema=supports,
    )
