"""Per-plugin service tokens: ``plg_`` + 32 random bytes, only their SHA-256 kept.

A token's identity is a plugin key: whoever presents it calls the gateway as that plugin (trust
gate, limits and audit exactly as ``ctx.llm``). ``<home>/service/tokens.db`` (SQLite, 0600) keeps
one row per token: an id (``tok_`` + 12 hex, safe to show and log), the plugin key, the digest,
created/expires/revoked times; the token itself is printed once by ``plugin-llm tokens create``
and stored nowhere. With ``limits.store: redis`` the tokens live in that Redis instead
(:class:`RedisTokenStore`; :func:`token_store_for` picks); a Redis that does not answer refuses
every token (503), never lets a call through.

Unknown, expired and revoked tokens all give the caller the same ``None`` (401). Every record is
HMAC-signed under ``<home>/service/token_key`` (:class:`_RecordKey`); an unsigned record is
refused like an unknown token. A verified token is cached at most :data:`CACHE_SECONDS`, so a
revocation holds everywhere within a second. Refused tokens are counted per client address
(:meth:`_VerifyingStore.authenticate`, ``service.failed_auth``). Replicas: docs/service.md.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import logging
import os
import re
import secrets
import sqlite3
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "TOKEN_PREFIX",
    "CACHE_SECONDS",
    "TokenInfo",
    "TokenStore",
    "RedisTokenStore",
    "token_store_for",
    "TokenError",
    "tokens_path",
    "parse_duration",
    "digest",
    "failures_path",
    "token_key_path",
    "REASON_BLOCKED",
    "REASON_BAD_SIGNATURE",
]

_log = logging.getLogger("plugin_llm.service")

#: the refusal reason (audit, metrics) of a token whose record the home's key did not sign
REASON_BAD_SIGNATURE = "bad_signature"

#: the refusal reason (audit, metrics) of a request from an address with too many failed authentications
REASON_BLOCKED = "too_many_failures"
#: a client address is cut to this many characters for counting (an IPv6 address is at most 45)
_MAX_CLIENT = 100
#: addresses remembered as blocked by one worker (beyond that, expired ones are dropped, then all)
_MAX_BLOCKED = 10_000

TOKEN_PREFIX = "plg_"
#: random bytes in a token (256 bits)
TOKEN_BYTES = 32
#: a verified token is trusted this long without asking the file again (revocation latency)
CACHE_SECONDS = 0.5
#: the longest Authorization value looked at; a token is 47 characters
_MAX_TOKEN_CHARS = 128
_TOKEN_SHAPE = re.compile(r"plg_[A-Za-z0-9_-]{43,100}")
_ID_SHAPE = re.compile(r"tok_[0-9a-f]{12}")
_DURATION = re.compile(r"\s*(\d{1,6})\s*([smhdw]?)\s*")
_UNIT_SECONDS = {"": 86400, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_MAX_PLUGIN = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    plugin TEXT NOT NULL,
    sha256 TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    expires REAL,
    revoked REAL,
    mac TEXT
);
"""
#: a record's fields, signed in this order (the tag separates this use of the key from any other)
_MAC_TAG = "plugin-llm token record v1"
_KEY_BYTES = 32
_MAX_KEY_FILE = 1024
#: digests of tokens this process has seen revoked (a record rolled back to before its revocation stays refused)
_MAX_REVOKED_SEEN = 100_000
_MAX_BAD_REPORTED = 1_000
_COLUMNS = "id, plugin, created, expires, revoked, sha256, mac"
_DIGEST_SHAPE = re.compile(r"[0-9a-f]{64}")
#: records a Redis listing reads at most
_MAX_LISTED = 100_000


class TokenError(Exception):
    """An operator mistake with tokens (unknown id, bad plugin key or duration), or an unusable file."""


