"""``plugin-llm plugins``: list, inspect, install, update, remove, enable and disable plugins.

``list`` discovers the plugins of the home and loads the enabled ones; it never imports litellm.
``install/update/remove`` live in :mod:`plugin_llm.plugins.install` (no prompts there); this
module asks the questions: the values of missing ``requires_env`` variables (secrets without
echo, saved in ``<home>/.env``, mode 0600, never echoed: only their names are printed) and whether
to enable the new plugin. ``enable/disable`` and the interactive screen edit config.yaml through
:mod:`plugin_llm.config_edit`; none of them imports plugin code.

Everything a plugin supplies (manifest fields, error texts, tool and command names, file names) is
printed through :func:`plugin_llm.cli._common.printable` (control characters and bidi overrides
escaped, lengths bounded); ``--json`` goes through :func:`~plugin_llm.cli._common.dumps_json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from auth.env_names import steering_reason
from plugin_llm.auditing import write_event
from plugin_llm.cli._common import dumps_json, printable
from plugin_llm.cli.main import CliError
from plugin_llm.cli.plugins_select import apply_menu, build_menu, disable_in, enable_in, known_plugins
from plugin_llm.config import get_config_source, hermes_home
from plugin_llm.config_edit import ConfigEditError, delete_value, edit_config, get_value, list_remove
from plugin_llm.plugins import PluginManager, install as inst
from plugin_llm.plugins.consent import consent_state, describe, record_consent
from plugin_llm.plugins.install import InstallError, is_secret_name, missing_env, read_metadata, resolve_name
from plugin_llm.plugins.isolation.sandbox import plugin_data_path
from plugin_llm.plugins.scaffold import ScaffoldError, scaffold_plugin
from plugin_llm.service.tokens import TokenError, token_store_for
from plugin_llm.timefmt import utc_iso_text
from plugin_llm.trust import config_path

__all__ = ["register", "run"]

_PLUGINS_LOGGER = "plugin_llm.plugins"


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
        logging.getLogger(_PLUGINS_LOGGER).addHandler(logging.NullHandler())
    handler = _ACTIONS.get(action or "")
    if handler is not None:
        return handler(args, home or _default_home())
    if action is None and not args.json and _interactive():
        return _interactive_menu(home or _default_home())

    # read-only: loading the plugins to list them appends no load events to the audit log
    manager = PluginManager(home or _default_home(), audit_events=False)
    config_error = _config_error(manager.home)
    plugins_log = logging.getLogger(_PLUGINS_LOGGER)
    propagate = plugins_log.propagate
    if not getattr(args, "debug", False):  # the listing reports each load failure itself: once, not also as a log line
        plugins_log.propagate = False
    try:
        plugins = manager.list_plugins()
    finally:
        plugins_log.propagate = propagate
        manager.shutdown()  # out-of-process plugins were started to be listed: stop them now
    plugins = [_cli_view(p, config_error) for p in plugins]
    if action in (None, "list"):
        code = _list(manager.home, plugins, args.json, config_error)
        if action is None and not args.json:
            print(_USAGE)
        return code
    if action == "info":
        return _info(manager.home, plugins, args.name, args.json)
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


def _interactive() -> bool:
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _emit(args: argparse.Namespace, data: dict[str, Any], lines: list[str]) -> None:
    if args.json:
        print(dumps_json(data))
    else:
        for line in lines:  # a line may hold a diff: each of its lines is escaped on its own
            print("\n".join(printable(part, limit=4000) for part in line.split("\n")))


def _os_error(exc: OSError) -> str:
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return f"{exc.strerror or exc}{where}"


def _config_error(home: Path) -> str | None:
    try:
        return get_config_source(home).current().error
    except Exception as exc:  # pragma: no cover - defensive
        return str(exc)


def _cli_view(p: dict[str, Any], config_error: str | None) -> dict[str, Any]:
    """A ``list_plugins()`` entry as ``plugins list/info`` report it (text and ``--json`` alike).

    ``enabled`` is what the operator configured — in ``plugins.enabled`` (or, for an
    exclusive plugin, named by ``<category>.provider``) and not in ``plugins.disabled`` —
    as ``install --json`` reports it, whether or not the plugin loaded; ``loaded`` says
    whether its code is loaded and active, and ``not_loaded_reason`` why not (None when
    loaded). The Python API's ``enabled`` (SPEC: true only when loaded) is ``loaded`` here.
    An isolated plugin's ``pid`` is not reported: the CLI started its process to list it and
    has stopped it before printing (``list_plugins()`` reports it while the process runs).
    """
    view = {k: v for k, v in p.items() if k not in ("enabled_in_config", "pid")}
    loaded = bool(p.get("enabled"))
    view["enabled"] = bool(p.get("enabled_in_config"))
    view["loaded"] = loaded
    view["not_loaded_reason"] = None if loaded else _not_loaded_reason(p, config_error)
    return view


def _not_loaded_reason(p: dict[str, Any], config_error: str | None) -> str:
    status = p["status"]
    if status == "failed":
        return f"it failed to load: {p['error'] or 'unknown error'}"
    if status == "disabled":
        return "it is in plugins.disabled (which always wins)"
    if config_error:
        return "config.yaml does not parse: no plugin is enabled until it is fixed"
    if p.get("note"):
        return p["note"]
    if status == "not enabled":
        return f"it is not in plugins.enabled (enable it with: plugin-llm plugins enable {p['key']})"
    return status


def _list(home: Path, plugins: list[dict[str, Any]], as_json: bool, config_error: str | None) -> int:
    if as_json:
        print(dumps_json(plugins))
        return 0
    if config_error:  # the error itself (where, why) is the CLI's one error line on stderr: see cli.main
        print("config.yaml does not parse: no plugin is enabled until it is fixed")
    if not plugins:
        print(f"No plugins found in {home / 'plugins'}.")
        print("A plugin is a directory <name>/ with plugin.yaml and __init__.py defining register(ctx).")
        return 0
    headers = ("NAME", "KEY", "STATUS", "VERSION", "SOURCE", "TOOLS", "HOOKS", "CMDS")
    rows = [
        (printable(p["name"], 60), printable(p["key"], 100), p["status"], printable(p["version"] or "-", 30),
         p["source"], str(len(p["tools"])), str(len(p["hooks"])), str(len(p["commands"])))
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
            print(f"    {printable(line, limit=2000)}")
    counts: dict[str, int] = {}
    for p in plugins:
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    print(f"\n{len(plugins)} plugin{'s' if len(plugins) != 1 else ''} ({summary}) in {home}")
    return 0


def _notes(p: dict[str, Any]) -> list[str]:
    notes = []
    if p["error"]:
        where = f" (plugin-llm plugins info {p['key']} shows where)" if p.get("error_frames") else ""
        notes.append(f"error: {p['error']}{where}")
    if p["missing_env"]:
        notes.append(f"missing env: {', '.join(p['missing_env'])} (the plugin loads, but may not work)")
    if p["enable_hint"]:
        notes.append(f"enable: {p['enable_hint']}")
    if p.get("note"):
        notes.append(f"note: {p['note']}")
    if p.get("isolation") == "process":
        notes.append(f"isolation: {_isolation_text(p)}")
    pending = [c for c in p.get("capabilities") or () if c not in (p.get("granted_capabilities") or ())]
    if pending:
        notes.append(f"capabilities not granted: {', '.join(pending)} (plugin-llm plugins consent {p['key']})")
    for warning in p.get("warnings") or ():
        notes.append(f"warning: {warning}")
    return notes


def _isolation_text(p: dict[str, Any]) -> str:
    """How a plugin runs: in process, or out of process with its confinement (bubblewrap | process)."""
    if p.get("isolation") != "process":
        return (f"in process (shares the host's memory; plugins.entries.{p['key']}.isolation: process "
                "runs it in its own process)")
    confinement = p.get("confinement")
    if confinement == "bubblewrap":
        text = "out of process, confined by bubblewrap (home and the host's /proc hidden)"
    elif confinement == "process":
        text = ("out of process, without bubblewrap (it can read files this OS user can: "
                f"{p.get('confinement_reason') or 'bubblewrap is not usable'})")
    else:
        text = "out of process (not started)"
    if p.get("isolation_network") == "none":
        text += "; no network"
    elif p.get("isolation_network") == "host":  # asked for, or a plain process that cannot be cut off
        text += "; the host's network" + (" (isolation_network: host)" if confinement == "bubblewrap" else "")
    if p.get("data_dir"):
        text += f"; its data: {p['data_dir']}"
    restarts = p.get("restarts") or 0
    if restarts:
        text += f"; restarted {restarts} time{'s' if restarts != 1 else ''}, last: {p.get('last_fault')}"
    return text


def _trust_block(key: str) -> str:
    """The config path of the plugin's ``llm`` trust block (its identity is the key)."""
    return config_path(key, "allow_model_override").rsplit(".", 1)[0]


