"""Reading what plugin code returns or raises without trusting it.

Anything a plugin hands back may be hostile (an exception whose ``__str__`` raises or never
returns, a ``Mapping`` whose ``get`` raises, a gigabyte string). The host reads such values only
through these helpers: :func:`type_name`, :func:`safe_str` and :func:`error_text` give bounded
text (nothing escapes them but :class:`HostInterrupt`); :func:`plain` copies a value into exact
built-in types, or raises :class:`UnusableValue` when it is too large, too deep or raises;
:data:`SIGINT_WATCH` tells the operator's Ctrl-C from a ``KeyboardInterrupt`` a plugin raises.

Call these while the plugin's time limit still runs where there is one (a hostile ``__str__`` may
hang): :mod:`.hooks` does so for hooks and loading.
"""

from __future__ import annotations

import _signal  # signal's C functions: signal.signal/getsignal add an enum conversion costing µs
import signal
import threading
from collections.abc import Mapping
from typing import Any, Callable

__all__ = [
    "HostInterrupt",
    "UnusableValue",
    "MAX_TEXT",
    "MAX_ERROR_TEXT",
    "type_name",
    "exact_str",
    "bounded",
    "shown",
    "safe_str",
    "opaque_text",
    "error_text",
    "plain",
    "SigintWatch",
    "SIGINT_WATCH",
]

#: Characters kept of one string a plugin returns (longer ones are cut, with a marker).
MAX_TEXT = 1 << 22
#: Characters kept of an exception message (errors, logs, audit events, ``list_plugins()``).
MAX_ERROR_TEXT = 500
#: Entries (dict items, list elements) in one value a plugin returns.
MAX_ITEMS = 100_000
#: Nesting depth of one value a plugin returns.
MAX_DEPTH = 64

_TYPE_NAME = type.__dict__["__name__"]  # the real name, whatever a metaclass defines
_NONE_TYPE = type(None)


def _is_key_type(kind: type) -> bool:
    # identity tests: ``kind in (str, ...)`` would call a hostile metaclass's __eq__
    return kind is str or kind is int or kind is float or kind is bool or kind is _NONE_TYPE


class HostInterrupt(BaseException):
    """Raised by the host into plugin code to stop it (a time limit); never swallowed here."""


class UnusableValue(ValueError):
    """A value a plugin returned that cannot be read safely (too large, too deep, or reading raised)."""


def exact_str(value: str) -> str:
    """``value`` (a ``str`` or a subclass) as an exact ``str``; the subclass's methods are never called."""
    return value if type(value) is str else str.__str__(value)


def bounded(text: str, limit: int) -> str:
    """``text`` (an exact ``str``) cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def type_name(obj: Any) -> str:
    """The name of ``obj``'s class, bounded; runs no code of the object or its metaclass."""
    try:
        name = exact_str(_TYPE_NAME.__get__(type(obj)))
    except Exception:  # pragma: no cover - type.__name__ always reads
        return "object"
    return bounded(name, 100)


def shown(value: Any, limit: int = 80) -> str:
    """A bounded ``repr`` of a string (or just the type name of anything else) for messages."""
    if issubclass(type(value), str):
        return repr(bounded(exact_str(value), limit))
    return type_name(value)


def safe_str(obj: Any, limit: int = MAX_ERROR_TEXT) -> str | None:
    """``str(obj)`` as an exact, bounded ``str``; None when it raises or returns nothing usable."""
    if type(obj) is str:
        return bounded(obj, limit)
    try:
        text = str(obj)
        if not issubclass(type(text), str):  # pragma: no cover - str() guarantees a str
            return None
        return bounded(exact_str(text), limit)
    except HostInterrupt:
        raise
    except BaseException:  # a plugin's __str__ may raise anything; a real Ctrl-C is re-raised by SIGINT_WATCH
        return None


def opaque_text(obj: Any) -> str:
    """A value as bounded text (``MAX_TEXT``): its ``str()`` when that can be read, else ``<type>``."""
    text = safe_str(obj, MAX_TEXT)
    return text if text is not None else f"<{type_name(obj)}>"


def error_text(exc: BaseException, limit: int = MAX_ERROR_TEXT) -> str:
    """``Type: message`` for an exception a plugin raised; never raises (but :class:`HostInterrupt`)."""
    name = type_name(exc)
    message = safe_str(exc, limit)
    if message is None:
        return f"{name} (its message could not be read)"
    message = message.strip()
    return f"{name}: {message}" if message else name


