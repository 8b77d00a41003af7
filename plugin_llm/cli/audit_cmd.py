"""``plugin-llm audit tail | query | stats | export | verify | keygen | pubkey``: the auditor's commands.

Reads ``<home>/logs/agent.log`` and its rotated backups through the ``audit``
package's read API (never litellm). Every listing has ``--json``; ``query``
and ``export`` stream, so they work on logs of any size.

``verify`` exit codes: 0 the chain and its checkpoints are whole (warnings,
e.g. records newer than the last checkpoint, allowed); 1 at least one problem
was found (all are listed); 2 the log is missing or an option is wrong.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable, TextIO

from audit.errors import AuditLogNotFoundError
from audit.export import FORMATS, export_records
from audit.logfiles import resolve_log_path
from audit.reader import follow_records, iter_records, parse_time, tail_records
from audit.records import DECISIONS, STATUSES, is_call_record
from audit.replicas import Replica, merge_records, replicas
from audit.settings import AuditSettings
from audit.signing import (
    AuditKeyError,
    Retirement,
    append_public_key,
    append_retirement,
    generate_key,
    key_file,
    load_signer,
    pub_file,
    read_keyring,
    read_verifiers,
    write_new_key,
)
from audit.summary import stats
from audit.verifier import verify
from audit.writer import AuditLog
from plugin_llm.auditpage.data import Source
from plugin_llm.cli._common import dumps_json, printable
from plugin_llm.cli.main import CliError
from plugin_llm.config import ConfigSource
from plugin_llm.limits import views
from plugin_llm.limits.settings import NANO
from plugin_llm.limits.views import usd_text
from plugin_llm.hardened.terminal_text import escape_unsafe

__all__ = ["register", "run"]

_ENVELOPE = frozenset({"schema", "seq", "prev_hash", "hash", "ts", "event", "kind"})
_ANCHOR = re.compile(r"([0-9]{1,19}):([0-9a-fA-F]{64})")
_SHOWN = 40  # characters of a rejected value echoed back in an error


# -- parser --------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``audit`` and its actions to the ``plugin-llm`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("log location")
    where.add_argument("--home", metavar="DIR", help="Hermes home (default: $HERMES_HOME or ~/.hermes); the log is <home>/logs/agent.log")
    where.add_argument("--log", metavar="PATH", action="append",
                       help="read this log file instead (e.g. a copy handed to an auditor); verify, query, stats "
                            "and serve take it several times, one per replica (a log file, or a replica's home or "
                            "logs directory), and merge the records by time")

    filters = argparse.ArgumentParser(add_help=False)
    group = filters.add_argument_group("filters (all must match; lists are comma-separated)")
    group.add_argument("--plugin", metavar="ID[,ID...]", help="plugin id(s)")
    group.add_argument("--status", metavar="S[,S...]", help="ok, denied, timeout, provider_error, schema_error, quota, error, abandoned")
    group.add_argument("--decision", metavar="D", help="denied (every refusal: the trust gate's, status denied, and the "
                                                        "limits', status quota; stats' DENIED) or allowed")
    group.add_argument("--model", metavar="M[,M...]", help="requested or reported model; globs like 'gpt-4o*' allowed")
    group.add_argument("--since", metavar="TIME", help="ISO 8601 (2025-01-31, 2025-01-31T12:00Z) or relative: 90s, 15m, 1h, 7d")
    group.add_argument("--until", metavar="TIME", help="same forms as --since; inclusive")
    group.add_argument("--purpose", metavar="TEXT", help="case-insensitive substring of the call's purpose")

    parser = subparsers.add_parser(
        "audit",
        help="tail, query, summarise, export and verify the audit log; manage its signing key",
        description="Read the tamper-evident audit log ($HERMES_HOME/logs/agent.log and its rotated backups); "
                    "with a signing key (audit keygen), checkpoints an auditor verifies with the public key alone.",
    )
    actions = parser.add_subparsers(dest="audit_action", metavar="ACTION")

    tail = actions.add_parser("tail", parents=[common], help="the last records, human-readable",
                              description="Show the last records (calls, denials and operational events).")
    tail.add_argument("-n", "--lines", default="10", metavar="N", help="how many records, N >= 1 (default 10)")
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing new records until Ctrl-C")
    tail.add_argument("--max-wait", default=None, metavar="SECONDS", help="with -f: stop after SECONDS (a number >= 0)")
    tail.add_argument("--json", action="store_true", help="one JSON object per line")
    tail.add_argument("-v", "--verbose", action="store_true",
                      help="each record whole (default: one line per record, cut to the terminal's width)")

    query = actions.add_parser("query", parents=[common, filters], help="filter call records (streaming)",
                               description="Print the call records matching every filter, oldest first.")
    query.add_argument("--events", action="store_true", help="include operational events")
    query.add_argument("--limit", default=None, metavar="N", help="stop after N records (N >= 1)")
    query.add_argument("--json", action="store_true", help="one JSON object per line")

    stats = actions.add_parser("stats", parents=[common, filters], help="calls, denials, errors, tokens, cost, latency",
                               description="Summarise call records per plugin and per model "
                                           "(latency percentiles: nearest-rank, denials excluded).")
    stats.add_argument("--json", action="store_true", help="one JSON document")

    verify = actions.add_parser(
        "verify", parents=[common], help="check the hash chain and signed checkpoints; list every problem (exit 0 only if whole)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Walk every file oldest first and list every broken, missing, reordered, inserted, edited,\n"
                    "torn, re-encoded or unreadable line, and -- with public keys -- every record a signed\n"
                    "checkpoint contradicts, records deleted that a checkpoint covered, and forged, forked or\n"
                    "missing checkpoints, and checkpoints signed by a key retired by `keygen --rotate` after\n"
                    "its hand-over (keep the `retired` lines `audit pubkey` prints with the keys). Exit 0 when\n"
                    "all is whole (warnings allowed), 1 when a problem was found, 2 when there is no log or an\n"
                    "option is wrong.\n\n"
                    "The chain runs across the rotated files and must start at seq 1 from the genesis hash.\n"
                    "With a signing key, the rotation checkpoint names what retention deletes, so a pruned head\n"
                    "is proven; without one, a log whose head was pruned looks exactly like one whose first\n"
                    "lines were deleted: both fail unless you pass --allow-pruned-head (then it is a warning).\n"
                    "Keep the head verify prints and pass it back with --anchor: that record must still be there.",
    )
    verify.add_argument("--strict", action="store_true",
                        help="parse every line and require the writer's exact rendering (slower; also catches "
                             "a rewritten chain with re-encoded lines or duplicate keys)")
    verify.add_argument("--anchor", metavar="SEQ:HASH", help="a head printed by an earlier verify: it must still be there")
    verify.add_argument("--allow-pruned-head", action="store_true",
                        help="accept a log whose oldest record is not seq 1 because retention (audit.backup_count) "
                             "dropped old files; without it that is a failure")
    verify.add_argument("--pubkey", metavar="FILE", action="append",
                        help="public key file(s) from `plugin-llm audit pubkey`: check the signed checkpoints with "
                             "them and its key rotation records ('retired' lines: a retired key vouches for nothing "
                             "after its hand-over) (default: the home's keys/audit-signing.pub, unless --log is given); "
                             "with several --log, one per --log in the same order (default: each replica's "
                             "audit-signing.pub beside its log)")
    verify.add_argument("--json", action="store_true", help="one JSON document; 'findings' lists every problem and warning")

    export = actions.add_parser("export", parents=[common, filters], help="records as CSV, JSON lines or OTLP JSON logs",
                                description="Write the matching records, oldest first, for spreadsheets (csv), "
                                            "scripts (jsonl) or a SIEM / OpenTelemetry collector (otlp: OTLP/JSON "
                                            "logs with OpenTelemetry GenAI attribute names).")
    export.add_argument("--format", default="jsonl", metavar="FORMAT", help="csv, jsonl or otlp (default: jsonl)")
    export.add_argument("--events", action="store_true", help="include operational events")
    export.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")

    keygen = actions.add_parser("keygen", parents=[common], help="create (or rotate) the key that signs checkpoints",
                                description="Create the Ed25519 key the writer signs checkpoints with "
                                            "(<home>/keys/audit-signing.key, mode 0600, or audit.signing_key) and "
                                            "write a first checkpoint. --rotate replaces it: a checkpoint signed "
                                            "by the old and the new key hands over, so auditors holding the old "
                                            "public key can check later checkpoints too; the public keys file "
                                            "records the old key's retirement (give auditors the new file: with "
                                            "it, the old key signs nothing after the hand-over).")
    keygen.add_argument("--rotate", action="store_true", help="replace the existing key")
    keygen.add_argument("--stdout", action="store_true",
                        help="print the private key instead of writing it (to store in a password manager "
                             "for audit.key_cmd)")

    checkpoint = actions.add_parser("checkpoint", parents=[common], help="sign a checkpoint of the log's head now",
                                    description="Append a signed checkpoint of the current head (e.g. before copying "
                                                "the logs for an auditor while the host runs, so no record is left "
                                                "uncovered). Needs the signing key.")
    checkpoint.add_argument("--json", action="store_true", help="one JSON document")

    pubkey = actions.add_parser("pubkey", parents=[common], help="print the public key(s) for auditors",
                                description="Print every public key checkpoints of this home were signed with "
                                            "(newest last): give this file to auditors for `audit verify --pubkey`.")
    pubkey.add_argument("--json", action="store_true", help="one JSON document")

    serve = actions.add_parser(
        "serve", parents=[common], help="the auditor's page: a read-only web view of the log(s) and budgets",
        description="Serve the auditor's page (spend per plugin against its budgets, calls and denials per plugin "
                    "with the deciding rule, the records with filters, one record's evidence, the chain's state) "
                    "on 127.0.0.1. Without --token anyone who can reach the port on this machine can read it; "
                    "--token requires the admin token ($PLUGIN_LLM_ADMIN_TOKEN, or one generated and printed). "
                    "Several --log: one per replica, each chain verified with its own keys.")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other needs --token)")
    serve.add_argument("--port", type=int, default=8788, help="port (default 8788; 0 picks a free one)")
    serve.add_argument("--pubkey", metavar="FILE", action="append",
                       help="public keys file to check the signed checkpoints with (one per --log, in order; "
                            "default: the home's, or the audit-signing.pub beside each log)")
    serve.add_argument("--token", action="store_true",
                       help="require the admin token: $PLUGIN_LLM_ADMIN_TOKEN (at least 32 characters) if set, "
                            "else a random one printed once")

    parser.set_defaults(func=run, _audit_parser=parser)


def _shown(text: str) -> str:
    """A user's value, quoted and cut short, for an error message."""
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _count(text: str | None, option: str) -> int | None:
    """A whole number >= 1 from ``option``'s text; a huge one is capped (it means "all")."""
    if text is None:
        return None
    value = text.strip().lstrip("0") or "0"
    if not value.isascii() or not value.isdigit():
        raise CliError(f"{option} {_shown(text)}: expected a whole number >= 1, e.g. {option} 20")
    number = int(value) if len(value) <= 19 else sys.maxsize  # no int() of a 5000-digit string
    if number < 1:
        raise CliError(f"{option} {_shown(text)}: expected a whole number >= 1, e.g. {option} 20")
    return min(number, sys.maxsize)