def _info(home: Path, plugins: list[dict[str, Any]], name: str, as_json: bool) -> int:
    try:
        key = resolve_name(name, {p["key"]: p["name"] for p in plugins}, where=f" in {home}")
    except InstallError as exc:
        raise CliError(printable(str(exc), limit=2000)) from None
    # Several plugins claiming one key all failed to load: show every one of them.
    claimants = [dict(p) for p in plugins if p["key"] == key]
    install, trust_entry = _install_record(home, key), _trust_entry(home, key)
    for p in claimants:
        p["install"], p["trust_entry"] = install, trust_entry
    if as_json:
        data = claimants[0]
        if len(claimants) > 1:
            data["also_claimed_by"] = claimants[1:]
        print(dumps_json(data))
        return 0
    for i, p in enumerate(claimants):
        if i:
            print()
        _print_info(home, p)
    return 0


def _print_info(home: Path, p: dict[str, Any]) -> None:
    install = p["install"] or {}
    origin = install.get("source")
    if origin and install.get("ref"):
        origin += f" (pinned to {install['ref']})"
    fields = [
        ("key", p["key"]), ("name", p["name"]), ("status", p["status"]),
        ("enabled", "yes (config.yaml enables it)" if p["enabled"] else "no"),
        ("loaded", "yes" if p["loaded"] else "no: it failed to load (see error)" if p["status"] == "failed"
         else f"no: {p['not_loaded_reason']}"),
        ("version", p["version"]),
        ("description", p["description"]), ("author", p["author"]),
        ("kind", p["kind"] + (f" (declared: {p['declared_kind']})" if p.get("declared_kind")
                              and p["declared_kind"] != p["kind"] else "")),
        ("note", p.get("note")),
        ("isolation", _isolation_text(p)),
        ("capabilities", ", ".join(p.get("capabilities") or ())),
        ("granted", ", ".join(p.get("granted_capabilities") or ()) if p.get("capabilities") else None),
        ("middleware", ", ".join(p.get("middleware") or ())),
        ("source", p["source"]), ("path", p["path"] or p["entry_point"]),
        ("installed from", origin), ("revision", install.get("revision")),
        ("installed at", install.get("installed_at")), ("updated at", install.get("updated_at")),
        ("tools", ", ".join(p["tools"])), ("hooks", ", ".join(p["hooks"])),
        ("commands", ", ".join("/" + c for c in p["commands"])),
        ("cli commands", ", ".join(p["cli_commands"])), ("skills", ", ".join(p["skills"])),
        ("memory providers", ", ".join(p["memory_providers"])),
        ("context engines", ", ".join(p["context_engines"])),
        ("image providers", ", ".join(p["image_gen_providers"])), ("platforms", ", ".join(p["platforms"])),
        ("auxiliary tasks", ", ".join(p.get("auxiliary_tasks") or ())),
        ("requires env", ", ".join(p["requires_env"])), ("missing env", ", ".join(p["missing_env"])),
        ("error", p["error"]), ("enable", p["enable_hint"]),
        ("trust block", f"{_trust_block(p['key'])} in {home / 'config.yaml'}"),
        ("trust entry", _compact(p["trust_entry"]) if p["trust_entry"] is not None else "none (no override allowed)"),
    ]
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        if value:
            print(f"{key.ljust(width)}  {printable(value, limit=2000 if key == 'error' else 500)}")
        if key == "error" and p.get("error_frames"):  # where in the plugin's own code it failed
            print(f"{'traceback'.ljust(width)}  (most recent call last)")
            for frame in p["error_frames"]:
                print(f"{''.ljust(width)}    {printable(frame, limit=400)}")
    for warning in p["warnings"]:
        print(f"{'warning'.ljust(width)}  {printable(warning, limit=2000)}")


