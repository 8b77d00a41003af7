"""One registered hook callback and what it did.

:class:`HookEntry` is a callback with the keywords its signature accepts (``params`` is an alias of
``args``), :class:`HookOutcome` its value (plain data) or its error as bounded ``Type: message``
text, and :class:`HookTimeoutError` / :class:`HookSuppressedError` what a callback that overran
its time limit, or is still being skipped for it, ends with.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from .untrusted import UnusableValue, error_text, type_name

__all__ = ["HookEntry", "HookOutcome", "HookTimeoutError", "HookSuppressedError"]


class HookTimeoutError(TimeoutError):
    """A hook callback did not return within its time limit (``plugins.hook_callback_timeout`` /
    ``plugins.hook_timeout``)."""


class HookSuppressedError(HookTimeoutError):
    """A callback skipped because it timed out less than :data:`SUPPRESSION_SECONDS` ago."""


@dataclass(frozen=True)
class HookEntry:
    """One registered callback. ``accepts`` is None when it takes ``**kwargs``."""

    hook: str
    plugin_key: str
    callback: Callable[..., Any]
    accepts: frozenset[str] | None
    wants_params: bool = False  # declares ``params`` (alias of ``args``)
    wants_args: bool = False  # declares ``args`` (alias of ``params``)
    _plans: dict = field(default_factory=dict, repr=False, compare=False)  # keyword set -> selection

    @classmethod
    def create(cls, hook: str, plugin_key: str, callback: Callable[..., Any]) -> "HookEntry":
        try:
            parameters = inspect.signature(callback).parameters.values()
        except (TypeError, ValueError):  # some builtins have no signature: pass everything
            return cls(hook, plugin_key, callback, None, True, True)
        accepts: set[str] = set()
        for p in parameters:
            if p.kind is p.VAR_KEYWORD:
                return cls(hook, plugin_key, callback, None, True, True)
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                accepts.add(p.name)
        return cls(hook, plugin_key, callback, frozenset(accepts), "params" in accepts, "args" in accepts)

    def select_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments this callback accepts, with the args/params alias applied."""
        keys = tuple(kwargs)
        plan = self._plans.get(keys)
        if plan is None:
            plan = self._plan(keys)
            if len(self._plans) < 64:  # hosts call each hook with a fixed set of keywords
                self._plans[keys] = plan
        return {target: kwargs[source] for target, source in plan}

    def _plan(self, keys: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        """(argument name, source keyword) pairs for a given set of offered keywords."""
        accepts = self.accepts
        pairs = [(k, k) for k in keys if accepts is None or k in accepts]
        names = {k for k, _ in pairs}
        if self.wants_params and "params" not in names and "args" in keys:
            pairs.append(("params", "args"))
        if self.wants_args and "args" not in names and "params" in keys:
            pairs.append(("args", "params"))
        return tuple(pairs)


class HookOutcome:
    """What one callback did: ``error`` is None on success (``value`` may be None).

    ``value`` is plain data (see :func:`.untrusted.plain`) or an opaque object;
    ``error_text`` is ``Type: message``, bounded, read under the time limit.
    """

    __slots__ = ("entry", "value", "error", "error_text")

    def __init__(self, entry: HookEntry, value: Any = None, error: BaseException | None = None,
                 text: str | None = None) -> None:
        self.entry = entry
        self.value = value
        self.error = error
        self.error_text = text if text is not None or error is None else error_text(error)

    @property
    def timed_out(self) -> bool:
        return isinstance(self.error, HookTimeoutError)

    @property
    def unreadable(self) -> bool:
        """It returned a value that could not be read (in process, or in its own process)."""
        return isinstance(self.error, UnusableValue) or getattr(type(self.error), "remote_type", None) == "UnusableValue"

    def __repr__(self) -> str:
        value = type_name(self.value) if self.value is not None else None
        return (f"HookOutcome(plugin={self.entry.plugin_key!r}, hook={self.entry.hook!r}, "
                f"value={value}, error={self.error_text!r})")
