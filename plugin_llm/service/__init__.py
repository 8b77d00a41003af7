"""The gateway as a service: ``plugin-llm serve``.

A Starlette app (:func:`create_app`) that lets a plugin in another process,
language or machine call the gateway with a per-plugin token
(:class:`TokenStore`, or :class:`RedisTokenStore` with ``limits.store: redis``), through the same pipeline as ``ctx.llm``. Modules:
``tokens`` (the token file), ``requests`` (body checks), ``errors`` (errors as
HTTP), ``metrics`` (Prometheus), ``app`` (routes), ``server`` (uvicorn, signals,
workers); the ``service:`` section of config.yaml is read by
``plugin_llm.config.service``. Importing this package loads nothing else; the
names below load their module on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "TokenStore", "RedisTokenStore", "token_store_for", "TokenInfo", "TokenError"]

_TOKEN_NAMES = frozenset({"TokenStore", "RedisTokenStore", "token_store_for", "TokenInfo", "TokenError"})


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from plugin_llm.service.app import create_app

        return create_app
    if name in _TOKEN_NAMES:
        from plugin_llm.service import tokens

        return getattr(tokens, name)
    raise AttributeError(f"module 'plugin_llm.service' has no attribute {name!r}")
