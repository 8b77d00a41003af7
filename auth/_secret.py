"""Where loaded secrets live: a private vault, out of every object's ``vars()``.

Objects that need a secret (parsed ``auth.json`` entries, pool key states,
:class:`~auth.store.Credential`) hold a :class:`SecretRef` — an opaque handle
whose only attribute is an integer. The secret itself sits in a module-level
dict keyed by that handle, so ``repr``/``vars``/``dataclasses.asdict`` of any
of those objects (and anything that holds them) never contain it, and pickling
one fails instead of writing the key to disk. The vault entry is dropped when
the last reference to its handle is garbage collected.
"""

from __future__ import annotations

import itertools
import weakref

_VAULT: dict[int, str] = {}
_handles = itertools.count(1)


class SecretRef:
    """An opaque reference to one secret. ``get()`` returns it."""

    __slots__ = ("_handle", "__weakref__")

    def __init__(self, secret: str) -> None:
        handle = next(_handles)  # itertools.count is atomic under the GIL
        _VAULT[handle] = secret
        self._handle = handle
        weakref.finalize(self, _VAULT.pop, handle, None)

    def get(self) -> str | None:
        return _VAULT.get(self._handle)

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__

    def __reduce__(self):  # noqa: D105 - pickling would write the key somewhere
        raise TypeError("credentials cannot be pickled (the key never leaves the host process)")

    def __copy__(self) -> "SecretRef":
        return self

    def __deepcopy__(self, memo: dict) -> "SecretRef":
        return self
