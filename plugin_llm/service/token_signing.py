"""Signing token records: the home's key (``<home>/service/token_key``) and a record's HMAC.

Every token record carries an HMAC-SHA256 (:func:`record_mac`) under the key :class:`RecordKey`
reads (made at the first token, mode 0600), so a record anyone else wrote into the file or the
Redis is refused like an unknown token. The key is the same on every replica (docs/service.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import threading
from pathlib import Path

from plugin_llm.service.token_records import TokenError, token_key_path

__all__ = ["RecordKey", "record_mac"]

_log = logging.getLogger("plugin_llm.service")

#: a record's fields, signed in this order (the tag separates this use of the key from any other)
_MAC_TAG = "plugin-llm token record v1"
_KEY_BYTES = 32
_MAX_KEY_FILE = 1024


def record_mac(key: bytes, row: tuple) -> str:
    """HMAC-SHA256 of a record ``(id, plugin, created, expires, revoked, sha256)``, hex."""
    token_id, plugin, created, expires, revoked, sha256 = row[:6]
    message = json.dumps([_MAC_TAG, token_id, plugin, sha256, created, expires, revoked], separators=(",", ":"))
    return hmac.new(key, message.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


class RecordKey:
    """``<home>/service/token_key``: 32 random bytes as hex, mode 0600, made at the first token.

    Read again when the file changes (an operator copied a replica's key over it). A missing key signs nothing
    and verifies nothing: every record is then refused (and the log says which file to copy).
    """

    def __init__(self, home: Path | str) -> None:
        self.path = token_key_path(home)
        self._lock = threading.Lock()
        self._key: bytes | None = None
        self._seen: tuple | None = None

    def get(self, *, create: bool) -> bytes | None:
        with self._lock:
            try:
                st = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    self._key = self._seen = None
                    return None
                try:
                    self._make()
                    st = os.stat(self.path, follow_symlinks=False)
                except OSError as exc:
                    raise self._error(f"cannot be created ({exc.strerror or type(exc).__name__})") from None
            except OSError as exc:
                raise self._error(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
            seen = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            if self._key is None or seen != self._seen:
                self._key, self._seen = self._read(), seen
            return self._key

    def _error(self, problem: str) -> TokenError:
        return TokenError(f"the token key {self.path} {problem}; it signs every token record: restore it (copy it "
                          "from the machine where the tokens were created), or move it away and create every "
                          "token again (plugin-llm tokens create)")

    def _make(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            try:
                os.write(fd, secrets.token_hex(_KEY_BYTES).encode() + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(temporary, self.path)  # complete when it appears; never replaces a key made meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)

    def _read(self) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise self._error(f"cannot be read ({exc.strerror or type(exc).__name__}; a symlink is refused)") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise self._error("must be a regular file owned by this user")
            if stat.S_IMODE(st.st_mode) & 0o077:
                os.fchmod(fd, 0o600)
                _log.warning("the token key %s was readable by others (mode %o); made it 0600", self.path,
                             stat.S_IMODE(st.st_mode))
            raw = os.read(fd, _MAX_KEY_FILE + 1)
        finally:
            os.close(fd)
        try:
            key = bytes.fromhex(raw.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            key = b""
        if len(raw) > _MAX_KEY_FILE or len(key) < _KEY_BYTES:
            raise self._error("is damaged (expected 64 hexadecimal digits)")
        return key
