"""Capability consent: what a plugin asks for (``capabilities:`` in plugin.yaml) and what the operator granted.

A consent is recorded in ``config.yaml`` as ``plugins.entries.<key>.granted_capabilities`` plus
``capabilities_sha256`` (:func:`consent_digest` of the key and the list), which ties the list to
the key it was consented for: a list copied to another plugin with its digest, or edited after the
consent, grants nothing. A list without a digest, as Hermes writes it (with ``capabilities_consent``),
is honoured as Hermes honours it; ``plugins consent KEY`` binds it.
``plugins install`` on a terminal shows the requested capabilities and asks; a non-interactive
install grants nothing; an update that requests more asks again; ``plugins consent KEY`` reviews
and grants later.

Fail closed where Hermes documents nothing: unknown capabilities give nothing,
a capability the current manifest no longer requests is not in effect
(:meth:`PluginManager.granted_capabilities`), and nothing is granted without an explicit yes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from plugin_llm.capabilities import LEGACY_KEYS, Grant, legacy_granted, parse_grant
from plugin_llm.config_edit import edit_config, set_value
from plugin_llm.trust import consent_digest

__all__ = ["CAPABILITY_HELP", "LEGACY_KEYS", "ConsentState", "Grant", "parse_grant", "legacy_granted",
           "consent_state", "record_consent", "describe"]

#: what each capability this host knows lets a plugin do
CAPABILITY_HELP = {
    "tools.override": "replace a tool another plugin registered (as allow_tool_override does)",
    "llm.model_override": "choose the model of its ctx.llm calls (as allow_model_override does)",
    "llm.provider_override": "choose the provider of its ctx.llm calls (as allow_provider_override does)",
    "llm.agent_id_override": "pass agent_id= to ctx.llm (as allow_agent_id_override does)",
    "llm.profile_override": "pick the credential profile of its ctx.llm calls (as allow_profile_override does)",
    "llm.task_override": "route ctx.llm calls to a built-in auxiliary task with task= (as allow_task_override does)",
    "gateway.platform_actions": "act on chat platforms as the gateway bot (no chat platforms here: no effect)",
    "gateway.plugin_status": "post status lines to chat platforms (no chat platforms here: no effect)",
}


def describe(capability: str) -> str:
    return CAPABILITY_HELP.get(capability, "not known to this host: granting it has no effect here")


@dataclass(frozen=True)
class ConsentState:
    """Requested vs granted for one plugin. ``valid`` is False when a recorded grant does not match its
    digest; ``bound`` is False for a grant without one (written by Hermes: honoured, not yet bound)."""

    key: str
    requested: tuple[str, ...]
    granted: tuple[str, ...]
    valid: bool = True
    bound: bool = True

    @property
    def pending(self) -> tuple[str, ...]:
        """Requested and not granted (what a consent would add)."""
        granted = set(self.granted) if self.valid else set()
        return tuple(c for c in self.requested if c not in granted)


def _entry(raw: Any, key: str) -> Any:
    plugins = raw.get("plugins") if isinstance(raw, dict) else None
    entries = plugins.get("entries") if isinstance(plugins, dict) else None
    return entries.get(key) if isinstance(entries, dict) else None


def consent_state(home: Path, key: str, requested: tuple[str, ...] | list[str]) -> ConsentState:
    """What ``config.yaml`` grants plugin ``key`` (read through the host's config loader)."""
    from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

    try:
        raw = get_config_source(Path(home)).current().raw
    except Exception:
        raw = {}
    grant = parse_grant(key, _entry(dict(raw or {}), key))
    return ConsentState(key, tuple(requested), grant.granted, not grant.broken, grant.bound or not grant.granted)


def record_consent(home: Path, key: str, capabilities: tuple[str, ...] | list[str],
                   declared: tuple[str, ...] | list[str] = ()) -> None:
    """Write ``granted_capabilities`` and its digest for ``key`` (comments and the rest of config.yaml kept),
    and Hermes's ``capabilities_consent`` record of the ``declared`` set, so Hermes does not ask again."""
    granted = sorted(set(capabilities))
    digest = consent_digest(key, granted)
    seen = "\n".join(sorted({c for c in declared if c in LEGACY_KEYS}))
    record = {"hash": hashlib.sha256(seen.encode("utf-8")).hexdigest(),
              "granted_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def mutate(doc: Any) -> None:
        set_value(doc, ("plugins", "entries", key, "granted_capabilities"), list(granted))
        set_value(doc, ("plugins", "entries", key, "capabilities_sha256"), digest)
        set_value(doc, ("plugins", "entries", key, "capabilities_consent"), record)

    edit_config(Path(home), mutate)