def _seconds(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text) if len(text) <= 100 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise CliError(f"{option} {_shown(text)}: expected a number of seconds >= 0, e.g. {option} 30")
    return value


# -- dispatch ------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "audit_action", None)
    if action is None:
        args._audit_parser.print_help()
        return 2

    handler = {"tail": _tail, "query": _query, "stats": _stats, "verify": _verify, "export": _export,
               "keygen": _keygen, "pubkey": _pubkey, "checkpoint": _checkpoint, "serve": None}[action]
    try:
        if action == "serve":
            return _serve(args)
        if action in _MULTI and args.log and len(args.log) > 1:
            return _MULTI[action](args, _replicas(args))
        return handler(args, _log_path(args, must_exist=action not in ("keygen", "pubkey", "checkpoint")))
    except (AuditLogNotFoundError, AuditKeyError) as exc:
        raise CliError(str(exc)) from None
    except BrokenPipeError:  # e.g. `plugin-llm audit query | head`
        _silence_stdout()
        return 0
    except OSError as exc:  # unreadable, a directory or a FIFO where a log file belongs
        where = f" {exc.filename}" if exc.filename else ""
        raise CliError(f"cannot read the audit log{where}: {exc.strerror or type(exc).__name__}; "
                       f"point --log at an agent.log file (or --home at a Hermes home)") from None


