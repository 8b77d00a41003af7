"""Signed audit: a keyed audit log an outsider can check -- signing key, signed checkpoints,
every verdict of ``audit verify`` against a signed log, with only the public key."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from audit import AuditLog, AuditSettings, verify
from audit.chain import GENESIS_HASH, render_line
from audit.checkpoints import checkpoints_path, render
from audit.signing import generate_key, key_file, load_signer, pub_file, read_keyring, read_verifiers, write_new_key
from plugin_llm.cli.main import main

EVERY = 10


def make_key(home: Path):
    line, signer = generate_key()
    write_new_key(key_file(home), line, signer)
    return signer


def write(home: Path, n: int, start: int = 0, *, close: bool = True, **settings) -> Path:
    settings.setdefault("checkpoint_every", EVERY)
    log = AuditLog(home / "logs" / "agent.log", AuditSettings(**settings))
    for i in range(start, start + n):
        log.write({"plugin_id": f"plugin-{i % 3}", "status": "ok", "purpose": f"job {i}", "i": i})
    if close:
        log.close()
    return log.path


@pytest.fixture
def signed(hermes_home: Path):
    """35 records with a key: checkpoints at seq 10, 20, 30 and 35 (shutdown)."""
    make_key(hermes_home)
    path = write(hermes_home, 35)
    return path, read_verifiers(pub_file(key_file(hermes_home)))


def rows(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def save(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def rechain(lines: list[bytes]) -> list[bytes]:
    """What an attacker without the key does: re-number and re-hash every record from genesis."""
    out, prev = [], GENESIS_HASH
    for seq, raw in enumerate(lines, 1):
        record = json.loads(raw)
        record.pop("hash")
        record.update(seq=seq, prev_hash=prev)
        line, prev = render_line(record)
        out.append(line)
    return out


def kinds(result) -> list[str]:
    return [p.kind for p in result.problems]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- keys --------------------------------------------------------------------------------


def test_keygen_writes_a_private_key_0600_and_prints_the_public_key(hermes_home, capsys):
    code, out, _ = cli(capsys, "audit", "keygen")
    key = key_file(hermes_home)
    assert code == 0 and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    signer = load_signer(key)
    assert signer.verifier.text() in out and "PRIVATE" not in out
    secret = key.read_text().strip().split("+", 4)[4]
    assert secret not in repr(signer) and secret not in out
    code, out, _ = cli(capsys, "audit", "pubkey")
    assert code == 0 and out.strip() == signer.verifier.text()
    # a second keygen does not silently replace the key
    code, _, err = cli(capsys, "audit", "keygen")
    assert code == 2 and "already holds a signing key" in err and "--rotate" in err
    # keygen wrote a first checkpoint, so a signed home always has checkpoints
    assert verify(hermes_home, pubkeys=[signer.verifier]).ok


def test_the_private_key_is_redacted_and_never_in_the_log(hermes_home):
    from auth import redact

    make_key(hermes_home)
    secret = key_file(hermes_home).read_text().strip()
    path = write(hermes_home, 3)
    log = AuditLog(path, AuditSettings(checkpoint_every=EVERY))
    assert log.signer is not None and secret not in repr(log.signer)
    assert secret.split("+", 4)[4] not in redact(f"leaked {secret}")
    for name in ("agent.log", "agent.log.checkpoints"):
        assert secret.split("+", 4)[4] not in (path.parent / name).read_text()


def test_a_key_readable_by_others_is_refused_with_the_fix(hermes_home, capsys):
    make_key(hermes_home)
    os.chmod(key_file(hermes_home), 0o644)
    path = write(hermes_home, 3)
    err = capsys.readouterr().err
    assert "readable by others" in err and "chmod 600" in err
    assert not checkpoints_path(path).exists()


def test_key_cmd_supplies_the_key(hermes_home, tmp_path):
    line, signer = generate_key()
    script = tmp_path / "print-key"
    script.write_text(f"#!/bin/sh\necho '{line}'\n")
    script.chmod(0o700)
    path = write(hermes_home, 12, key_cmd=(str(script),))
    result = verify(path, pubkeys=[signer.verifier])
    assert result.ok and result.checkpoints.valid == 2 and result.checkpoints.covered_seq == 12


def test_pubkey_refuses_a_private_key_given_as_public(hermes_home, signed, capsys):
    code, _, err = cli(capsys, "audit", "verify", "--pubkey", str(key_file(hermes_home)))
    assert code == 2 and "PRIVATE key" in err and "audit pubkey" in err


# -- a copy verified elsewhere, with the public key only ---------------------------------


def test_a_copied_log_verifies_with_only_the_public_key(hermes_home, signed, tmp_path, capsys, monkeypatch):
    path, _ = signed
    evidence = tmp_path / "evidence"
    shutil.copytree(path.parent, evidence)
    pub = tmp_path / "auditor.pub"
    shutil.copy(pub_file(key_file(hermes_home)), pub)
    shutil.rmtree(hermes_home)  # no home at all on the auditor's machine
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "nowhere"))
    code, out, _ = cli(capsys, "audit", "verify", "--log", str(evidence / "agent.log"), "--pubkey", str(pub))
    assert code == 0, out
    assert "OK: 35 records" in out and "checkpoints: 4 signed" in out and "records 1..35 covered" in out


def test_an_attacker_who_recomputes_the_whole_chain_is_caught_by_the_signature(signed, tmp_path, capsys):
    path, pubkeys = signed
    lines = rows(path)
    forged = json.loads(lines[4])
    forged["purpose"] = "nothing to see here"
    lines[4] = json.dumps(forged).encode() + b"\n"
    save(path, rechain(lines))
    assert verify(path).ok  # the unkeyed chain is whole again: that is the attack
    result = verify(path, pubkeys=pubkeys)
    assert not result.ok and set(kinds(result)) == {"checkpoint_mismatch"}
    assert len(result.problems) == 4  # every checkpoint after the edit (10, 20, 30, 35) disagrees
    pub = tmp_path / "auditor.pub"
    pub.write_text("".join(k.text() + "\n" for k in pubkeys))
    code, out, _ = cli(capsys, "audit", "verify", "--log", str(path), "--pubkey", str(pub))
    assert code == 1 and out.count("FAILED: ") == 4 and "checkpoint_mismatch" in out


def test_deleting_records_and_recomputing_is_caught(signed):
    path, pubkeys = signed
    lines = rows(path)
    save(path, rechain(lines[:3] + lines[6:]))  # records 4-6 gone, the rest renumbered
    result = verify(path, pubkeys=pubkeys)
    assert not result.ok and "checkpoint_mismatch" in kinds(result) and "truncated" in kinds(result)


# -- every verdict, against a signed log --------------------------------------------------


def _edit(lines):
    lines[6] = lines[6].replace(b'"job 6"', b'"job X"')


def _delete(lines):
    del lines[6]


def _reorder(lines):
    lines[6], lines[7] = lines[7], lines[6]


def _insert(lines):
    fake = json.loads(lines[6])
    fake["purpose"] = "inserted"
    fake.pop("hash")
    line, _ = render_line(fake)
    lines.insert(7, line)


def _torn(lines):
    lines[6] = lines[6][:40] + b"\n"


def _truncate(lines):
    del lines[32:]  # the shutdown checkpoint covered seq 35


@pytest.mark.parametrize("tamper, expected", [
    (_edit, {"edited"}),
    (_delete, {"seq_gap"}),
    (_reorder, {"seq_order"}),
    (_insert, {"inserted"}),
    (_torn, {"torn"}),
    (_truncate, {"truncated"}),
])
def test_every_tamper_case_has_its_verdict(signed, tamper, expected):
    path, pubkeys = signed
    lines = rows(path)
    tamper(lines)
    save(path, lines)
    result = verify(path, pubkeys=pubkeys)
    assert not result.ok
    assert expected <= set(kinds(result)), result.problems


def test_all_findings_are_reported_not_only_the_first(signed, capsys):
    path, pubkeys = signed
    lines = rows(path)
    _edit(lines)
    lines[20] = lines[20].replace(b'"job 20"', b'"job Y"')
    del lines[30]
    save(path, lines)
    result = verify(path, pubkeys=pubkeys)
    assert [(p.line, p.kind) for p in result.problems] == [(7, "edited"), (21, "edited"), (31, "seq_gap")]
    code, out, _ = cli(capsys, "audit", "verify", "--json")
    doc = json.loads(out)
    assert code == 1 and [f["kind"] for f in doc["findings"] if f["severity"] == "error"] == ["edited", "edited", "seq_gap"]


def test_a_checkpoint_whose_text_was_altered_fails_its_signature(signed):
    path, pubkeys = signed
    cp = checkpoints_path(path)
    cp.write_bytes(cp.read_bytes().replace(b"\n20\n", b"\n21\n", 1))  # claims seq 21 under seq 20's signature
    result = verify(path, pubkeys=pubkeys)
    assert kinds(result) == ["checkpoint_signature"]


def test_two_signed_heads_for_one_seq_are_a_fork(hermes_home, signed):
    path, pubkeys = signed
    signer = load_signer(key_file(hermes_home))
    with open(checkpoints_path(path), "ab") as f:
        f.write(render(signer.name, 20, "ab" * 32, ["time 2026-01-01T00:00:00.000Z", "reason records"], [signer]))
    result = verify(path, pubkeys=pubkeys)
    assert "checkpoint_fork" in kinds(result)


def test_a_checkpoint_signed_by_another_key_is_not_trusted(hermes_home, signed):
    path, pubkeys = signed
    _, stranger = generate_key(pubkeys[0].name)
    result = verify(path, pubkeys=[stranger.verifier])
    assert not result.ok and kinds(result) == ["checkpoint_key"]  # one finding for the key, not one per checkpoint
    assert "and 3 later checkpoints signed the same way" in result.problems[0].detail


def test_a_deleted_checkpoints_file_fails_when_a_public_key_is_given(signed):
    path, pubkeys = signed
    checkpoints_path(path).unlink()
    assert verify(path).ok  # unkeyed, as before
    result = verify(path, pubkeys=pubkeys)
    assert kinds(result) == ["checkpoint_missing"]


def test_records_newer_than_the_last_checkpoint_are_a_warning(hermes_home, signed):
    path, pubkeys = signed
    log = AuditLog(path, AuditSettings(checkpoint_every=EVERY, checkpoint_seconds=3600))
    for i in range(3):
        log.write({"plugin_id": "late", "i": i})
    result = verify(path, pubkeys=pubkeys)  # the writer is still running: no checkpoint yet
    assert result.ok and [w.kind for w in result.warnings] == ["unverified_tail"]
    assert "records 36..38" in result.warnings[0].detail
    log.close()  # clean shutdown: a checkpoint covers them
    result = verify(path, pubkeys=pubkeys)
    assert result.ok and not result.warnings and result.checkpoints.covered_seq == 38


def test_the_interval_timer_checkpoints_an_idle_writer(hermes_home, signed):
    import time

    path, pubkeys = signed
    log = AuditLog(path, AuditSettings(checkpoint_every=EVERY, checkpoint_seconds=0.05))
    log.write({"plugin_id": "late"})
    deadline = time.monotonic() + 10
    while verify(path, pubkeys=pubkeys).warnings and time.monotonic() < deadline:
        time.sleep(0.02)
    result = verify(path, pubkeys=pubkeys)
    assert result.ok and not result.warnings and result.checkpoints.covered_seq == 36
    log.close()


# -- crashes ------------------------------------------------------------------------------


def test_crash_between_a_record_and_its_checkpoint(hermes_home, capsys):
    assert main(["audit", "keygen"]) == 0  # and its first checkpoint (seq 0)
    pubkeys = read_verifiers(pub_file(key_file(hermes_home)))
    pid = os.fork()
    if pid == 0:  # the child dies right after record 10, before its checkpoint
        try:
            log = AuditLog(hermes_home / "logs" / "agent.log", AuditSettings(checkpoint_every=EVERY))
            log._write_checkpoint = lambda *a, **k: os._exit(0)  # type: ignore[method-assign]
            for i in range(10):
                log.write({"plugin_id": "p", "i": i})
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    path = hermes_home / "logs" / "agent.log"
    result = verify(path, pubkeys=pubkeys)
    assert result.ok and [w.kind for w in result.warnings] == ["unverified_tail"]  # chained, not yet signed
    write(hermes_home, 1, 10)  # the next writer resumes; its checkpoint covers everything
    result = verify(path, pubkeys=pubkeys)
    assert result.ok and not result.warnings and result.checkpoints.covered_seq == 11


def test_a_torn_checkpoint_is_recovered_by_the_next_writer(hermes_home, signed, capsys):
    path, pubkeys = signed
    cp = checkpoints_path(path)
    signer = load_signer(key_file(hermes_home))
    whole = render(signer.name, 35, "cd" * 32, ["time x", "reason records"], [signer])
    with open(cp, "ab") as f:
        f.write(whole[: len(whole) - 30])  # a crash in the middle of the signature line
    result = verify(path, pubkeys=pubkeys)
    assert result.ok and "checkpoint_torn" in [w.kind for w in result.warnings]
    write(hermes_home, 2, 35)
    assert "torn checkpoint" in capsys.readouterr().err
    result = verify(path, pubkeys=pubkeys)
    assert result.ok, result.problems
    assert [w.kind for w in result.warnings] == ["checkpoint_torn"] and "recovered" in result.warnings[0].detail


def test_garbage_in_the_middle_of_the_checkpoints_is_not_a_crash(signed):
    path, pubkeys = signed
    cp = checkpoints_path(path)
    data = cp.read_bytes()
    cut = data.index(b"\n\n\xe2\x80\x94", 200)  # inside the second checkpoint
    cp.write_bytes(data[:cut] + b"\nnot a checkpoint\n\n" + data[cut:])
    result = verify(path, pubkeys=pubkeys)
    assert "checkpoint_bad" in kinds(result) or "checkpoint_signature" in kinds(result)


# -- rotation and key rotation ------------------------------------------------------------


def test_rotation_with_checkpoints_proves_what_retention_pruned(hermes_home, capsys):
    make_key(hermes_home)
    pubkeys = read_verifiers(pub_file(key_file(hermes_home)))
    path = write(hermes_home, 300, max_bytes=4000, backup_count=2)
    files = sorted(p.name for p in path.parent.glob("agent.log*"))
    assert "agent.log.2" in files and "agent.log.3" not in files  # old files were pruned
    result = verify(path, pubkeys=pubkeys)  # no --allow-pruned-head needed: the pruning was signed
    assert result.ok and not result.warnings, (result.problems, result.warnings)
    assert result.checkpoints.pruned_through is not None and result.checkpoints.covered_seq == 300
    assert not verify(path).ok  # without the key the pruned head is unprovable, as before
    # deleting one more file than retention did is still caught
    (path.parent / "agent.log.2").unlink()
    result = verify(path, pubkeys=pubkeys)
    assert kinds(result)[0] == "history_start"


def test_key_rotation_old_and_new_checkpoints_verify(hermes_home, capsys):
    old = make_key(hermes_home)
    path = write(hermes_home, 15)
    code, out, _ = cli(capsys, "audit", "keygen", "--rotate")
    assert code == 0 and "rotated" in out
    new = load_signer(key_file(hermes_home))
    assert new.key_id != old.key_id and new.name == old.name
    write(hermes_home, 15, 15)
    both = read_verifiers(pub_file(key_file(hermes_home)))
    assert [v.key_id for v in both] == [old.key_id, new.key_id]
    result = verify(path, pubkeys=both)
    assert result.ok and set(result.checkpoints.keys) == {old.verifier.key_id_hex, new.verifier.key_id_hex}
    # an auditor holding only the old public key follows the signed hand-over
    assert verify(path, pubkeys=[old.verifier]).ok
    # the new key alone cannot vouch for checkpoints signed before it existed
    assert "checkpoint_key" in kinds(verify(path, pubkeys=[new.verifier]))


# -- concurrency --------------------------------------------------------------------------


def test_threads_with_checkpoints_interleaved(hermes_home):
    import threading

    make_key(hermes_home)
    pubkeys = read_verifiers(pub_file(key_file(hermes_home)))
    log = AuditLog(hermes_home / "logs" / "agent.log", AuditSettings(checkpoint_every=7))

    def work(t: int) -> None:
        for i in range(100):
            log.write({"plugin_id": f"t{t}", "i": i})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    result = verify(log.path, pubkeys=pubkeys)
    assert result.ok and result.records == 400 and not result.warnings
    assert result.checkpoints.valid >= 400 // 7


def test_processes_with_checkpoints_interleaved(hermes_home):
    make_key(hermes_home)
    pubkeys = read_verifiers(pub_file(key_file(hermes_home)))
    children = []
    for c in range(3):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                write(hermes_home, 60, c * 1000, checkpoint_every=5)
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    result = verify(hermes_home / "logs" / "agent.log", pubkeys=pubkeys)
    assert result.ok and result.records == 180 and not result.warnings, (result.problems, result.warnings)
    assert result.checkpoints.valid >= 180 // 5


# -- the writer never writes a line verify would reject -------------------------------------


def test_an_oversized_or_too_deep_record_is_truncated_not_lost(hermes_home):
    from audit.chain import MAX_LINE_BYTES

    deep: list = []
    node = deep
    for _ in range(10_000):
        node.append([])
        node = node[0]
    log = AuditLog(hermes_home / "logs" / "agent.log", AuditSettings(log_content=True), signer=None)
    log.write({"plugin_id": "p", "purpose": "big", "gen_ai.output.text": "x" * (MAX_LINE_BYTES + 10)})
    log.write({"plugin_id": "p", "purpose": "deep", "gen_ai.input.messages": deep})
    log.close()
    result = verify(log.path, strict=True)
    assert result.ok and result.records == 2
    big, nested = (json.loads(line) for line in rows(log.path))
    assert big["purpose"] == "big" and big["audit_truncated"] == ["gen_ai.output.text"]
    assert big["gen_ai.output.text"].startswith("[truncated by the audit writer")
    assert nested["purpose"] == "deep" and "truncated by the audit writer" in json.dumps(nested)


# -- doctor ---------------------------------------------------------------------------------


def test_doctor_says_accidents_only_without_a_key_and_signed_with_one(hermes_home, capsys):
    write(hermes_home, 2)
    main(["doctor"])
    out = capsys.readouterr().out
    assert "tamper-evident against accidents only" in out
    make_key(hermes_home)
    write(hermes_home, 2, 2)
    main(["doctor"])
    out = capsys.readouterr().out
    assert "signed checkpoints (key id" in out and "accidents only" not in out


def test_keygen_stdout_for_key_cmd_then_rotation(hermes_home, tmp_path, capsys):
    code, out, err = cli(capsys, "audit", "keygen", "--stdout")
    assert code == 0 and out.startswith("PRIVATE+KEY+") and "not saved here" in err
    assert not key_file(hermes_home).exists()  # only printed, for a password manager
    store = tmp_path / "vault"
    store.write_text(out)
    script = tmp_path / "print-key"
    script.write_text(f"#!/bin/sh\ncat '{store}'\n")
    script.chmod(0o700)
    (hermes_home / "config.yaml").write_text(f"audit:\n  key_cmd: [{script}]\n  checkpoint_every: 5\n")
    code, _, err = cli(capsys, "audit", "keygen")
    assert code == 2 and "keygen --stdout" in err
    from plugin_llm.config import ConfigSource

    settings = ConfigSource(hermes_home).current().audit
    path = write(hermes_home, 7, **{k: getattr(settings, k) for k in ("key_cmd", "checkpoint_every")})
    code, out, err = cli(capsys, "audit", "keygen", "--rotate", "--stdout")
    assert code == 0 and "rotated" in err
    store.write_text(out)
    write(hermes_home, 7, 7, **{k: getattr(settings, k) for k in ("key_cmd", "checkpoint_every")})
    pubkeys = read_verifiers(pub_file(key_file(hermes_home)))
    assert len(pubkeys) == 2
    result = verify(path, pubkeys=pubkeys)
    assert result.ok and not result.warnings and len(result.checkpoints.keys) == 2
    code, out, _ = cli(capsys, "audit", "verify")
    assert code == 0 and "checkpoints: " in out and "covered" in out


def test_a_fifo_where_the_checkpoints_belong_never_blocks_the_writer(hermes_home, capsys):
    make_key(hermes_home)
    (hermes_home / "logs").mkdir()
    os.mkfifo(hermes_home / "logs" / "agent.log.checkpoints")
    path = write(hermes_home, EVERY + 1)  # returns: the records are written, the checkpoint is reported lost
    assert "checkpoint could not be written" in capsys.readouterr().err
    result = verify(path)
    assert result.records == EVERY + 1 and kinds(result) == ["checkpoint_bad"]  # a verdict, not an OSError


# -- the key and note formats are C2SP signed-note / Go sumdb/note, byte for byte ------------

_GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
_GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
_GO_TEXT = b"If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
_GO_SIG = ("\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6Ryy"
           "BwJnAM=\n").encode()


def test_keys_and_signatures_match_the_signed_note_reference_vectors():
    from audit.signing import parse_signer, parse_verifier

    signer = parse_signer(_GO_SKEY, "vector")
    assert signer.key_id_hex == "c74f20a3" and signer.verifier.text() == _GO_VKEY
    assert signer.signature_line(_GO_TEXT) == _GO_SIG  # Ed25519 is deterministic
    verifier = parse_verifier(_GO_VKEY, "vector")
    blob = __import__("base64").b64decode(_GO_SIG.split(b" ")[2])
    assert int.from_bytes(blob[:4], "big") == verifier.key_id and verifier.verify(_GO_TEXT, blob[4:])
    assert not verifier.verify(_GO_TEXT.replace(b"answer", b"answers"), blob[4:])
    # the C2SP signed-note specification's own example
    spec = parse_verifier("example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "spec")
    sig = __import__("base64").b64decode("Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=")
    assert spec.verify(b"This is an example message.\n", sig[4:])


def test_without_a_key_nothing_changes(hermes_home, capsys):
    path = write(hermes_home, 3 * EVERY)
    assert not checkpoints_path(path).exists() and capsys.readouterr().err == ""
    result = verify(path)
    assert result.ok and not result.warnings and not result.checkpoints.present
    code, out, _ = cli(capsys, "audit", "verify")
    assert code == 0 and "tamper-evident against accidents only" in out


def test_audit_checkpoint_covers_a_running_writers_tail(hermes_home, signed, capsys):
    path, pubkeys = signed
    log = AuditLog(path, AuditSettings(checkpoint_every=EVERY, checkpoint_seconds=3600))
    log.write({"plugin_id": "late"})
    assert [w.kind for w in verify(path, pubkeys=pubkeys).warnings] == ["unverified_tail"]
    code, out, _ = cli(capsys, "audit", "checkpoint")
    assert code == 0 and "signed checkpoint of seq 36" in out
    result = verify(path, pubkeys=pubkeys)
    assert result.ok and not result.warnings
    log.close()
    key_file(hermes_home).unlink()
    code, _, err = cli(capsys, "audit", "checkpoint")
    assert code == 2 and "audit keygen" in err


# -- random damage is always a finding, never a crash ----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("target", ["agent.log", "agent.log.checkpoints"])
def test_any_single_byte_change_is_found(signed, target):
    import random

    path, pubkeys = signed
    victim = path.parent / target
    original = victim.read_bytes()
    rng = random.Random(12)
    for _ in range(150):
        data = bytearray(original)
        pos = rng.randrange(len(data) - 1)  # the final newline: its loss is a tear, seen as one (a warning)
        data[pos] = rng.choice([b for b in range(256) if b != data[pos]])
        victim.write_bytes(bytes(data))
        result = verify(path, pubkeys=pubkeys)
        assert not result.ok, (target, pos, bytes(data[max(0, pos - 20):pos + 20]))
    victim.write_bytes(original)
    assert verify(path, pubkeys=pubkeys).ok


def test_random_garbage_as_checkpoints_is_a_verdict(signed):
    import random

    path, pubkeys = signed
    rng = random.Random(7)
    cp = checkpoints_path(path)
    for size in (1, 100, 5000, 200_000):
        cp.write_bytes(bytes(rng.randrange(256) for _ in range(size)))
        result = verify(path, pubkeys=pubkeys)
        assert not result.ok and len(result.problems) <= 1000


def test_a_last_checkpoint_missing_only_its_closing_blank_line_still_counts(signed):
    path, pubkeys = signed
    cp = checkpoints_path(path)
    cp.write_bytes(cp.read_bytes()[:-1])
    result = verify(path, pubkeys=pubkeys)
    assert result.ok and result.checkpoints.covered_seq == 35
    assert [w.kind for w in result.warnings] == ["checkpoint_torn"]


def test_a_lost_key_is_replaced_keeping_the_logs_origin(hermes_home, capsys):
    assert main(["audit", "keygen"]) == 0
    path = write(hermes_home, 12)
    old = read_verifiers(pub_file(key_file(hermes_home)))[0]
    key_file(hermes_home).unlink()  # lost
    code, _, err = cli(capsys, "audit", "keygen")
    assert code == 0 and "cannot be endorsed" in err
    write(hermes_home, 12, 12)
    both = read_verifiers(pub_file(key_file(hermes_home)))
    assert [v.name for v in both] == [old.name, old.name]
    assert verify(path, pubkeys=both).ok  # same origin: one log, two keys
    assert "checkpoint_key" in kinds(verify(path, pubkeys=[old]))  # the old key alone cannot vouch for the new


# -- a retired key vouches for nothing after its retirement ---------------------------------


def _rotated(hermes_home: Path, capsys):
    """15 records under the old key, a rotation, 15 more under the new one: (log, old signer, kept pub file)."""
    old = make_key(hermes_home)
    path = write(hermes_home, 15)
    code, out, _ = cli(capsys, "audit", "keygen", "--rotate")
    assert code == 0 and "auditors must replace the public keys they keep" in out
    write(hermes_home, 15, 15)
    return path, old, pub_file(key_file(hermes_home))


def _resign(path: Path, lines: list[bytes], signer, every: int = 10) -> None:
    """What the holder of a leaked key does: a fresh checkpoints file for a rewritten log, signed by it."""
    out = b""
    for seq, raw in enumerate(lines, 1):
        if seq % every == 0 or seq == len(lines):
            out += render(signer.name, seq, json.loads(raw)["hash"], ("reason records",), [signer])
    checkpoints_path(path).write_bytes(out)


def test_a_normal_rotation_verifies_with_the_kept_rotation_record(hermes_home, capsys, tmp_path):
    path, old, pub = _rotated(hermes_home, capsys)
    keys, retirements = read_keyring(pub)
    new = load_signer(key_file(hermes_home))
    assert [r.text() for r in retirements] == [f"retired {old.name}+{old.key_id_hex} 15 {retirements[0].head} "
                                               f"{new.key_id_hex}"]
    result = verify(path, pubkeys=keys, retirements=retirements)
    assert result.ok and not result.warnings and len(result.checkpoints.keys) == 2
    code, out, _ = cli(capsys, "audit", "pubkey")
    kept = tmp_path / "auditor.pub"
    kept.write_text(out)  # what the auditor keeps: both keys and the rotation record
    assert out.count("\n") == 3 and out.splitlines()[-1].startswith("retired ")
    code, out, _ = cli(capsys, "audit", "verify", "--log", str(path), "--pubkey", str(kept))
    assert code == 0 and out.startswith("OK: 30 records")


def test_a_log_rewritten_and_resigned_by_a_retired_key_fails(hermes_home, capsys, tmp_path):
    path, old, pub = _rotated(hermes_home, capsys)
    kept = tmp_path / "auditor.pub"
    kept.write_text(pub.read_text())
    lines = rows(path)
    forged = json.loads(lines[4])
    forged["purpose"] = "nothing to see here"
    lines[4] = json.dumps(forged).encode() + b"\n"
    lines = rechain(lines)
    save(path, lines)
    _resign(path, lines, old)  # the rotation record and every checkpoint of the new key are gone
    code, out, _ = cli(capsys, "audit", "verify", "--log", str(path), "--pubkey", str(kept))
    assert code == 1 and "checkpoint_retired_key" in out and "was retired at seq 15" in out
    assert "key rotation record kept with the public keys" in out  # the pinned head: records 1..15 were rewritten
    keys, retirements = read_keyring(kept)
    result = verify(path, pubkeys=keys, retirements=retirements)
    assert {"checkpoint_retired_key", "checkpoint_mismatch"} <= set(kinds(result))
    # what the kept rotation record is for: with the public keys alone, the forgery verifies
    assert verify(path, pubkeys=keys).ok


def test_the_retired_keys_records_past_its_retirement_cannot_be_resigned(hermes_home, capsys, tmp_path):
    """Records 1..15 untouched (the pinned head holds), 16..30 rewritten and signed by the old key."""
    path, old, pub = _rotated(hermes_home, capsys)
    keys, retirements = read_keyring(pub)
    lines = rows(path)
    forged = json.loads(lines[20])
    forged["purpose"] = "rewritten after the hand-over"
    lines[20] = json.dumps(forged).encode() + b"\n"
    lines = lines[:20] + rechain(lines)[20:]
    save(path, lines)
    _resign(path, lines, old)
    result = verify(path, pubkeys=keys, retirements=retirements)
    assert not result.ok and "checkpoint_retired_key" in kinds(result)


def test_a_retired_key_signing_after_the_hand_over_in_the_log_is_refused(hermes_home, capsys):
    """Without the kept record too: the rotation in the checkpoints file retires the old key from there on."""
    path, old, pub = _rotated(hermes_home, capsys)
    keys = read_verifiers(pub)
    last = json.loads(rows(path)[-1])
    with checkpoints_path(path).open("ab") as f:  # the old key vouches for the newest head as well
        f.write(render(old.name, last["seq"], last["hash"], ("reason records",), [old]))
    result = verify(path, pubkeys=keys)
    assert kinds(result) == ["checkpoint_retired_key"]
    assert "handed over" in result.problems[0].detail and "at line" in result.problems[0].detail


def test_a_retired_key_cannot_endorse_a_key_of_its_own(hermes_home, capsys):
    path, old, pub = _rotated(hermes_home, capsys)
    keys, retirements = read_keyring(pub)
    _line, mine = generate_key(old.name)
    lines = rows(path)
    head = json.loads(lines[9])
    blocks = render(old.name, 10, head["hash"], ("reason key-rotation", f"key {mine.verifier.text()}"), [old, mine])
    last = json.loads(lines[-1])
    blocks += render(mine.name, last["seq"], last["hash"], ("reason records",), [mine])
    checkpoints_path(path).write_bytes(blocks)  # the real hand-over (and everything signed after it) deleted
    result = verify(path, pubkeys=keys, retirements=retirements)
    assert "checkpoint_retired_key" in kinds(result)
    assert any("a retired key endorses no other key" in p.detail for p in result.problems)


def test_a_running_writer_stops_signing_with_the_old_key_after_a_rotation(hermes_home, capsys):
    make_key(hermes_home)
    log = AuditLog(hermes_home / "logs" / "agent.log", AuditSettings(checkpoint_every=5))
    for i in range(7):
        log.write({"plugin_id": "p", "status": "ok", "i": i})
    code, _, _ = cli(capsys, "audit", "keygen", "--rotate")  # while that writer holds the old key
    assert code == 0
    for i in range(7, 9):  # no periodic checkpoint (seq 10) to reload the key at
        log.write({"plugin_id": "p", "status": "ok", "i": i})
    log.close()  # its shutdown checkpoint is signed with the key in force, not the one it loaded
    keys, retirements = read_keyring(pub_file(key_file(hermes_home)))
    result = verify(log.path, pubkeys=keys, retirements=retirements)
    assert result.ok and not result.warnings, (result.problems, result.warnings)


def test_a_malformed_rotation_record_is_a_clear_error(hermes_home, capsys, tmp_path):
    path, _old, pub = _rotated(hermes_home, capsys)
    kept = tmp_path / "auditor.pub"
    kept.write_text(pub.read_text() + "retired nonsense\n")
    code, _, err = cli(capsys, "audit", "verify", "--log", str(path), "--pubkey", str(kept))
    assert code == 2 and "not a key rotation record" in err and "auditor.pub:4" in err
