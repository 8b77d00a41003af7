"""Per-plugin service tokens: ``plg_`` + 32 random bytes, only their SHA-256 kept (issue 14).

A token's identity is a plugin key: whoever presents it calls the gateway as
that plugin (trust gate, limits and audit exactly as ``ctx.llm``). The home
keeps ``<home>/service/tokens.db``, a small SQLite file created mode 0600,
with one row per token: an id (``tok_`` + 12 hex digits, safe to show and to
log), the plugin key, the SHA-256 of the token, created/expires/revoked
times. The token itself is printed once, by ``plugin-llm tokens create``, and
stored nowhere.

Several workers and ``serve`` processes on one machine share the file; each caches a verified token for at most :data:`CACHE_SECONDS`, so a
revocation is refused everywhere within one second. Tokens are not replicated
across machines: copy the file to each replica after a change (it holds only
digests; ``sqlite3 tokens.db ".backup copy.db"``, then ``mv`` it into place on
the replica) - a replaced file is noticed and reopened at the next lookup.

With ``limits.store: redis`` the tokens live in that Redis instead
(:class:`RedisTokenStore`, :func:`token_store_for` picks), shared by every
replica on every machine; a Redis that does not answer refuses every token
(the service answers 503), never lets a call through.

Refused tokens are counted per client address (:meth:`_VerifyingStore.authenticate`,
``service.failed_auth`` in config.yaml): after ``max_failures`` within ``window_seconds`` the address is
refused for ``block_seconds`` without its token being looked at. The counts live beside the tokens - the
SQLite file ``<home>/service/auth_failures.db`` (WAL, apart from the token file so that a copied
``tokens.db`` stays a file of digests only), or the same Redis - so every worker and replica sharing the
tokens shares them; each worker remembers a block it has seen until it ends, so a blocked address costs no I/O.

Verification looks the token's digest up (the token is never compared as
text) and compares the stored digest with ``hmac.compare_digest``; unknown,
expired and revoked tokens all give the same ``None`` to the caller, which
answers 401 without saying which.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
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
    "REASON_BLOCKED",
]

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
    revoked REAL
);
"""


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

    def status(self, now: float | None = None) -> str:
        """``active``, ``expired`` or ``revoked``."""
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and self.expires <= (time.time() if now is None else now):
            return "expired"
        return "active"

    def as_dict(self) -> dict:
        return {"id": self.id, "plugin": self.plugin, "created": self.created, "expires": self.expires,
                "revoked": self.revoked, "status": self.status()}


def tokens_path(home: Path | str) -> Path:
    return Path(home) / "service" / "tokens.db"


