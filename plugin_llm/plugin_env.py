"""Which environment variables a plugin may read: none that may hold a credential of this host.

One predicate for every place that hands a plugin a variable (the Hermes
``get_env_value`` shims, an isolated child's ``requires_env``), built on
:func:`auth.env_names.is_credential_name` with this home's own names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from auth.env_names import auth_file_names, is_credential_name

__all__ = ["credential_check"]

#: the gateway's own variables (its service token, ...), never a plugin's
_HOST_PREFIX = "PLUGIN_LLM_"


def credential_check(home: Path) -> Callable[[str], bool]:
    """``check(name)`` is True when ``name`` may hold a credential of this host's, so a plugin gets nothing.

    Counts auth.json's ``key_env`` names and providers, and the configured
    route's provider (``model.provider``, also one litellm does not list).
    """
    key_names, providers = auth_file_names(home)
    route = _route_provider(home)
    names = frozenset(key_names)
    all_providers = providers | ({route} if route else set())

    def check(name: str) -> bool:
        return name.upper().startswith(_HOST_PREFIX) or is_credential_name(name, key_names=names,
                                                                           providers=all_providers)

    return check


def _route_provider(home: Path) -> str | None:
    try:
        from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

        provider = get_config_source(Path(home)).current().model.provider
    except Exception:  # no usable config: the known providers still apply
        return None
    return provider if isinstance(provider, str) and provider else None
