"""``plugin-llm plugins install`` and ``plugins update``: the questions around
:mod:`plugin_llm.plugins.install` (which asks none).

Install asks for the values of missing ``requires_env`` variables (secrets without echo, saved in
``<home>/.env``, mode 0600, never echoed: only their names are printed), then whether to enable the
new plugin, then for consent to its capabilities.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from auth.env_names import steering_reason
from plugin_llm.cli._common import printable
from plugin_llm.cli.main import CliError
from plugin_llm.cli.plugins import terminal
from plugin_llm.cli.plugins.consent import ask_consent, consent_after_update, grant_consent
from plugin_llm.cli.plugins.enabling import name_clashes, set_enabled
from plugin_llm.cli.plugins.lookups import closed_reason, config_mentions, read_install_record
from plugin_llm.cli.plugins.terminal import ask_yes_no, emit, os_error
from plugin_llm.config_edit import ConfigEditError, edit_config
from plugin_llm.plugins import install as inst
from plugin_llm.plugins.install import is_secret_name


def run_install(args: argparse.Namespace, home: Path) -> int:
    interactive = not args.json and terminal.interactive()
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
        raise CliError(printable(f"cannot install {args.source}: {os_error(exc)}; nothing was installed", 2000)) from None
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
        values = prompt_env(home, requirements) if requirements and interactive else {}
        enable = args.enable
        if enable is None and interactive:
            enable = ask_yes_no(f"Enable {key} now?")
        enable = bool(enable)
        if enable:  # refuse before installing when config.yaml cannot be edited
            try:
                edit_config(home, lambda doc: None, dry_run=True)
            except ConfigEditError as exc:
                raise CliError(f"cannot enable {key}: {exc}; nothing was installed (fix config.yaml or use --no-enable)") from None
        requested = tuple(staged.manifest.capabilities)  # consent last: non-interactive installs grant nothing
        grant = ask_consent(key, requested) if requested and interactive else False
        entry = inst.commit_staged(staged, force=args.force)
    except inst.InstallError as exc:
        raise CliError(printable(f"{exc}; nothing was installed", limit=2000)) from None
    except OSError as exc:
        raise CliError(printable(f"cannot install {key}: {os_error(exc)}; nothing was installed", 2000)) from None
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
        lines.append(grant_consent(home, key, requested, grant, declared=requested))
    clashes = name_clashes(home, key) if enable else []
    lines.extend(f"warning: {c}" for c in clashes)  # before enabling: what it will not get
    if enable:
        try:
            set_enabled(home, key, enable=True, dry_run=False)
            lines.append(f"Enabled {key} in {home / 'config.yaml'}")
        except CliError as exc:
            lines.append(f"warning: installed but not enabled: {exc}")
            emit(args, _install_json(entry, target, False, still_missing, saved, staged.data_moved_to), lines)
            return 1
    elif "plugins.enabled" in config_mentions(home, key):  # kept with --accept-existing-grants: say so
        enable = True
        lines.append(f"Enabled: {key} is already in plugins.enabled of {home / 'config.yaml'}")
    else:
        lines.append(f"Not enabled; enable it with: plugin-llm plugins enable {key}")
    emit(args, _install_json(entry, target, enable, still_missing, saved, staged.data_moved_to), lines)
    return 0


def _check_leftover_config(home: Path, key: str, *, accept: bool, interactive: bool) -> None:
    """Settings config.yaml already has for ``key`` (a removed plugin's ``--keep-config``, a hand
    edit) would enable and trust the new plugin: ask on a terminal, refuse otherwise."""
    closed = closed_reason(home)
    if closed is not None and not accept:  # leftover grants cannot be ruled out
        raise CliError(f"{closed}; whether it has settings for {key} (left by an earlier plugin of that name) "
                       "cannot be read, so nothing was installed (fix config.yaml, or pass --accept-existing-grants)")
    mentions = [m for m in config_mentions(home, key) if m != "plugins.disabled"]
    if not mentions or accept:
        return
    shown = ", ".join(mentions)
    if interactive:
        print(f"config.yaml already has settings for {key}: {shown}. They were not given to this plugin.",
              file=sys.stderr)
        if ask_yes_no(f"Let the new {key} have them (enabled / trusted as configured)?"):
            return
    raise CliError(f"config.yaml already has settings for {key} ({shown}), left by an earlier plugin of that name; "
                   "nothing was installed. Remove them from config.yaml, or pass --accept-existing-grants "
                   "to give them to this plugin")


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


def prompt_env(
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


def _install_json(entry: Any, target: Path, enabled: bool, missing: list[str], saved: list[str],
                  data_moved_to: Path | None = None) -> dict[str, Any]:
    data = {"key": entry.key, "path": str(target), **entry.to_json(),
            "data_moved_to": str(data_moved_to) if data_moved_to is not None else None}
    data.update(enabled=enabled, missing_env=missing, env_saved=saved)
    return data


def run_update(args: argparse.Namespace, home: Path) -> int:
    timeout = args.timeout if args.timeout is not None else inst.DEFAULT_GIT_TIMEOUT
    try:
        result = inst.update_plugin(home, args.name, timeout=timeout)
    except inst.InstallError as exc:
        raise CliError(printable(str(exc), limit=2000)) from None
    except OSError as exc:
        raise CliError(printable(f"cannot update {args.name}: {os_error(exc)}", limit=2000)) from None
    if not result.changed and result.old_revision is None and _is_link(home, result.key):
        line = f"{result.key} is linked (--link): nothing to update; edits in its directory apply on the next load"
    elif not result.changed:
        line = f"{result.key} is already up to date" + (f" ({result.old_revision[:12]})" if result.old_revision else "")
    else:
        line = f"Updated {result.key}: {(result.old_revision or '?')[:12]} -> {(result.new_revision or '?')[:12]}"
    lines = [line]
    if result.created_files:
        lines.append(f"Created from *.example: {', '.join(result.created_files)}")
    lines += consent_after_update(args, home, result.key)
    emit(args, {"key": result.key, "changed": result.changed, "old_revision": result.old_revision,
                 "new_revision": result.new_revision, "created_files": list(result.created_files)}, lines)
    return 0


def _is_link(home: Path, key: str) -> bool:
    record = read_install_record(home, key)
    return bool(record) and record.get("kind") == "link"
