"""The audit signing key: Ed25519, in the text key formats of signed notes (C2SP signed-note).

A checkpoint (:mod:`audit.checkpoints`) is a signed note, so a C2SP signed-note verifier (Go's
``golang.org/x/mod/sumdb/note``) checks ours too. The private key is one line, mode 0600; the
public key one line, safe to publish; formats and key ids in docs/design.md, "The audit log".
A rotated key keeps the log's name and gets a new key id.

The private key lives at ``audit.signing_key`` (default ``<home>/keys/audit-signing.key``) or is
printed by ``audit.key_cmd``; the public keys ever used sit in ``<home>/keys/audit-signing.pub``
(newest last), which ``plugin-llm audit pubkey`` prints for auditors. The private key is
registered with the credential redactor as soon as it is loaded, and no object of this module
shows it in a ``repr``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "AuditKeyError",
    "Signer",
    "Verifier",
    "Retirement",
    "RETIRED_PREFIX",
    "KEY_DIR",
    "KEY_NAME",
    "PUB_NAME",
    "SIG_PREFIX",
    "generate_key",
    "parse_signer",
    "parse_verifier",
    "parse_verifiers",
    "read_verifiers",
    "parse_retirements",
    "read_keyring",
    "append_retirement",
    "load_signer",
    "key_file",
    "pub_file",
    "write_new_key",
    "append_public_key",
    "unique",
]

KEY_DIR = "keys"
KEY_NAME = "audit-signing.key"
PUB_NAME = "audit-signing.pub"
#: a signature line starts with an em dash and a space (signed-note)
SIG_PREFIX = "\u2014 "
_ALG_ED25519 = 1
_MAX_KEY_FILE = 64 * 1024
_MAX_NAME = 200
#: a line of the public keys file that records a key rotation (see :class:`Retirement`)
RETIRED_PREFIX = "retired "
_ID = re.compile(r"[0-9a-f]{8}")
_SEQ = re.compile(r"0|[1-9][0-9]{0,18}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class AuditKeyError(ValueError):
    """A key that cannot be used: what is wrong and where (never the key's bytes)."""


def _key_hash(name: str, public: bytes) -> int:
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([_ALG_ED25519]) + public).digest()
    return int.from_bytes(digest[:4], "big")


def _check_name(name: str, where: str) -> None:
    if not name or len(name) > _MAX_NAME or "+" in name or any(c.isspace() or ord(c) < 32 for c in name):
        raise AuditKeyError(f"{where}: the key name must be 1-{_MAX_NAME} characters without spaces or '+'")


def _crypto():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - a dependency of the package
        raise AuditKeyError(
            "the 'cryptography' package is needed to sign or check audit checkpoints: pip install cryptography"
        ) from None
    return ed25519


class Verifier:
    """A public key: checks signatures of one key id."""

    __slots__ = ("name", "key_id", "public", "_key")

    def __init__(self, name: str, key_id: int, public: bytes) -> None:
        self.name, self.key_id, self.public = name, key_id, public
        self._key = _crypto().Ed25519PublicKey.from_public_bytes(public)

    @property
    def key_id_hex(self) -> str:
        return f"{self.key_id:08x}"

    def text(self) -> str:
        """The verifier key line (what ``audit pubkey`` prints)."""
        encoded = base64.b64encode(bytes([_ALG_ED25519]) + self.public).decode("ascii")
        return f"{self.name}+{self.key_id_hex}+{encoded}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Verifier) and (other.name, other.key_id, other.public) == (self.name, self.key_id, self.public)

    def __hash__(self) -> int:
        return hash((self.name, self.key_id, self.public))

    def __repr__(self) -> str:
        return f"Verifier({self.name!r}, key_id={self.key_id_hex})"


class Signer:
    """A private key. Its repr shows the name and key id only; it cannot be pickled."""

    __slots__ = ("name", "key_id", "_key", "verifier")

    def __init__(self, name: str, seed: bytes) -> None:
        ed = _crypto()
        self._key = ed.Ed25519PrivateKey.from_private_bytes(seed)
        from cryptography.hazmat.primitives import serialization

        public = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.name = name
        self.key_id = _key_hash(name, public)
        self.verifier = Verifier(name, self.key_id, public)

    @property
    def key_id_hex(self) -> str:
        return f"{self.key_id:08x}"

    def sign(self, message: bytes) -> bytes:
        """The raw 64-byte Ed25519 signature of ``message``."""
        return self._key.sign(message)

    def signature_line(self, message: bytes) -> bytes:
        """``— <name> <base64(key hash || signature)>\\n`` for a note whose text is ``message``."""
        blob = self.key_id.to_bytes(4, "big") + self.sign(message)
        return (SIG_PREFIX + self.name + " ").encode("utf-8") + base64.b64encode(blob) + b"\n"

    def __repr__(self) -> str:
        return f"Signer({self.name!r}, key_id={self.key_id_hex})"

    def __reduce__(self):  # noqa: D105
        raise TypeError("the audit signing key cannot be pickled")


