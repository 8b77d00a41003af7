"""Hermes's capability ids, the older ``allow_*`` keys that grant the same, and how a
``granted_capabilities`` entry is read (pure: no I/O). See :mod:`plugin_llm.plugins.consent`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from plugin_llm.trust import consent_digest

__all__ = ["LEGACY_KEYS", "Grant", "parse_grant", "legacy_granted"]

#: Hermes's capability ids, each with the older ``allow_*`` key under ``plugins.entries.<key>`` that
#: grants the same thing (Hermes honours either; so does this host)
LEGACY_KEYS: dict[str, tuple[str, ...]] = {
    "tools.override": ("allow_tool_override",),
    "llm.provider_override": ("llm", "allow_provider_override"),
    "llm.model_override": ("llm", "allow_model_override"),
    "llm.agent_id_override": ("llm", "allow_agent_id_override"),
    "llm.profile_override": ("llm", "allow_profile_override"),
    "llm.task_override": ("llm", "allow_task_override"),
    "gateway.platform_actions": ("allow_platform_actions",),
    "gateway.plugin_status": ("allow_plugin_status",),
}


@dataclass(frozen=True)
class Grant:
    """What ``plugins.entries.<key>.granted_capabilities`` grants.

    ``bound``: recorded by this host's consent (its ``capabilities_sha256`` matches); False for a grant
    without a digest, as Hermes writes it (honoured all the same). A digest that does not match grants
    nothing (``broken``). ``problems``: what was ignored, for warnings."""

    granted: tuple[str, ...] = ()
    bound: bool = False
    broken: bool = False
    problems: tuple[str, ...] = ()


def parse_grant(key: str, entry: Any) -> Grant:
    """Read a plugin entry's grant as Hermes does (a list of known ids; non-strings and unknown ids
    skipped), plus this host's binding: a ``capabilities_sha256`` that is there must match."""
    names = entry.get("granted_capabilities") if isinstance(entry, Mapping) else None
    if names is None:
        return Grant()
    where = f"plugins.entries.{key}.granted_capabilities"
    if not isinstance(names, list):
        return Grant(problems=(f"{where}: expected a list of capability names, got {type(names).__name__}; "
                               "nothing granted",))
    strings = [n.strip() for n in names if isinstance(n, str) and n.strip()]
    written = sorted(set(strings))
    problems = []
    if len(strings) != len(names):
        problems.append(f"{where}: non-string or blank entries ignored")
    unknown = [n for n in written if n not in LEGACY_KEYS]
    if unknown:
        problems.append(f"{where}: unknown capabilities ignored: {', '.join(unknown)[:200]}")
    granted = tuple(n for n in written if n in LEGACY_KEYS)
    digest = entry.get("capabilities_sha256")
    if digest is None:
        return Grant(granted, False, False, tuple(problems))
    if not isinstance(digest, str) or digest.strip() != consent_digest(key, written):
        problems.append(f"{where} does not match plugins.entries.{key}.capabilities_sha256 (not what a consent "
                        f"recorded): nothing granted; run 'plugin-llm plugins consent {key}' to review and grant them")
        return Grant((), False, True, tuple(problems))
    return Grant(granted, True, False, tuple(problems))


def legacy_granted(entry: Any, capability: str) -> bool:
    """True when the older ``allow_*`` key of ``capability`` is set to true in the plugin's entry."""
    node: Any = entry
    for part in LEGACY_KEYS.get(capability, ("",)):
        if not isinstance(node, Mapping):
            return False
        node = node.get(part)
    return node is True
