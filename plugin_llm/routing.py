"""Pure routing: (HostConfig, granted overrides) -> Route.

The route says which provider and model a call goes to, the litellm model
string, the operator's endpoint (plugins can never set one), the call's total
timeout and retry budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from plugin_llm.config import DEFAULT_LOCAL_MODEL, LOCAL_PROVIDER, HostConfig, shown_url
from plugin_llm.config.routes import RouteConfig
from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.provider_names import provider_fix, unknown_provider_problem
from plugin_llm.trust import Overrides

__all__ = ["Route", "resolve_route", "resolve_chain", "catalog_route", "requested_overrides", "call_timeout"]


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
    #: the catalog route's name (``models.<name>``); None for the inline ``model:`` route or a raw model
    name: str | None = None
    #: the longest one attempt may take when a fallback follows (``models.<name>.timeout``)
    attempt_timeout: float | None = None

    @property
    def label(self) -> str:
        """The route as operators name it: its catalog name, else ``provider/model``."""
        return self.name or f"{self.provider}/{self.model}"

    def __repr__(self) -> str:  # the endpoint's userinfo is a secret
        return (f"Route(name={self.name!r}, provider={self.provider!r}, model={self.model!r}, "
                f"litellm_model={self.litellm_model!r}, "
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


def catalog_route(config: HostConfig, provider: str | None, model: str | None) -> RouteConfig | None:
    """The route a call asks for by name: ``model=`` naming a route of ``models:`` (and no
    ``provider=``: with a provider, ``model=`` is that provider's model name), else None."""
    if provider is None and model is not None:
        return config.models.get(model.strip())
    return None


def requested_overrides(config: HostConfig, *, provider: str | None, model: str | None, agent_id: str | None,
                        profile: str | None) -> Overrides:
    """What a call asks the trust gate for: the default route asked for by its own name is no
    override; a route of the catalog carries its provider (the gate covers where it goes)."""
    if provider is None and model is not None and model.strip() == config.model.name:
        model = None
    active = (provider or config.model.provider or "").lower() or None
    named = catalog_route(config, provider, model)
    return Overrides(provider=provider, model=model, agent_id=agent_id, profile=profile, active_provider=active,
                     route_provider=(named.provider or "") if named is not None else None)


def resolve_chain(
    config: HostConfig,
    *,
    provider: str | None = None,
    model: str | None = None,
    profile: str | None = None,
    timeout: float | None = None,
    task: str | None = None,
) -> tuple[Route, ...]:
    """The routes of a call, in the order they are tried: the route :func:`resolve_route` picks, then
    its fallbacks when it is a route of the catalog or the default route (a raw model or provider
    override has none). A fallback that cannot be used (see the config warnings) is left out.

    ``task`` (a key past the trust gate) with a route in ``auxiliary.<task>``: that route and its
    fallbacks, whatever ``provider=``/``model=`` say (the slot's route wins, as Hermes attributes the
    call); its ``timeout`` is the deadline when ``timeout=`` is not given. A task without a slot, or
    whose slot names no route, is the call without it."""
    slot = config.auxiliary.get(task) if task else None
    if slot is not None and timeout is None:
        timeout = slot.timeout
    if slot is not None and slot.route is not None:
        first = _route(config, slot.route, None, profile, call_timeout(config, timeout))
        return (first, *_fallback_routes(config, slot.fallbacks, profile, first.timeout))
    first = resolve_route(config, provider=provider, model=model, profile=profile, timeout=timeout)
    if provider is None and model is None:
        names = config.model.fallbacks
    elif (named := catalog_route(config, provider, model)) is not None:
        names = named.fallbacks
    else:
        return (first,)
    routes = tuple(config.models[name] for name in names if name in config.models)
    return (first, *_fallback_routes(config, routes, profile, first.timeout))


def _fallback_routes(config: HostConfig, routes: tuple[RouteConfig, ...], profile: str | None,
                     seconds: float) -> tuple[Route, ...]:
    chain = []
    for base in routes:
        try:
            chain.append(_route(config, base, None, profile, seconds))
        except PluginLlmConfigError:
            continue
    return tuple(chain)


def resolve_route(
    config: HostConfig,
    *,
    provider: str | None = None,
    model: str | None = None,
    profile: str | None = None,
    timeout: float | None = None,
) -> Route:
    """Route for a call whose overrides already passed the trust gate.

    ``model=`` naming a route of the catalog is that route, whole: its provider, model, endpoint and
    key profile. Otherwise the provider is the granted ``provider=`` override or the one config.py
    decided for ``model:``; a ``model=`` override is a model name *within* that provider
    (``openai/gpt-4o`` asked of a custom endpoint is sent to that endpoint under that name), so it
    never changes provider, endpoint or key.
    """
    seconds = call_timeout(config, timeout)
    named = catalog_route(config, provider, model)
    if named is not None:
        return _route(config, named, None, profile, seconds)
    if provider is None and model is None:
        return _route(config, config.model, None, profile, seconds)
    return _route(config, config.model, (provider, model), profile, seconds)


def _profile(base: RouteConfig, whole: bool, same: bool, asked: str | None) -> str | None:
    """The key profile: a route's own (a plugin's ``profile=`` cannot move a route that names its key
    to another one), else the granted ``profile=``, else, for a model override on the route's own
    provider, the route's."""
    if whole and base.profile is not None:
        return base.profile
    if asked is not None:
        return asked
    return base.profile if same else None


def _route(config: HostConfig, base: RouteConfig, override: tuple[str | None, str | None] | None,
           profile: str | None, seconds: float) -> Route:
    """``base`` as a route, or with a granted (provider, model) override applied to it."""
    if base.problem is not None:
        raise PluginLlmConfigError(base.problem)
    provider, model = override or (None, None)
    where = f"models.{base.name}" if base.name else "model"
    chosen_provider = (provider or base.provider or "").strip().lower()
    if not chosen_provider:
        raise PluginLlmConfigError(
            f"cannot tell which provider serves model {base.model!r}: set {where}.provider in {config.path}"
        )
    problem = unknown_provider_problem(chosen_provider)
    if problem is not None:  # refused before prices and keys: their fixes would repeat the typo
        if provider:
            raise PluginLlmConfigError(f"provider override: {problem}; the call was not sent")
        raise PluginLlmConfigError(f"{where}.provider in {config.path}: {problem}. Fix: {provider_fix(chosen_provider)}")
    chosen_model = (model if model is not None else base.model).strip()
    if chosen_model.lower().startswith(chosen_provider + "/"):
        chosen_model = chosen_model[len(chosen_provider) + 1 :]
    if chosen_provider == LOCAL_PROVIDER and not chosen_model:
        chosen_model = DEFAULT_LOCAL_MODEL
    if not chosen_model:
        raise PluginLlmConfigError(f"no model configured for provider {chosen_provider!r}: set {where}.model in {config.path}")
    # The operator's base_url belongs to the operator's provider; an overridden
    # provider goes to that provider's own endpoint.
    same = chosen_provider == (base.provider or "")
    base_url = base.base_url if same else None
    if chosen_provider == "custom" and not base_url:
        raise PluginLlmConfigError(
            f"provider 'custom' needs an endpoint: set {where}.base_url in {config.path} (e.g. http://127.0.0.1:8080/v1)"
        )
    supports = base.supports_json_schema if same else None
    if chosen_provider == LOCAL_PROVIDER:
        supports = True
    return Route(
        provider=chosen_provider,
        model=chosen_model,
        litellm_model=_litellm_model(chosen_provider, chosen_model),
        base_url=base_url,
        profile=_profile(base, override is None, same, profile),
        timeout=seconds,
        max_retries=config.llm.max_retries,
        supports_json_schema=supports,
        name=base.name if override is None else None,
        attempt_timeout=base.timeout if override is None else None,
    )