def failures_path(home: Path | str) -> Path:
    return Path(home) / "service" / "auth_failures.db"


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

    def __init__(self, *, clock=time.time, monotonic=time.monotonic) -> None:
        self._clock = clock
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, TokenInfo]] = {}
        self._blocked: dict[str, float] = {}  # client address -> wall-clock end of its block

    def _row(self, wanted: str) -> tuple | None:  # (id, plugin, created, expires, revoked, sha256)
        raise NotImplementedError

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

    # -- the service
    def lookup(self, token: str) -> TokenInfo | None:
        """The row of a token, whatever its status, or None when it is not one of ours.

        Used by :meth:`verify`; the caller must not tell the client which case refused it.
        """
        if not isinstance(token, str) or len(token) > _MAX_TOKEN_CHARS or not _TOKEN_SHAPE.fullmatch(token):
            return None
        wanted = digest(token)
        row = self._row(wanted)
        if row is None or not hmac.compare_digest(str(row[5]), wanted):
            return None
        return TokenInfo(*row[:5])

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
        """``(info, "ok")`` for an active token, else ``(info or None, "unknown" | "expired" | "revoked")``.

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
        info = self.lookup(token)
        if info is None:
            self._cache.pop(key, None)
            return None, "unknown"
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
        super().__init__(clock=clock, monotonic=monotonic)
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
        except (sqlite3.Error, OSError) as exc:
            raise TokenError(f"the token file {self.path} cannot be used ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); check its permissions, or move it away to start afresh") from None
        self._conn, self._pid, self._opened = conn, os.getpid(), self._file_id()
        return conn

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
        self._execute("INSERT INTO tokens (id, plugin, sha256, created, expires, revoked) VALUES (?, ?, ?, ?, ?, NULL)",
                      (info.id, info.plugin, digest(token), info.created, info.expires), create=True)
        return info, token

    def list(self) -> list[TokenInfo]:
        rows = self._execute("SELECT id, plugin, created, expires, revoked FROM tokens ORDER BY created, id")
        return [TokenInfo(*row) for row in rows]

    def revoke(self, token_id: str) -> TokenInfo:
        """Revoke by id (idempotent: an already revoked token keeps its first revocation time)."""
        token_id = self._checked_id(token_id)
        self._execute("UPDATE tokens SET revoked = ? WHERE id = ? AND revoked IS NULL", (self._clock(), token_id))
        rows = self._execute("SELECT id, plugin, created, expires, revoked FROM tokens WHERE id = ?", (token_id,))
        if not rows:
            raise TokenError(f"no token {token_id} in {self.path} (see plugin-llm tokens list)")
        with self._lock:
            self._cache.clear()
        return TokenInfo(*rows[0])

    def _row(self, wanted: str) -> tuple | None:
        rows = self._execute("SELECT id, plugin, created, expires, revoked, sha256 FROM tokens WHERE sha256 = ?",
                             (wanted,))
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
    revoked, sha256) and ``<prefix>:tokens:ids`` (id -> sha256). Every
    operation is bounded by ``timeout``; a Redis that fails raises
    :class:`TokenError` (the service answers 503, never lets a call through).
    """

    def __init__(self, url: str, *, prefix: str = "plugin_llm", timeout: float = 2.0, clock=time.time,
                 monotonic=time.monotonic) -> None:
        super().__init__(clock=clock, monotonic=monotonic)
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
    def _info(fields: dict) -> tuple | None:
        if not fields:
            return None
        get = lambda name: fields.get(name.encode())  # noqa: E731
        number = lambda name: float(get(name)) if get(name) not in (None, b"") else None  # noqa: E731
        return (get("id").decode(), get("plugin").decode(), number("created"), number("expires"), number("revoked"),
                get("sha256").decode())

    def create(self, plugin: str, *, expires_in: float | None = None) -> tuple[TokenInfo, str]:
        info, token = self._new(plugin, self._clock(), expires_in)
        wanted = digest(token)
        mapping = {"id": info.id, "plugin": info.plugin, "created": repr(info.created), "sha256": wanted,
                   "expires": repr(info.expires) if info.expires is not None else "", "revoked": ""}

        def work(client):
            pipe = client.pipeline(transaction=True)
            pipe.hset(f"{self._prefix}:{wanted}", mapping=mapping)
            pipe.hset(f"{self._prefix}:ids", info.id, wanted)
            pipe.execute()

        self._call(work)
        return info, token

    def list(self) -> list[TokenInfo]:
        def work(client):
            ids = client.hgetall(f"{self._prefix}:ids")
            pipe = client.pipeline(transaction=False)
            for wanted in ids.values():
                pipe.hgetall(f"{self._prefix}:{wanted.decode()}")
            return pipe.execute()

        rows = [self._info(fields) for fields in self._call(work)]
        return sorted((TokenInfo(*row[:5]) for row in rows if row), key=lambda t: (t.created, t.id))

    def revoke(self, token_id: str) -> TokenInfo:
        token_id = self._checked_id(token_id)

        def work(client):
            wanted = client.hget(f"{self._prefix}:ids", token_id)
            if wanted is None:
                return None
            key = f"{self._prefix}:{wanted.decode()}"
            if not client.hget(key, "revoked"):
                client.hset(key, "revoked", repr(self._clock()))
            return client.hgetall(key)

        row = self._info(self._call(work) or {})
        if row is None:
            raise TokenError(f"no token {token_id} in the token store ({self.path}) (see plugin-llm tokens list)")
        self._cache.clear()
        return TokenInfo(*row[:5])

    def _row(self, wanted: str) -> tuple | None:
        return self._info(self._call(lambda client: client.hgetall(f"{self._prefix}:{wanted}")))

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
        return RedisTokenStore(settings.redis_url, prefix=settings.redis_key_prefix, timeout=settings.store_timeout)
    return TokenStore(home)
