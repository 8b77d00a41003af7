"""``plugin-llm limits show|reset``: per-plugin budgets and rate limits, what is spent and in flight.

``show`` lists every plugin with limits (its own block, or ``limits.defaults``
for the enabled plugins), each limit, its usage in the current window and when
that window resets. ``reset PLUGIN`` forgets the plugin's settled usage in the
current windows (for an operator who raised a cap mid-window); it is written
to the audit log first, and nothing is reset when that write fails. In-flight
reservations are kept: those calls are still running.

A PLUGIN that names no plugin (not under ``plugins.entries`` or
``plugins.enabled``, not installed) is refused with a "did you mean", so a
typo neither shows ``limits.defaults`` nor resets (and audits) nothing.
``show`` exits 1 when a store did not answer or a shown plugin's limits are
broken (its calls are refused; its row says why).
"""

from __future__ import annotations

import argparse
import difflib
import logging
from pathlib import Path
from typing import Any, Mapping

from plugin_llm.cli._common import add_home_argument, dumps_json, home_from, printable
from plugin_llm.cli.main import CliError

__all__ = ["register", "run_show", "run_reset"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("limits", help="show or reset per-plugin budgets and rate limits",
                              description=__doc__.split("\n\n")[1])
    sub = p.add_subparsers(dest="limits_command", metavar="{show,reset}")
    show = sub.add_parser("show", help="each plugin's limits, usage in the current windows and when they reset")
    show.add_argument("plugin", nargs="?", help="one plugin key (default: every plugin with limits)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    add_home_argument(show)
    show.set_defaults(func=run_show)
    reset = sub.add_parser("reset", help="forget a plugin's settled usage in the current windows (audited)")
    reset.add_argument("plugin", help="the plugin key")
    add_home_argument(reset)
    reset.set_defaults(func=run_reset)


def _config(args: argparse.Namespace) -> Any:
    from plugin_llm.config import get_config_source

    home = home_from(args)
    if home.exists() and not home.is_dir():
        raise CliError(f"--home {home} is not a directory")
    config = get_config_source(home).current()
    if config.error is not None:
        print(f"plugin-llm: warning: {printable(config.closed_reason)}; showing the last good limits")
    return config


def _plugins(config: Any, wanted: str | None) -> list[str]:
    """The plugin ``wanted`` names (refused when no plugin has that key), or every plugin with limits."""
    if wanted is not None:
        key = wanted.strip()
        if not key:
            raise CliError("the plugin key must not be empty")
        _known_or_refused(config, key)
        return [key]
    settings = config.limits
    keys = set(settings.plugins)
    if not settings.defaults.empty:  # limits.defaults governs every enabled plugin without a block
        keys.update(_enabled(config))
    return sorted(keys)


def _section(config: Any, key: str) -> Any:
    plugins = config.raw.get("plugins")
    return plugins.get(key) if isinstance(plugins, Mapping) else None


def _enabled(config: Any) -> list[str]:
    return [k.strip() for k in _section(config, "enabled") or () if isinstance(k, str) and k.strip()]


def _installed(home: Path) -> dict[str, str]:
    """``{key: manifest name}`` of the plugins discovery finds (nothing is loaded); its warnings about
    broken manifests are `plugins list`'s to report, not this command's."""
    from plugin_llm.cli.main import debug_enabled
    from plugin_llm.trust_report import installed_plugins

    logger = logging.getLogger("plugin_llm.plugins")

    def quiet(record: logging.LogRecord) -> bool:  # discovery logs under plugin_llm.plugins
        return False

    if not debug_enabled():
        logger.addFilter(quiet)
    try:
        return installed_plugins(home)
    except Exception:  # noqa: BLE001 - an unreadable plugins directory: the configured names still count
        return {}
    finally:
        logger.removeFilter(quiet)


def _known_or_refused(config: Any, name: str) -> None:
    """Refuse a name no plugin has: a typo would show ``limits.defaults`` or reset (and audit) nothing.

    Known: a key under ``plugins.entries``, a name in ``plugins.enabled``, an installed plugin.
    (The store's rows are not consulted: the stores have no listing of their plugins.)
    """
    entries = _section(config, "entries")
    configured = [str(k) for k in entries] if isinstance(entries, Mapping) else []
    if name in configured or name in _enabled(config):
        return
    installed = _installed(config.home)
    if name in installed:
        return
    from plugin_llm.trust_report import resolve_plugin_id

    known = sorted({*configured, *_enabled(config), *installed})
    resolved, _ = resolve_plugin_id(name, installed, configured)  # a manifest name or bare leaf -> its key
    close = [resolved] if resolved != name else difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{printable(close[0], 100)}'?)" if close else ""
    limited = _plugins(config, None)
    if not limited:
        have = f"no plugin has limits in {printable(config.path)}"
    elif len(limited) <= 20:
        have = "plugins with limits: " + ", ".join(printable(k, 100) for k in limited)
    else:
        have = f"{len(limited)} plugins have limits (see plugin-llm limits show)"
    raise CliError(f"unknown plugin '{printable(name, 100)}'{hint}: it is not under plugins.entries or "
                   f"plugins.enabled in {printable(config.path)} and no installed plugin has that key; {have}")


def run_show(args: argparse.Namespace) -> int:
    from plugin_llm.limits import views

    config = _config(args)
    rows = views.show(config.limits, config.home, _plugins(config, args.plugin))
    if args.json:
        print(dumps_json({"store": config.limits.store, "plugins": [row.as_dict() for row in rows]}))
    elif not rows:
        print(f"No plugin has limits in {printable(config.path)} (see README: Budgets and rate limits).")
    else:
        for line in views.format_rows(rows):
            print(printable(line, limit=2000))
    # 1 when a store did not answer, or a plugin's limits are broken (its calls are refused: the row says why)
    return 1 if any(row.error or row.limits.error for row in rows) else 0


def run_reset(args: argparse.Namespace) -> int:
    from plugin_llm import limits
    from plugin_llm.auditing import host_audit_log
    from plugin_llm.limits import views

    config = _config(args)
    [plugin_id] = _plugins(config, args.plugin)
    settings = config.limits
    if settings.for_plugin(plugin_id).empty:
        raise CliError(f"plugin {printable(plugin_id)!s} has no limits in {printable(config.path)}: nothing to reset")
    try:
        before = limits.snapshot(settings, config.home, plugin_id)
    except limits.StoreError as exc:
        raise CliError(f"the {settings.store} limits store did not answer: {printable(exc)}", exit_code=1) from None
    event = views.reset_event(plugin_id, settings, before)
    name = event.pop("event")
    try:  # on record first: a reset nobody can see afterwards is not done
        host_audit_log(config.home, config.audit).write_event(name, **event)
    except Exception as exc:  # noqa: BLE001 - any failure to record refuses the reset
        raise CliError(f"the audit log could not be written ({printable(exc)}): nothing was reset", exit_code=1) from None
    try:
        limits.reset(settings, config.home, plugin_id)
    except limits.StoreError as exc:
        raise CliError(f"the {settings.store} limits store did not answer: {printable(exc)} "
                       "(the audit log has the attempt)", exit_code=1) from None
    finally:
        limits.close_stores()  # settlements queued by this process are flushed
    kept = before.counters.in_flight
    print(f"reset {printable(plugin_id)}: spent today ${event.get('forgotten.spent_usd.day', 0):.6f} and this month "
          f"${event.get('forgotten.spent_usd.month', 0):.6f} forgotten; {kept} call(s) in flight keep their reservation")
    return 0
