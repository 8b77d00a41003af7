"""What every token store shares: creating a token, verifying one, and the brake on guessing.

:class:`VerifyingStore` checks a presented token (shape, digest, signature, status), caches a
verified one for :data:`~plugin_llm.service.token_records.CACHE_SECONDS`, remembers revocations it
has seen, and counts refused tokens per client address (``service.failed_auth``); a subclass
reads and writes the records (:mod:`.token_file`, :mod:`.token_redis`).
"""

from __future__ import annotations

import base64
import hmac
import logging
import re
import secrets
import time
from typing import Any

from plugin_llm.service.token_records import (
    CACHE_SECONDS,
    MAX_PLUGIN,
    REASON_BAD_SIGNATURE,
    REASON_BLOCKED,
    TOKEN_BYTES,
    TOKEN_PREFIX,
    TokenError,
    TokenInfo,
    digest,
)
from plugin_llm.service.token_signing import RecordKey, record_mac

__all__ = ["VerifyingStore"]

_log = logging.getLogger("plugin_llm.service")

#: a client address is cut to this many characters for counting (an IPv6 address is at most 45)
_MAX_CLIENT = 100
#: addresses remembered as blocked by one worker (beyond that, expired ones are dropped, then all)
_MAX_BLOCKED = 10_000
#: the longest Authorization value looked at; a token is 47 characters
_MAX_TOKEN_CHARS = 128
_TOKEN_SHAPE = re.compile(r"plg_[A-Za-z0-9_-]{43,100}")
_ID_SHAPE = re.compile(r"tok_[0-9a-f]{12}")
#: digests of tokens this process has seen revoked (a record rolled back to before its revocation stays refused)
_MAX_REVOKED_SEEN = 100_000
_MAX_BAD_REPORTED = 1_000


class VerifyingStore:
    """What every token store shares: token creation, verification with a short cache of good answers."""

    path: Any = None

    def __init__(self, key: RecordKey, *, clock=time.time, monotonic=time.monotonic) -> None:
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
        return hmac.compare_digest(mac.encode("utf-8", "surrogatepass"), record_mac(key, row).encode())

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
        return TokenInfo(str(row[0])[:40], str(row[1])[:MAX_PLUGIN], number(row[2]) or 0.0, number(row[3]),
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
        if not isinstance(plugin, str) or not plugin.strip() or len(plugin.strip()) > MAX_PLUGIN \
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