def _install_record(home: Path, key: str) -> dict[str, Any] | None:
    try:
        entry = read_metadata(home / "plugins").get(key)
    except InstallError as exc:
        return {"error": str(exc)}
    if entry is None:
        return None

    record = entry.to_json()
    for name in ("installed_at", "updated_at"):  # stored with microseconds and +00:00: shown in the one format
        if name in record:
            record[name] = utc_iso_text(record[name])
    return record


def _trust_entry(home: Path, key: str) -> Any:
    """The raw ``plugins.entries.<key>.llm`` block as written (None when absent)."""
    try:
        raw = get_config_source(home).current().raw
    except Exception:  # pragma: no cover - reported by the listing already
        return None
    plugins = raw.get("plugins") if isinstance(raw, Mapping) else None
    entries = plugins.get("entries") if isinstance(plugins, Mapping) else None
    entry = entries.get(key) if isinstance(entries, Mapping) else None
    return entry.get("llm") if isinstance(entry, Mapping) else None


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# --------------------------------------------------------------------------- install / update / remove


def _ask_yes_no(question: str, input_fn: Callable[[str], str] | None = None) -> bool:
    input_fn = input_fn or input  # looked up at call time (tests replace builtins.input)
    try:
        answer = input_fn(f"{question} [y/N] ").strip().lower()
    except EOFError:
        return False
    return answer in ("y", "yes")


