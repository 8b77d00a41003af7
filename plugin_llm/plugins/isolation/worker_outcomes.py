"""In an isolated plugin's child: what the plugin's calls come to, as the host and the plugin see it.

An awaitable the plugin returned is run to its value (:func:`_resolved`); an exception it raised
is described for the host by class name, message and kind (:func:`describe_error`, read defensively:
the plugin's object may lie about itself); an error the host answered with is raised as the class
the plugin would see in process (:func:`_host_exception`). Imports only what the child starts with.
"""

from __future__ import annotations

import inspect
from typing import Any

#: Characters of an error message sent to the host.
_MAX_ERROR = 2000


def _type_name(obj: Any) -> str:
    try:
        name = type.__dict__["__name__"].__get__(type(obj))
        return str.__str__(name)[:100] if isinstance(name, str) else "object"
    except Exception:  # pragma: no cover
        return "object"


def _text(obj: Any, limit: int = _MAX_ERROR) -> str:
    try:
        text = str(obj)
        return str.__str__(text)[:limit] if isinstance(text, str) else ""
    except BaseException:
        return "(its message could not be read)"


def describe_error(exc: BaseException) -> dict[str, Any]:
    """What the host learns of an exception raised here: its class name, message and kind."""
    info: dict[str, Any] = {"type": _type_name(exc), "message": _text(exc),
                            "base": "exception" if isinstance(exc, Exception) else "base"}
    for attr in ("status", "provider", "retryable", "plugin_id", "config_key"):
        value = getattr(exc, attr, None) if isinstance(exc, Exception) else None
        if value is None or type(value) in (str, int, bool):
            if value is not None:
                info.setdefault("attrs", {})[attr] = value
    return info


def _resolved(value: Any) -> Any:
    """``value``, or what it resolves to when the plugin's function was async (run on a fresh event loop)."""
    if value is None or not inspect.isawaitable(value):
        return value
    import asyncio

    async def _await() -> Any:
        return await value

    return asyncio.run(_await())


# --- errors coming back from the host ---------------------------------------------------

_EXCEPTIONS: dict[str, type] = {}


def _host_exception(info: dict[str, Any]) -> BaseException:
    """The host's error as the exception class the plugin would see in process (by name)."""
    name = info.get("type") if type(info.get("type")) is str else "RuntimeError"
    message = info.get("message") if type(info.get("message")) is str else ""
    from plugin_llm import errors, wire  # on first use: the isolated child starts light

    if name in errors.__all__:  # a gateway error, with its fields, through the one codec
        return wire.decode_error(info)
    import builtins

    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception) and builtin.__module__ == "builtins":
        try:
            return builtin(message)
        except Exception:
            pass
    cls = _EXCEPTIONS.get(name)
    if cls is None and name.isidentifier():
        cls = _EXCEPTIONS[name] = type(name, (RuntimeError,), {})
    return (cls or RuntimeError)(message)
