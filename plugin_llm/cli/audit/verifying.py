"""``plugin-llm audit verify``: the hash chain and the signed checkpoints, every problem listed.

Exit codes: 0 the chain and its checkpoints are whole (warnings, e.g. records newer than the last
checkpoint, allowed); 1 at least one problem was found (all are listed); 2 the log is missing or
an option is wrong. Several ``--log``: each replica's chain is verified on its own.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from audit.signing import read_keyring
from audit.verifier import verify
from plugin_llm.cli._common import dumps_json
from plugin_llm.cli.audit.keys import key_paths
from plugin_llm.cli.audit.locations import home_of
from plugin_llm.cli.audit.options import quoted
from plugin_llm.cli.audit.render import clean
from plugin_llm.cli.main import CliError

_ANCHOR = re.compile(r"([0-9]{1,19}):([0-9a-fA-F]{64})")


def run_verify(args: argparse.Namespace, log_path: Path) -> int:
    anchor = None
    if args.anchor is not None:
        match = _ANCHOR.fullmatch(args.anchor.strip())
        if match is None or int(match.group(1)) < 1:
            raise CliError(f"--anchor {quoted(args.anchor)}: expected SEQ:HASH (SEQ a whole number >= 1 of at "
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
        _settings, _key, pub = key_paths(home_of(args))
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
    print_verify(result, key_source)
    return 0 if result.ok else 1


def run_verify_many(args: argparse.Namespace, found: list[Any]) -> int:
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
        print(f"== replica {clean(replica.name)}: {clean(str(replica.log))}")
        print_verify(result, key_source)
    ok = all(r.ok for r in results)
    if args.json:
        print(dumps_json({"ok": ok, "replicas": docs}))
    else:
        bad = [r.name for r, res in zip(found, results) if not res.ok]
        print(f"{'OK' if ok else 'FAILED'}: {len(found) - len(bad)} of {len(found)} replica chains whole"
              + (f"; broken: {', '.join(clean(b) for b in bad)}" if bad else ""))
    return 0 if ok else 1


def print_verify(result: Any, key_source: str | None) -> None:
    for warning in result.warnings:
        print(f"warning: {clean(str(warning))}")
    files = f"{len(result.files)} file{'s' if len(result.files) != 1 else ''}"
    cps = result.checkpoints
    if result.ok:
        print(f"OK: {result.records} records in {files}, chain whole")
    else:
        for problem in result.problems:
            print(f"FAILED: {clean(str(problem))}")
        count = len(result.problems) + result.more
        more = f", {result.more} more not shown (see --json)" if result.more else ""
        print(f"({count} problem{'s' if count != 1 else ''}{more}; {result.records} records in {files})")
    if cps is not None and cps.checked:
        keys = ", ".join(cps.keys) or "none"
        line = f"checkpoints: {cps.valid} signed (key id {keys}, from {clean(key_source)})"
        if cps.covered_seq is not None:
            line += f"; records 1..{cps.covered_seq} covered by a signature"
        if cps.last_seq is not None:
            line += f"; the last signed at seq {cps.last_seq}, {clean(cps.last_time or 'unknown time')}"
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
