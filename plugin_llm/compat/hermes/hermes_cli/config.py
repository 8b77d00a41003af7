"""``hermes_cli.config`` for plugins: this host's ``config.yaml`` and ``.env``.

``load_config()`` is a deep copy of the parsed ``<home>/config.yaml`` (read
through the host's bounded loader; ``{}`` when there is none or it is broken).
``save_config(cfg)`` writes back the calling plugin's own settings
(``plugins.entries.<key>.settings``) and nothing else: any other change raises
``PermissionError`` and nothing is written. ``get_env_value`` reads the process
environment, then ``<home>/.env``, except variables that may hold a model
route's credential (None, as for an unset one); ``save_env_value`` writes
``<home>/.env`` (mode 0600), except variables that steer the host (see
:func:`save_env_value`). No credential of the host's own store is reachable from here.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, Optional

from .._home import active_home

__all__ = ["load_config", "load_config_readonly", "save_config", "get_env_value", "save_env_value", "cfg_get",
           "get_config_path", "get_env_path"]

#: the host's own settings (provider variables are refused by auth.env_names' rule)
_HOST_ENV_PREFIXES = ("HERMES_", "PLUGIN_LLM_", "LITELLM_", "PYTHON", "OPENAI_", "ANTHROPIC_", "LD_", "MALLOC_")
_HOST_ENV_NAMES = frozenset({"PATH", "HOME", "TMPDIR", "SHELL", "USER", "LOGNAME"})


def get_config_path():
    return active_home() / "config.yaml"


def get_env_path():
    return active_home() / ".env"


def _raw() -> Dict[str, Any]:
    try:
        from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

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
    """Write the calling plugin's own settings (``plugins.entries.<key>.settings``) from ``config``.

    Every other difference from :func:`load_config` is the operator's and raises ``PermissionError``;
    nothing is written then."""
    if not isinstance(config, dict):
        raise TypeError("save_config() needs a dict")
    from ..finder import caller_plugin_key  # on first use: this shim stays light

    key = caller_plugin_key()
    own = ("plugins", "entries", key, "settings") if key is not None else None
    changed = [p for p in _changed_paths(_raw(), config) if own is None or p[:len(own)] != own]
    if changed:
        where = (f"plugins.entries.{key}.settings" if key is not None
                 else "its plugins.entries.<key>.settings (this call is not made by a plugin's code)")
        raise PermissionError(
            f"a plugin may not change {_describe(changed)} in config.yaml: a plugin writes only {where}; "
            "everything else (enabling, trust, capabilities, routing, auditing, limits, the service, provider "
            "selection, other plugins' settings) is the operator's. Nothing was written"
        )
    if own is None:
        return
    settings = _get_path(config, own)
    from plugin_llm.config_edit import edit_config  # on first use: this shim stays light

    def mutate(doc: Any) -> None:
        node = doc
        for part in own[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                if settings is _MISSING:
                    return
                child = node[part] = {}
            node = child
        if settings is _MISSING:
            node.pop(own[-1], None)
        elif node.get(own[-1]) != settings:
            node[own[-1]] = copy.deepcopy(settings)

    edit_config(active_home(), mutate)


_MISSING: Any = object()
_MAX_DEPTH = 32


def _get_path(node: Any, path: tuple) -> Any:
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _absent(value: Any) -> bool:
    return value is _MISSING or value is None


def _changed_paths(old: Any, new: Any, path: tuple = ()) -> list[tuple]:
    """The paths at which ``new`` differs from ``old`` (a missing or null mapping counts as an empty one)."""
    old_map = old if isinstance(old, dict) else {} if _absent(old) and isinstance(new, dict) else None
    new_map = new if isinstance(new, dict) else {} if _absent(new) and isinstance(old, dict) else None
    if old_map is None or new_map is None or len(path) >= _MAX_DEPTH:
        try:
            return [] if old is not _MISSING and new is not _MISSING and old == new else [path]
        except RecursionError:  # a self-referencing value
            return [path]
    out: list[tuple] = []
    for k in list(old_map) + [k for k in new_map if k not in old_map]:
        out.extend(_changed_paths(old_map.get(k, _MISSING), new_map.get(k, _MISSING), path + (k,)))
    return out


def _describe(paths: list[tuple]) -> str:
    """``the 'model' section`` for several changes in one section (or any in ``plugins``), else ``memory.provider``."""
    by_section: Dict[Any, list] = {}
    for p in paths:
        by_section.setdefault(p[0] if p else "", []).append(p)
    parts = []
    for section, group in by_section.items():
        if section == "plugins" or len(group) > 1 or len(group[0]) < 2:
            parts.append(f"the '{str(section)[:100]}' section")
        else:
            parts.append(".".join(str(x)[:100] for x in group[0][:4]))
    return ", ".join(parts[:10]) + (", ..." if len(parts) > 10 else "")


def get_env_value(key: str) -> Optional[str]:
    """The variable from the process environment, else from ``<home>/.env`` (None when unset, and for a
    variable that may hold a credential of this host: see :func:`plugin_may_read`)."""
    if not plugin_may_read(str(key)):
        return None
    if key in os.environ:
        return os.environ[key]
    try:
        from plugin_llm.home_env import read_env_file  # on first use: this shim stays light

        return read_env_file(active_home()).get(key)
    except Exception:
        return None


def plugin_may_read(name: str) -> bool:
    """False for any variable that may hold a credential of this host (:mod:`plugin_llm.plugin_env`)."""
    from plugin_llm.plugin_env import credential_check  # on first use: this shim stays light

    return not credential_check(active_home())(name)


def save_env_value(key: str, value: str) -> None:
    """Set ``key`` in ``<home>/.env`` (and in this process's environment). Refused (``PermissionError``,
    nothing written): every variable that can select a model provider's endpoint, proxy, CA bundle, key
    or key file (:func:`auth.env_names.steering_reason`: by rule, for any provider), the ``key_env``
    names of auth.json, and the host's own ``HERMES_*``, ``PLUGIN_LLM_*``, ``PYTHON*``, ``LD_*`` ..."""
    from auth.env_names import auth_file_names, steering_reason  # on first use: this shim stays light
    from plugin_llm.plugins.install import write_env_values  # on first use: this shim stays light

    name = str(key)
    upper = name.upper()
    reason = steering_reason(name)
    if reason is None and name in auth_file_names(active_home())[0]:
        reason = "the variable auth.json reads a key from (key_env)"
    if reason is None and (upper.startswith(_HOST_ENV_PREFIXES) or upper in _HOST_ENV_NAMES):
        reason = "it changes how this host runs"
    if reason is not None:
        raise PermissionError(f"a plugin may not set {name[:100]}: {reason}; nothing was written "
                              "(the operator can set it, in the environment or .env)")
    write_env_values(active_home(), {name: str(value)})
    os.environ[name] = str(value)