def _prompt_env(
    home: Path,
    requirements: list[tuple[str, str]],
    *,
    input_fn: Callable[[str], str] | None = None,
    getpass_fn: Callable[[str], str] | None = None,
) -> dict[str, str]:
    """Ask for each missing variable (secrets masked); empty answer skips it. Values are never printed."""
    input_fn = input_fn or input
    if getpass_fn is None:
        import getpass

        getpass_fn = getpass.getpass
    values: dict[str, str] = {}
    print(f"This plugin needs {len(requirements)} environment variable(s) that are not set "
          f"(saved to {home / '.env'}, mode 0600; enter skips):")
    for name, description in requirements:
        label = f"  {name}" + (f" ({printable(description, 200)})" if description else "")
        try:
            value = (getpass_fn if is_secret_name(name) else input_fn)(f"{label}: ")
        except EOFError:
            break
        value = value.strip()
        if value:
            values[name] = value
    return values


def _without_host_variables(requirements: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Drop (with a note) the variables that steer this host's model routes: a plugin's description must not
    get an operator to type, say, a URL into DEEPSEEK_API_BASE, which the host would send its key to."""
    kept = []
    for name, description in requirements:
        reason = steering_reason(name, any_provider=False)
        if reason is None:
            kept.append((name, description))
        else:
            print(f"Not asking for {printable(name, 100)}: {reason}; it changes this host's model calls, not just "
                  "the plugin's. Set it yourself in the environment or .env if you mean to.")
    return kept


def _install(args: argparse.Namespace, home: Path) -> int:
    interactive = not args.json and _interactive()
    timeout = args.timeout if args.timeout is not None else inst.DEFAULT_GIT_TIMEOUT
    if timeout <= 0:
        raise CliError("--timeout must be a positive number of seconds")
    if home.exists() and not home.is_dir():
        raise CliError(f"home {home} is not a directory")
    if (args.source is None) == (args.link is None):
        raise CliError("give SOURCE or --link DIR (not both): plugin-llm plugins install owner/repo | --link ./my-plugin")
    if args.link is not None and args.ref:
        raise CliError("--ref applies to git sources, not --link")
    try:
        home.mkdir(parents=True, exist_ok=True)
        if args.link is not None:
            staged = inst.stage_link(home / "plugins", args.link, category=args.category)
        else:
            source = inst.parse_source(args.source)
            if not args.json:
                verb = "Cloning" if source.kind == "git" else "Copying"
                print(f"{verb} {source.display} ...", file=sys.stderr)
            staged = inst.stage_plugin(home / "plugins", source, ref=args.ref, category=args.category, timeout=timeout)
    except inst.InstallError as exc:
        raise CliError(printable(f"{exc}; nothing was installed", limit=2000)) from None
    except OSError as exc:  # disk full, permissions: the staging directory is already gone
        raise CliError(printable(f"cannot install {args.source}: {_os_error(exc)}; nothing was installed", 2000)) from None
    try:
        key = staged.key
        target = staged.target
        # before any question: an existing plugin needs --force; a category or a non-plugin is never replaced
        inst.check_target(staged, force=args.force)
        if not staged.target.exists():  # a new name: settings left by a removed plugin are not its to inherit
            _check_leftover_config(home, key, accept=args.accept_existing_grants, interactive=interactive)
        # the environment values first (secrets masked), then "Enable?": an answer is never typed at the wrong prompt
        requirements = [(r.name, r.description) for r in staged.manifest.requires_env]
        missing = set(inst.missing_env(home, [n for n, _ in requirements]))
        requirements = [r for r in requirements if r[0] in missing]
        requirements = _without_host_variables(requirements) if interactive else requirements
        values = _prompt_env(home, requirements) if requirements and interactive else {}
        enable = args.enable
        if enable is None and interactive:
            enable = _ask_yes_no(f"Enable {key} now?")
        enable = bool(enable)
        if enable:  # refuse before installing when config.yaml cannot be edited
            try:
                edit_config(home, lambda doc: None, dry_run=True)
            except ConfigEditError as exc:
                raise CliError(f"cannot enable {key}: {exc}; nothing was installed (fix config.yaml or use --no-enable)") from None
        requested = tuple(staged.manifest.capabilities)  # consent last: non-interactive installs grant nothing
        grant = _ask_consent(key, requested) if requested and interactive else False
        entry = inst.commit_staged(staged, force=args.force)
    except inst.InstallError as exc:
        raise CliError(printable(f"{exc}; nothing was installed", limit=2000)) from None
    except OSError as exc:
        raise CliError(printable(f"cannot install {key}: {_os_error(exc)}; nothing was installed", 2000)) from None
    finally:
        inst.discard_staged(staged)

    version = f" {staged.manifest.version}" if staged.manifest.version else ""
    if entry.kind == "link":  # nothing was copied: say what was made
        lines = [f"Linked {key}{version}: {target} is a symlink to {entry.location} (edits there apply on the "
                 "next load; remove deletes only the link)"]
    else:
        lines = [f"Installed {key}{version} from {entry.source}" + (f" at {entry.revision[:12]}" if entry.revision else "")
                 + (" (pinned)" if entry.ref else "") + f" into {target}"]
    if entry.created_files:
        lines.append(f"Created from *.example: {', '.join(entry.created_files)} (edit them to configure the plugin)")
    if staged.data_moved_to is not None:  # an earlier plugin's memory and tokens are never inherited
        lines.append(f"Moved the private data an earlier plugin named {key} left aside to {staged.data_moved_to}: "
                     f"{key} starts with none (delete it with: rm -rf {staged.data_moved_to})")
    saved: list[str] = []
    if values:
        try:
            inst.write_env_values(home, values)
            saved = sorted(values)
            lines.append(f"Saved {', '.join(saved)} to {home / '.env'} (values not shown)")
        except (inst.InstallError, OSError) as exc:
            lines.append(f"warning: could not save to {home / '.env'}: {exc}")
    still_missing = [n for n, _ in requirements if n not in values]
    if still_missing:
        lines.append(f"Missing environment: {', '.join(still_missing)} — set them in the environment "
                     f"or in {home / '.env'}; the plugin loads, but may not work without them")
    if requested:
        lines.append(_record_consent(home, key, requested, grant, declared=requested))
    clashes = _clashes(home, key) if enable else []
    lines.extend(f"warning: {c}" for c in clashes)  # before enabling: what it will not get
    if enable:
        try:
            _set_enabled(home, key, enable=True, dry_run=False)
            lines.append(f"Enabled {key} in {home / 'config.yaml'}")
        except CliError as exc:
            lines.append(f"warning: installed but not enabled: {exc}")
            _emit(args, _install_json(entry, target, False, still_missing, saved, staged.data_moved_to), lines)
            return 1
    elif "plugins.enabled" in _config_mentions(home, key):  # kept with --accept-existing-grants: say so
        enable = True
        lines.append(f"Enabled: {key} is already in plugins.enabled of {home / 'config.yaml'}")
    else:
        lines.append(f"Not enabled; enable it with: plugin-llm plugins enable {key}")
    _emit(args, _install_json(entry, target, enable, still_missing, saved, staged.data_moved_to), lines)
    return 0


def _ask_consent(key: str, capabilities: tuple[str, ...] | list[str]) -> bool:
    """Show what ``key`` requests and ask (terminal only)."""
    print(f"{printable(key, 200)} requests these capabilities:")
    for capability in capabilities:
        print(f"  {printable(capability, 100)}: {describe(capability)}")
    return _ask_yes_no("Grant them?")


def _record_consent(home: Path, key: str, capabilities: tuple[str, ...] | list[str], grant: bool,
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


def _consent_after_update(args: argparse.Namespace, home: Path, key: str) -> list[str]:
    """An update that requests more capabilities asks again; until then the new ones are not granted."""
    requested = _requested_capabilities(home, key)
    if not requested:
        return []
    state = consent_state(home, key, requested)
    if not state.pending:
        return []
    already = tuple(c for c in state.granted if c in requested) if state.valid else ()
    grant = not args.json and _interactive() and _ask_consent(key, state.pending)
    return [_record_consent(home, key, state.pending, grant, already, requested)]


def _consent(args: argparse.Namespace, home: Path) -> int:
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
        if not args.yes and (args.json or not _interactive()):  # nobody to ask: never "run this command again"
            why = "--json" if args.json else "not a terminal"
            raise CliError(printable(f"{why}: pass --yes to grant {', '.join(state.pending)} to {key} "
                                     "(nothing was granted)", limit=2000))
        grant = args.yes or _ask_consent(key, state.pending)
        already = tuple(c for c in state.granted if c in requested) if state.valid else ()
        lines.append(_record_consent(home, key, state.pending, bool(grant), already, requested))
    elif unbound:
        bind = args.yes or (not args.json and _interactive() and _ask_yes_no(f"Bind the grant of {key}?"))
        kept = tuple(c for c in state.granted if c in requested)
        lines.append(_record_consent(home, key, kept, bool(bind), declared=requested) if bind else
                     f"Not bound; bind it with: plugin-llm plugins consent {key} --yes")
    after = consent_state(home, key, requested)
    _emit(args, {"key": key, "requested": list(requested), "granted": list(after.granted if after.valid else ()),
                 "pending": list(after.pending), "bound": after.bound}, lines)
    return 0


def _install_json(entry: Any, target: Path, enabled: bool, missing: list[str], saved: list[str],
                  data_moved_to: Path | None = None) -> dict[str, Any]:
    data = {"key": entry.key, "path": str(target), **entry.to_json(),
            "data_moved_to": str(data_moved_to) if data_moved_to is not None else None}
    data.update(enabled=enabled, missing_env=missing, env_saved=saved)
    return data


def _update(args: argparse.Namespace, home: Path) -> int:
    timeout = args.timeout if args.timeout is not None else inst.DEFAULT_GIT_TIMEOUT
    try:
        result = inst.update_plugin(home, args.name, timeout=timeout)
    except inst.InstallError as exc:
        raise CliError(printable(str(exc), limit=2000)) from None
    except OSError as exc:
        raise CliError(printable(f"cannot update {args.name}: {_os_error(exc)}", limit=2000)) from None
    if not result.changed and result.old_revision is None and _is_link(home, result.key):
        line = f"{result.key} is linked (--link): nothing to update; edits in its directory apply on the next load"
    elif not result.changed:
        line = f"{result.key} is already up to date" + (f" ({result.old_revision[:12]})" if result.old_revision else "")
    else:
        line = f"Updated {result.key}: {(result.old_revision or '?')[:12]} -> {(result.new_revision or '?')[:12]}"
    lines = [line]
    if result.created_files:
        lines.append(f"Created from *.example: {', '.join(result.created_files)}")
    lines += _consent_after_update(args, home, result.key)
    _emit(args, {"key": result.key, "changed": result.changed, "old_revision": result.old_revision,
                 "new_revision": result.new_revision, "created_files": list(result.created_files)}, lines)
    return 0


def _remove(args: argparse.Namespace, home: Path) -> int:
    refs = _refs(home)
    try:
        key = inst.resolve_installed(home / "plugins", args.name)
    except inst.InstallError as exc:
        hint = _not_removable_hint(args.name, refs)
        raise CliError(printable(f"{exc}{hint}", limit=2000)) from None
    closed = _closed_reason(home)
    if closed is not None and not args.keep_config:  # its enabled entry and grants would stay behind
        raise CliError(f"{closed}; whether it still enables or trusts {key} cannot be read, so nothing was "
                       "removed (fix config.yaml, or use --keep-config)")
    every_mention = _config_mentions(home, key)
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
        raise CliError(printable(f"cannot remove {args.name}: {_os_error(exc)} (nothing was removed)", 2000)) from None
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
    _emit(args, {"key": result.key, "removed": list(result.removed_paths), "config_removed": removed_config,
                 "config_mentions": [] if removed_config else mentions, "data_moved_to": result.data_moved_to,
                 "data_kept": _kept_data(home, result.key, keep_data), "tokens_revoked": [t.id for t in revoked],
                 "tokens_error": token_problem}, lines)
    return 1 if token_problem else 0


def _has_data(home: Path, key: str) -> bool:
    return os.path.lexists(plugin_data_path(home, key))


def _kept_data(home: Path, key: str, keep_data: bool) -> str | None:
    return str(plugin_data_path(home, key)) if keep_data and _has_data(home, key) else None


def _keep_data(args: argparse.Namespace, home: Path, key: str) -> bool:
    """Whether ``remove`` leaves the plugin's private data in place: ``--keep-data``; ``--yes`` or a yes on
    a terminal moves it aside; without a terminal and without either, nothing is removed."""
    if args.keep_data or args.yes or not _has_data(home, key):
        return bool(args.keep_data)
    where = plugin_data_path(home, key)
    if not args.json and _interactive():
        print(f"{key} has private data in {where} (its memory, tokens it stored).", file=sys.stderr)
        if _ask_yes_no(f"Remove it with the plugin (moved aside to {where.parent / '.removed'}/, to delete later)?"):
            return False
        raise CliError(f"nothing was removed; to remove {key} but leave its data in {where}, use --keep-data")
    raise CliError(f"{key} has private data in {where} (its memory, tokens it stored); nothing was removed. "
                   f"Pass --yes to move it aside with the plugin (to {where.parent / '.removed'}/), "
                   "or --keep-data to leave it")


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


def _check_leftover_config(home: Path, key: str, *, accept: bool, interactive: bool) -> None:
    """Settings config.yaml already has for ``key`` (a removed plugin's ``--keep-config``, a hand
    edit) would enable and trust the new plugin: ask on a terminal, refuse otherwise."""
    closed = _closed_reason(home)
    if closed is not None and not accept:  # leftover grants cannot be ruled out
        raise CliError(f"{closed}; whether it has settings for {key} (left by an earlier plugin of that name) "
                       "cannot be read, so nothing was installed (fix config.yaml, or pass --accept-existing-grants)")
    mentions = [m for m in _config_mentions(home, key) if m != "plugins.disabled"]
    if not mentions or accept:
        return
    shown = ", ".join(mentions)
    if interactive:
        print(f"config.yaml already has settings for {key}: {shown}. They were not given to this plugin.",
              file=sys.stderr)
        if _ask_yes_no(f"Let the new {key} have them (enabled / trusted as configured)?"):
            return
    raise CliError(f"config.yaml already has settings for {key} ({shown}), left by an earlier plugin of that name; "
                   "nothing was installed. Remove them from config.yaml, or pass --accept-existing-grants "
                   "to give them to this plugin")


def _is_link(home: Path, key: str) -> bool:
    record = _install_record(home, key)
    return bool(record) and record.get("kind") == "link"


def _new(args: argparse.Namespace) -> int:
    try:
        path = scaffold_plugin(args.name, Path(args.dir).expanduser(), kind=args.kind)
    except ScaffoldError as exc:
        raise CliError(printable(str(exc), limit=2000)) from None
    except OSError as exc:
        raise CliError(printable(f"cannot create {args.name} in {args.dir}: {_os_error(exc)}", limit=2000)) from None
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    lines = [f"Created {path}: {', '.join(files)}",
             f"Test it:     python -m pytest {path / 'tests'}",
             f"Try it:      plugin-llm plugins install --link {path} --enable && plugin-llm run {args.name} 'some text'"]
    _emit(args, {"path": str(path), "files": files, "kind": args.kind, "template": args.kind}, lines)
    return 0


def _not_removable_hint(name: str, refs: list[Any]) -> str:
    for ref in refs:
        if name in (ref.key, ref.name) and ref.source != "user":
            if ref.source == "entrypoint":
                return f" ({ref.key} is a pip-installed plugin: uninstall its distribution with pip)"
            return f" ({ref.key} is a project plugin in ./.hermes/plugins; remove it there)"
    return ""


def _closed_reason(home: Path) -> str | None:
    """Why config.yaml cannot be read (``HostConfig.closed_reason``), None when it parses."""
    try:
        return get_config_source(home).current().closed_reason
    except Exception as exc:  # pragma: no cover - defensive
        return str(exc)


def _config_mentions(home: Path, key: str) -> list[str]:
    try:
        raw = get_config_source(home).current().raw
    except Exception:  # pragma: no cover - defensive
        return []
    plugins = raw.get("plugins") if isinstance(raw, Mapping) else None
    if not isinstance(plugins, Mapping):
        return []
    out = []
    for section in ("enabled", "disabled"):
        value = plugins.get(section)
        if isinstance(value, list) and key in value:
            out.append(f"plugins.{section}")
    if isinstance(plugins.get("entries"), Mapping) and key in plugins["entries"]:
        out.append(f"plugins.entries.{key}")
    return out


# --------------------------------------------------------------------------- enable / disable


def _refs(home: Path) -> list[Any]:
    return known_plugins(home)


def _resolve_ref(name: str, refs: list[Any], home: Path) -> Any:
    try:
        key = resolve_name(name, {r.key: r.name for r in refs}, where=f" in {home} (or entry points)")
    except InstallError as exc:
        raise CliError(printable(str(exc), limit=2000)) from None
    return next(r for r in refs if r.key == key)


def _set_enabled(home: Path, name: str, *, enable: bool, dry_run: bool) -> tuple[Any, list[str], Any]:
    refs = _refs(home)
    target = _resolve_ref(name, refs, home)
    changes: list[str] = []

    def mutate(doc: Any) -> None:
        changes.extend((enable_in if enable else disable_in)(doc, target, refs))

    try:
        result = edit_config(home, mutate, dry_run=dry_run)
    except ConfigEditError as exc:
        raise CliError(str(exc)) from None
    return target, changes, result


def _toggle(args: argparse.Namespace, home: Path, *, enable: bool) -> int:
    clashes = _clashes(home, _resolve_ref(args.name, _refs(home), home).key) if enable else []
    target, changes, result = _set_enabled(home, args.name, enable=enable, dry_run=args.dry_run)
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
    _emit(args, {"key": target.key, "action": "enable" if enable else "disable", "changed": bool(changes),
                 "changes": changes, "dry_run": args.dry_run, "diff": result.diff,
                 "backup": str(result.backup) if result.backup else None, "missing_env": missing,
                 "clashes": clashes}, lines)
    return 0


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


def _clashes(home: Path, key: str) -> list[str]:
    """What ``key`` would fail to register once enabled because another plugin has the name
    (the first plugin to register a name keeps it; see ``registry.load_order``). Loads the
    plugins read-only (no audit events) as they would load with ``key`` enabled."""
    from dataclasses import replace

    manager = PluginManager(home, audit_events=False)
    real = manager._settings

    class _WithKey:  # config.yaml as it will read once key is enabled
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def current(self) -> Any:
            settings = real.current()
            return replace(settings, enabled=settings.enabled | {key}, disabled=settings.disabled - {key})

    manager._settings = _WithKey()  # type: ignore[assignment]
    quiet = logging.getLogger(_PLUGINS_LOGGER)
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


# --------------------------------------------------------------------------- interactive


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
    return build_menu(_refs(home), config.raw)


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
    "install": _install,
    "consent": _consent,
    "update": _update,
    "remove": _remove,
    "new": lambda args, home: _new(args),
    "enable": lambda args, home: _toggle(args, home, enable=True),
    "disable": lambda args, home: _toggle(args, home, enable=False),
}
