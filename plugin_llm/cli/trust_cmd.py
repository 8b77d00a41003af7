"""``plugin-llm trust show|check|explain|grant|revoke``: the per-plugin trust policy.

``show`` prints each plugin's effective policy and where every value came from;
``check`` validates the whole ``plugins:`` section (exit 1 on errors);
``explain`` dry-runs the gate and prints the YAML that would allow a denied
call (exit 0 allowed, 1 denied); ``grant``/``revoke`` edit the plugin's entry
through :mod:`plugin_llm.config_edit` (comments kept, ``config.yaml.bak``).

``revoke PLUGIN FLAG`` without values sets the flag to false and keeps the
allowlist, so a later ``grant`` restores the same limits; with values it
removes them from the allowlist (an emptied list allows nothing).

None of these import litellm or load any plugin code.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Mapping

from plugin_llm import trust_report as tr
from plugin_llm.capabilities import parse_grant
from plugin_llm.cli._common import dumps_json, printable
from plugin_llm.cli.main import CliError
from plugin_llm.config import hermes_home
from plugin_llm.config_edit import ConfigEditError, edit_config, get_value, list_add, list_remove, set_value
from plugin_llm.limits.views import describe
from plugin_llm.routing import requested_overrides
from plugin_llm.trust import CAPABILITY_FOR, FLAG_KEYS, LIST_KEYS, TASK_FLAG
from plugin_llm.trust_report import _entries

__all__ = ["register", "run", "normalize_flag"]

_ACTIONS = ("show", "check", "explain", "grant", "revoke")
#: the exit code of a config.yaml that does not parse (cli.main.EXIT_CODES: a configuration error)
_CONFIG_ERROR = 2


# ------------------------------------------------------------------ parser
def _common_options(*, suppress: bool) -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    extra: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    options.add_argument("--home", metavar="DIR", help="home directory (default: $HERMES_HOME or ~/.hermes)", **extra)
    options.add_argument("--json", action="store_true", help="machine-readable output", **extra)
    return options


def register(subparsers: Any) -> None:
    common = _common_options(suppress=False)
    again = _common_options(suppress=True)
    parser = subparsers.add_parser(
        "trust",
        parents=[common],
        help="show, check and explain the per-plugin trust policy",
        description="The trust gate: what each plugin may override (plugins.entries.<id>.llm in config.yaml).",
    )
    actions = parser.add_subparsers(dest="trust_action", metavar="ACTION")

    show = actions.add_parser("show", parents=[again], help="effective policy per plugin, with where each value came from")
    show.add_argument("plugin", nargs="?", help="only this plugin (its key, e.g. image_gen/openai)")

    actions.add_parser("check", parents=[again], help="validate the plugins: section; exit 1 on errors")

    explain = actions.add_parser(
        "explain", parents=[again], help="dry-run the gate for one plugin (exit 0 allowed, 1 denied)",
        description="Would the gate allow this call? Prints the deciding rule and, for a denial, the YAML that allows it.",
    )
    explain.add_argument("plugin", help="plugin key (e.g. image_gen/openai)")
    explain.add_argument("--provider", help="provider= the plugin passes")
    explain.add_argument("--model", help="model= the plugin passes")
    explain.add_argument("--agent-id", dest="agent_id", help="agent_id= the plugin passes")
    explain.add_argument("--profile", help="profile= the plugin passes")
    explain.add_argument("--task", help="task= the plugin passes (a built-in task, or one the plugin registers)")

    for name, text in (
        ("grant", "turn an override on (and add VALUES to its allowlist)"),
        ("revoke", "remove VALUES from an allowlist, or turn the override off"),
    ):
        edit = actions.add_parser(name, parents=[again], help=text, description=_EDIT_HELP[name])
        edit.add_argument("plugin", help="plugin key (e.g. image_gen/openai)")
        edit.add_argument("flag", help="provider | model | agent_id | profile | task (or the full key name)")
        edit.add_argument("values", nargs="*", help="allowlist values (provider and model only)")
        edit.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
        edit.add_argument("--strict", action="store_true", help="refuse a plugin that is not installed")
    parser.set_defaults(func=run, trust_action=None)


_EDIT_HELP = {
    "grant": "Set allow_<flag>_override: true for the plugin and add VALUES to allowed_<flag>s "
    "(provider and model only). Creating an allowlist narrows a grant that allowed any value.",
    "revoke": "With VALUES: remove them from the allowlist (an empty list allows nothing). Without "
    "VALUES: set allow_<flag>_override: false; the allowlist is kept for a later grant.",
}


def normalize_flag(text: str) -> str:
    """``provider|model|agent_id|profile|task`` from a short name or a full trust key."""
    word = text.strip().lower().replace("-", "_")
    if word in FLAG_KEYS or word == "task":
        return word
    if word == TASK_FLAG:
        return "task"
    for name, key in FLAG_KEYS.items():
        if word == key:
            return name
    for name, key in LIST_KEYS.items():
        if word == key:
            return name
    if word in ("agent", "agentid"):
        return "agent_id"
    raise CliError(
        f"unknown flag {text!r}: use provider, model, agent_id, profile or task "
        f"(or a key such as allow_model_override)"
    )


# ------------------------------------------------------------------ run
def run(args: argparse.Namespace) -> int:
    action = getattr(args, "trust_action", None) or "show"
    if not getattr(args, "debug", False):
        # Discovery problems (broken manifests) are reported by `plugins list`; keep stderr for ours.
        logger = logging.getLogger("plugin_llm.plugins")
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
    home = _home(args)

    view = tr.read_config(home)
    installed = tr.installed_plugins(home)
    as_json = bool(getattr(args, "json", False))
    if action == "show":
        return _show(tr, view, installed, getattr(args, "plugin", None), as_json)
    if action == "check":
        return _check(tr, view, installed, as_json)
    if action == "explain":
        return _explain(tr, view, installed, args, as_json)
    if action in ("grant", "revoke"):
        return _edit(tr, view, installed, args, as_json, grant=action == "grant")
    raise CliError(f"unknown trust action {action!r}")  # pragma: no cover - argparse rejects it first


def _home(args: argparse.Namespace) -> Path:
    given = getattr(args, "home", None)
    home = Path(given).expanduser() if given else hermes_home()
    if given and not home.is_dir():
        raise CliError(f"--home {home}: {'not a directory' if home.exists() else 'does not exist'}")
    return home


def _warn(message: str) -> None:
    print(f"plugin-llm: warning: {printable(message, 2000)}", file=sys.stderr)


def _dump(data: Any) -> None:
    print(dumps_json(data))


def _print_lines(lines: list[str]) -> None:
    """Rendered lines carry plugin keys (directory and manifest names): escaped, line by line."""
    for line in lines:
        for part in line.split("\n"):
            print(printable(part, 2000))


def _configured_ids(tr: Any, view: Any) -> list[str]:
    return tr.configured_plugin_ids(view)


def _resolve(tr: Any, view: Any, installed: Mapping[str, str], name: str) -> str:
    if not name.strip():
        raise CliError("the plugin id is empty")
    plugin_id, note = tr.resolve_plugin_id(name, installed, _configured_ids(tr, view))
    if note:
        _warn(note)
    return plugin_id


# ------------------------------------------------------------------ show
def _where(line: int | None, view: Any) -> str:
    return f" ({view.path.name} line {line})" if line is not None else ""


def _render_finding(f: Any, view: Any, indent: str = "") -> list[str]:
    pad = indent + " " * 9
    fix = f.fix.replace("\n", "\n" + pad + "     ")
    return [
        f"{indent}{f.severity:<8} {printable(f.path, 400)}{_where(f.line, view)}",
        f"{pad}{f.problem}",
        f"{pad}fix: {fix}",
    ]


def _render_plugin(pt: Any, view: Any) -> list[str]:
    from plugin_llm.hardened.bounded_repr import short_repr  # a value as written may be anything: shown bounded

    state = "installed" if pt.installed else "NOT INSTALLED"
    where = f", entry at {view.path.name} line {pt.entry_line}" if pt.entry_line is not None else ""
    lines = [f"{printable(pt.plugin_id, 200)}  ({state}{where})"]  # (escaped here: a line break in a key is data)
    if view.error is not None:
        lines.append("  fail closed: no overrides (config.yaml does not parse)")
        return lines
    lines.append(f"  {pt.summary}")
    plugin_limits = view.config.limits.for_plugin(pt.plugin_id)
    if not plugin_limits.empty or plugin_limits.error is not None:
        lines.append(f"  limits: {describe(plugin_limits)}")
    if pt.has_entry:
        width_key = max(len(s.key) for s in pt.settings)
        width_val = max(len(s.display()) for s in pt.settings)
        for s in pt.settings:
            note = f"  (written: {short_repr(s.written)})" if s.written is not None else ""
            lines.append(f"    {s.key:<{width_key}}  {s.display():<{width_val}}  {s.source}{note}")
    granted = getattr(pt.policy, "granted_capabilities", ())
    if granted:  # consented capabilities allow the matching overrides like the allow_* flags

        entry = next((v for k, v in _entries(view.raw).items() if str(k) == pt.plugin_id), None)
        how = ("consent recorded" if parse_grant(pt.plugin_id, entry).bound else
               f"as Hermes records it, not bound: plugin-llm plugins consent {printable(pt.plugin_id, 200)} binds it")
        by_capability = {c: n for n, c in CAPABILITY_FOR.items()}
        for capability in granted:
            what = f"allows the {by_capability[capability]} override" if capability in by_capability else "no effect here"
            lines.append(f"    capability {printable(capability, 100)}  granted ({how})  {what}")
    for f in pt.findings:
        lines.extend(_render_finding(f, view, indent="  "))
    return lines


def _limits_of(view: Any, plugin_id: str) -> dict[str, Any] | None:
    """The plugin's limits as ``trust show --json`` gives them (None: it has none), like its text's line."""
    limits = view.config.limits.for_plugin(plugin_id)
    return None if limits.empty and limits.error is None else limits.as_dict()


def _show(tr: Any, view: Any, installed: Mapping[str, str], plugin: str | None, as_json: bool) -> int:
    findings = tr.check_plugins(view, installed)
    if plugin is not None:
        plugin_id = _resolve(tr, view, installed, plugin)
        if view.error is None and plugin_id not in installed and plugin_id not in _configured_ids(tr, view):
            known = ", ".join(sorted(set(installed) | set(_configured_ids(tr, view)))) or "none"
            raise CliError(printable(f"no plugin {plugin_id!r} is installed or configured in {view.home} (known: {known})", 2000))
        policies = [tr.effective_policy(view, plugin_id, installed, findings)]
        general: list[Any] = []
    else:
        policies = tr.effective_policies(view, installed, findings)
        # a parse error is reported once, at the top
        general = [f for f in findings if f.plugin_id is None and view.error is None]
    if as_json:
        _dump({
            "config": str(view.path),
            "exists": view.exists,
            "error": view.error,
            "fail_closed": view.error is not None,
            "plugins": [{**p.as_dict(), "limits": _limits_of(view, p.plugin_id)} for p in policies],
            "findings": [f.as_dict() for f in general],
        })
    else:
        if view.error is not None:  # the one error line (on stderr) is the CLI's: see cli.main
            print(f"config: {view.path}: does not parse; every plugin override is refused until it is fixed (fail closed)")
        elif not view.exists:
            print(f"config: {view.path} (missing: no plugin has any override)")
        else:
            print(f"config: {view.path}")
        if not policies:
            print("no plugins installed and no entries under plugins.entries")
        for pt in policies:
            print()
            _print_lines(_render_plugin(pt, view))
        if general:
            print()
            print("plugins section:")
            for f in general:
                _print_lines(_render_finding(f, view, indent="  "))
    return _CONFIG_ERROR if view.error is not None else 0


# ------------------------------------------------------------------ check
def _check(tr: Any, view: Any, installed: Mapping[str, str], as_json: bool) -> int:
    findings = tr.check_plugins(view, installed)
    errors = sum(1 for f in findings if f.severity == tr.ERROR)
    warnings = len(findings) - errors
    if as_json:
        _dump({
            "config": str(view.path),
            "ok": errors == 0,
            "errors": errors,
            "warnings": warnings,
            "findings": [f.as_dict() for f in findings],
        })
        return _check_code(view, errors)
    for f in findings:
        _print_lines(_render_finding(f, view))
    if not view.exists:
        print(f"no {view.path}: nothing to check (no plugin is enabled, none has overrides)")
    elif findings:
        print(f"{_plural(errors, 'error')}, {_plural(warnings, 'warning')} in {view.path}")
    else:
        entries = len(_configured_ids(tr, view))
        print(f"plugins section OK: {_plural(entries, 'entry', 'entries')}, {_plural(len(installed), 'plugin')} installed ({view.path})")
    if errors and view.error is None:  # a config that does not parse is the CLI's one error line
        print(f"plugin-llm: trust check failed: {_plural(errors, 'error')} in {view.path}", file=sys.stderr)
    return _check_code(view, errors)


def _check_code(view: Any, errors: int) -> int:
    """2 when config.yaml does not parse (a configuration error), 1 for findings, else 0."""
    return _CONFIG_ERROR if view.error is not None else (1 if errors else 0)


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


# ------------------------------------------------------------------ explain
def _optional(args: argparse.Namespace, name: str) -> str | None:
    value = getattr(args, name, None)
    if value is None:
        return None
    if not value.strip():
        raise CliError(f"--{name.replace('_', '-')} must not be empty")
    return value.strip()


def _explain(tr: Any, view: Any, installed: Mapping[str, str], args: argparse.Namespace, as_json: bool) -> int:
    plugin_id = _resolve(tr, view, installed, args.plugin)
    # the gateway's own rule (call/pipeline.py, Pipeline._admit)
    overrides = requested_overrides(view.config, provider=_optional(args, "provider"), model=_optional(args, "model"),
                                    agent_id=_optional(args, "agent_id"), profile=_optional(args, "profile"))
    result = tr.explain(view, plugin_id, overrides, installed, task=_optional(args, "task"))
    if not result.installed:
        _warn(f"no installed plugin has the key {plugin_id!r}; this is the policy it would get once installed")
    if as_json:
        _dump(result.as_dict())
        return _explain_code(view, result.decision.allowed)
    d = result.decision
    if view.error is not None and not d.allowed:  # the flag may be set: say what really refuses it
        asked = ", ".join(f"{name} {value!r}" for name, value in overrides.requested().items())
        print(f"DENIED  plugin '{printable(plugin_id)}' may not override {printable(asked)}: config.yaml does not parse ({printable(view.error)}): "
              f"the trust gate is closed until it is fixed")
    else:
        print(f"{'ALLOWED' if d.allowed else 'DENIED'}  {d.reason}")
    for rule in result.rules:
        print(f"  {rule}")
    if not d.allowed and result.snippet:
        print(f"\nto allow it, add to {view.path}:\n")
        print(result.snippet, end="")
        policy = view.config.trust_for(plugin_id)
        if any(getattr(policy, key) is not None for key in ("allowed_providers", "allowed_models")
               if key in result.changes):
            print("(a list shown here replaces the existing one)")
        if result.commands:
            print("\nor run:")
            for command in result.commands:
                print(f"  {command}")
        for command, allows in result.broader:  # second choice, with what it allows
            print(f"\nbroader (allows {allows}):\n  {command}")
    if d.allowed:
        if result.route is not None:
            r = result.route
            endpoint = r["base_url"] or "the provider's default endpoint"
            named = f"{printable(r['name'])}: " if r.get("name") else ""
            print(
                f"route: {named}{r['provider']} / {r['model']} (litellm {r['litellm_model']}), {endpoint}, "
                f"profile {r['profile'] or 'default'}, agent_id {r['agent_id'] or '-'}, timeout {r['timeout']:g}s"
                + _breaker_text(r)
            )
            for fallback in r.get("fallbacks", ()):
                endpoint = fallback["base_url"] or "the provider's default endpoint"
                print(f"  then, on a failure another provider can fix: {printable(fallback['name'])}: "
                      f"{fallback['provider']} / {fallback['model']}, {endpoint}{_breaker_text(fallback)}")
        elif result.route_error:
            print(f"route: {result.route_error}" if view.error else f"route: cannot be resolved: {result.route_error}")
    if result.tasks is not None and view.error is None:
        _print_lines(_render_tasks(result.tasks))
    return _explain_code(view, d.allowed)


def _render_tasks(tasks: Any) -> list[str]:
    """Whether the plugin may name a built-in task (``task=``), and each ``auxiliary.<task>`` slot's route."""
    lines = ["", f"tasks: {tasks.summary}"]
    if not tasks.slots:
        lines.append("  no auxiliary: slots: every task takes the default route")
    for slot in tasks.slots:
        usable = {"yes": "built-in, usable by this plugin", "no": "built-in, not usable by this plugin"}.get(
            slot.usable, slot.usable)
        if slot.error is not None:
            where = f"cannot be resolved: {slot.error}"
        else:
            r = slot.route
            named = f"{r['name']}: " if r.get("name") else ""
            where = "the default route: " if slot.default else ""
            endpoint = r["base_url"] or "the provider's default endpoint"
            where += f"{named}{r['provider']} / {r['model']}, {endpoint}"
            if slot.timeout is not None:
                where += f", timeout {slot.timeout:g}s"
            where += "".join(f"; then {f['name'] or f['provider'] + '/' + f['model']}" for f in r.get("fallbacks", ()))
        lines.append(f"  auxiliary.{slot.task} ({usable}): {where}")
    return lines


