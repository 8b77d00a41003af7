"""``plugin-llm plugins list`` and ``plugins info``: the plugins as the CLI reports them.

``list`` discovers the plugins of the home and loads the enabled ones (it never imports litellm);
``enabled`` there is what the operator configured, ``loaded`` whether the code is active.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plugin_llm.cli._common import dumps_json, printable
from plugin_llm.cli.main import CliError
from plugin_llm.cli.plugins.lookups import read_install_record, read_trust_entry
from plugin_llm.plugins.install import InstallError, resolve_name
from plugin_llm.trust import config_path


def cli_view(p: dict[str, Any], config_error: str | None) -> dict[str, Any]:
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


def print_list(home: Path, plugins: list[dict[str, Any]], as_json: bool, config_error: str | None) -> int:
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
        notes.append(f"isolation: {isolation_text(p)}")
    pending = [c for c in p.get("capabilities") or () if c not in (p.get("granted_capabilities") or ())]
    if pending:
        notes.append(f"capabilities not granted: {', '.join(pending)} (plugin-llm plugins consent {p['key']})")
    for warning in p.get("warnings") or ():
        notes.append(f"warning: {warning}")
    return notes


def isolation_text(p: dict[str, Any]) -> str:
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


def show_info(home: Path, plugins: list[dict[str, Any]], name: str, as_json: bool) -> int:
    try:
        key = resolve_name(name, {p["key"]: p["name"] for p in plugins}, where=f" in {home}")
    except InstallError as exc:
        raise CliError(printable(str(exc), limit=2000)) from None
    # Several plugins claiming one key all failed to load: show every one of them.
    claimants = [dict(p) for p in plugins if p["key"] == key]
    install, trust_entry = read_install_record(home, key), read_trust_entry(home, key)
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
        ("isolation", isolation_text(p)),
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


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
