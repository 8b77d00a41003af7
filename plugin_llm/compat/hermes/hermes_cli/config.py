"""``hermes_cli.config`` for plugins: this host's ``config.yaml`` and ``.env``.

``load_config()`` is a deep copy of the parsed ``<home>/config.yaml`` (read
through the host's bounded loader; ``{}`` when there is none or it is broken).
``save_config(cfg)`` writes the file back through the host's config editor —
except the ``plugins`` section (enable lists, trust, granted capabilities),
which is the operator's: a change to it raises ``PermissionError`` and nothing
is written. ``get_env_value`` reads the process environment, then
``<home>/.env``; ``save_env_value`` writes ``<home>/.env`` (mode 0600). No
credential of the host's own store is reachable from here.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, Optional

from .._home import active_home

__all__ = ["load_config", "load_config_readonly", "save_config", "get_env_value", "save_env_value", "cfg_get",
           "get_config_path", "get_env_path"]

_PROTECTED = "plugins"


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
    if config.get(_PROTECTED) != current.get(_PROTECTED):
        raise PermissionError(
            "a plugin may not change the 'plugins' section of config.yaml (enabling, trust and granted "
            "capabilities are the operator's): nothing was written"
        )
    from plugin_llm.config_edit import edit_config

    def mutate(doc: Any) -> None:
        for key in [k for k in list(doc) if k not in config]:
            del doc[key]
        for key, value in config.items():
            if key != _PROTECTED and doc.get(key) != value:
                doc[key] = copy.deepcopy(value)

    edit_config(active_home(), mutate)


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
    """Set ``key`` in ``<home>/.env`` (and in this process's environment). The variables the host reads
    provider keys from (``OPENAI_API_KEY``, ...) are refused: they are the operator's."""
    from auth.providers import ENV_VARS
    from plugin_llm.plugins.install import write_env_values

    if any(str(key) in names for names in ENV_VARS.values()):
        raise PermissionError(f"{key} holds a model provider key of this host; a plugin may not set it")

    write_env_values(active_home(), {str(key): str(value)})
    os.environ[str(key)] = str(value)
