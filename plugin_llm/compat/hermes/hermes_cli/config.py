"""``hermes_cli.config`` for plugins: this host's ``config.yaml`` and ``.env``.

``load_config()`` is a deep copy of the parsed ``<home>/config.yaml`` (read
through the host's bounded loader; ``{}`` when there is none or it is broken).
``save_config(cfg)`` writes the file back through the host's config editor —
except what decides trust, routing, auditing and which plugin code runs, which
is the operator's: the ``plugins``, ``model``, ``llm``, ``audit``,
``limits`` and ``service`` sections, every ``<section>.provider`` (it selects an exclusive
plugin) and ``context.engine``. A change to any of them raises
``PermissionError`` and nothing is written. ``get_env_value`` reads the process environment, then
``<home>/.env``; ``save_env_value`` writes ``<home>/.env`` (mode 0600), except
variables that steer the host (see :func:`save_env_value`). No credential of
the host's own store is reachable from here.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, Optional

from .._home import active_home

__all__ = ["load_config", "load_config_readonly", "save_config", "get_env_value", "save_env_value", "cfg_get",
           "get_config_path", "get_env_path"]

_PROTECTED = "plugins"
#: top-level sections a plugin may not change (trust, routing, credentials' use, auditing, budgets, the
#: service's brake on token guessing): plugin_llm.config.GOVERNED_SECTIONS, in the order errors name them
_HOST_SECTIONS = ("plugins", "model", "llm", "audit", "limits", "service")
_HOST_ENV_PREFIXES = ("HERMES_", "PLUGIN_LLM_", "LITELLM_", "PYTHON", "OPENAI_", "ANTHROPIC_")
_HOST_ENV_NAMES = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR",
                             "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PATH", "HOME", "LD_PRELOAD",
                             "LD_LIBRARY_PATH"})


def get_config_path():
    return active_home() / "config.yaml"


def get_env_path():
    return active_home() / ".env"


def _raw() -> Dict[str, Any]:
    try:
        from plugin_llm.config import get_config_source

        raw = get_config_source(active_home()).current().raw
    except Exception:
        return {}
    return raw if isinstance(raw, dict) else dict(raw or {})


def load_config() -> Dict[str, Any]:
    """A deep copy of the parsed config.yaml ({} when absent or unreadable)."""
    return copy.deepcopy(_raw())


def load_config_readonly() -> Dict[str, Any]:
    return load_config()


def cfg_get(cfg: Optional[Dict[str, Any]], *keys: str, default: Any = None) -> Any:
    """``cfg[k1][k2]...``, or ``default`` on any missing key or non-mapping on the way."""
    node: Any = cfg
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return default if node is None else node


def save_config(config: Dict[str, Any], **_: Any) -> None:
    """Write ``config`` to config.yaml (comments of untouched parts kept); ``plugins`` must not change."""
    if not isinstance(config, dict):
        raise TypeError("save_config() needs a dict")
    current = _raw()
    changed = _protected_changes(current, config)
    if changed:
        raise PermissionError(
            f"a plugin may not change {', '.join(changed)} in config.yaml (enabling, trust, granted "
            "capabilities, routing, auditing, limits and provider selection are the operator's): nothing was written"
        )
    from plugin_llm.config_edit import edit_config

    def mutate(doc: Any) -> None:
        for key in [k for k in list(doc) if k not in config]:
            del doc[key]
        for key, value in config.items():
            if key not in _HOST_SECTIONS and doc.get(key) != value:
                doc[key] = copy.deepcopy(value)

    edit_config(active_home(), mutate)


def _protected_changes(current: Dict[str, Any], new: Dict[str, Any]) -> list[str]:
    """The operator-owned settings ``new`` changes (see the module docstring)."""
    changed = [f"the '{s}' section" for s in _HOST_SECTIONS if new.get(s) != current.get(s)]
    for section in sorted(set(current) | set(new), key=str):
        old_block, new_block = current.get(section), new.get(section)
        for key in ("provider", "engine") if section == "context" else ("provider",):
            old_value = old_block.get(key) if isinstance(old_block, dict) else None
            new_value = new_block.get(key) if isinstance(new_block, dict) else None
            if old_value != new_value and section not in _HOST_SECTIONS:
                changed.append(f"{section}.{key}")
    return changed


def get_env_value(key: str) -> Optional[str]:
    """The variable from the process environment, else from ``<home>/.env`` (None when unset)."""
    if key in os.environ:
        return os.environ[key]
    try:
        from plugin_llm.home_env import read_env_file

        return read_env_file(active_home()).get(key)
    except Exception:
        return None


def save_env_value(key: str, value: str) -> None:
    """Set ``key`` in ``<home>/.env`` (and in this process's environment). Variables that steer the
    host are refused: the ones provider keys are read from (``OPENAI_API_KEY``, ...), ``HERMES_*``,
    ``PLUGIN_LLM_*``, ``LITELLM_*``, ``PYTHON*``, proxies and CA bundles."""
    from auth.providers import ENV_VARS
    from plugin_llm.plugins.install import write_env_values

    name = str(key)
    if any(name in names for names in ENV_VARS.values()):
        raise PermissionError(f"{name} holds a model provider key of this host; a plugin may not set it")
    if name.upper().startswith(_HOST_ENV_PREFIXES) or name.upper() in _HOST_ENV_NAMES:
        raise PermissionError(f"{name} changes how this host runs or connects; a plugin may not set it "
                              "(the operator can, in the environment or .env)")

    write_env_values(active_home(), {str(key): str(value)})
    os.environ[str(key)] = str(value)