def _log_path(args: argparse.Namespace, must_exist: bool = True) -> Path:
    if args.log:
        if len(args.log) > 1:
            raise CliError(f"audit {args.audit_action} reads one log: pass --log once (verify, query, stats and "
                           f"serve take one --log per replica)")
        path = Path(args.log[0]).expanduser()
        if not path.exists() and must_exist:
            raise CliError(f"no audit log at {path} (from --log)")
        return resolve_log_path(path)
    home = Path(args.home).expanduser() if args.home else _default_home()
    if args.home and not home.is_dir():
        raise CliError(f"--home {home}: no such directory")
    log = home / "logs" / "agent.log"
    if log.is_dir():  # resolve_log_path would take it for yet another home
        raise CliError(f"cannot read the audit log {log}: a directory, not an audit log file")
    return log


def _default_home() -> Path:
    try:
        from plugin_llm.config import hermes_home
    except ImportError:  # the shared helper is not there: same rule, locally
        raw = os.environ.get("HERMES_HOME", "").strip()
        return Path(raw or "~/.hermes").expanduser()
    return hermes_home()


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _time(text: str | None, option: str) -> Any:
    if text is None:
        return None

    try:
        return parse_time(text)
    except ValueError as exc:
        raise CliError(f"{option}: {exc}") from None


def _statuses(text: str | None) -> str | None:
    """``--status`` checked against the statuses the gateway writes."""
    if text is None:
        return None

    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in STATUSES]
    if unknown or not values:
        import difflib

        shown = unknown[0] if unknown else text
        hint = difflib.get_close_matches(shown, STATUSES, n=1)
        raise CliError(f"--status {_shown(shown)}: not a status" + (f" (did you mean {hint[0]}?)" if hint else "")
                       + f"; valid: {', '.join(STATUSES)}")
    return ",".join(values)


def _decisions(text: str | None) -> str | None:
    """``--decision`` checked against the decisions the gateway writes."""
    if text is None:
        return None

    values = [v.strip().lower() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in DECISIONS]
    if unknown or not values:
        raise CliError(f"--decision {_shown(unknown[0] if unknown else text)}: expected {' or '.join(DECISIONS)}")
    return ",".join(values)


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    since, until = _time(args.since, "--since"), _time(args.until, "--until")
    if since is not None and until is not None and since > until:
        raise CliError(f"--since {_shown(args.since)} is after --until {_shown(args.until)}: nothing can match")
    return {
        "plugin": args.plugin,
        "status": _statuses(args.status),
        "decision": _decisions(getattr(args, "decision", None)),
        "model": args.model,
        "since": since,
        "until": until,
        "purpose": args.purpose,
    }


