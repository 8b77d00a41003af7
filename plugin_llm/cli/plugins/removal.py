"""``plugin-llm plugins remove``: the plugin, its install record, its service tokens, its settings
in config.yaml and (moved aside, or kept with ``--keep-data``) its private data."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from plugin_llm.auditing import write_event
from plugin_llm.cli._common import printable
from plugin_llm.cli.main import CliError
from plugin_llm.cli.plugins import terminal
from plugin_llm.cli.plugins.enabling import known_refs
from plugin_llm.cli.plugins.lookups import closed_reason, config_mentions
from plugin_llm.cli.plugins.terminal import ask_yes_no, emit, os_error
from plugin_llm.config_edit import ConfigEditError, delete_value, edit_config, get_value, list_remove
from plugin_llm.plugins import install as inst
from plugin_llm.plugins.isolation.sandbox import plugin_data_path
from plugin_llm.service.tokens import TokenError, token_store_for


def run_remove(args: argparse.Namespace, home: Path) -> int:
    refs = known_refs(home)
    try:
        key = inst.resolve_installed(home / "plugins", args.name)
    except inst.InstallError as exc:
        hint = _not_removable_hint(args.name, refs)
        raise CliError(printable(f"{exc}{hint}", limit=2000)) from None
    closed = closed_reason(home)
    if closed is not None and not args.keep_config:  # its enabled entry and grants would stay behind
        raise CliError(f"{closed}; whether it still enables or trusts {key} cannot be read, so nothing was "
                       "removed (fix config.yaml, or use --keep-config)")
    every_mention = config_mentions(home, key)
    mentions = [m for m in every_mention if m != "plugins.disabled"]  # disabled: harmless if kept (--keep-config)
    cleaning = bool(every_mention) and not args.keep_config  # a name left in disabled is a doctor warning
    if cleaning:  # refuse before deleting anything when config.yaml cannot be edited
        try:
            edit_config(home, lambda doc: None, dry_run=True)
        except ConfigEditError as exc:
            raise CliError(f"cannot remove {key}'s settings: {exc}; nothing was removed "
                           "(fix config.yaml, or use --keep-config)") from None
    keep_data = _keep_data(args, home, key)
    try:
        result = inst.remove_plugin(home, key, force=args.force, keep_data=keep_data)
    except inst.InstallError as exc:
        hint = _not_removable_hint(args.name, refs)
        raise CliError(printable(f"{exc}{hint}", limit=2000)) from None
    except OSError as exc:
        raise CliError(printable(f"cannot remove {args.name}: {os_error(exc)} (nothing was removed)", 2000)) from None
    lines = [f"Removed {result.key} ({', '.join(result.removed_paths) or 'no files left'})"]
    lines += _data_lines(home, result, keep_data)
    revoked, token_problem = _revoke_tokens(home, result.key)
    if revoked:
        lines.append(f"Revoked {len(revoked)} service token{'s' if len(revoked) != 1 else ''} of {result.key} "
                     f"({', '.join(t.id for t in revoked)})")
    if token_problem:
        lines.append(f"warning: {token_problem}")
    removed_config: list[str] = []
    if cleaning:
        try:
            removed_config, edit = _remove_config(home, result.key)
        except ConfigEditError as exc:
            lines.append(f"warning: {result.key}'s settings are still in config.yaml ({', '.join(mentions)}): {exc}")
        else:
            lines.append(f"Removed from {home / 'config.yaml'}: {'; '.join(removed_config)} "
                         "(so a plugin installed later under this name is neither enabled nor trusted)")
            if edit.backup:
                lines.append(f"Previous version saved as {edit.backup}")
    elif mentions:
        lines.append(f"config.yaml still mentions {result.key} in {', '.join(mentions)} (kept: --keep-config; "
                     "a plugin installed later under this name would inherit them)")
    emit(args, {"key": result.key, "removed": list(result.removed_paths), "config_removed": removed_config,
                 "config_mentions": [] if removed_config else mentions, "data_moved_to": result.data_moved_to,
                 "data_kept": _kept_data(home, result.key, keep_data), "tokens_revoked": [t.id for t in revoked],
                 "tokens_error": token_problem}, lines)
    return 1 if token_problem else 0


def _keep_data(args: argparse.Namespace, home: Path, key: str) -> bool:
    """Whether ``remove`` leaves the plugin's private data in place: ``--keep-data``; ``--yes`` or a yes on
    a terminal moves it aside; without a terminal and without either, nothing is removed."""
    if args.keep_data or args.yes or not _has_data(home, key):
        return bool(args.keep_data)
    where = plugin_data_path(home, key)
    if not args.json and terminal.interactive():
        print(f"{key} has private data in {where} (its memory, tokens it stored).", file=sys.stderr)
        if ask_yes_no(f"Remove it with the plugin (moved aside to {where.parent / '.removed'}/, to delete later)?"):
            return False
        raise CliError(f"nothing was removed; to remove {key} but leave its data in {where}, use --keep-data")
    raise CliError(f"{key} has private data in {where} (its memory, tokens it stored); nothing was removed. "
                   f"Pass --yes to move it aside with the plugin (to {where.parent / '.removed'}/), "
                   "or --keep-data to leave it")


def _has_data(home: Path, key: str) -> bool:
    return os.path.lexists(plugin_data_path(home, key))


def _kept_data(home: Path, key: str, keep_data: bool) -> str | None:
    return str(plugin_data_path(home, key)) if keep_data and _has_data(home, key) else None


def _data_lines(home: Path, result: Any, keep_data: bool) -> list[str]:
    if result.data_moved_to:
        return [f"Moved its private data aside to {result.data_moved_to} (no plugin can reach it there; "
                f"delete it with: rm -rf {result.data_moved_to})"]
    kept = _kept_data(home, result.key, keep_data)
    if kept:
        return [f"Kept its private data in {kept} (--keep-data); a plugin installed "
                "later under this name does not get it: install moves it aside to plugin-data/.removed/"]
    return []


def _revoke_tokens(home: Path, key: str) -> tuple[list[Any], str | None]:
    """Revoke every service token of ``key`` (audited); ``(revoked, problem)``."""
    try:
        store = token_store_for(home)
        try:
            revoked = store.revoke_plugin(key)
        finally:
            store.close()
    except (TokenError, OSError) as exc:
        return [], (f"{key}'s service tokens could not be revoked ({printable(str(exc), 500)}): they still work; "
                    f"revoke them with plugin-llm tokens list / plugin-llm tokens revoke ID")
    for info in revoked:
        write_event(home, "service.token_revoked", token_id=info.id, plugin_id=info.plugin, reason="plugin_removed")
    return revoked, None


def _remove_config(home: Path, key: str) -> tuple[list[str], Any]:
    """Take ``key`` out of ``plugins.enabled`` and delete ``plugins.entries.<key>``; what was removed."""
    removed: list[str] = []

    def mutate(doc: Any) -> None:
        for section in ("enabled", "disabled"):
            if list_remove(doc, ("plugins", section), key):
                removed.append(f"{key} from plugins.{section}")
        entry = get_value(doc, ("plugins", "entries", key))
        if entry is not None:
            what = ", ".join(printable(k, 60) for k in entry) if isinstance(entry, Mapping) else "its value"
            if delete_value(doc, ("plugins", "entries", key)):
                removed.append(f"plugins.entries.{key} ({what})")

    result = edit_config(home, mutate)
    return removed, result


def _not_removable_hint(name: str, refs: list[Any]) -> str:
    for ref in refs:
        if name in (ref.key, ref.name) and ref.source != "user":
            if ref.source == "entrypoint":
                return f" ({ref.key} is a pip-installed plugin: uninstall its distribution with pip)"
            return f" ({ref.key} is a project plugin in ./.hermes/plugins; remove it there)"
    return ""
