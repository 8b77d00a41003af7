"""``plugin-llm audit keygen``, ``checkpoint`` and ``pubkey``: the key that signs checkpoints.

``keygen --rotate`` hands over with a checkpoint signed by the old and the new key, and records
the old key's retirement in the public keys file auditors keep.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from audit.settings import AuditSettings
from audit.signing import (
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
from audit.writer import AuditLog
from plugin_llm.cli.audit.locations import home_of
from plugin_llm.cli.main import CliError
from plugin_llm.config import ConfigSource


def run_keygen(args: argparse.Namespace, log_path: Path) -> int:
    home = home_of(args)
    if args.home and not home.is_dir():
        raise CliError(f"--home {home}: no such directory")
    try:
        return _make_key(args, home, log_path)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        raise CliError(f"cannot write{where}: {exc.strerror or type(exc).__name__}; check that the home and its "
                       f"logs/ and keys/ directories are writable by you") from None


def _make_key(args: argparse.Namespace, home: Path, log_path: Path) -> int:
    settings, key, pub = key_paths(home)
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


def run_checkpoint(args: argparse.Namespace, log_path: Path) -> int:
    settings, key, _pub = key_paths(home_of(args))
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


def run_pubkey(args: argparse.Namespace, log_path: Path) -> int:
    _settings, key, pub = key_paths(home_of(args))
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


def key_paths(home: Path) -> tuple[Any, Path, Path]:
    settings = _audit_settings(home)
    key = key_file(home, settings.signing_key or None)
    return settings, key, pub_file(key)


def _audit_settings(home: Path) -> Any:
    """The home's ``audit:`` settings (defaults when config.yaml is missing or broken)."""
    try:
        return ConfigSource(home).current().audit
    except Exception:  # noqa: BLE001 - a broken config must not stop key management
        return AuditSettings()
