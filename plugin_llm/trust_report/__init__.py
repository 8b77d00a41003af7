"""What ``plugin-llm trust`` and ``doctor`` report about the trust policy.

Reads ``config.yaml`` once (:func:`read_config`: the same
:func:`plugin_llm.config.parse_config` the gateway uses, plus PyYAML's
``compose`` for the line of every key) and derives, without side effects:

- :func:`effective_policies`: every plugin's effective policy, each value
  with its provenance (``config.yaml line N`` or the fail-closed default);
- :func:`check_plugins`: findings about the whole ``plugins:`` section, each
  with a severity, the config path, the problem and the fix;
- :func:`explain`: a dry run of the gate (:func:`plugin_llm.trust.decide`,
  the gateway's own function) with the YAML that would allow a denied call.

Never imports litellm: model names are checked against litellm's bundled
price map, read as a JSON file. Parts: ``view``, ``policy``, ``checks``, ``explain``, ``tasks``, ``routes``.
"""

from __future__ import annotations

from .checks import check_plugins, limit_parse_issues
from .explain import Explanation, explain, yaml_snippet
from .model_names import litellm_knows_model, litellm_model_names
from .policy import PluginTrust, Setting, effective_policies, effective_policy
from .view import (
    ENTRY_KEYS,
    ERROR,
    OVERRIDES,
    PLUGINS_KEYS,
    WARNING,
    ConfigView,
    Finding,
    _entries,
    configured_plugin_ids,
    entry_key,
    installed_plugins,
    read_config,
    resolve_plugin_id,
)

__all__ = [
    "ERROR",
    "WARNING",
    "OVERRIDES",
    "PLUGINS_KEYS",
    "ENTRY_KEYS",
    "Finding",
    "ConfigView",
    "Setting",
    "PluginTrust",
    "Explanation",
    "read_config",
    "installed_plugins",
    "resolve_plugin_id",
    "configured_plugin_ids",
    "effective_policy",
    "effective_policies",
    "check_plugins",
    "limit_parse_issues",
    "explain",
    "yaml_snippet",
    "entry_key",
    "litellm_model_names",
    "litellm_knows_model",
    "_entries",  # the plugin entries of a parsed config (trust_cmd reads them)
]