@dataclass(frozen=True)
class TokenInfo:
    """One token's row: never the token itself."""

    id: str
    plugin: str
    created: float
    expires: float | None
    revoked: float | None
    #: False: the home's key did not sign this record (forged, edited, signed with another key, or older)
    signed: bool = field(default=True, compare=False)

    def status(self, now: float | None = None) -> str:
        """``active``, ``expired``, ``revoked``, or ``invalid`` (its record is not signed by the home's key)."""
        if not self.signed:
            return "invalid"
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and self.expires <= (time.time() if now is None else now):
            return "expired"
        return "active"

    def as_dict(self) -> dict:
        """For ``--json``: times in the CLI's one format, each with its ``*_unix`` seconds."""
        from plugin_llm.timefmt import with_unix

        return {"id": self.id, "plugin": self.plugin, **with_unix("created", self.created),
                **with_unix("expires", self.expires), **with_unix("revoked", self.revoked), "status": self.status()}


def tokens_path(home: Path | str) -> Path:
    from plugin_llm.home_layout import TOKENS_DB, host_path

    return host_path(home, TOKENS_DB)


def failures_path(home: Path | str) -> Path:
    from plugin_llm.home_layout import AUTH_FAILURES_DB, host_path

    return host_path(home, AUTH_FAILURES_DB)


def token_key_path(home: Path | str) -> Path:
    """The key that signs token records (host-only: never in a plugin's sandbox, never in Redis)."""
    return Path(home) / "service" / "token_key"


