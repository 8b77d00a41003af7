"""Service tokens in the Redis of ``limits.store: redis``, shared by every replica on every machine.

Records are hashes keyed by digest, found by ``SCAN`` (an id index speeds revocation up, checked
against the record it names); refused tokens are counted on Redis's clock. A Redis that fails
refuses every token (the service answers 503). redis-py is imported when the store is made.
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path
from typing import Any

from plugin_llm.service.token_records import MAX_PLUGIN, TokenError, TokenInfo, digest
from plugin_llm.service.token_signing import RecordKey, record_mac
from plugin_llm.service.token_verify import VerifyingStore

__all__ = ["RedisTokenStore"]

_DIGEST_SHAPE = re.compile(r"[0-9a-f]{64}")
#: records a Redis listing reads at most
_MAX_LISTED = 100_000


class RedisTokenStore(VerifyingStore):
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
        super().__init__(RecordKey(home), clock=clock, monotonic=monotonic)
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
            return value.decode("utf-8", "surrogateescape")[:MAX_PLUGIN + 64] if isinstance(value, bytes) else None

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
        mac = record_mac(key, (info.id, info.plugin, info.created, info.expires, None, wanted))
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
            mac = record_mac(key, row)
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