@dataclass(frozen=True)
class Retirement:
    """A key rotation as the auditor keeps it, one line of the public keys file:
    ``retired <name>+<old key id> <seq> <head hex> <successor key id>``. The old key's authority
    ends at the hand-over checkpoint of ``seq`` (head ``head``): a checkpoint it alone signs for a
    later ``seq``, or for that ``seq`` with another head, is refused, and that head pins every
    record up to it (a retired key may have leaked: it must not vouch for a rewritten history)."""

    name: str
    key_id: int
    seq: int
    head: str
    successor: int

    def text(self) -> str:
        return f"{RETIRED_PREFIX}{self.name}+{self.key_id:08x} {self.seq} {self.head} {self.successor:08x}"


def _parse_retirement(line: str, where: str) -> Retirement:
    parts = line.split(" ")
    name, _, id_hex = parts[1].rpartition("+") if len(parts) == 5 else ("", "", "")
    if (not name or not _ID.fullmatch(id_hex) or not _SEQ.fullmatch(parts[2]) or not _HEX64.fullmatch(parts[3])
            or not _ID.fullmatch(parts[4])):
        raise AuditKeyError(f"{where}: not a key rotation record (expected 'retired <name>+<key id> <seq> "
                            f"<head hash> <successor key id>', as written by `plugin-llm audit keygen --rotate`)")
    _check_name(name, where)
    return Retirement(name, int(id_hex, 16), int(parts[2]), parts[3], int(parts[4], 16))


def parse_retirements(text: str, where: str) -> list[Retirement]:
    """The key rotation records (``retired ...`` lines) of a public keys file's text."""
    return [_parse_retirement(line.strip(), f"{where}:{number}")
            for number, line in enumerate(text.splitlines(), 1) if line.strip().startswith(RETIRED_PREFIX)]


def _b64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AuditKeyError(f"{where}: the key is not valid base64") from None


def generate_key(name: str | None = None) -> tuple[str, Signer]:
    """A new key: ``(private key line, signer)``. ``name`` defaults to a fresh origin."""
    name = name or f"plugin-llm-audit/{secrets.token_hex(8)}"
    _check_name(name, "new key")
    seed = secrets.token_bytes(32)
    signer = Signer(name, seed)
    line = f"PRIVATE+KEY+{name}+{signer.key_id_hex}+{base64.b64encode(bytes([_ALG_ED25519]) + seed).decode('ascii')}"
    return line, signer


def parse_signer(text: str, where: str) -> Signer:
    """A signer from its key line; ``where`` (a file or "audit.key_cmd") names it in errors."""
    line = text.strip()
    parts = line.split("+", 4)
    if len(parts) != 5 or parts[0] != "PRIVATE" or parts[1] != "KEY":
        raise AuditKeyError(f"{where}: not an audit signing key (expected one line PRIVATE+KEY+<name>+<id>+<key>, "
                            f"as written by `plugin-llm audit keygen`)")
    name, id_hex, encoded = parts[2], parts[3], parts[4]
    _check_name(name, where)
    raw = _b64(encoded, where)
    if len(raw) != 33 or raw[0] != _ALG_ED25519:
        raise AuditKeyError(f"{where}: not an Ed25519 key")
    signer = Signer(name, raw[1:])
    if id_hex.lower() != signer.key_id_hex:
        raise AuditKeyError(f"{where}: the key id does not match the key (the file was altered)")
    return signer


def parse_verifier(text: str, where: str) -> Verifier:
    """A verifier from its key line ``<name>+<id>+<base64>``."""
    parts = text.strip().split("+", 2)
    if len(parts) != 3 or parts[0] == "PRIVATE":
        raise AuditKeyError(f"{where}: not an audit public key (expected <name>+<id>+<key>, as printed by "
                            f"`plugin-llm audit pubkey`)")
    name, id_hex, encoded = parts
    _check_name(name, where)
    raw = _b64(encoded, where)
    if len(raw) != 33 or raw[0] != _ALG_ED25519:
        raise AuditKeyError(f"{where}: not an Ed25519 public key")
    key_id = _key_hash(name, raw[1:])
    if id_hex.lower() != f"{key_id:08x}":
        raise AuditKeyError(f"{where}: the key id does not match the key (the line was altered)")
    return Verifier(name, key_id, raw[1:])


