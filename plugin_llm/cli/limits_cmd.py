"""``plugin-llm limits show|reset``: per-plugin budgets and rate limits, what is spent and in flight.

``show`` lists every plugin with limits (its own block, or ``limits.defaults``
for the plugins that run), each limit, its usage in the current window and when
that window resets. ``reset PLUGIN`` forgets the plugin's settled usage in the
current windows (for an operator who raised a cap mid-window); its request is
written to the audit log first, and nothing is reset when that write fails,
then what the store deleted (or its failure). In-flight reservations are kept:
those calls are still running.

A PLUGIN that names no plugin is refused with a "did you mean", so a typo neither
shows ``limits.defaults`` nor resets anything. ``show`` exits 1 when a store did
not answer or a shown plugin's limits are broken (its row says why).
"""

from __future__ import annotations

import argparse
import difflib
import logging
from pathlib import Path
from typing import Any, Mapping

from audit import AuditWriteError
from plugin_llm import limits
from plugin_llm.auditing import host_audit_log
from plugin_llm.cli._common import add_home_argument, dumps_json, home_from, printable
from plugin_llm.cli.main import CliError, debug_enabled
from plugin_llm.config import get_config_source
from plugin_llm.limits import views
from plugin_llm.plugins.discovery import discover_candidates
from plugin_llm.plugins.manifest import KIND_EXCLUSIVE, KIND_MODEL_PROVIDER, KIND_STANDALONE
from plugin_llm.plugins.settings import settings_from_raw
from plugin_llm.trust_report import resolve_plugin_id

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


def _config(args: argparse.Namespace, *, for_reset: bool = False) -> Any:
    """The config; a reset refuses a config.yaml it cannot use as written (unparsable, or an error in
    its ``limits:`` section): the store or key prefix it would reach may not be the one meant."""
    home = home_from(args)
    if home.exists() and not home.is_dir():
        raise CliError(f"--home {home} is not a directory")
    config = get_config_source(home).current()
    if for_reset and (config.error is not None or config.limits.error is not None):
        problem = config.closed_reason if config.error is not None else config.limits.error
        raise CliError(f"{printable(problem)}; nothing was reset: fix config.yaml first (plugin-llm trust check "
                       "lists its problems), so that the reset reaches the store and key prefix meant", exit_code=1)
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
    if not settings.defaults.empty:  # limits.defaults governs every active plugin without a block
        keys.update(_active(config))
    return sorted(keys)


def _configured(config: Any) -> list[str]:
    plugins = config.raw.get("plugins")
    entries = plugins.get("entries") if isinstance(plugins, Mapping) else None
    return [str(k) for k in entries] if isinstance(entries, Mapping) else []


def _active(config: Any) -> list[str]:
    """The plugins that run, as the plugin manager decides it, by key: installed ones enabled by key or
    manifest name (``plugins.enabled``) or exclusive ones selected by ``<category>.provider``, not
    disabled; plus names in ``plugins.enabled`` that no installed plugin has, as written."""
    settings = settings_from_raw(config.raw)
    keys: set[str] = set()
    matched: set[str] = set()
    for key, (name, kind) in _installed(config.home).items():
        matched.update((key, name))
        if kind == KIND_MODEL_PROVIDER or settings.is_disabled(key, name):
            continue
        if settings.is_enabled(key, name) or (kind == KIND_EXCLUSIVE and settings.is_selected(key, name)):
            keys.add(key)
    keys.update(n for n in settings.enabled if n not in matched and n not in settings.disabled)
    return sorted(keys)


def _installed(home: Path) -> dict[str, tuple[str, str]]:
    """``{key: (manifest name, kind)}`` of the plugins discovery finds (nothing is loaded); its warnings
    about broken manifests are `plugins list`'s to report, not this command's."""
    logger = logging.getLogger("plugin_llm.plugins")

    def quiet(record: logging.LogRecord) -> bool:  # discovery logs under plugin_llm.plugins
        return False

    if not debug_enabled():
        logger.addFilter(quiet)
    try:
        return {key: (c.name, c.manifest.kind if c.manifest is not None else KIND_STANDALONE)
                for key, c in discover_candidates(Path(home)).items()}
    except Exception:  # noqa: BLE001 - an unreadable plugins directory: the configured names still count
        return {}
    finally:
        logger.removeFilter(quiet)