def _mac(key: bytes, row: tuple) -> str:
    """HMAC-SHA256 of a record ``(id, plugin, created, expires, revoked, sha256)``, hex."""
    token_id, plugin, created, expires, revoked, sha256 = row[:6]
    message = json.dumps([_MAC_TAG, token_id, plugin, sha256, created, expires, revoked], separators=(",", ":"))
    return hmac.new(key, message.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


class _RecordKey:
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


def digest(token: str) -> str:
    """Hex SHA-256 of a token (what the file keeps)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` (a bare number is days) -> seconds."""
    match = _DURATION.fullmatch(text or "")
    if match is None or int(match.group(1)) == 0:
        raise TokenError(f"--expires must be a positive duration such as 30d, 12h, 90m or 2w, got {text[:40]!r}")
    return float(int(match.group(1)) * _UNIT_SECONDS[match.group(2)])


class _VerifyingStore:
    """What every token store shares: token creation, verification with a short cache of good answers."""

    path: Any = None

    def __init__(self, key: _RecordKey, *, clock=time.time, monotonic=time.monotonic) -> None:
        self._key = key
        self._clock = clock
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, TokenInfo]] = {}
        self._flights: dict[tuple[str, str], Any] = {}  # (digest, client) -> the lookup in flight (a Future)
        self._blocked: dict[str, float] = {}  # client address -> wall-clock end of its block
        self._revoked_seen: dict[str, float] = {}  # digest -> revocation time, as this process read it signed
        self._bad_reported: set[str] = set()

    def _row(self, wanted: str) -> tuple | None:  # (id, plugin, created, expires, revoked, sha256, mac)
        raise NotImplementedError

    # -- record signatures
    def _signed(self, row: tuple, key: bytes | None = None) -> bool:
        """Whether the home's key signed this record as it is now."""
        key = key if key is not None else self._key.get(create=False)
        mac = row[6] if len(row) > 6 else None
        if key is None or not isinstance(mac, str):
            return False
        return hmac.compare_digest(mac.encode("utf-8", "surrogatepass"), _mac(key, row).encode())

    def _report_bad(self, wanted: str, row: tuple) -> None:
        """Tell the operator (once per record and process) that a record was refused, and why it may be."""
        if wanted in self._bad_reported:
            return
        if len(self._bad_reported) >= _MAX_BAD_REPORTED:
            self._bad_reported.clear()
        self._bad_reported.add(wanted)
        shown = f"token {str(row[0])[:40]!r} (plugin {str(row[1])[:80]!r})"
        if not self._key.path.exists():
            why = (f"there is no token key {self._key.path} here: copy it from the machine where the tokens were "
                   "created (every machine sharing the tokens needs the same key)")
        elif not row[6]:
            why = ("the record has no signature: it was written into the store directly, or created before token "
                   "records were signed; create a new token for the plugin (plugin-llm tokens create) and revoke "
                   "this one")
        else:
            why = (f"its signature does not match: the record was forged or edited by someone without the key "
                   f"{self._key.path}, or it was signed with another machine's key (copy that key here)")
        _log.warning("token store %s: %s refused as an unknown token: %s", self.path, shown, why)

    def _info(self, row: tuple, signed: bool) -> TokenInfo:
        if signed:
            return TokenInfo(*row[:5])
        number = lambda value: float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
            else None  # noqa: E731 - an unsigned record's fields are shown, never trusted
        return TokenInfo(str(row[0])[:40], str(row[1])[:_MAX_PLUGIN], number(row[2]) or 0.0, number(row[3]),
                         number(row[4]), signed=False)

    # -- failed authentications, per client address (shared through the store)
    def _block_end(self, client: str) -> float | None:
        """The end (wall clock) of the address's block in the shared store, or None."""
        raise NotImplementedError

    def _count_failure(self, client: str, now: float, brake: Any) -> float | None:
        """Count one refused token of ``client``; the end of its block when it is (now) blocked."""
        raise NotImplementedError

    def blocked_here(self, client: str) -> float | None:
        """Seconds left of a block this process has seen for ``client`` (memory only), else None."""
        if not self._blocked:
            return None
        end = self._blocked.get(client[:_MAX_CLIENT])
        if end is None:
            return None
        left = end - self._clock()
        if left > 0:
            return left
        self._blocked.pop(client[:_MAX_CLIENT], None)
        return None

    def _remember_block(self, client: str, end: float) -> float:
        if len(self._blocked) >= _MAX_BLOCKED:
            now = self._clock()
            for key in [key for key, until in self._blocked.items() if until <= now]:
                del self._blocked[key]
            if len(self._blocked) >= _MAX_BLOCKED:
                self._blocked.clear()
        self._blocked[client] = end
        return max(0.0, end - self._clock())

    def authenticate(self, token: str, client: str, brake: Any) -> tuple[TokenInfo | None, str, float | None]:
        """``verify`` behind the brake on guessing: ``(info, reason, retry_after)``.

        ``brake`` is a ``FailedAuthSettings``. An address blocked in the store gets
        ``(None, REASON_BLOCKED, seconds)`` before its token is looked at; a refused token is counted for its
        address, and the refusal that blocks it still answers its own reason (the next request gets 429).
        Raises :class:`TokenError` when the store cannot answer.
        """
        client = client[:_MAX_CLIENT]
        if brake is not None and brake.enabled:
            end = self._block_end(client)
            if end is not None and end > self._clock():
                return None, REASON_BLOCKED, self._remember_block(client, end)
        info, reason = self.verify(token)
        if reason != "ok" and brake is not None and brake.enabled:
            end = self._count_failure(client, self._clock(), brake)
            if end is not None:
                self._remember_block(client, end)
        return info, reason, None

    async def aauthenticate(self, token: str, client: str, brake: Any) -> tuple[TokenInfo | None, str, float | None]:
        """:meth:`authenticate` on a worker thread, once for the concurrent requests of one client with one token.

        When a token's cached answer runs out, every request in flight with it would ask the store at once; the
        first one asks (on a thread: a slow store never blocks the event loop), the others wait for its answer
        - the same answer they would each have got, since the lookup is the same token's from the same address.
        """
        import asyncio

        key = (digest(token) if isinstance(token, str) and len(token) <= _MAX_TOKEN_CHARS else "", client[:_MAX_CLIENT])
        loop = asyncio.get_running_loop()
        flight = self._flights.get(key)
        if flight is None or flight.get_loop() is not loop:
            flight = self._flights[key] = loop.create_task(asyncio.to_thread(self.authenticate, token, client, brake))
            flight.add_done_callback(lambda done: self._landed(key, done))
        return await asyncio.shield(flight)  # a waiter that is cancelled leaves the lookup to the others

    def _landed(self, key: tuple[str, str], flight: Any) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # retrieved: every waiter may have gone (the loop would log it as never retrieved)

    @staticmethod
    def _new(plugin: str, now: float, expires_in: float | None) -> tuple[TokenInfo, str]:
        if not isinstance(plugin, str) or not plugin.strip() or len(plugin.strip()) > _MAX_PLUGIN \
                or any(ch.isspace() or not ch.isprintable() for ch in plugin.strip()):
            raise TokenError("the plugin key must be a non-empty name without spaces or control characters, "
                             "such as my-plugin or image_gen/openai (see plugin-llm plugins list)")
        token = TOKEN_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(TOKEN_BYTES)).rstrip(b"=").decode()
        info = TokenInfo(id="tok_" + secrets.token_hex(6), plugin=plugin.strip(), created=now,
                         expires=now + expires_in if expires_in is not None else None, revoked=None)
        return info, token

    @staticmethod
    def _checked_id(token_id: Any) -> str:
        if not isinstance(token_id, str) or not _ID_SHAPE.fullmatch(token_id.strip()):
            raise TokenError(f"a token id looks like tok_0123456789ab (see plugin-llm tokens list), "
                             f"got {str(token_id)[:40]!r}")
        return token_id.strip()

    def revoke_plugin(self, plugin: str) -> list[TokenInfo]:
        """Revoke every token of ``plugin`` not revoked yet (a removed plugin); the tokens revoked."""
        return [self.revoke(info.id) for info in self.list() if info.plugin == plugin and info.revoked is None]

    # -- the service
    def lookup(self, token: str) -> TokenInfo | None:
        """The row of a token, whatever its status, or None when it is not one of ours.

        Used by :meth:`verify`; the caller must not tell the client which case refused it.
        """
        return self._find(token)[0]

    def _find(self, token: str) -> tuple[TokenInfo | None, str]:
        """``(info, "found")``, ``(None, "unknown")``, or ``(None, REASON_BAD_SIGNATURE)`` for a record the
        home's key did not sign (refused like an unknown token, and logged)."""
        if not isinstance(token, str) or len(token) > _MAX_TOKEN_CHARS or not _TOKEN_SHAPE.fullmatch(token):
            return None, "unknown"
        wanted = digest(token)
        row = self._row(wanted)
        if row is None or not hmac.compare_digest(str(row[5]), wanted):
            return None, "unknown"
        if not self._signed(row):
            self._report_bad(wanted, row)
            return None, REASON_BAD_SIGNATURE
        info = TokenInfo(*row[:5])
        if info.revoked is not None:
            if len(self._revoked_seen) >= _MAX_REVOKED_SEEN:
                self._revoked_seen.pop(next(iter(self._revoked_seen)))
            self._revoked_seen[wanted] = info.revoked
        elif wanted in self._revoked_seen:  # a signed record from before its revocation, put back
            _log.warning("token store %s: token %s was revoked and its record is active again (an older copy was "
                         "put back); still refused", self.path, info.id)
            info = TokenInfo(info.id, info.plugin, info.created, info.expires, self._revoked_seen[wanted])
        return info, "found"

    def cached(self, token: str) -> TokenInfo | None:
        """The active token's row when a fresh verified answer is cached (no I/O), else None."""
        if not isinstance(token, str) or len(token) > _MAX_TOKEN_CHARS:
            return None
        cached = self._cache.get(digest(token))
        if cached is None or self._monotonic() - cached[0] >= CACHE_SECONDS:
            return None
        info = cached[1]
        return info if info.expires is None or info.expires > self._clock() else None

    def verify(self, token: str) -> tuple[TokenInfo | None, str]:
        """``(info, "ok")`` for an active token, else ``(info or None, "unknown" | "expired" | "revoked" |
        "bad_signature")``.

        The reason is for the audit log only. An active token is cached for
        :data:`CACHE_SECONDS` (keyed by its digest), then read again.
        """
        if not isinstance(token, str) or len(token) > _MAX_TOKEN_CHARS:
            return None, "unknown"
        key = digest(token)
        cached = self._cache.get(key)
        now_mono = self._monotonic()
        if cached is not None and now_mono - cached[0] < CACHE_SECONDS:
            info = cached[1]
            if info.expires is None or info.expires > self._clock():
                return info, "ok"
        info, found = self._find(token)
        if info is None:
            self._cache.pop(key, None)
            return None, found
        status = info.status(self._clock())
        if status != "active":
            self._cache.pop(key, None)
            return info, status
        if len(self._cache) > 10_000:  # bounded: a host with that many live tokens re-reads more often
            self._cache.clear()
        self._cache[key] = (now_mono, info)
        return info, "ok"


