"""The routes of config.yaml: the default route (``model:``) and the model catalog (``models:``).

Pure: takes the parsed YAML values, returns frozen routes and warnings. A route names a provider, a
model, optionally the operator's endpoint (``base_url``) and key profile, and the routes to fall back
to. A route that cannot be used keeps its ``problem``: every call on it is refused with those words.
The rules and examples: docs/routes.md.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from plugin_llm.hardened.bounded_repr import short_repr
from plugin_llm.config.values import did_you_mean, parse_bool
from plugin_llm.provider_names import unknown_provider_problem

__all__ = [
    "LOCAL_PROVIDER",
    "DEFAULT_LOCAL_MODEL",
    "MAX_FALLBACKS",
    "MAX_ROUTES",
    "RouteConfig",
    "parse_models",
    "parse_default_route",
    "shown_url",
    "register_url_secrets",
    "infer_provider",
]

LOCAL_PROVIDER = "local"
DEFAULT_LOCAL_MODEL = "local-echo-1"
#: a catalog is a handful of routes; more is a generated file gone wrong
MAX_ROUTES = 256
#: fallbacks one route may name (each is a full provider request within the call's one deadline)
MAX_FALLBACKS = 8
#: a route's name: what plugins pass as ``model=`` and operators list in ``allowed_models``; never a
#: ``/`` (``provider/model`` is a raw model name), never blank
ROUTE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")
ENTRY_KEYS = ("provider", "model", "base_url", "profile", "supports_json_schema", "fallbacks", "timeout")
#: the longest attempt bound accepted (a call's own deadline, llm.max_timeout, bounds it anyway)
MAX_ATTEMPT_SECONDS = 3600.0
DEFAULT_KEYS = ("route", "fallbacks", "provider", "model", "default", "base_url", "supports_json_schema")

#: model-name prefixes used to infer the provider of a plain ``model: x``
_PROVIDER_BY_PREFIX = (
    ("gpt-", "openai"), ("o1", "openai"), ("o3", "openai"), ("o4", "openai"), ("chatgpt-", "openai"),
    ("claude", "anthropic"), ("gemini", "gemini"), ("mistral", "mistral"), ("codestral", "mistral"),
    ("deepseek", "deepseek"), ("grok", "xai"), ("command", "cohere"), ("local-", LOCAL_PROVIDER),
)


@dataclass(frozen=True)
class RouteConfig:
    """One route: the default one (``model:``) or a catalog entry (``models.<name>``)."""

    provider: str | None = LOCAL_PROVIDER
    model: str = DEFAULT_LOCAL_MODEL
    base_url: str | None = None
    #: force native ``json_schema`` response_format on/off (None: ask litellm)
    supports_json_schema: bool | None = None
    #: the key profile of auth.json this route uses (None: the provider's default key)
    profile: str | None = None
    #: the catalog name (None: an inline ``model:`` route)
    name: str | None = None
    #: catalog names tried in order when this route fails in a way another provider can fix
    fallbacks: tuple[str, ...] = ()
    #: why calls on this route are refused (a ``model.route`` naming no catalog entry)
    problem: str | None = None
    #: the longest one attempt on this route may take when a fallback follows it (None: the call's
    #: whole remaining deadline), so that a hung provider leaves time for the next route
    timeout: float | None = None

    def __repr__(self) -> str:  # the endpoint's userinfo is a secret
        return (f"RouteConfig(name={self.name!r}, provider={self.provider!r}, model={self.model!r}, "
                f"base_url={shown_url(self.base_url)!r}, profile={self.profile!r}, "
                f"supports_json_schema={self.supports_json_schema!r}, fallbacks={self.fallbacks!r})")

    @property
    def label(self) -> str:
        """The route as operators name it: its catalog name, else ``provider/model``."""
        return self.name or f"{self.provider}/{self.model}"


def shown_url(url: str | None) -> str | None:
    """``url`` for messages, output and reprs: through the redactor, so its userinfo
    (``https://user:pass@host``) and any key in it are hidden."""
    if not url or not isinstance(url, str):
        return url
    from auth.redaction import redact

    return redact(url)


def register_url_secrets(url: str) -> None:
    """Teach the redactor the credentials in an endpoint URL's userinfo, so that they are hidden
    wherever they appear, also without the URL around them (a provider echoing them)."""
    from urllib.parse import unquote, urlsplit

    from auth.redaction import register_secret

    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return
    userinfo, at, _ = parts.netloc.rpartition("@")
    if not at:
        return
    user, _, password = userinfo.partition(":")
    secret = password or user  # a token alone stands in the user's place
    register_secret(secret)
    register_secret(unquote(secret))


def infer_provider(model: str) -> str | None:
    lowered = model.lower()
    for prefix, provider in _PROVIDER_BY_PREFIX:
        if lowered.startswith(prefix):
            return provider
    return None




def _route_fields(raw: Mapping[str, Any], where: str, warnings: list[str]) -> dict[str, Any]:
    """provider, model, base_url and supports_json_schema of a route mapping (the provider decided
    here, once, from config alone: a model override can then never switch provider, endpoint or key)."""
    provider = raw.get("provider")
    model = raw.get("model", raw.get("default"))
    base_url = raw.get("base_url")
    if provider is not None and not isinstance(provider, str):
        warnings.append(f"{where}.provider: expected a string, got {short_repr(provider)}")
        provider = None
    if model is not None and not isinstance(model, str):
        warnings.append(f"{where}.model: expected a string, got {short_repr(model)}")
        model = None
    if base_url is not None and not isinstance(base_url, str):
        warnings.append(f"{where}.base_url: expected a URL string, got {type(base_url).__name__}")
        base_url = None
    provider = provider.strip().lower() if provider else None
    if not model:
        model = DEFAULT_LOCAL_MODEL if provider in (None, LOCAL_PROVIDER) else ""
        if not model:
            warnings.append(f"{where}.model is missing for provider {short_repr(provider)}")
    if provider is None:
        if base_url:
            provider = "custom"  # an endpoint without a provider is an OpenAI-compatible one
        elif "/" in model:
            provider, _, model = model.partition("/")
            provider = provider.strip().lower()
        else:
            provider = infer_provider(model) if model else LOCAL_PROVIDER
    if provider is not None:
        problem = unknown_provider_problem(provider)
        if problem is not None:
            warnings.append(f"{where}.provider: {problem}")
    if provider == "custom" and not base_url:
        warnings.append(f"{where}.provider is 'custom' but {where}.base_url is not set; calls will fail until it is")
    supports = raw.get("supports_json_schema")
    if supports is not None:
        supports = parse_bool(supports, f"{where}.supports_json_schema", warnings)
    if base_url:
        register_url_secrets(base_url)
    return {"provider": provider, "model": model.strip(), "base_url": base_url or None,
            "supports_json_schema": supports}


def _fallbacks(value: Any, where: str, own: str | None, names: Mapping[str, Any], warnings: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        warnings.append(f"{where}: expected a list of route names of models:, got {short_repr(value)}; no fallback")
        return ()
    out: list[str] = []
    for item in value:
        if not isinstance(item, str) or item.strip() not in names:
            hint = did_you_mean(item, names) if isinstance(item, str) else ""
            known = ", ".join(sorted(names)[:10]) or "none: models: is empty"
            warnings.append(f"{where}: {short_repr(item)} is not a route of models:{hint} (routes: {known}); it is "
                            "skipped")
            continue
        item = item.strip()
        if item == own or item in out:
            warnings.append(f"{where}: {item!r} is listed twice or names the route itself; it is tried once")
            continue
        out.append(item)
    if len(out) > MAX_FALLBACKS:
        warnings.append(f"{where}: {len(out)} fallbacks; only the first {MAX_FALLBACKS} are tried")
        out = out[:MAX_FALLBACKS]
    return tuple(out)


def _profile(value: Any, where: str, warnings: list[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > 128:
        warnings.append(f"{where}: expected a key profile name of auth.json, got {short_repr(value)}; the "
                        "provider's default key is used")
        return None
    return value.strip()


def _attempt_timeout(value: Any, where: str, warnings: list[str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_ATTEMPT_SECONDS:
        warnings.append(f"{where}: expected seconds between 0 and {MAX_ATTEMPT_SECONDS:.0f}, got {short_repr(value)}; "
                        "an attempt on this route may take the call's whole remaining time")
        return None
    return float(value)


def parse_models(raw: Any, warnings: list[str]) -> Mapping[str, RouteConfig]:
    """``models:``: the catalog of named routes (empty when absent or unusable)."""
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping):
        warnings.append(f"models: expected a mapping of route name -> {{provider, model, ...}}, got "
                        f"{type(raw).__name__}; no route of the catalog can be used")
        return MappingProxyType({})
    entries: dict[str, Mapping[str, Any]] = {}
    for name, entry in raw.items():
        where = f"models.{short_repr(name) if not isinstance(name, str) else name}"
        if not isinstance(name, str) or not ROUTE_NAME.match(name):
            warnings.append(f"{where}: a route name is letters, digits and . _ : @ + - (no '/', at most 128 "
                            "characters); this route is ignored")
            continue
        if isinstance(entry, str):
            entry = {"model": entry}
        if not isinstance(entry, Mapping):
            warnings.append(f"{where}: expected a mapping like {{provider: openai, model: gpt-4o-mini}}, got "
                            f"{short_repr(entry)}; this route is ignored")
            continue
        if len(entries) == MAX_ROUTES:
            warnings.append(f"models: more than {MAX_ROUTES} routes; {where} and the ones after it are ignored")
            break
        entries[name] = entry
    routes: dict[str, RouteConfig] = {}
    for name, entry in entries.items():
        where = f"models.{name}"
        for key in entry:
            if key not in ENTRY_KEYS:
                warnings.append(f"{where}.{short_repr(key)}: unknown key, ignored{did_you_mean(str(key), ENTRY_KEYS)}")
        routes[name] = RouteConfig(
            **_route_fields(entry, where, warnings),
            profile=_profile(entry.get("profile"), f"{where}.profile", warnings),
            name=name,
            fallbacks=_fallbacks(entry.get("fallbacks"), f"{where}.fallbacks", name, entries, warnings),
            timeout=_attempt_timeout(entry.get("timeout"), f"{where}.timeout", warnings),
        )
    return MappingProxyType(routes)


def parse_default_route(raw: Any, models: Mapping[str, RouteConfig], warnings: list[str]) -> RouteConfig:
    """``model:``: a model name (``gpt-4o-mini``, ``openai/gpt-4o-mini``, or a route of the catalog), a
    mapping ``{provider, model, base_url, ...}``, or ``{route: <name>, fallbacks: [<name>, ...]}``."""
    if raw is None:
        return RouteConfig()
    if isinstance(raw, str):
        name = raw.strip()
        if name in models:
            return models[name]
        if "/" in name:
            provider, _, rest = name.partition("/")
            provider = provider.strip().lower()
            problem = unknown_provider_problem(provider)
            if problem is not None:  # the same warning as for model.provider (the route refuses it too)
                warnings.append(f"model.provider: {problem}")
            return RouteConfig(provider=provider, model=rest)
        return RouteConfig(provider=infer_provider(name), model=name)
    if not isinstance(raw, Mapping):
        warnings.append(f"model: expected a mapping or a model name, got {type(raw).__name__}; using the local model")
        return RouteConfig()
    for key in raw:
        if key not in DEFAULT_KEYS:
            warnings.append(f"model.{short_repr(key)}: unknown key, ignored{did_you_mean(str(key), DEFAULT_KEYS)}")
    route = raw.get("route")
    if route is None:
        fields = _route_fields(raw, "model", warnings)
        fallbacks = _fallbacks(raw.get("fallbacks"), "model.fallbacks", None, models, warnings)
        return RouteConfig(**fields, fallbacks=fallbacks)
    inline = sorted(k for k in ("provider", "model", "default", "base_url", "supports_json_schema") if k in raw)
    if inline:
        warnings.append(f"model: {', '.join(inline)} ignored: model.route names the route (set them in models.{route})")
    if not isinstance(route, str) or route.strip() not in models:
        known = ", ".join(sorted(models)[:10]) or "none: models: is empty"
        hint = did_you_mean(route, models) if isinstance(route, str) else ""
        problem = (f"model.route {short_repr(route)} is not a route of models:{hint} (routes: {known}); fix "
                   "model.route in config.yaml")
        warnings.append(problem + "; every call on the default route is refused until it is fixed")
        return RouteConfig(provider=None, model="", problem=problem)
    base = models[route.strip()]
    if "fallbacks" not in raw:
        return base
    fallbacks = _fallbacks(raw.get("fallbacks"), "model.fallbacks", base.name, models, warnings)
    return dataclasses.replace(base, fallbacks=fallbacks)
