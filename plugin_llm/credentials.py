"""The one place the gateway asks for a key: ``key_source(home, provider, profile)``.

The returned :class:`~plugin_llm.transport.KeySource` is handed to the
transport, which acquires a credential per attempt (so a pooled key that just
failed is not reused) and reports failures back (cooldowns). Keys are held by
the ``auth`` store; nothing here keeps one.
"""

from __future__ import annotations

from pathlib import Path

from auth import get_store

__all__ = ["key_source"]


class _StoreKeys:
    __slots__ = ("_home", "_provider", "_profile")

    def __init__(self, home: Path, provider: str, profile: str | None) -> None:
        self._home, self._provider, self._profile = home, provider, profile

    def _store(self):
        return get_store(self._home)

    def acquire(self):
        return self._store().acquire(self._provider, self._profile)

    async def aacquire(self):
        return await self._store().aacquire(self._provider, self._profile)

    def report_failure(self, credential, status: int, retry_after: float | None = None) -> None:
        self._store().report_failure(credential, status, retry_after)

    def report_success(self, credential) -> None:
        self._store().report_success(credential)

    def __repr__(self) -> str:
        return f"KeySource(provider={self._provider!r}, profile={self._profile!r})"


def key_source(home: Path, provider: str, profile: str | None):
    """Keys for ``provider`` (and the named profile) from the home's credential store."""
    return _StoreKeys(home, provider, profile)
