"""Where ``plugin-llm audit`` reads: the home (``--home``, ``$HERMES_HOME``), its log, or the
files ``--log`` names (several: one per replica)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from audit.logfiles import resolve_log_path
from audit.replicas import replicas
from plugin_llm.cli.main import CliError
from plugin_llm.config import hermes_home


def find_log(args: argparse.Namespace, must_exist: bool = True) -> Path:
    if args.log:
        if len(args.log) > 1:
            raise CliError(f"audit {args.audit_action} reads one log: pass --log once (verify, query, stats and "
                           f"serve take one --log per replica)")
        path = Path(args.log[0]).expanduser()
        if not path.exists() and must_exist:
            raise CliError(f"no audit log at {path} (from --log)")
        return resolve_log_path(path)
    home = Path(args.home).expanduser() if args.home else default_home()
    if args.home and not home.is_dir():
        raise CliError(f"--home {home}: no such directory")
    log = home / "logs" / "agent.log"
    if log.is_dir():  # resolve_log_path would take it for yet another home
        raise CliError(f"cannot read the audit log {log}: a directory, not an audit log file")
    return log


def home_of(args: argparse.Namespace) -> Path:
    return Path(args.home).expanduser() if args.home else default_home()


def default_home() -> Path:
    return hermes_home()


def find_replicas(args: argparse.Namespace) -> list[Any]:
    for raw in args.log:
        if not Path(raw).expanduser().exists():
            raise CliError(f"no audit log at {Path(raw).expanduser()} (from --log)")
    try:
        found = replicas(args.log, getattr(args, "pubkey", None) or ())
    except ValueError as exc:
        raise CliError(str(exc)) from None
    for replica in found:
        if not replica.log.exists():
            raise CliError(f"no audit log at {replica.log} (from --log): point it at an agent.log file, "
                           f"a logs directory or a home")
        if replica.log.is_dir():
            raise CliError(f"cannot read the audit log {replica.log}: a directory, not an audit log file")
    return found