def _known_or_refused(config: Any, name: str) -> None:
    """Refuse a name no plugin has: a typo would show ``limits.defaults`` or reset (and audit) nothing.

    Known: a key under ``plugins.entries``, an installed plugin's key, a name in ``plugins.enabled``
    that no installed plugin has. A manifest name or bare leaf is refused with its plugin's key as
    the "did you mean": calls are metered under the key.
    (The store's rows are not consulted: the stores have no listing of their plugins.)
    """
    configured = _configured(config)
    if name in configured:
        return
    installed = {key: found[0] for key, found in _installed(config.home).items()}
    if name in installed:
        return
    resolved, _ = resolve_plugin_id(name, installed, configured)  # a manifest name or bare leaf -> its key
    enabled = settings_from_raw(config.raw).enabled
    if resolved == name and name in enabled and name not in installed.values():
        return  # enabled, not installed (yet)
    known = sorted({*configured, *enabled, *installed})
    close = [resolved] if resolved != name else difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{printable(close[0], 100)}'?)" if close else ""
    limited = _plugins(config, None)
    if not limited:
        have = f"no plugin has limits in {printable(config.path)}"
    elif len(limited) <= 20:
        have = "plugins with limits: " + ", ".join(printable(k, 100) for k in limited)
    else:
        have = f"{len(limited)} plugins have limits (see plugin-llm limits show)"
    what = ("it names an installed plugin, whose calls are metered under its key" if resolved != name else
            f"it is not under plugins.entries or plugins.enabled in {printable(config.path)} and no installed "
            "plugin has that key")
    raise CliError(f"unknown plugin '{printable(name, 100)}'{hint}: {what}; {have}")


def run_show(args: argparse.Namespace) -> int:
    config = _config(args)
    rows = views.show(config.limits, config.home, _plugins(config, args.plugin))
    if args.json:
        print(dumps_json({"store": config.limits.store, "plugins": [row.as_dict() for row in rows]}))
    elif not rows:
        print(f"No plugin has limits in {printable(config.path)} (see docs/limits.md).")
    else:
        for line in views.format_rows(rows):
            print(printable(line, limit=2000))
    # 1 when a store did not answer, or a plugin's limits are broken (its calls are refused: the row says why)
    return 1 if any(row.error or row.limits.error for row in rows) else 0


def run_reset(args: argparse.Namespace) -> int:
    config = _config(args, for_reset=True)
    [plugin_id] = _plugins(config, args.plugin)
    settings = config.limits
    if settings.for_plugin(plugin_id).empty:
        raise CliError(f"plugin {printable(plugin_id)!s} has no limits in {printable(config.path)}: nothing to reset")
    target = views.reset_target(plugin_id, settings, config.home)
    log = host_audit_log(config.home, config.audit)
    try:
        try:
            before = limits.snapshot(settings, config.home, plugin_id)  # (its calls in flight are kept)
        except limits.StoreError as exc:
            raise CliError(f"{printable(str(exc).rstrip('.'))}; nothing was reset", exit_code=1) from None
        try:  # on record first: a reset nobody can see afterwards is not done
            log.record_event("limits.reset.requested", **target)
        except AuditWriteError as exc:
            raise CliError(_unrecorded(exc, "nothing was reset"), exit_code=1) from None
        try:
            forgotten = limits.reset(settings, config.home, plugin_id)
        except limits.StoreError as exc:
            log.write_event("limits.reset.failed", **target, error=str(exc)[:500])
            raise CliError(f"{printable(str(exc).rstrip('.'))}; nothing was reset (the audit log has the request "
                           "and its failure)", exit_code=1) from None
    finally:
        limits.close_stores()  # settlements queued by this process are flushed
    event = views.reset_event(target, forgotten, before.counters.in_flight)
    try:
        log.record_event("limits.reset", **event)
    except AuditWriteError as exc:
        raise CliError(_unrecorded(exc, "the counters were reset, but the log has only the request "
                                        "(limits.reset.requested), not what was forgotten"), exit_code=1) from None
    print(f"reset {printable(plugin_id)}: spent today ${event['forgotten.spent_usd.day']:.6f} and this month "
          f"${event['forgotten.spent_usd.month']:.6f} forgotten; {before.counters.in_flight} call(s) in flight keep "
          "their reservation")
    return 0


def _unrecorded(exc: Any, outcome: str) -> str:
    """A reset's audit write failed: a reset needs the log whatever ``audit.required`` says."""
    return (f"the audit log {printable(exc.path)} cannot be written ({printable(exc.reason)}): {outcome}; "
            f"limits reset needs a writable audit log whatever audit.required says (make {printable(exc.path.parent)} "
            "writable and free disk space)")
