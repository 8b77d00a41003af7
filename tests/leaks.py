"""Leak checks shared by the credential tests."""

from __future__ import annotations

import types


def strings_reachable(obj, _seen=None):
    """Every str reachable through vars()/__slots__/containers (not through functions or modules)."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, str):
        yield obj
        return
    if isinstance(obj, bytes):
        yield obj.decode("latin-1")
        return
    if obj is None or isinstance(obj, (int, float, bool, type, types.ModuleType, types.FunctionType,
                                       types.MethodType, types.BuiltinFunctionType)):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from strings_reachable(k, seen)
            yield from strings_reachable(v, seen)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from strings_reachable(v, seen)
        return
    if hasattr(obj, "__dict__"):
        yield from strings_reachable(vars(obj), seen)
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                yield from strings_reachable(getattr(obj, slot), seen)
