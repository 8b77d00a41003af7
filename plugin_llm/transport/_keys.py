"""The key as the transport's frames hold it (masked), and the one call that reveals it."""

from __future__ import annotations

from typing import Any

from plugin_llm.transport._types import Credential

__all__ = ["Key", "provider_call"]


class Key:
    """One attempt's key, as the transport's frames hold it: masked in every repr.

    The secret itself is produced only by :meth:`reveal`, called as the
    argument of the provider call (:func:`provider_call`) or of a redaction
    call, so it is never the value of a local variable in a frame that a
    traceback (``capture_locals``, ``pytest -l``, an error reporter) could show.
    """

    __slots__ = ("_credential", "_placeholder", "absent")

    def __init__(self, credential: Credential, placeholder: str | None) -> None:
        self._credential = credential
        self._placeholder = placeholder
        self.absent = placeholder is None and not credential.reveal()

    def reveal(self) -> str | None:
        return self._credential.reveal() or self._placeholder

    def secret(self) -> str | None:
        """The real key (never the keyless placeholder), for redaction."""
        return self._credential.reveal()

    def __repr__(self) -> str:
        return "<key>"

    __str__ = __repr__

    def __reduce__(self):  # noqa: D105
        raise TypeError("keys cannot be pickled")


def provider_call(fn: Any, kwargs: dict[str, Any], key: Key) -> Any:
    """``fn(**kwargs)`` with the key added as an argument: no frame of ours holds it in a local."""
    if key.absent:
        return fn(**kwargs)
    return fn(**kwargs, api_key=key.reveal())
