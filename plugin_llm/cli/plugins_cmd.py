"""``plugin-llm plugins``: list, inspect, install, update, remove, enable and disable plugins.

This module is the command: its parser, its dispatch, ``new`` and the interactive checklist. Each
action lives in :mod:`plugin_llm.cli.plugins` (``listing``, ``installing``, ``consent``,
``removal``, ``enabling``); none of them imports plugin code but ``list``/``info``, which load the
enabled plugins read-only. ``install/update/remove`` live in :mod:`plugin_llm.plugins.install`
(no prompts there); the actions here ask the questions. ``enable/disable`` and the interactive
screen edit config.yaml through :mod:`plugin_llm.config_edit`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Callable

from plugin_llm.cli._common import printable
from plugin_llm.cli.main import CliError
from plugin_llm.cli.plugins import terminal
from plugin_llm.cli.plugins.consent import run_consent
from plugin_llm.cli.plugins.enabling import known_refs, run_toggle
from plugin_llm.cli.plugins.installing import run_install, run_update
from plugin_llm.cli.plugins.listing import cli_view, print_list, show_info
from plugin_llm.cli.plugins.lookups import config_parse_error
from plugin_llm.cli.plugins.removal import run_remove
from plugin_llm.cli.plugins.terminal import PLUGINS_LOGGER, emit, os_error
from plugin_llm.cli.plugins_select import apply_menu, build_menu
from plugin_llm.config import get_config_source, hermes_home
from plugin_llm.config_edit import ConfigEditError, edit_config
from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.scaffold import ScaffoldError, scaffold_plugin

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    common = _common_options(suppress=False)
    # Sub-actions accept the same options; SUPPRESS keeps them from resetting a value given earlier.
    again = _common_options(suppress=True)

    parser = subparsers.add_parser(
        "plugins",
        help="list and manage plugins",
        description="List, inspect, install and enable plugins. Plugins are opt-in (plugins.enabled in "
        "config.yaml). Without an action: an interactive checklist on a terminal, the list otherwise.",
        parents=[common],
    )
    actions = parser.add_subparsers(dest="plugins_action", metavar="ACTION")
    actions.add_parser(
        "list", parents=[again], help="every plugin found, its status, what it registered",
        description="Every plugin found (user, project, entry points), enabled or not, loaded or failed.",
    )
    info = actions.add_parser("info", parents=[again], help="details of one plugin")
    info.add_argument("name", help="plugin key (e.g. image_gen/openai) or bare name")

    install = actions.add_parser(
        "install", parents=[again], help="install a plugin from git or a directory",
        description="Install a plugin into <home>/plugins/. SOURCE: owner/repo (GitHub), a git URL "
        "(https://, ssh://, git@host:path, file://), URL#subdir, or a local directory (path or path#subdir).",
    )
    install.add_argument("source", metavar="SOURCE", nargs="?")
    install.add_argument("--link", metavar="DIR", help="development: link DIR instead of copying it (edits apply "
                         "on the next load; update is a no-op; remove deletes only the link)")
    install.add_argument("--force", action="store_true", help="replace an existing plugin of the same name")
    install.add_argument("--accept-existing-grants", action="store_true",
                         help="keep the plugins.enabled / plugins.entries.<key> settings config.yaml already has "
                         "for this name (left by a removed plugin) without asking")
    toggle = install.add_mutually_exclusive_group()
    toggle.add_argument("--enable", dest="enable", action="store_true", default=None, help="enable it (no question)")
    toggle.add_argument("--no-enable", dest="enable", action="store_false", help="do not enable it (no question)")
    install.add_argument("--ref", metavar="SHA", help="check out this commit (or tag) and pin it: update refuses pinned installs")
    install.add_argument("--category", metavar="CAT", help="install as <CAT>/<name> (e.g. memory, context_engine)")
    install.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="git timeout (default 120)")

    consent = actions.add_parser(
        "consent", parents=[again], help="review and grant the capabilities a plugin requests",
        description="Show the capabilities a plugin's manifest requests (capabilities: in plugin.yaml) and what "
        "is granted; on a terminal, ask to grant the ones not granted yet (recorded in plugins.entries.<key>).",
    )
    consent.add_argument("name", help="plugin key, name or unique leaf")
    consent.add_argument("--yes", action="store_true", help="grant every requested capability without asking")

    update = actions.add_parser("update", parents=[again], help="git pull --ff-only an installed plugin")
    update.add_argument("name", help="plugin key, name or unique leaf")
    update.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="git timeout (default 120)")

    remove = actions.add_parser("remove", parents=[again], help="delete an installed plugin (directory and record)")
    remove.add_argument("name", help="plugin key, name or unique leaf")
    remove.add_argument("--force", action="store_true", help="remove even with local edits in its git checkout")
    remove.add_argument("--keep-config", action="store_true",
                        help="keep its plugins.enabled entry and plugins.entries.<key> (trust grants) in config.yaml")
    data = remove.add_mutually_exclusive_group()
    data.add_argument("--yes", action="store_true",
                      help="without asking, move its private data (plugin-data/<key>/: memory, stored tokens) "
                      "aside to plugin-data/.removed/ (needed without a terminal when it has data)")
    data.add_argument("--keep-data", action="store_true",
                      help="leave its private data in plugin-data/<key>/ (a plugin installed later under this "
                      "name still starts empty: install moves it aside)")

    new = actions.add_parser("new", parents=[again], help="create a working plugin to start from (with a test)",
                             description="Create DIR/NAME/: plugin.yaml, __init__.py (register(ctx) with a command "
                             "that calls ctx.llm), tests/ (passes as generated, offline) and a README.")
    new.add_argument("name", metavar="NAME", help="plugin name (also its command: /NAME)")
    new.add_argument("--template", "--kind", dest="kind", default="command",
                     choices=("command", "structured", "stream", "tool", "hook"),
                     help="command (default): ctx.llm.complete; structured: JSON checked by a schema; stream: "
                     "ctx.llm.stream; tool: also a tool for the model; hook: also a pre_llm_call hook")
    new.add_argument("--dir", default=".", metavar="DIR", help="where to create NAME/ (default: the current directory)")

    for verb, text in (("enable", "add a plugin to plugins.enabled (and out of plugins.disabled)"),
                       ("disable", "add a plugin to plugins.disabled (and out of plugins.enabled)")):
        sub = actions.add_parser(verb, parents=[again], help=text, description=text[0].upper() + text[1:] + ".")
        sub.add_argument("name", help="plugin key (image_gen/openai), manifest name, or a unique leaf (openai)")
        sub.add_argument("--dry-run", action="store_true", help="show the config.yaml diff, write nothing")
    parser.set_defaults(func=run, plugins_action=None)


def _common_options(*, suppress: bool) -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    extra = {"default": argparse.SUPPRESS} if suppress else {}
    options.add_argument("--home", metavar="DIR", help="home directory (default: $HERMES_HOME or ~/.hermes)", **extra)
    options.add_argument("--json", action="store_true", help="machine-readable output", **extra)
    return options


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "plugins_action", None)
    home = Path(args.home).expanduser() if getattr(args, "home", None) else None
    if home is not None and home.exists() and not home.is_dir():
        raise CliError(f"--home {home} is not a directory")
    if not getattr(args, "debug", False):
        # Problems are reported in the listing itself; keep stderr for real errors.
        logging.getLogger(PLUGINS_LOGGER).addHandler(logging.NullHandler())
    handler = _ACTIONS.get(action or "")
    if handler is not None:
        return handler(args, home or _default_home())
    if action is None and not args.json and terminal.interactive():
        return _interactive_menu(home or _default_home())

    # read-only: loading the plugins to list them appends no load events to the audit log
    manager = PluginManager(home or _default_home(), audit_events=False)
    config_error = config_parse_error(manager.home)
    plugins_log = logging.getLogger(PLUGINS_LOGGER)
    propagate = plugins_log.propagate
    if not getattr(args, "debug", False):  # the listing reports each load failure itself: once, not also as a log line
        plugins_log.propagate = False
    try:
        plugins = manager.list_plugins()
    finally:
        plugins_log.propagate = propagate
        manager.shutdown()  # out-of-process plugins were started to be listed: stop them now
    plugins = [cli_view(p, config_error) for p in plugins]
    if action in (None, "list"):
        code = print_list(manager.home, plugins, args.json, config_error)
        if action is None and not args.json:
            print(_USAGE)
        return code
    if action == "info":
        return show_info(manager.home, plugins, args.name, args.json)
    raise CliError(f"unknown plugins action {action!r}")  # pragma: no cover - argparse rejects it first


_USAGE = """
Manage plugins:
  plugin-llm plugins install SOURCE [--enable|--no-enable] [--ref SHA] [--force]
        SOURCE: owner/repo, a git URL (https://, ssh://, git@host:path, file://)[#subdir], or a directory
  plugin-llm plugins update NAME        git pull --ff-only (refuses pinned installs and local edits)
  plugin-llm plugins consent NAME       review and grant the capabilities a plugin requests
  plugin-llm plugins remove NAME        delete the plugin, its install record and tokens [--yes|--keep-data]
  plugin-llm plugins enable NAME        NAME: key (image_gen/openai), manifest name, or unique leaf (openai)
  plugin-llm plugins disable NAME
  plugin-llm plugins info NAME | list [--json]
Run `plugin-llm plugins` in a terminal for an interactive checklist."""


def _default_home() -> Path:
    return hermes_home()


def _new(args: argparse.Namespace) -> int:
    try:
        path = scaffold_plugin(args.name, Path(args.dir).expanduser(), kind=args.kind)
    except ScaffoldError as exc:
        raise CliError(printable(str(exc), limit=2000)) from None
    except OSError as exc:
        raise CliError(printable(f"cannot create {args.name} in {args.dir}: {os_error(exc)}", limit=2000)) from None
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    lines = [f"Created {path}: {', '.join(files)}",
             f"Test it:     python -m pytest {path / 'tests'}",
             f"Try it:      plugin-llm plugins install --link {path} --enable && plugin-llm run {args.name} 'some text'"]
    emit(args, {"path": str(path), "files": files, "kind": args.kind, "template": args.kind}, lines)
    return 0


def _interactive_menu(home: Path) -> int:
    from plugin_llm.cli.plugins_menu import run_menu  # looked up per call: tests replace the menu

    model = _menu_model(home)
    if not model.refs:
        print(f"No plugins found in {home / 'plugins'} (or entry points).")
        print(_USAGE)
        return 0
    if not run_menu(model):
        print("No changes saved.")
        return 0
    return _save_menu(home, model)


def _menu_model(home: Path) -> Any:
    config = get_config_source(home).current()
    if config.error:
        raise CliError(f"{config.error}; fix config.yaml before changing plugins")
    return build_menu(known_refs(home), config.raw)


def _save_menu(home: Path, model: Any) -> int:
    changes: list[str] = []
    try:
        result = edit_config(home, lambda doc: changes.extend(apply_menu(doc, model)))
    except ConfigEditError as exc:
        raise CliError(str(exc)) from None
    if not result.changed:
        print("Nothing changed.")
        return 0
    print(f"Saved {result.path}:")
    for change in changes:
        print(f"  {printable(change)}")
    return 0


_ACTIONS: dict[str, Callable[[argparse.Namespace, Path], int]] = {
    "install": run_install,
    "consent": run_consent,
    "update": run_update,
    "remove": run_remove,
    "new": lambda args, home: _new(args),
    "enable": lambda args, home: run_toggle(args, home, enable=True),
    "disable": lambda args, home: run_toggle(args, home, enable=False),
}
