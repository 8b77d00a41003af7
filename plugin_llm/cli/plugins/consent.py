"""``plugin-llm plugins consent``: show the capabilities a plugin requests and grant them.

Installs and updates ask here too; without a terminal nothing is granted unless ``--yes`` says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from plugin_llm.cli._common import printable
from plugin_llm.cli.main import CliError
from plugin_llm.cli.plugins import terminal
from plugin_llm.cli.plugins.terminal import ask_yes_no, emit
from plugin_llm.config_edit import ConfigEditError
from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.consent import consent_state, describe, record_consent
from plugin_llm.plugins.install import InstallError, resolve_name


def run_consent(args: argparse.Namespace, home: Path) -> int:
    plugins = {p["key"]: p for p in PluginManager(home, audit_events=False).list_plugins()}
    try:
        key = resolve_name(args.name, {k: p["name"] for k, p in plugins.items()}, where=f" in {home}")
    except InstallError as exc:
        raise CliError(printable(str(exc), limit=2000)) from None
    requested = tuple(plugins[key].get("capabilities") or ())
    state = consent_state(home, key, requested)
    lines = [f"{key}: requests {', '.join(requested) or 'no capabilities'}"]
    for capability in requested:
        mark = "granted" if capability in state.granted and state.valid else "not granted"
        lines.append(f"  {capability}: {mark} — {describe(capability)}")
    if not state.valid:
        lines.append("  the recorded grant does not match its capabilities_sha256: it grants nothing")
    unbound = state.valid and not state.bound
    if unbound:
        lines.append("  granted as Hermes records it (no capabilities_sha256): honoured; once bound, an edit "
                     "or a copy of the list to another plugin grants nothing")
    if state.pending:
        if not args.yes and (args.json or not terminal.interactive()):  # nobody to ask: never "run this command again"
            why = "--json" if args.json else "not a terminal"
            raise CliError(printable(f"{why}: pass --yes to grant {', '.join(state.pending)} to {key} "
                                     "(nothing was granted)", limit=2000))
        grant = args.yes or ask_consent(key, state.pending)
        already = tuple(c for c in state.granted if c in requested) if state.valid else ()
        lines.append(grant_consent(home, key, state.pending, bool(grant), already, requested))
    elif unbound:
        bind = args.yes or (not args.json and terminal.interactive() and ask_yes_no(f"Bind the grant of {key}?"))
        kept = tuple(c for c in state.granted if c in requested)
        lines.append(grant_consent(home, key, kept, bool(bind), declared=requested) if bind else
                     f"Not bound; bind it with: plugin-llm plugins consent {key} --yes")
    after = consent_state(home, key, requested)
    emit(args, {"key": key, "requested": list(requested), "granted": list(after.granted if after.valid else ()),
                 "pending": list(after.pending), "bound": after.bound}, lines)
    return 0


def ask_consent(key: str, capabilities: tuple[str, ...] | list[str]) -> bool:
    """Show what ``key`` requests and ask (terminal only)."""
    print(f"{printable(key, 200)} requests these capabilities:")
    for capability in capabilities:
        print(f"  {printable(capability, 100)}: {describe(capability)}")
    return ask_yes_no("Grant them?")


def grant_consent(home: Path, key: str, capabilities: tuple[str, ...] | list[str], grant: bool,
                    already: tuple[str, ...] = (), declared: tuple[str, ...] | list[str] = ()) -> str:
    shown = ", ".join(printable(c, 100) for c in capabilities)
    if not grant:
        return (f"Capabilities not granted: {shown} — review and grant them with: "
                f"plugin-llm plugins consent {key}")
    try:
        record_consent(home, key, tuple(already) + tuple(capabilities), declared)
    except (ConfigEditError, OSError) as exc:
        return f"warning: capabilities not granted: cannot edit config.yaml: {printable(str(exc), 500)}"
    return f"Granted {shown} to {key} in {home / 'config.yaml'}"


def _requested_capabilities(home: Path, key: str) -> tuple[str, ...] | None:
    plugins = {p["key"]: p for p in PluginManager(home, audit_events=False).list_plugins()}
    p = plugins.get(key)
    return tuple(p.get("capabilities") or ()) if p is not None else None


def consent_after_update(args: argparse.Namespace, home: Path, key: str) -> list[str]:
    """An update that requests more capabilities asks again; until then the new ones are not granted."""
    requested = _requested_capabilities(home, key)
    if not requested:
        return []
    state = consent_state(home, key, requested)
    if not state.pending:
        return []
    already = tuple(c for c in state.granted if c in requested) if state.valid else ()
    grant = not args.json and terminal.interactive() and ask_consent(key, state.pending)
    return [grant_consent(home, key, state.pending, grant, already, requested)]