class _BadLines:
    """Counts lines the reader skipped (not JSON, too long or deep, a duplicate key), to say so once at the end."""

    def __init__(self) -> None:
        self.count = 0
        self.first = ""

    def __call__(self, path: Path, line: int, reason: str) -> None:
        if not self.count:
            self.first = f"{path}:{line} ({reason})" if line else f"{path} ({reason})"
        self.count += 1

    def report(self) -> None:
        if self.count:
            print(
                f"plugin-llm: warning: skipped {self.count} unreadable line(s), first at {_clean(self.first)}; "
                f"run `plugin-llm audit verify --strict`",
                file=sys.stderr,
            )


class _Header:
    """Prints the column titles once, before the first human-readable record (never with --json)."""

    def __init__(self, as_json: bool, out: TextIO, width: int | None = None, replica: bool = False) -> None:
        self.done, self.out, self.width = as_json, out, width
        self.title = f"{'REPLICA':<12} {HEADER}" if replica else HEADER

    def __call__(self) -> None:
        if not self.done:
            self.out.write(_cut(self.title, self.width) + "\n")
            self.done = True


def _terminal_width(args: argparse.Namespace) -> int | None:
    """The width ``tail`` cuts its lines to: the terminal's (or $COLUMNS); None with -v, --json or no terminal."""
    if args.json or args.verbose:
        return None
    raw = os.environ.get("COLUMNS", "").strip()
    columns = int(raw) if raw.isdigit() and len(raw) < 6 else 0
    if not columns:
        try:
            columns = os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else 0
        except (OSError, ValueError, AttributeError):  # a pipe, a file, a stream without a descriptor
            columns = 0
    return max(columns, 20) if columns > 0 else None


def _cut(line: str, width: int | None) -> str:
    return line if width is None or len(line) <= width else line[: width - 3] + "..."


# -- actions -------------------------------------------------------------------------


def _tail(args: argparse.Namespace, log_path: Path) -> int:
    lines = _count(args.lines, "--lines")
    max_wait = _seconds(args.max_wait, "--max-wait")
    bad = _BadLines()
    records, cursor = tail_records(log_path, lines or 10, on_bad_line=bad)
    out = sys.stdout
    width = _terminal_width(args)
    header = _Header(args.json, out, width)
    for record in records:
        header()
        _print_record(record, args.json, out, width)
    if not args.follow:
        bad.report()
        return 0
    out.flush()
    try:
        for record in follow_records(cursor, max_wait=max_wait, on_bad_line=bad):
            header()
            _print_record(record, args.json, out, width)
            out.flush()
    except KeyboardInterrupt:  # Ctrl-C is how `tail -f` ends
        pass
    bad.report()
    return 0


def _query(args: argparse.Namespace, log_path: Path) -> int:
    limit = _count(args.limit, "--limit")
    bad = _BadLines()
    records: Iterable[dict[str, Any]] = iter_records(log_path, include_events=args.events, on_bad_line=bad, **_filters(args))
    if limit is not None:
        records = itertools.islice(records, limit)
    out = sys.stdout
    header = _Header(args.json, out)
    for record in records:
        header()
        _print_record(record, args.json, out)
    if not header.done and not args.json:
        hint = ""
        if "denied" in (args.status or "") and not args.decision:  # stats' DENIED counts quota refusals too
            hint = " (budget and rate-limit refusals have status quota: --decision denied lists every refusal)"
        print("no records match" + hint, file=sys.stderr)
    bad.report()
    return 0


def _stats(args: argparse.Namespace, log_path: Path) -> int:
    bad = _BadLines()
    rows = stats(iter_records(log_path, on_bad_line=bad, **_filters(args)))
    budgets, budget_errors = _budgets(args, [r.key for r in rows if r.dimension == "plugin"])
    if args.json:
        doc = {
            "by_plugin": [r.as_dict() for r in rows if r.dimension == "plugin"],
            "by_model": [r.as_dict() for r in rows if r.dimension == "model"],
            "percentiles": "nearest-rank, over calls that were not denied",
            "budgets": budgets,  # plugin -> window -> spent, in flight, budget
            "budget_errors": budget_errors,  # plugin -> why the store could not say
        }
        print(dumps_json(doc))
    elif not rows:
        print("no call records match")
        _print_budgets(budgets, budget_errors, sys.stdout)
    else:
        _print_stats(rows, sys.stdout)
        _print_budgets(budgets, budget_errors, sys.stdout)
    ignored = sum(r.ignored_values for r in rows if r.dimension == "plugin")
    if ignored:
        print(f"note: {ignored} token/cost/latency value(s) no real call can have (negative, not a number or "
              "absurdly large) were left out of the sums", file=sys.stderr)
    bad.report()
    return 0


