"""``plugin-llm plugins enable`` and ``disable``: edit ``plugins.enabled``/``plugins.disabled``
through :mod:`plugin_llm.config_edit`, warning of the names the plugin would fail to register."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from plugin_llm.cli._common import printable
from plugin_llm.cli.main import CliError
from plugin_llm.cli.plugins.terminal import PLUGINS_LOGGER, emit
from plugin_llm.cli.plugins_select import disable_in, enable_in, known_plugins
from plugin_llm.config_edit import ConfigEditError, edit_config
from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.install import InstallError, missing_env, resolve_name
from plugin_llm.service.tokens import TokenError, token_store_for


def run_toggle(args: argparse.Namespace, home: Path, *, enable: bool) -> int:
    clashes = name_clashes(home, _resolve_ref(args.name, known_refs(home), home).key) if enable else []
    target, changes, result = set_enabled(home, args.name, enable=enable, dry_run=args.dry_run)
    verb = "enabled" if enable else "disabled"
    lines: list[str] = [f"warning: {c}" for c in clashes]
    if not changes:
        lines.append(f"{target.key} is already {verb}")
    elif args.dry_run:
        lines.append(f"Would edit {result.path} ({'; '.join(changes)}); nothing written (--dry-run):")
        lines.append(result.diff.rstrip("\n"))
    else:
        lines.append(f"{target.key} {verb}: {'; '.join(changes)} in {result.path}")
        if result.backup:
            lines.append(f"Previous version saved as {result.backup}")
    missing = missing_env(home, list(target.requires_env)) if enable else []
    if enable and missing:
        lines.append(f"Missing environment: {', '.join(missing)} (the plugin loads, but may not work)")
    if enable and target.error:
        lines.append(f"warning: {target.key} cannot load as it is: {target.error}")
    if changes and not args.dry_run:
        lines.append("Takes effect the next time plugins are loaded (new sessions and commands).")
        tokens = _active_tokens(home, target.key)
        if tokens:
            lines.append(f"Its service tokens ({tokens}) "
                         + ("work again (plugin-llm serve)." if enable else
                            "are refused by plugin-llm serve (403 plugin_disabled) while it is disabled."))
    emit(args, {"key": target.key, "action": "enable" if enable else "disable", "changed": bool(changes),
                 "changes": changes, "dry_run": args.dry_run, "diff": result.diff,
                 "backup": str(result.backup) if result.backup else None, "missing_env": missing,
                 "clashes": clashes}, lines)
    return 0


def known_refs(home: Path) -> list[Any]:
    return known_plugins(home)


def _resolve_ref(name: str, refs: list[Any], home: Path) -> Any:
    try:
        key = resolve_name(name, {r.key: r.name for r in refs}, where=f" in {home} (or entry points)")
    except InstallError as exc:
        raise CliError(printable(str(exc), limit=2000)) from None
    return next(r for r in refs if r.key == key)


def set_enabled(home: Path, name: str, *, enable: bool, dry_run: bool) -> tuple[Any, list[str], Any]:
    refs = known_refs(home)
    target = _resolve_ref(name, refs, home)
    changes: list[str] = []

    def mutate(doc: Any) -> None:
        changes.extend((enable_in if enable else disable_in)(doc, target, refs))

    try:
        result = edit_config(home, mutate, dry_run=dry_run)
    except ConfigEditError as exc:
        raise CliError(str(exc)) from None
    return target, changes, result


def _active_tokens(home: Path, key: str) -> int:
    """How many unexpired, unrevoked service tokens ``key`` has (0 when the store cannot say)."""
    try:
        store = token_store_for(home)
        try:
            return sum(1 for t in store.list() if t.plugin == key and t.status() == "active")
        finally:
            store.close()
    except (TokenError, OSError):
        return 0


def name_clashes(home: Path, key: str) -> list[str]:
    """What ``key`` would fail to register once enabled because another plugin has the name
    (the first plugin to register a name keeps it; see ``registry.load_order``). Loads the
    plugins read-only (no audit events) as they would load with ``key`` enabled."""
    manager = PluginManager(home, audit_events=False)
    real = manager._settings

    class _WithKey:  # config.yaml as it will read once key is enabled
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def current(self) -> Any:
            settings = real.current()
            return replace(settings, enabled=settings.enabled | {key}, disabled=settings.disabled - {key})

    manager._settings = _WithKey()  # type: ignore[assignment]
    quiet = logging.getLogger(PLUGINS_LOGGER)
    was = quiet.disabled
    quiet.disabled = True  # the refusals are reported below, once
    try:
        plugins = manager.list_plugins()
    except Exception:  # a probe never blocks enabling
        return []
    finally:
        quiet.disabled = was
    mine = next((p for p in plugins if p["key"] == key), None)
    return [f"{key}: {w}" for w in (mine or {}).get("warnings") or () if "already registered by" in str(w)]