def _breaker_text(route: Mapping[str, Any]) -> str:
    breaker = route.get("breaker")
    if not breaker:
        return ""
    if breaker["state"] == "closed":
        return " [breaker closed]"
    return f" [breaker {breaker['state']}, {breaker['failures']} failure(s), next probe {breaker['retry_at'] or '-'}]"


def _explain_code(view: Any, allowed: bool) -> int:
    """0 allowed, 1 denied; 2 whenever config.yaml does not parse (the answer is not the operator's policy)."""
    return _CONFIG_ERROR if view.error is not None else (0 if allowed else 1)


# ------------------------------------------------------------------ grant / revoke
def _same_item(a: Any, b: str) -> bool:
    return isinstance(a, str) and a.strip().lower() == b.strip().lower()


def _edit(tr: Any, view: Any, installed: Mapping[str, str], args: argparse.Namespace, as_json: bool, *, grant: bool) -> int:
    name = normalize_flag(args.flag)
    values = [v.strip() for v in args.values]
    if any(not v for v in values):
        raise CliError("allowlist values must not be empty")
    if values and name not in LIST_KEYS:
        raise CliError(f"{name} has no allowlist: run `plugin-llm trust {'grant' if grant else 'revoke'} {args.plugin} {name}` without values")
    if view.error is not None:
        raise CliError(f"{view.config.closed_reason}; nothing was written")
    plugin_id = _resolve(tr, view, installed, args.plugin)
    notes: list[str] = []
    if plugin_id not in installed:
        message = f"no installed plugin has the key {plugin_id!r}"
        if args.strict:
            raise CliError(f"{message} (--strict); install it first or check the key with `plugin-llm plugins list`")
        notes.append(f"{message}; the entry takes effect once it is installed")

    flag = TASK_FLAG if name == "task" else FLAG_KEYS[name]
    list_key = LIST_KEYS.get(name)
    base = ("plugins", "entries", plugin_id, "llm")

    def mutate(doc: Any) -> None:
        current = get_value(doc, base + (list_key,)) if list_key else None
        if grant:
            set_value(doc, base + (flag,), True)
            if values and current is None:
                notes.append(f"{list_key} did not exist (any {name} was allowed); it now limits the plugin to: {', '.join(values)}")
            if list_key and not values and current is None:  # say what a bare grant means
                notes.append(f"this allows any {name}: {tr.entry_key(plugin_id)} has no {list_key}; to allow only "
                             f"some, name them: plugin-llm trust grant {plugin_id} {name} VALUE...")
            if isinstance(current, list) and any(_same_item(item, "*") for item in current):
                notes.append(f"{list_key} contains '*', which already allows any {name}")
            for value in values:
                if isinstance(current, list) and any(_same_item(item, value) for item in current):
                    continue
                list_add(doc, base + (list_key,), value)
            return
        if not values:
            if get_value(doc, base + (flag,)) is not None:
                set_value(doc, base + (flag,), False)
            if isinstance(current, list):
                notes.append(f"{list_key} is kept (inactive while {flag} is false)")
            return
        if current is None:
            raise CliError(
                f"{tr.entry_key(plugin_id)} has no {list_key} list, so any {name} is allowed while {flag} is true; "
                f"to allow only some, grant those: plugin-llm trust grant {plugin_id} {name} VALUE..., "
                f"or revoke the flag: plugin-llm trust revoke {plugin_id} {name}"
            )
        items = current if isinstance(current, list) else [current]
        for value in values:
            matching = [item for item in items if _same_item(item, value)]
            if not matching:
                notes.append(f"{value!r} is not on {list_key}")
            for item in matching:
                list_remove(doc, base + (list_key,), item)
        remaining = get_value(doc, base + (list_key,))
        if isinstance(remaining, list) and not remaining:
            notes.append(f"{list_key} is now empty: no {name} is allowed")
        elif isinstance(remaining, list) and any(_same_item(item, "*") for item in remaining):
            notes.append(f"{list_key} still contains '*', which allows any {name}")

    try:
        result = edit_config(view.home, mutate, dry_run=args.dry_run)
    except ConfigEditError as exc:
        raise CliError(str(exc), exit_code=1) from None
    for note in notes:
        _warn(note)
    after = tr.read_config(view.home)
    policy = tr.effective_policy(after, plugin_id, installed, tr.check_plugins(after, installed))
    written = result.changed and not args.dry_run
    if as_json:
        _dump({
            "plugin_id": plugin_id,
            "action": "grant" if grant else "revoke",
            "flag": flag,
            "values": values,
            "changed": result.changed,
            "written": written,
            "dry_run": args.dry_run,
            "path": str(result.path),
            "backup": str(result.backup) if result.backup else None,
            "diff": result.diff,
            "notes": notes,
            "policy": policy.as_dict() if not args.dry_run else None,
        })
        return 0
    if not result.changed:
        print(f"nothing to change in {result.path}")
    else:
        print(result.diff, end="" if result.diff.endswith("\n") else "\n")
        if args.dry_run:
            print("dry run: nothing was written")
            return 0
        backup = f" (previous version: {result.backup})" if result.backup else ""
        print(f"wrote {result.path}{backup}")
    print()
    _print_lines(_render_plugin(policy, after))
    return 0