def parse_verifiers(text: str, where: str) -> list[Verifier]:
    """Every public key of a file's text (one per line; blank lines and ``#`` comments skipped)."""
    out: list[Verifier] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#") or line.startswith(RETIRED_PREFIX):
            continue
        if line.startswith("PRIVATE+"):
            raise AuditKeyError(f"{where}:{number}: this is a PRIVATE key; give auditors the public key "
                                f"(`plugin-llm audit pubkey`), never the private one")
        out.append(parse_verifier(line, f"{where}:{number}"))
    if not out:
        raise AuditKeyError(f"{where}: no public key in it (expected lines printed by `plugin-llm audit pubkey`)")
    return out


def _read_small(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AuditKeyError(f"{path}: not a regular file")
        data = os.read(fd, _MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_FILE:
        raise AuditKeyError(f"{path}: larger than {_MAX_KEY_FILE // 1024} KiB, not a key file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AuditKeyError(f"{path}: not UTF-8 text, not a key file") from None


def read_verifiers(path: Path | str) -> list[Verifier]:
    """The public keys in a file. Raises :class:`AuditKeyError` (or ``OSError`` when unreadable)."""
    path = Path(path)
    return parse_verifiers(_read_small(path), str(path))


def read_keyring(path: Path | str) -> tuple[list[Verifier], list[Retirement]]:
    """The public keys and the key rotation records of a public keys file (one read)."""
    path = Path(path)
    text = _read_small(path)
    return parse_verifiers(text, str(path)), parse_retirements(text, str(path))


def key_file(home: Path, configured: str | None = None) -> Path:
    """The private key file: ``audit.signing_key`` (relative to the home) or the default."""
    path = Path(configured).expanduser() if configured else Path(KEY_DIR) / KEY_NAME
    return path if path.is_absolute() else Path(home) / path


def pub_file(key_path: Path) -> Path:
    """The public keys file that goes with a private key file."""
    name = key_path.name[:-4] if key_path.name.endswith(".key") else key_path.name
    return key_path.with_name(name + ".pub")


def load_signer(key_path: Path, key_cmd: Sequence[str] = ()) -> Signer | None:
    """The signer from ``key_cmd`` (when set) or ``key_path``; None when there is no key file.

    Raises :class:`AuditKeyError` for a key that exists but cannot be used (a
    group/world-readable key file, a malformed key, a failing key_cmd).
    """
    if key_cmd:
        try:
            from auth.keycmd import run_key_cmd
        except ImportError as exc:  # pragma: no cover
            raise AuditKeyError(f"audit.key_cmd: cannot run it ({type(exc).__name__})") from None
        try:
            text = run_key_cmd(list(key_cmd), where="audit.key_cmd")
        except Exception as exc:  # noqa: BLE001 - PluginLlmConfigError; its message holds no output
            raise AuditKeyError(str(exc)) from None
        _register(text)
        return parse_signer(text, "audit.key_cmd")
    try:
        st = os.stat(key_path)
    except FileNotFoundError:
        return None
    if st.st_mode & 0o077:
        raise AuditKeyError(f"{key_path}: the private key is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                            f"fix: chmod 600 {key_path}")
    text = _read_small(key_path)
    _register(text.strip())
    return parse_signer(text, str(key_path))


def _register(text: str) -> None:
    try:
        from auth.redaction import register_secret
    except ImportError:  # pragma: no cover
        return
    register_secret(text.strip())
    encoded = text.strip().split("+", 4)[-1]
    register_secret(encoded)


def write_new_key(key_path: Path, line: str, signer: Signer, *, replace: bool = False) -> Path:
    """Write a private key (0600, its directory 0700) and append its public key to the .pub file.

    Without ``replace`` an existing key file is an error (``FileExistsError``).
    Returns the public keys file.
    """
    key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = (line + "\n").encode("ascii")
    if replace:
        tmp = key_path.with_name(f".{key_path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, key_path)
    else:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    return append_public_key(pub_file(key_path), signer)


def append_public_key(pub: Path, signer: Signer) -> Path:
    """Add ``signer``'s public key to the public keys file (created 0644; its directory 0700)."""
    pub.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(pub, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (signer.verifier.text() + "\n").encode("ascii"))
    finally:
        os.close(fd)
    return pub


def append_retirement(pub: Path, retirement: Retirement) -> Path:
    """Record a key rotation in the public keys file, after the keys (what auditors keep)."""
    fd = os.open(pub, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (retirement.text() + "\n").encode("utf-8"))
    finally:
        os.close(fd)
    return pub


def unique(verifiers: Iterable[Verifier]) -> list[Verifier]:
    seen: set[Verifier] = set()
    out = []
    for v in verifiers:
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out