def plain(value: Any) -> Any:
    """A copy of ``value`` made of exact built-in types (see the module docstring).

    Raises :class:`UnusableValue` when it is too large or deep, or reading it raised.
    """
    kind = type(value)
    if _is_key_type(kind):
        return value if kind is not str else bounded(value, MAX_TEXT)
    try:
        return _plain(value, 0, [MAX_ITEMS])
    except (UnusableValue, HostInterrupt):
        raise
    except BaseException as exc:  # reading plugin objects runs plugin code
        raise UnusableValue(f"reading it raised {error_text(exc)}") from None


def _plain(value: Any, depth: int, budget: list[int]) -> Any:
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float:
        return value
    if kind is str:
        return bounded(value, MAX_TEXT)
    if issubclass(kind, str):  # issubclass on a built-in class runs no plugin code
        return bounded(str.__str__(value), MAX_TEXT)
    if issubclass(kind, int):
        return int.__int__(value)  # an exact int (bool cannot be subclassed)
    if issubclass(kind, float):
        return float.__float__(value)
    if depth >= MAX_DEPTH:
        raise UnusableValue(f"it is nested deeper than {MAX_DEPTH} levels")
    if issubclass(kind, dict):
        items: Any = dict.items(value)  # the real items, whatever the subclass overrides
    elif issubclass(kind, (list, tuple)):
        iterate = list.__iter__ if issubclass(kind, list) else tuple.__iter__
        out = []
        for item in iterate(value):
            _spend(budget)
            out.append(_plain(item, depth + 1, budget))
        return out if issubclass(kind, list) else tuple(out)
    elif isinstance(value, Mapping):
        items = value.items()  # plugin code: the caller's time limit and guard apply
    else:
        return value  # opaque: consumers only type-check it
    copy: dict[Any, Any] = {}
    for key, item in items:
        _spend(budget)
        key = _plain(key, depth + 1, budget)
        if not _is_key_type(type(key)):
            raise UnusableValue(f"it has a key of type {type_name(key)} (keys must be strings or numbers)")
        copy[key] = _plain(item, depth + 1, budget)
    return copy


def _spend(budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise UnusableValue(f"it has more than {MAX_ITEMS} entries")


class SigintWatch:
    """Counts the operator's Ctrl-Cs (SIGINTs that raised ``KeyboardInterrupt``) while plugin code runs.

    ``token = watch.enter()`` before calling plugin code, ``watch.leave(token)``
    after it: ``leave`` returns True when a real SIGINT raised ``KeyboardInterrupt``
    in between, whatever the plugin did with it (caught it, swallowed it, or let
    it out). Any other ``KeyboardInterrupt`` is the plugin's own and is isolated.
    Only the main thread receives signals; elsewhere the token is -1 and
    ``leave`` is always False. The handler is installed for the outermost region
    only, wraps whatever Python handler was installed (the default raises
    ``KeyboardInterrupt``) and is restored afterwards; with ``SIG_DFL``/``SIG_IGN``
    nothing is installed (a SIGINT then never raises).
    """

    def __init__(self) -> None:
        self.raised = 0
        self._depth = 0
        self._wrapped: Callable[..., Any] | None = None
        self._handler = self._on_sigint  # one bound method, so ``getsignal() is`` works

    def enter(self) -> int:
        if threading.get_ident() != threading.main_thread().ident:
            return -1
        if self._depth == 0:
            current = _signal.getsignal(signal.SIGINT)
            if callable(current) and current is not self._handler:
                try:
                    _signal.signal(signal.SIGINT, self._handler)
                    self._wrapped = current
                except (ValueError, OSError):  # pragma: no cover - e.g. a sub-interpreter
                    self._wrapped = None
        self._depth += 1
        return self.raised

    def leave(self, token: int) -> bool:
        if token < 0:
            return False
        self._depth -= 1
        if self._depth == 0 and self._wrapped is not None:
            wrapped, self._wrapped = self._wrapped, None
            if _signal.getsignal(signal.SIGINT) is self._handler:  # unless someone replaced it meanwhile
                _signal.signal(signal.SIGINT, wrapped)
        return self.raised != token

    def _on_sigint(self, signum: int, frame: Any) -> Any:
        wrapped = self._wrapped
        if wrapped is None or wrapped is signal.default_int_handler:
            self.raised += 1
            raise KeyboardInterrupt
        try:
            return wrapped(signum, frame)
        except KeyboardInterrupt:
            self.raised += 1
            raise


#: The process's one watch (signal handlers are per process).
SIGINT_WATCH = SigintWatch()