class TokenStore(_VerifyingStore):
    """The token file of one home; one connection per process, shared by its threads."""

    def __init__(self, home: Path | str, *, clock=time.time, monotonic=time.monotonic) -> None:
        super().__init__(_RecordKey(home), clock=clock, monotonic=monotonic)
        self.path = tokens_path(home)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._opened: tuple[int, int] | None = None
        self._failures = _FailureFile(failures_path(home))

    def __repr__(self) -> str:
        return f"TokenStore({str(self.path)!r})"

    def _block_end(self, client: str) -> float | None:
        return self._failures.block_end(client, self._clock())

    def _count_failure(self, client: str, now: float, brake: Any) -> float | None:
        return self._failures.count(client, now, brake)

    # -- file
    def _connection(self, create: bool) -> sqlite3.Connection | None:
        if self._conn is not None and self._pid == os.getpid():
            if self._file_id() == self._opened:
                return self._conn
            self._conn.close()  # the file was replaced (a copy distributed to this replica): open the new one
            self._conn = None
        if not create and not self.path.exists():
            return None
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))  # owner-only before SQLite writes a byte
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
            # a rollback journal, not WAL: the file stands alone (no -wal beside it that a copy would leave
            # behind), so a replica can be given a new copy by mv; reads are rare (one per token per
            # CACHE_SECONDS) and writes rarer still
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.executescript(_SCHEMA)
            self._sign_unsigned_file(conn)
        except (sqlite3.Error, OSError) as exc:
            raise TokenError(f"the token file {self.path} cannot be used ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); check its permissions, or move it away to start afresh") from None
        self._conn, self._pid, self._opened = conn, os.getpid(), self._file_id()
        return conn

    def _sign_unsigned_file(self, conn: sqlite3.Connection) -> None:
        """A file from before records were signed gets its ``mac`` column, and its rows their signatures, once.

        The file is the host's own (0600, hidden from sandboxed plugins), so its rows are what the operator
        created; after this one step an unsigned row is refused like a forged one.
        """
        if any(column[1] == "mac" for column in conn.execute("PRAGMA table_info(tokens)")):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not any(column[1] == "mac" for column in conn.execute("PRAGMA table_info(tokens)")):
                conn.execute("ALTER TABLE tokens ADD COLUMN mac TEXT")
                rows = conn.execute("SELECT id, plugin, created, expires, revoked, sha256 FROM tokens").fetchall()
                if rows:
                    key = self._key.get(create=True)
                    conn.executemany("UPDATE tokens SET mac = ? WHERE id = ?", [(_mac(key, r), r[0]) for r in rows])
                    _log.info("token file %s: signed its %d existing token records with %s", self.path, len(rows),
                              self._key.path)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _file_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _execute(self, sql: str, params: tuple = (), *, create: bool = False) -> list[tuple]:
        with self._lock:
            conn = self._connection(create)
            if conn is None:
                return []
            try:
                return conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise TokenError(f"the token file {self.path} failed ({type(exc).__name__}: {str(exc)[:200]})") from None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
            self._cache.clear()
        self._failures.close()

    # -- operator commands
    def create(self, plugin: str, *, expires_in: float | None = None) -> tuple[TokenInfo, str]:
        """A new token for ``plugin``: its row and the token (shown once, stored nowhere)."""
        info, token = self._new(plugin, self._clock(), expires_in)
        key = self._key.get(create=True)
        mac = _mac(key, (info.id, info.plugin, info.created, info.expires, None, digest(token)))
        self._execute("INSERT INTO tokens (id, plugin, sha256, created, expires, revoked, mac) "
                      "VALUES (?, ?, ?, ?, ?, NULL, ?)",
                      (info.id, info.plugin, digest(token), info.created, info.expires, mac), create=True)
        return info, token

    def list(self) -> list[TokenInfo]:
        """Every row; one the home's key did not sign has status ``invalid``."""
        rows = self._execute(f"SELECT {_COLUMNS} FROM tokens ORDER BY created, id")
        key = self._key.get(create=False) if rows else None
        return [self._info(row, self._signed(row, key)) for row in rows]

    def revoke(self, token_id: str) -> TokenInfo:
        """Revoke by id (idempotent: an already revoked token keeps its first revocation time), signed anew."""
        token_id = self._checked_id(token_id)
        now = self._clock()

        def work(conn: sqlite3.Connection) -> tuple | None:
            row = conn.execute(f"SELECT {_COLUMNS} FROM tokens WHERE id = ?", (token_id,)).fetchone()
            if row is None:
                return None
            key = self._key.get(create=True)
            if row[4] is not None and self._signed(row, key):
                return row
            revoked = row[4] if isinstance(row[4], float) else now
            row = (*row[:4], revoked, row[5])
            conn.execute("UPDATE tokens SET revoked = ?, mac = ? WHERE id = ?", (revoked, _mac(key, row), token_id))
            return (*row, _mac(key, row))

        row = self._transaction(work)
        if row is None:
            raise TokenError(f"no token {token_id} in {self.path} (see plugin-llm tokens list)")
        with self._lock:
            self._cache.clear()
        return self._info(row, True)

    def _transaction(self, work):
        with self._lock:
            conn = self._connection(False)
            if conn is None:
                return None
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = work(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                raise TokenError(f"the token file {self.path} failed ({type(exc).__name__}: {str(exc)[:200]})") from None

    def _row(self, wanted: str) -> tuple | None:
        rows = self._execute(f"SELECT {_COLUMNS} FROM tokens WHERE sha256 = ?", (wanted,))
        return rows[0] if rows else None


class _FailureFile:
    """Refused tokens per client address in ``<home>/service/auth_failures.db``, shared by the processes of a
    machine. WAL and ``synchronous=NORMAL``: a count is cheap to write and nothing to lose in a crash."""

    _SCHEMA = ("CREATE TABLE IF NOT EXISTS failures (client TEXT PRIMARY KEY, first REAL NOT NULL, "
               "count INTEGER NOT NULL, blocked_until REAL)")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._writes = 0

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(self._SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise TokenError(f"the failed-authentication file {self.path} cannot be used ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); check its permissions, or delete it (it holds only counts)") from None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _run(self, work):
        with self._lock:
            conn = self._connection()
            try:
                return work(conn)
            except sqlite3.Error as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise TokenError(f"the failed-authentication file {self.path} failed ({type(exc).__name__}: "
                                 f"{str(exc)[:200]}); delete it if it is damaged (it holds only counts)") from None

    def block_end(self, client: str, now: float) -> float | None:
        if self._conn is None and not self.path.exists():
            return None  # nothing ever refused here: no file to open
        rows = self._run(lambda conn: conn.execute("SELECT blocked_until FROM failures WHERE client = ? AND "
                                                   "blocked_until > ?", (client, now)).fetchall())
        return rows[0][0] if rows else None

    def count(self, client: str, now: float, brake: Any) -> float | None:
        def work(conn: sqlite3.Connection) -> float | None:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT first, count, blocked_until FROM failures WHERE client = ?",
                               (client,)).fetchone()
            first, count, until = row if row is not None else (now, 0, None)
            if first <= now - brake.window_seconds:  # the window is over: count afresh
                first, count = now, 0
            count += 1
            if until is not None and until <= now:
                until = None
            if until is None and count >= brake.max_failures:
                until = now + brake.block_seconds
            conn.execute("INSERT OR REPLACE INTO failures (client, first, count, blocked_until) VALUES (?, ?, ?, ?)",
                         (client, first, count, until))
            self._writes += 1
            if self._writes % 256 == 0:  # forget addresses whose window and block are both over
                conn.execute("DELETE FROM failures WHERE first <= ? AND (blocked_until IS NULL OR blocked_until <= ?)",
                             (now - brake.window_seconds, now))
            conn.execute("COMMIT")
            return until

        return self._run(work)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


class RedisTokenStore(_VerifyingStore):
    """Tokens in the Redis of ``limits.store: redis``, shared by every replica on every machine.

    Keys: ``<prefix>:tokens:<sha256>`` (a hash: id, plugin, created, expires,
    revoked, sha256, mac) and ``<prefix>:tokens:ids`` (id -> sha256). Every
    operation is bounded by ``timeout``; a Redis that fails raises
    :class:`TokenError` (the service answers 503, never lets a call through).
    Whoever can write that Redis can write a record, so each one is signed with
    the key in ``home`` (:func:`token_key_path`, the same on every replica).
    """

    def __init__(self, url: str, *, home: Path | str, prefix: str = "plugin_llm", timeout: float = 2.0,
                 clock=time.time, monotonic=time.monotonic) -> None:
        super().__init__(_RecordKey(home), clock=clock, monotonic=monotonic)
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from plugin_llm.limits.settings import redact_url

        self._errors = (redis.RedisError, OSError)
        self.path = f"redis {redact_url(url)}"
        self._prefix = f"{prefix}:tokens"
        self._failed = f"{prefix}:auth_failures"
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                                retry=Retry(NoBackoff(), 0), health_check_interval=0)
        except (ValueError, redis.RedisError) as exc:
            raise TokenError(f"limits.redis_url ({self.path}) is not usable for tokens: {type(exc).__name__}") from None

    def __repr__(self) -> str:
        return f"RedisTokenStore({self.path!r})"

    def _call(self, work):
        try:
            return work(self._client)
        except self._errors as exc:
            raise TokenError(f"the token store ({self.path}) failed: {type(exc).__name__}; check that Redis is "
                             "up and limits.redis_url in config.yaml") from None

    @staticmethod
    def _fields(fields: dict) -> tuple | None:
        """``(id, plugin, created, expires, revoked, sha256, mac)`` of a hash as it is (anyone may have written
        it: a missing or odd field stays None or text, and only fails the signature check)."""
        if not fields or not isinstance(fields, dict):
            return None

        def text(name: str) -> str | None:
            value = fields.get(name.encode())
            return value.decode("utf-8", "surrogateescape")[:_MAX_PLUGIN + 64] if isinstance(value, bytes) else None

        def number(name: str) -> float | str | None:
            value = text(name)
            if not value:
                return None
            try:
                return float(value)
            except ValueError:
                return value

        return (text("id"), text("plugin"), number("created"), number("expires"), number("revoked"), text("sha256"),
                text("mac"))

    def create(self, plugin: str, *, expires_in: float | None = None) -> tuple[TokenInfo, str]:
        info, token = self._new(plugin, self._clock(), expires_in)
        wanted = digest(token)
        key = self._key.get(create=True)
        mac = _mac(key, (info.id, info.plugin, info.created, info.expires, None, wanted))
        mapping = {"id": info.id, "plugin": info.plugin, "created": repr(info.created), "sha256": wanted,
                   "expires": repr(info.expires) if info.expires is not None else "", "revoked": "", "mac": mac}

        def work(client):
            pipe = client.pipeline(transaction=True)
            pipe.hset(f"{self._prefix}:{wanted}", mapping=mapping)
            pipe.hset(f"{self._prefix}:ids", info.id, wanted)
            pipe.execute()

        self._call(work)
        return info, token

    def _record_keys(self, client) -> list[str]:
        """Every ``<prefix>:tokens:<sha256>`` key (found by SCAN, not by the id index anyone could edit)."""
        found = []
        for name in client.scan_iter(match=f"{self._prefix}:*", count=1000):
            name = name.decode("utf-8", "replace")
            if _DIGEST_SHAPE.fullmatch(name[len(self._prefix) + 1:]):
                found.append(name)
                if len(found) >= _MAX_LISTED:
                    break
        return found

    def list(self) -> list[TokenInfo]:
        """Every record in the store; one the home's key did not sign has status ``invalid``."""
        def work(client):
            pipe = client.pipeline(transaction=False)
            for name in self._record_keys(client):
                pipe.hgetall(name)
            return pipe.execute()

        rows = [row for row in (self._fields(fields) for fields in self._call(work)) if row]
        key = self._key.get(create=False) if rows else None
        return sorted((self._info(row, self._signed(row, key)) for row in rows), key=lambda t: (t.created, t.id))

    def revoke(self, token_id: str) -> TokenInfo:
        """Revoke by id, signed anew (the first revocation time is kept). The record is found through the id
        index, else by a scan; the index is checked against the record it names."""
        token_id = self._checked_id(token_id)
        key = self._key.get(create=True)

        def find(client) -> tuple[str, tuple] | None:  # the signed record of that id, else an unsigned one
            wanted = client.hget(f"{self._prefix}:ids", token_id)
            indexed = [f"{self._prefix}:{wanted.decode('utf-8', 'replace')}"] if wanted is not None else []
            unsigned = None

            def scanned():  # only when the index does not name the signed record
                yield from (n for n in self._record_keys(client) if n not in indexed)

            for name in itertools.chain(indexed, scanned()):
                row = self._fields(client.hgetall(name))
                if row is not None and row[0] == token_id:
                    if self._signed(row, key):
                        return name, row
                    unsigned = unsigned or (name, row)
            return unsigned

        def work(client):
            found = find(client)
            if found is None:
                return None
            name, row = found
            if row[4] is not None and self._signed(row, key):
                return row
            revoked = row[4] if isinstance(row[4], float) else self._clock()
            row = (*row[:4], revoked, row[5])
            mac = _mac(key, row)
            client.hset(name, mapping={"revoked": repr(revoked), "mac": mac})
            return (*row, mac)

        row = self._call(work)
        if row is None:
            raise TokenError(f"no token {token_id} in the token store ({self.path}) (see plugin-llm tokens list)")
        self._cache.clear()
        return self._info(row, self._signed(row, key))

    def _row(self, wanted: str) -> tuple | None:
        return self._fields(self._call(lambda client: client.hgetall(f"{self._prefix}:{wanted}")))

    # failures: <prefix>:auth_failures:count:<client> (expires window_seconds after the first failure) and
    # <prefix>:auth_failures:block:<client> (expires when the block ends): Redis's clock, one for all replicas
    def _block_end(self, client: str) -> float | None:
        left_ms = self._call(lambda c: c.pttl(f"{self._failed}:block:{client}"))
        return self._clock() + left_ms / 1000 if left_ms and left_ms > 0 else None

    def _count_failure(self, client: str, now: float, brake: Any) -> float | None:
        count_key, block_key = f"{self._failed}:count:{client}", f"{self._failed}:block:{client}"

        def work(c):
            pipe = c.pipeline(transaction=True)
            pipe.set(count_key, 0, px=max(1, int(brake.window_seconds * 1000)), nx=True)
            pipe.incr(count_key)
            count = pipe.execute()[1]
            if count < brake.max_failures:
                return None
            pipe = c.pipeline(transaction=True)
            pipe.set(block_key, 1, px=max(1, int(brake.block_seconds * 1000)), nx=True)  # a block is not extended
            pipe.pttl(block_key)
            return pipe.execute()[1]

        left_ms = self._call(work)
        return self._clock() + left_ms / 1000 if left_ms and left_ms > 0 else None

    def close(self) -> None:
        self._cache.clear()
        try:
            self._client.close()
        except Exception:  # noqa: BLE001 - closing must not fail
            pass


def token_store_for(home: Path | str, config: Any = None) -> "TokenStore | RedisTokenStore":
    """The token store the home's config selects: Redis with ``limits.store: redis``, else the file."""
    if config is None:
        from plugin_llm.config import get_config_source

        config = get_config_source(Path(home)).current()
    settings = config.limits
    if settings.store == "redis":
        return RedisTokenStore(settings.redis_url, home=home, prefix=settings.redis_key_prefix,
                               timeout=settings.store_timeout)
    return TokenStore(home)
