"""Per-plugin service tokens: ``plg_`` + 32 random bytes, only their SHA-256 kept.

A token's identity is a plugin key: whoever presents it calls the gateway as that plugin (trust
gate, limits and audit exactly as ``ctx.llm``). ``<home>/service/tokens.db`` (SQLite, 0600,
:class:`TokenStore`) keeps one row per token: an id (``tok_`` + 12 hex, safe to show), the plugin
key, the digest, created/expires/revoked times; the token itself is printed once by ``plugin-llm
tokens create`` and stored nowhere. With ``limits.store: redis`` they live in that Redis
(:class:`RedisTokenStore`; :func:`token_store_for` picks); a Redis that does not answer refuses
every token (503), never lets a call through. Unknown, expired and revoked tokens all give the
caller the same ``None`` (401); every record is HMAC-signed (:mod:`.token_signing`), and a
verified token is cached at most :data:`CACHE_SECONDS`. This module is the way in: the record in
:mod:`.token_records`, verification and the brake on guessing in :mod:`.token_verify`, the stores
in :mod:`.token_file`, :mod:`.auth_failures` and :mod:`.token_redis`. Replicas: docs/service.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plugin_llm.service.token_file import TokenStore
from plugin_llm.service.token_records import (
    CACHE_SECONDS,
    REASON_BAD_SIGNATURE,
    REASON_BLOCKED,
    TOKEN_PREFIX,
    TokenError,
    TokenInfo,
    digest,
    failures_path,
    parse_duration,
    token_key_path,
    tokens_path,
)
from plugin_llm.service.token_redis import RedisTokenStore

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
