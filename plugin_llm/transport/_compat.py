"""The other OpenAI-compatible providers on the gateway's own path: what litellm's config of each changes.

For each provider of :data:`PROVIDERS`, litellm's chat config is OpenAI's plus a few well-defined
differences, reproduced here: the endpoint (litellm's default and environment variable), the
parameters its config passes on, the ones it drops or rewrites, how it sends message contents, and
whether ``litellm.completion`` reaches it through the openai SDK (then the reply's model is named
``<provider>/<model>`` and an error's message is taken from its body). :func:`build` resolves a
route once, without litellm; a request, model or reply handled any other way goes to litellm's fast
path, as for OpenAI routes. tests/test_transport_own.py compares every provider with litellm's
config piece by piece and on the wire. Which providers and why: docs/design.md, "Transport".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from plugin_llm.transport._pricemap import PriceMap, provider_entry

__all__ = ["PROVIDERS", "SCHEMA_PROVIDERS", "Provider", "Shape", "supports", "openai_params", "openai_catalog", "ensure_route",
           "join_route"]

#: the gateway's parameters litellm's OpenAI chat config passes on for any model
_OPENAI_PARAMS = frozenset({"temperature", "max_tokens", "tools", "tool_choice", "top_p", "stop", "seed",
                            "presence_penalty", "frequency_penalty", "logit_bias", "n"})
#: models litellm's OpenAI config refuses ``response_format`` for
NO_RESPONSE_FORMAT = frozenset({"gpt-3.5-turbo-16k", "gpt-4"})
_TOOL_PARAMS = ("tools", "tool_choice")
#: providers ``litellm.supports_response_schema`` answers yes for, whatever the model
SCHEMA_PROVIDERS = frozenset({"lm_studio", "nebius"})


def openai_catalog(prices: PriceMap, model: str) -> bool:
    """``OpenAIGPTConfig.is_openai_catalog_model``: an ``openai`` key of the map spelt as ``model``."""
    exact = prices.entry(model)
    return exact is not None and exact[0] == model and not (model.startswith("ft:") and model.count(":") <= 1) \
        and exact[1].get("litellm_provider") in ("openai", "text-completion-openai")


def openai_params(model: str, prices: PriceMap) -> frozenset[str]:
    """The gateway's parameters ``OpenAIGPTConfig.get_supported_openai_params(model)`` lists."""
    supported = set(_OPENAI_PARAMS)
    if model not in NO_RESPONSE_FORMAT:
        supported.add("response_format")
    if openai_catalog(prices, model):
        supported.add("user")
    return frozenset(supported)


def supports(prices: PriceMap, model: str, provider: str, key: str) -> bool:
    """``litellm.utils.supports_factory`` for a model mapped under ``provider`` (or not mapped at all):
    its entry's flag, else, when the entry leaves it out, the flag of the bare name's entry."""
    found = provider_entry(prices, model, provider)
    if found is None:
        return False
    value = found[1].get(key)
    if value is True:
        return True
    if value is None:
        bare = prices.entry(model)
        return bare is not None and bare[1].get(key) is True
    return False


# ------------------------------------------------------------------ URLs (litellm's url_utils)
def _strip_slashes(base: str) -> str:
    from urllib.parse import urlsplit

    stripped = base.rstrip("/")
    parts = urlsplit(stripped)
    if parts.scheme and not (parts.netloc or parts.path or parts.query or parts.fragment):
        return base
    if not parts.query or not parts.path.endswith("/"):
        return stripped
    before, _, query = stripped.partition("?")
    return f"{before.rstrip('/')}?{query}"


def join_route(base: str, route: str = "chat/completions") -> str:
    """``join_api_base``: the route appended to the endpoint."""
    return f"{_strip_slashes(base)}/{route.lstrip('/')}"


def ensure_route(base: str, route: str = "chat/completions") -> str:
    """``ensure_api_route``: the endpoint when its path already ends in the route, else the route joined."""
    from urllib.parse import urlsplit

    stripped = _strip_slashes(base)
    if urlsplit(stripped).path.endswith(f"/{route.lstrip('/')}"):
        return stripped
    return join_route(stripped, route)


def openai_url(base: str) -> str:
    """``OpenAIGPTConfig.get_complete_url``."""
    base = base.rstrip("/")
    return base if "chat/completions" in base else join_route(base)


# ------------------------------------------------------------------ contents
def _has_image(content: Any) -> bool:
    return type(content) is list and any(part.get("type") != "text" for part in content)


def _texts(content: list) -> str:
    """``convert_content_list_to_str``: the parts' texts run together (a part without text adds none)."""
    return "".join(part["text"] for part in content if part.get("text"))


