"""Which provider names exist: litellm's, plus ``custom`` and ``local`` — without importing litellm.

A typo such as ``model.provider: opnai`` or ``plugin-llm auth add opneai``
would otherwise only surface as a confusing failure on the first call. The
names come from litellm's ``LlmProviders`` enum, read as text from its
installed source (importing litellm costs seconds; commands that do not call
a model never import it). The common names are known without reading
anything.
"""

from __future__ import annotations

import difflib
import functools

from auth.env_names import litellm_providers as _litellm_providers
from auth.providers import ENV_VARS

__all__ = ["known_providers", "unknown_provider_problem", "provider_fix", "closest_provider"]

_HOST_PROVIDERS = frozenset({"custom", "local"})


@functools.lru_cache(maxsize=1)
def known_providers() -> frozenset[str]:
    """Every provider name a route may use (empty litellm list when litellm cannot be read)."""
    return _HOST_PROVIDERS | frozenset(ENV_VARS) | _litellm_providers()


def unknown_provider_problem(name: str) -> str | None:
    """None for a known provider, else a one-line problem with a "did you mean"."""
    name = name.strip().lower()
    if name in _HOST_PROVIDERS or name in ENV_VARS:
        return None  # the common names: no file read
    known = known_providers()
    if name in known or len(known) <= len(_HOST_PROVIDERS) + len(ENV_VARS):
        return None  # litellm's list is unreadable: do not guess
    close = _closest(name, known)
    hint = f" (did you mean {close!r}?)" if close else ""
    return (f"unknown provider {name!r}{hint}: use one of litellm's provider names (openai, anthropic, "
            "openrouter, gemini, ollama, ...), custom (an OpenAI-compatible model.base_url) or local")


def _closest(name: str, known: frozenset[str]) -> str | None:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return close[0] if close else None


def closest_provider(name: str) -> str | None:
    """The known provider an unknown ``name`` most likely means (None when none is close)."""
    return _closest(name.strip().lower(), known_providers())


def provider_fix(name: str, key: str = "model.provider") -> str:
    """The fix for an unknown provider ``name`` written at ``key``: never the misspelt name itself."""
    close = closest_provider(name)
    if close:
        return f"set {key}: {close}"
    return f"set {key} to a provider name litellm knows (openai, anthropic, openrouter, gemini, ollama, ...), custom or local"
