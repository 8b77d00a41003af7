"""``plugin-llm audit tail | query | stats | export | verify | keygen | pubkey``: the auditor's commands.

Reads ``<home>/logs/agent.log`` and its rotated backups through the ``audit``
package's read API (never litellm). Every listing has ``--json``; ``query``
and ``export`` stream, so they work on logs of any size.

``verify`` exit codes: 0 the chain and its checkpoints are whole (warnings,
e.g. records newer than the last checkpoint, allowed); 1 at least one problem
was found (all are listed); 2 the log is missing or an option is wrong.

This module is the parser and the dispatch; the actions live in
:mod:`plugin_llm.cli.audit`, one module per concern.
"""

from __future__ import annotations

import argparse
import os
import sys

from audit.errors import AuditLogNotFoundError
from audit.signing import AuditKeyError
from plugin_llm.cli.audit.keys import run_checkpoint, run_keygen, run_pubkey
from plugin_llm.cli.audit.locations import find_log, find_replicas
from plugin_llm.cli.audit.page import run_serve
from plugin_llm.cli.audit.reading import run_export, run_query, run_query_many, run_tail
from plugin_llm.cli.audit.summary import run_stats, run_stats_many
from plugin_llm.cli.audit.verifying import run_verify, run_verify_many
from plugin_llm.cli.main import CliError

__all__ = ["register", "run"]


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


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "audit_action", None)
    if action is None:
        args._audit_parser.print_help()
        return 2

    handler = {"tail": run_tail, "query": run_query, "stats": run_stats, "verify": run_verify, "export": run_export,
               "keygen": run_keygen, "pubkey": run_pubkey, "checkpoint": run_checkpoint, "serve": None}[action]
    try:
        if action == "serve":
            return run_serve(args)
        if action in _MULTI and args.log and len(args.log) > 1:
            return _MULTI[action](args, find_replicas(args))
        return handler(args, find_log(args, must_exist=action not in ("keygen", "pubkey", "checkpoint")))
    except (AuditLogNotFoundError, AuditKeyError) as exc:
        raise CliError(str(exc)) from None
    except BrokenPipeError:  # e.g. `plugin-llm audit query | head`
        _silence_stdout()
        return 0
    except OSError as exc:  # unreadable, a directory or a FIFO where a log file belongs
        where = f" {exc.filename}" if exc.filename else ""
        raise CliError(f"cannot read the audit log{where}: {exc.strerror or type(exc).__name__}; "
                       f"point --log at an agent.log file (or --home at a Hermes home)") from None


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


_MULTI = {"verify": run_verify_many, "query": run_query_many, "stats": run_stats_many}