def _collapsed(messages: list, roles: frozenset[str] | None = None) -> list | None:
    """Every text-part list (of ``roles``, or any role) as one string, as litellm's
    ``handle_messages_with_content_list_to_str_conversion`` sends it; None for a list with an image."""
    out = messages
    for i, message in enumerate(messages):
        content = message.get("content")
        if type(content) is not list or (roles is not None and message.get("role") not in roles):
            continue
        if _has_image(content):
            return None  # litellm would drop the image or forward it by a capability rule: its own call
        texts = _texts(content)
        if texts:
            if out is messages:
                out = list(messages)
            out[i] = {**message, "content": texts}
    return out


def _tool_texts(messages: list) -> list | None:
    """DeepInfra's tool results: a single text part as its text, any other list as its JSON."""
    out = messages
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "tool" or type(content) is not list:
            continue
        if len(content) == 1 and content[0].get("type") == "text" and "text" in content[0]:
            text = content[0]["text"]
        else:
            text = json.dumps(content)
        if out is messages:
            out = list(messages)
        out[i] = {**message, "content": text}
    return out


# ------------------------------------------------------------------ one provider
@dataclass(frozen=True)
class Shape:
    """What one route's requests go through beyond OpenAI's config (resolved once per route)."""

    drop: frozenset[str] = frozenset()  # parameters the config drops for this model
    contents: Callable[[list], list | None] | None = None  # the messages as the config sends them
    function_tools_only: bool = False  # a tool of another type: litellm's call (it filters them)
    refuse: Callable[[dict], bool] | None = None  # a request the config rewrites in a way not reproduced here

    def adapt(self, messages: list, optional: dict) -> tuple[list, dict] | None:
        """(messages, optional params) as the provider's config sends them, or None (litellm's call)."""
        if self.refuse is not None and self.refuse(optional):
            return None
        if self.drop and not self.drop.isdisjoint(optional):
            optional = {k: v for k, v in optional.items() if k not in self.drop}
        if self.function_tools_only and any(tool.get("type") != "function" for tool in optional.get("tools") or ()):
            return None
        if self.contents is not None:
            messages = self.contents(messages)
            if messages is None:
                return None
        return messages, optional


_PLAIN = Shape()


@dataclass(frozen=True)
class Provider:
    """A provider litellm serves with an OpenAI-like config, as the own path reproduces it."""

    base_env: tuple[str, ...]  # where litellm reads the endpoint from, in order, before its default
    default_base: str | None  # litellm's default endpoint (None: the route must name one)
    params: Callable[[str, PriceMap], frozenset[str]] = openai_params  # what its config passes on
    shape: Callable[[str, PriceMap], Shape] = lambda model, prices: _PLAIN  # noqa: E731
    url: Callable[[str], str] = openai_url  # its ``get_complete_url``

    def endpoint(self, base_url: str | None) -> str | None:
        """The endpoint litellm sends to: the route's, else the environment's, else litellm's default."""
        if base_url:
            return base_url
        for name in self.base_env:
            value = os.environ.get(name)
            if value:
                return value
        return self.default_base


# -- the providers' differences from OpenAI's config
def _listed(*names: str) -> Callable[[str, PriceMap], frozenset[str]]:
    supported = frozenset(names) & (_OPENAI_PARAMS | {"response_format", "user"})
    return lambda model, prices: supported


def _nvidia_params(model: str, prices: PriceMap) -> frozenset[str]:
    """``NvidiaNimConfig.get_supported_openai_params``: a few models take fewer."""
    if model in ("google/recurrentgemma-2b", "google/gemma-2-27b-it", "google/gemma-2-9b-it", "gemma-2-9b-it"):
        return frozenset({"temperature", "top_p", "max_tokens", "stop", "seed"})
    if model == "nvidia/nemotron-4-340b-instruct":
        return frozenset({"temperature", "top_p", "max_tokens"})
    if model == "nvidia/nemotron-4-340b-reward":
        return frozenset()
    if model == "google/codegemma-1.1-7b":
        return frozenset({"temperature", "top_p", "frequency_penalty", "presence_penalty", "max_tokens", "stop"})
    return frozenset({"temperature", "top_p", "frequency_penalty", "presence_penalty", "max_tokens", "stop", "seed",
                      "tools", "tool_choice", "response_format"})


def _sambanova_params(model: str, prices: PriceMap) -> frozenset[str]:
    """``SambanovaConfig``: tools only for a model the map says calls functions."""
    supported = {"max_tokens", "response_format", "stop", "temperature", "top_p"}
    if supports(prices, model, "sambanova", "supports_function_calling"):
        supported |= {"tools", "tool_choice"}
    return frozenset(supported)


