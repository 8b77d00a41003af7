"""``plugin-llm plugins list|info``: what plugins exist, which are active, and why not.

``list`` discovers the plugins of the home and loads the enabled ones (their
registrations are what it counts). It never imports litellm: ``ctx.llm`` is
only built when a plugin actually calls it.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from plugin_llm.cli.main import CliError

__all__ = ["register", "run"]

_PLUGINS_LOGGER = "plugin_llm.plugins"


def register(subparsers: Any) -> None:
    common = _common_options(suppress=False)
    # Sub-actions accept the same options; SUPPRESS keeps them from resetting a value given earlier.
    again = _common_options(suppress=True)

    parser = subparsers.add_parser(
        "plugins",
        help="list and inspect plugins",
        description="List and inspect plugins. Plugins are opt-in: enable one with plugins.enabled in config.yaml.",
        parents=[common],
    )
    actions = parser.add_subparsers(dest="plugins_action", metavar="ACTION")
    actions.add_parser(
        "list", parents=[again], help="every plugin found, its status, what it registered",
        description="Every plugin found (user, project, entry points), enabled or not, loaded or failed.",
    )
    info = actions.add_parser("info", parents=[again], help="details of one plugin")
    info.add_argument("name", help="plugin key (e.g. image_gen/openai) or bare name")
    parser.set_defaults(func=run, plugins_action=None)


def _common_options(*, suppress: bool) -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    extra = {"default": argparse.SUPPRESS} if suppress else {}
    options.add_argument("--home", metavar="DIR", help="home directory (default: $HERMES_HOME or ~/.hermes)", **extra)
    options.add_argument("--json", action="store_true", help="machine-readable output", **extra)
    return options


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "plugins_action", None) or "list"
    home = Path(args.home).expanduser() if getattr(args, "home", None) else None
    if home is not None and home.exists() and not home.is_dir():
        raise CliError(f"--home {home} is not a directory")
    if not getattr(args, "debug", False):
        # Problems are reported in the listing itself; keep stderr for real errors.
        logging.getLogger(_PLUGINS_LOGGER).addHandler(logging.NullHandler())
    from plugin_llm.plugins import get_plugin_manager

    manager = get_plugin_manager(home)
    config_error = _config_error(manager.home)
    plugins = manager.list_plugins()
    if action == "list":
        return _list(manager.home, plugins, args.json, config_error)
    if action == "info":
        return _info(manager.home, plugins, args.name, args.json)
    raise CliError(f"unknown plugins action {action!r}")  # pragma: no cover - argparse rejects it first


def _config_error(home: Path) -> str | None:
    try:
        from plugin_llm.config import get_config_source

        return get_config_source(home).current().error
    except Exception as exc:  # pragma: no cover - defensive
        return str(exc)


def _list(home: Path, plugins: list[dict[str, Any]], as_json: bool, config_error: str | None) -> int:
    if as_json:
        print(json.dumps(plugins, indent=2, ensure_ascii=False, default=str))
        return 0
    if config_error:
        print(f"warning: config.yaml is unusable, no plugin is enabled: {config_error}")
    if not plugins:
        print(f"No plugins found in {home / 'plugins'}.")
        print("A plugin is a directory <name>/ with plugin.yaml and __init__.py defining register(ctx).")
        return 0
    headers = ("NAME", "KEY", "STATUS", "VERSION", "SOURCE", "TOOLS", "HOOKS", "CMDS")
    rows = [
        (p["name"], p["key"], p["status"], p["version"] or "-", p["source"],
         str(len(p["tools"])), str(len(p["hooks"])), str(len(p["commands"])))
        for p in plugins
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    numeric = {5, 6, 7}

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    print(fmt(headers))
    for p, row in zip(plugins, rows):
        print(fmt(row))
        for line in _notes(p):
            print(f"    {line}")
    counts: dict[str, int] = {}
    for p in plugins:
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    print(f"\n{len(plugins)} plugin{'s' if len(plugins) != 1 else ''} ({summary}) in {home}")
    return 0


def _notes(p: dict[str, Any]) -> list[str]:
    notes = []
    if p["error"]:
        notes.append(f"error: {p['error']}")
    if p["missing_env"]:
        notes.append(f"missing env: {', '.join(p['missing_env'])} (the plugin loads, but may not work)")
    if p["enable_hint"]:
        notes.append(f"enable: {p['enable_hint']}")
    for warning in p.get("warnings") or ():
        notes.append(f"warning: {warning}")
    return notes


def _trust_block(key: str) -> str:
    """The config path of the plugin's ``llm`` trust block (its identity is the key)."""
    from plugin_llm.trust import config_path

    return config_path(key, "allow_model_override").rsplit(".", 1)[0]


def _info(home: Path, plugins: list[dict[str, Any]], name: str, as_json: bool) -> int:
    exact = [p for p in plugins if p["key"] == name]
    matches = exact or [p for p in plugins if p["name"] == name]
    if not matches:
        known = ", ".join(p["key"] for p in plugins) or "none"
        raise CliError(f"no plugin {name!r} in {home} (known: {known})")
    if len(matches) > 1:
        raise CliError(f"{name!r} is ambiguous: {', '.join(p['key'] for p in matches)}; use the full key")
    p = matches[0]
    if as_json:
        print(json.dumps(p, indent=2, ensure_ascii=False, default=str))
        return 0
    fields = [
        ("key", p["key"]), ("name", p["name"]), ("status", p["status"]), ("version", p["version"]),
        ("description", p["description"]), ("author", p["author"]), ("kind", p["kind"]),
        ("source", p["source"]), ("path", p["path"] or p["entry_point"]),
        ("tools", ", ".join(p["tools"])), ("hooks", ", ".join(p["hooks"])),
        ("commands", ", ".join("/" + c for c in p["commands"])),
        ("cli commands", ", ".join(p["cli_commands"])), ("skills", ", ".join(p["skills"])),
        ("memory providers", ", ".join(p["memory_providers"])),
        ("context engines", ", ".join(p["context_engines"])),
        ("image providers", ", ".join(p["image_gen_providers"])), ("platforms", ", ".join(p["platforms"])),
        ("requires env", ", ".join(p["requires_env"])), ("missing env", ", ".join(p["missing_env"])),
        ("error", p["error"]), ("enable", p["enable_hint"]),
        ("trust block", f"{_trust_block(p['key'])} in {home / 'config.yaml'}"),
    ]
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        if value:
            print(f"{key.ljust(width)}  {value}")
    for warning in p["warnings"]:
        print(f"{'warning'.ljust(width)}  {warning}")
    return 0