def _budgets(args: argparse.Namespace, plugins: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Spend against budget in the current windows, per plugin with a budget (the log's plugins and
    those configured with one of their own), from the home's limits store, and per plugin why the
    store could not say (a log copy read with --log has no home to ask: nothing). A config that
    cannot say which plugins have budgets is said on stderr, not taken for "no budgets"."""
    if args.log:
        return {}, {}
    try:
        budgets, errors, problem = views.budgets_for(_home_of(args), plugins)
        if problem is not None:
            print(f"note: spend against budget not shown: {printable(problem, 300)}", file=sys.stderr)
        return budgets, errors
    except Exception as exc:  # noqa: BLE001 - the log's own stats never fail for the budget view
        print(f"note: spend against budget unavailable ({printable(type(exc).__name__)}: {printable(exc, 300)})",
              file=sys.stderr)
        return {}, {}


def _print_budgets(budgets: dict[str, Any], errors: dict[str, str], out: Any) -> None:
    if not budgets and not errors:
        return
    print("\nspend against budget (current windows, from the limits store):", file=out)
    for plugin in sorted({*budgets, *errors}):
        if plugin in errors:
            print(f"  {_key(plugin)}: unknown ({printable(errors[plugin])})", file=out)
            continue
        for window, w in budgets[plugin].items():
            share = f"{w['used_fraction']:.0%}" if w.get("used_fraction") is not None else "-"
            print(f"  {_key(plugin)}  {window:<5}  spent ${w['spent_usd']:.6f}  in flight ${w['in_flight_usd']:.6f}  "
                  f"of {usd_text(round(w['budget_usd'] * NANO))} ({share}), resets {w['resets_at']}", file=out)


def _home_of(args: argparse.Namespace) -> Path:
    return Path(args.home).expanduser() if args.home else _default_home()


def _audit_settings(home: Path) -> Any:
    """The home's ``audit:`` settings (defaults when config.yaml is missing or broken)."""
    try:
        return ConfigSource(home).current().audit
    except Exception:  # noqa: BLE001 - a broken config must not stop key management
        return AuditSettings()


def _key_paths(home: Path) -> tuple[Any, Path, Path]:
    settings = _audit_settings(home)
    key = key_file(home, settings.signing_key or None)
    return settings, key, pub_file(key)


def _verify(args: argparse.Namespace, log_path: Path) -> int:
    anchor = None
    if args.anchor is not None:
        match = _ANCHOR.fullmatch(args.anchor.strip())
        if match is None or int(match.group(1)) < 1:
            raise CliError(f"--anchor {_shown(args.anchor)}: expected SEQ:HASH (SEQ a whole number >= 1 of at "
                           f"most 19 digits, HASH 64 hex digits) "
                           f"as printed by `plugin-llm audit verify`")
        anchor = (int(match.group(1)), match.group(2).lower())
    pubkeys = None
    retirements: list = []  # the key rotation records kept with the public keys
    key_source = None
    if args.pubkey:
        if len(args.pubkey) > 1:
            raise CliError("--pubkey: one public keys file for one log (it may hold several keys); several "
                           "--pubkey go with several --log, one each")
        path = Path(args.pubkey[0]).expanduser()
        try:
            pubkeys, retirements = read_keyring(path)
        except FileNotFoundError:
            raise CliError(f"--pubkey {path}: no such file (get it from the log's owner: `plugin-llm audit pubkey`)") from None
        except OSError as exc:
            raise CliError(f"--pubkey {path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
        key_source = str(path)
    elif not args.log:
        _settings, _key, pub = _key_paths(_home_of(args))
        if pub.is_file():
            pubkeys, retirements = read_keyring(pub)
            key_source = str(pub)
    result = verify(log_path, strict=args.strict, anchor=anchor, allow_pruned_head=args.allow_pruned_head,
                    pubkeys=pubkeys, retirements=retirements)
    if args.json:
        doc = result.as_dict()
        doc["pubkey"] = key_source
        print(dumps_json(doc))
        return 0 if result.ok else 1
    _print_verify(result, key_source)
    return 0 if result.ok else 1


def _print_verify(result: Any, key_source: str | None) -> None:
    for warning in result.warnings:
        print(f"warning: {_clean(str(warning))}")
    files = f"{len(result.files)} file{'s' if len(result.files) != 1 else ''}"
    cps = result.checkpoints
    if result.ok:
        print(f"OK: {result.records} records in {files}, chain whole")
    else:
        for problem in result.problems:
            print(f"FAILED: {_clean(str(problem))}")
        count = len(result.problems) + result.more
        more = f", {result.more} more not shown (see --json)" if result.more else ""
        print(f"({count} problem{'s' if count != 1 else ''}{more}; {result.records} records in {files})")
    if cps is not None and cps.checked:
        keys = ", ".join(cps.keys) or "none"
        line = f"checkpoints: {cps.valid} signed (key id {keys}, from {_clean(key_source)})"
        if cps.covered_seq is not None:
            line += f"; records 1..{cps.covered_seq} covered by a signature"
        if cps.last_seq is not None:
            line += f"; the last signed at seq {cps.last_seq}, {_clean(cps.last_time or 'unknown time')}"
        if cps.pruned_through:
            line += f"; records 1..{cps.pruned_through} pruned by retention (signed)"
        print(line)
    elif cps is not None and cps.present:
        print("checkpoints: present but not checked (pass --pubkey FILE)")
    else:
        print("checkpoints: none (no signing key: the chain is tamper-evident against accidents only; "
              "`plugin-llm audit keygen` signs it)")
    if result.ok and result.head_seq is not None:
        print(f"head: {result.head_seq}:{result.head_hash}  (keep it; check later with --anchor)")


# -- several replicas: each chain verified on its own, the records merged by time ---------------


def _replicas(args: argparse.Namespace) -> list[Any]:
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


def _verify_many(args: argparse.Namespace, found: list[Any]) -> int:
    if args.anchor is not None:
        raise CliError("--anchor names one chain's head: verify that replica's log alone (one --log) with it")
    docs, results = [], []
    for replica in found:
        pubkeys, retirements = None, []
        if replica.pubkey is not None:
            try:
                pubkeys, retirements = read_keyring(replica.pubkey)
            except FileNotFoundError:
                raise CliError(f"--pubkey {replica.pubkey}: no such file") from None
            except OSError as exc:
                raise CliError(f"--pubkey {replica.pubkey}: cannot read it "
                               f"({exc.strerror or type(exc).__name__})") from None
        result = verify(replica.log, strict=args.strict, allow_pruned_head=args.allow_pruned_head,
                        pubkeys=pubkeys, retirements=retirements)
        results.append(result)
        key_source = None if replica.pubkey is None else str(replica.pubkey)
        if args.json:
            docs.append({"replica": replica.name, "log": str(replica.log), "pubkey": key_source, **result.as_dict()})
            continue
        print(f"== replica {_clean(replica.name)}: {_clean(str(replica.log))}")
        _print_verify(result, key_source)
    ok = all(r.ok for r in results)
    if args.json:
        print(dumps_json({"ok": ok, "replicas": docs}))
    else:
        bad = [r.name for r, res in zip(found, results) if not res.ok]
        print(f"{'OK' if ok else 'FAILED'}: {len(found) - len(bad)} of {len(found)} replica chains whole"
              + (f"; broken: {', '.join(_clean(b) for b in bad)}" if bad else ""))
    return 0 if ok else 1


def _merged(args: argparse.Namespace, found: list[Any], bad: "_BadLines", include_events: bool = False) -> Any:
    filters = _filters(args)
    return merge_records((r.name, iter_records(r.log, include_events=include_events, on_bad_line=bad, **filters))
                         for r in found)


def _query_many(args: argparse.Namespace, found: list[Any]) -> int:
    limit = _count(args.limit, "--limit")
    bad = _BadLines()
    records: Iterable[dict[str, Any]] = _merged(args, found, bad, include_events=args.events)
    if limit is not None:
        records = itertools.islice(records, limit)
    out = sys.stdout
    header = _Header(args.json, out, replica=True)
    for record in records:
        header()
        if args.json:
            _print_record(record, True, out)
        else:
            out.write(f"{_key(record.get('replica')):<12} {format_record(record)}\n")
    if not header.done and not args.json:
        print("no records match", file=sys.stderr)
    bad.report()
    return 0


def _stats_many(args: argparse.Namespace, found: list[Any]) -> int:
    bad = _BadLines()
    per_replica: dict[str, int] = {r.name: 0 for r in found}

    def counted(records: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        for record in records:
            per_replica[record["replica"]] += 1
            yield record

    rows = stats(counted(_merged(args, found, bad)))
    if args.json:
        print(dumps_json({
            "by_plugin": [r.as_dict() for r in rows if r.dimension == "plugin"],
            "by_model": [r.as_dict() for r in rows if r.dimension == "model"],
            "by_replica": per_replica,
            "percentiles": "nearest-rank, over calls that were not denied",
        }))
    elif not rows:
        print("no call records match")
    else:
        _print_stats(rows, sys.stdout)
        print("calls per replica: " + ", ".join(f"{_key(k)} {v}" for k, v in per_replica.items()))
    bad.report()
    return 0


_MULTI = {"verify": _verify_many, "query": _query_many, "stats": _stats_many}


# -- the auditor's page -------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    import ipaddress
    import secrets
    import socket

    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be between 0 and 65535, got {args.port}")
    if args.log:
        source = Source(tuple(_replicas(args)))
    else:
        if args.pubkey and len(args.pubkey) > 1:
            raise CliError("--pubkey: one public keys file for the home's log (several go with several --log)")
        home = _home_of(args)
        log = _log_path(args)
        _settings, _key, pub = _key_paths(home)
        chosen = Path(args.pubkey[0]).expanduser() if args.pubkey else (pub if pub.is_file() else None)
        source = Source((Replica(home.resolve().name or "home", log, chosen),), home)
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    token = None
    if args.token or not loopback:
        if not args.token:
            raise CliError(f"--host {_shown(args.host)} lets other machines read the audit log: add --token "
                           f"(the page then needs the admin token), or keep the default 127.0.0.1")
        from plugin_llm.auditpage.app import ADMIN_TOKEN_ENV, MIN_TOKEN_CHARS  # on first use: it loads Starlette

        token = os.environ.get(ADMIN_TOKEN_ENV, "").strip() or None
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            raise CliError(f"${ADMIN_TOKEN_ENV} is {len(token)} characters; use at least {MIN_TOKEN_CHARS} random "
                           f"ones (e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
        if token is None:
            token = secrets.token_urlsafe(32)
            print(f"admin token (sign in with it; not stored anywhere): {token}", file=sys.stderr)
    try:
        infos = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
        sock = socket.socket(infos[0][0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(64)
    except OSError as exc:
        raise CliError(f"cannot listen on {_shown(args.host)}:{args.port}: {exc.strerror or exc}") from None
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    print(f"audit page: http://{shown_host}:{port}/  (read-only; "
          + ("the admin token is required)" if token else "no token: anyone on this machine can open it; --token "
             "requires one)") + "; Ctrl-C stops it", file=sys.stderr, flush=True)
    return _run_page(source, token, sock)


def _run_page(source: Any, token: str | None, sock: Any) -> int:
    import uvicorn

    from plugin_llm.auditpage.app import create_audit_app  # on first use: it loads Starlette

    app = create_audit_app(source, token=token)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                           server_header=False))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0


def _export(args: argparse.Namespace, log_path: Path) -> int:
    fmt = (args.format or "").strip().lower()
    if fmt not in FORMATS:
        raise CliError(f"--format {_shown(args.format)}: expected one of {', '.join(FORMATS)}")
    bad = _BadLines()
    records = iter_records(log_path, include_events=args.events, on_bad_line=bad, **_filters(args))
    if args.output:
        target = Path(args.output).expanduser()
        try:
            out = open(target, "w", encoding="utf-8", newline="")
        except OSError as exc:
            raise CliError(f"--output {target}: cannot write it ({exc.strerror or type(exc).__name__})") from None
        with out:
            count = export_records(records, fmt, out)
        print(f"wrote {count} record{'s' if count != 1 else ''} to {target} ({fmt})", file=sys.stderr)
    else:
        export_records(records, fmt, sys.stdout)
    bad.report()
    return 0


def _keygen(args: argparse.Namespace, log_path: Path) -> int:
    home = _home_of(args)
    if args.home and not home.is_dir():
        raise CliError(f"--home {home}: no such directory")
    try:
        return _make_key(args, home, log_path)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        raise CliError(f"cannot write{where}: {exc.strerror or type(exc).__name__}; check that the home and its "
                       f"logs/ and keys/ directories are writable by you") from None


def _make_key(args: argparse.Namespace, home: Path, log_path: Path) -> int:
    settings, key, pub = _key_paths(home)
    if settings.key_cmd and not args.stdout:
        raise CliError("audit.key_cmd is set in config.yaml, so the key comes from that command: run "
                       "`plugin-llm audit keygen --stdout` (with --rotate to replace it) and store what it prints "
                       "where the command reads it")
    if settings.key_cmd:
        old = load_signer(key, settings.key_cmd) if args.rotate else None
    else:
        old = load_signer(key) if key.exists() else None
        if old is not None and not args.rotate:
            raise CliError(f"{key} already holds a signing key (key id {old.key_id_hex}); to replace it run "
                           f"`plugin-llm audit keygen --rotate` (old checkpoints keep verifying with {pub})")
    name = old.name if old is not None else None
    if old is None and pub.is_file():  # the key was lost: keep the log's origin (no hand-over is possible)

        name = read_verifiers(pub)[-1].name
        print(f"plugin-llm: note: {pub} names earlier keys but their private key is gone, so the new key cannot "
              f"be endorsed by a signed hand-over: auditors need the new public key as well", file=sys.stderr)
    line, new = generate_key(name)
    log = AuditLog(log_path, settings, signer=new)

    def install(seq: int = 0, head: str = "") -> None:
        if args.stdout:
            append_public_key(pub, new)
        else:
            write_new_key(key, line, new, replace=old is not None)
        if old is not None:  # what auditors keep: the old key signs nothing after this hand-over
            append_retirement(pub, Retirement(old.name, old.key_id, seq, head, new.key_id))

    try:
        if old is not None:  # the hand-over: signed by both, naming the new key; installed under the log's lock
            seq, _ = log.checkpoint("key-rotation", signers=[old, new], extensions=(f"key {new.verifier.text()}",),
                                    then=install)
        else:
            install()
            seq, _ = log.checkpoint("keygen")
    finally:
        log.close()
    verb = "rotated" if old is not None else "created"
    if args.stdout:
        print(line)
        print(f"{verb} an audit signing key (key id {new.key_id_hex}), printed above: store it where audit.key_cmd "
              f"reads it (it is not saved here); checkpoint written at seq {seq}; public key appended to {pub}",
              file=sys.stderr)
        return 0
    print(f"{verb} the audit signing key {key} (mode 0600, key id {new.key_id_hex}); checkpoint written at seq {seq}")
    print(f"public key{'s' if old is not None else ''} for auditors: {pub}  (`plugin-llm audit pubkey` prints them)")
    if old is not None:
        print(f"auditors must replace the public keys they keep with this file (it records the retirement of key "
              f"{old.key_id_hex} at seq {seq}): with only the old one, whoever holds the old key can re-sign a "
              f"rewritten log")
    print(new.verifier.text())
    return 0


def _checkpoint(args: argparse.Namespace, log_path: Path) -> int:
    settings, key, _pub = _key_paths(_home_of(args))
    signer = load_signer(key, settings.key_cmd) if (settings.key_cmd or key.exists()) else None
    if signer is None:
        raise CliError(f"no audit signing key ({key} does not exist): create one with `plugin-llm audit keygen`")
    if not log_path.exists():
        raise CliError(f"no audit log at {log_path}: nothing to checkpoint yet")
    log = AuditLog(log_path, settings, signer=signer)
    try:
        seq, head = log.checkpoint("manual")
    except OSError as exc:
        raise CliError(f"cannot write the checkpoint: {exc.strerror or type(exc).__name__}") from None
    finally:
        log.close()
    if args.json:
        print(json.dumps({"seq": seq, "hash": head, "key_id": signer.key_id_hex}))
    else:
        print(f"signed checkpoint of seq {seq} (hash {head}, key id {signer.key_id_hex})")
    return 0


def _pubkey(args: argparse.Namespace, log_path: Path) -> int:
    _settings, key, pub = _key_paths(_home_of(args))
    retirements: list = []
    if pub.is_file():
        keys, retirements = read_keyring(pub)
    else:
        signer = load_signer(key, _settings.key_cmd) if (key.exists() or _settings.key_cmd) else None
        if signer is None:
            raise CliError(f"no audit signing key in this home ({key} does not exist): "
                           f"create one with `plugin-llm audit keygen`")
        keys = [signer.verifier]
    if args.json:
        print(json.dumps({"file": str(pub), "keys": [{"name": k.name, "key_id": k.key_id_hex, "key": k.text()} for k in keys],
                          "retired": [{"key_id": f"{r.key_id:08x}", "seq": r.seq, "hash": r.head,
                                       "successor": f"{r.successor:08x}", "line": r.text()} for r in retirements]},
                         ensure_ascii=False, indent=2))
    else:
        for k in keys:
            print(k.text())
        for r in retirements:  # the key rotation records: auditors keep them with the keys
            print(r.text())
    return 0


# -- rendering -----------------------------------------------------------------------


def _key(text: Any) -> str:
    """A plugin id or model from the log, escaped (as :func:`_clean`) and bounded: a table's column."""
    return escape_unsafe(text, 100)


def _clean(text: Any) -> str:
    """Record text for the auditor's terminal: controls, line separators, bidi and other invisible
    characters shown escaped, so a purpose can never draw a fake line or reorder one."""
    return escape_unsafe(text)


def _short_ts(value: Any) -> str:
    if not isinstance(value, str):
        return "-".ljust(20)
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return _clean(value)[:20].ljust(20)
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _num(value: Any) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "-"


def _cost(value: Any) -> str:
    return f"${value:.6f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


#: the column titles of format_record's call lines
HEADER = (f"{'TIME':<20}  {'PLUGIN':<20} {'STATUS':<14} {'MODEL':<26} {'TOKENS I/O':>11} {'COST USD':>11}  PURPOSE")


def format_record(record: dict[str, Any]) -> str:
    """One human line: time, plugin, status, model, tokens in/out, cost, purpose."""
    when = _short_ts(record.get("ts"))
    if not is_call_record(record):
        details = " ".join(
            f"{_clean(k)}={_clean(json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v)}"
            for k, v in record.items() if k not in _ENVELOPE
        )
        return f"{when}  [{_clean(record.get('event', 'event'))}] {details}".rstrip()
    model = record.get("gen_ai.response.model") or record.get("gen_ai.request.model") or "-"
    tokens = f"{_num(record.get('gen_ai.usage.input_tokens'))}/{_num(record.get('gen_ai.usage.output_tokens'))}"
    return (
        f"{when}  {_clean(record.get('plugin_id') or '-'):<20} {_clean(record.get('status') or '-'):<14} "
        f"{_clean(model):<26} {tokens:>11} {_cost(record.get('cost_usd')):>11}  {_clean(record.get('purpose') or '')}"
    ).rstrip()


def _print_record(record: dict[str, Any], as_json: bool, out: TextIO, width: int | None = None) -> None:
    out.write((dumps_json(record, indent=None) if as_json else _cut(format_record(record), width)) + "\n")


def _print_stats(rows: list[Any], out: TextIO) -> None:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    for dimension, title in (("plugin", "PLUGIN"), ("model", "MODEL")):
        selected = [r for r in rows if r.dimension == dimension]
        if not selected:
            continue
        width = max(len(title), *(len(_key(r.key)) for r in selected))
        out.write(
            f"{title:<{width}}  {'CALLS':>7} {'DENIED':>7} {'ERRORS':>7} {'TOKENS IN':>10} {'TOKENS OUT':>10} "
            f"{'COST USD':>12} {'UNPRICED':>8} {'P50 MS':>9} {'P95 MS':>9}\n"
        )
        for r in selected:  # the words of the query filters: DENIED is --decision denied
            priced = r.calls - r.denials - r.errors - r.unpriced
            cost = "-" if r.unpriced and priced <= 0 and not r.cost_usd else f"{r.cost_usd:.6f}"
            out.write(
                f"{_key(r.key):<{width}}  {r.calls:>7} {r.denials:>7} {r.errors:>7} {r.input_tokens:>10} "
                f"{r.output_tokens:>10} {cost:>12} {r.unpriced:>8} {ms(r.p50_latency_ms):>9} {ms(r.p95_latency_ms):>9}\n"
            )
        unpriced = sum(r.unpriced for r in selected)
        if dimension == "plugin" and any(r.denials or r.errors for r in selected):
            out.write("(DENIED: refused by the trust gate or a limit, as `audit query --decision denied` lists them; "
                      "ERRORS: the other calls whose status is not ok, among `audit query --decision allowed`)\n")
        if unpriced and dimension == "plugin":
            out.write(f"({unpriced} successful call{'s' if unpriced != 1 else ''} had no price (an unpriced model): "
                      f"COST USD leaves them out, '-' when no call of the row was priced)\n")
        out.write("\n")