def _deepseek_shape(model: str, prices: PriceMap) -> Shape:
    """``DeepSeekChatConfig``: text-part lists as one string, function tools only."""
    return Shape(contents=_collapsed, function_tools_only=True)


def _sambanova_shape(model: str, prices: PriceMap) -> Shape:
    return Shape(contents=_collapsed)


def _deepinfra_shape(model: str, prices: PriceMap) -> Shape:
    """``DeepInfraConfig``: ``tool_choice`` never passed on; tool results as text; one model's
    temperature 0 raised (left to litellm)."""
    zero = model == "mistralai/Mistral-7B-Instruct-v0.1"
    return Shape(drop=frozenset({"tool_choice"}), contents=_tool_texts, refuse=_zero_temperature if zero else None)


def _zero_temperature(optional: dict) -> bool:
    return optional.get("temperature") == 0


def _together_verdict(prices: PriceMap, model: str, flag: str) -> bool | None:
    """``together_ai``'s ``_registry_verdict``: True when the map says so, False when the entry under
    ``together_ai/<model>`` says no, else unknown (passed through for Together to judge)."""
    if supports(prices, model, "together_ai", flag):
        return True
    name = f"together_ai/{model}"
    exact = prices.entry(name)
    if exact is not None and exact[0] == name and exact[1].get(flag) is False:
        return False
    return None


def _together_shape(model: str, prices: PriceMap) -> Shape:
    """``TogetherAIChatConfig``: tools and ``response_format`` dropped for a model the map says cannot
    take them (``drop_params``); assistant messages without litellm's reply-only fields."""
    drop = set()
    if _together_verdict(prices, model, "supports_function_calling") is False:
        drop |= set(_TOOL_PARAMS)
    if _together_verdict(prices, model, "supports_response_schema") is False:
        drop.add("response_format")
    return Shape(drop=frozenset(drop))


def _lm_studio_shape(model: str, prices: PriceMap) -> Shape:
    """``LMStudioChatConfig``: a ``json_schema`` format given without its ``json_schema`` key is rebuilt
    (left to litellm)."""
    def refuse(optional: dict) -> bool:
        fmt = optional.get("response_format")
        return type(fmt) is dict and fmt.get("type") == "json_schema" and "json_schema" not in fmt
    return Shape(refuse=refuse)


#: the providers the own path serves, by litellm's name. Each is on the fast path too
#: (``_fastpath.FAST_PROVIDERS``): with the own path switched off, litellm's config serves it there.
PROVIDERS: dict[str, Provider] = {
    "deepseek": Provider(("DEEPSEEK_API_BASE",), "https://api.deepseek.com/beta", shape=_deepseek_shape,
                         url=ensure_route),
    "cerebras": Provider(("CEREBRAS_API_BASE",), "https://api.cerebras.ai/v1",
                         params=_listed("max_tokens", "response_format", "seed", "stop", "temperature", "top_p",
                                        "tool_choice", "tools", "user")),
    "nebius": Provider(("NEBIUS_API_BASE",), "https://api.studio.nebius.ai/v1"),
    "nvidia_nim": Provider(("NVIDIA_NIM_API_BASE",), "https://integrate.api.nvidia.com/v1", params=_nvidia_params),
    "llamafile": Provider(("LLAMAFILE_API_BASE",), "http://127.0.0.1:8080/v1"),
    "lm_studio": Provider(("LM_STUDIO_API_BASE",), None, shape=_lm_studio_shape),
    "hyperbolic": Provider(("HYPERBOLIC_API_BASE",), "https://api.hyperbolic.xyz/v1",
                           params=_listed("temperature", "top_p", "max_tokens", "frequency_penalty",
                                          "presence_penalty", "stop", "n", "tools", "tool_choice",
                                          "response_format", "seed", "user")),
    "together_ai": Provider(("TOGETHER_AI_API_BASE",), "https://api.together.ai/v1", shape=_together_shape),
    "deepinfra": Provider(("DEEPINFRA_API_BASE",), "https://api.deepinfra.com/v1/openai",
                          params=_listed("frequency_penalty", "logit_bias", "max_tokens", "n", "presence_penalty",
                                         "stop", "temperature", "top_p", "response_format", "tools", "tool_choice"),
                          shape=_deepinfra_shape),
    "sambanova": Provider(("SAMBANOVA_API_BASE",), "https://api.sambanova.ai/v1", params=_sambanova_params,
                          shape=_sambanova_shape),
}
