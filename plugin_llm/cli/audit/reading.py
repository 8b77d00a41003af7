"""``plugin-llm audit tail``, ``query`` and ``export``: records as they are, streamed.

``query`` and ``export`` stream, so they work on logs of any size; ``query`` with several
``--log`` merges the replicas' records by time.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any, Iterable

from audit.export import FORMATS, export_records
from audit.reader import follow_records, iter_records, tail_records
from audit.replicas import merge_records
from plugin_llm.cli.audit.options import parse_count, parse_seconds, quoted, record_filters
from plugin_llm.cli.audit.render import BadLines, Header, format_record, key_text, print_record, terminal_width
from plugin_llm.cli.main import CliError


def run_tail(args: argparse.Namespace, log_path: Path) -> int:
    lines = parse_count(args.lines, "--lines")
    max_wait = parse_seconds(args.max_wait, "--max-wait")
    bad = BadLines()
    records, cursor = tail_records(log_path, lines or 10, on_bad_line=bad)
    out = sys.stdout
    width = terminal_width(args)
    header = Header(args.json, out, width)
    for record in records:
        header()
        print_record(record, args.json, out, width)
    if not args.follow:
        bad.report()
        return 0
    out.flush()
    try:
        for record in follow_records(cursor, max_wait=max_wait, on_bad_line=bad):
            header()
            print_record(record, args.json, out, width)
            out.flush()
    except KeyboardInterrupt:  # Ctrl-C is how `tail -f` ends
        pass
    bad.report()
    return 0


def run_query(args: argparse.Namespace, log_path: Path) -> int:
    limit = parse_count(args.limit, "--limit")
    bad = BadLines()
    records: Iterable[dict[str, Any]] = iter_records(log_path, include_events=args.events, on_bad_line=bad, **record_filters(args))
    if limit is not None:
        records = itertools.islice(records, limit)
    out = sys.stdout
    header = Header(args.json, out)
    for record in records:
        header()
        print_record(record, args.json, out)
    if not header.done and not args.json:
        hint = ""
        if "denied" in (args.status or "") and not args.decision:  # stats' DENIED counts quota refusals too
            hint = " (budget and rate-limit refusals have status quota: --decision denied lists every refusal)"
        print("no records match" + hint, file=sys.stderr)
    bad.report()
    return 0


def run_query_many(args: argparse.Namespace, found: list[Any]) -> int:
    limit = parse_count(args.limit, "--limit")
    bad = BadLines()
    records: Iterable[dict[str, Any]] = merged_records(args, found, bad, include_events=args.events)
    if limit is not None:
        records = itertools.islice(records, limit)
    out = sys.stdout
    header = Header(args.json, out, replica=True)
    for record in records:
        header()
        if args.json:
            print_record(record, True, out)
        else:
            out.write(f"{key_text(record.get('replica')):<12} {format_record(record)}\n")
    if not header.done and not args.json:
        print("no records match", file=sys.stderr)
    bad.report()
    return 0


def merged_records(args: argparse.Namespace, found: list[Any], bad: "BadLines", include_events: bool = False) -> Any:
    filters = record_filters(args)
    return merge_records((r.name, iter_records(r.log, include_events=include_events, on_bad_line=bad, **filters))
                         for r in found)


def run_export(args: argparse.Namespace, log_path: Path) -> int:
    fmt = (args.format or "").strip().lower()
    if fmt not in FORMATS:
        raise CliError(f"--format {quoted(args.format)}: expected one of {', '.join(FORMATS)}")
    bad = BadLines()
    records = iter_records(log_path, include_events=args.events, on_bad_line=bad, **record_filters(args))
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
