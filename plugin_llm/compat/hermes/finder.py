"""The import hook serving :mod:`plugin_llm.compat.hermes` to plugin code under Hermes's names.

:func:`install` puts one :class:`HermesCompatFinder` at the front of ``sys.meta_path``
(idempotent). For a module of a Hermes package (:data:`~.HERMES_TOP_LEVEL`) it does nothing when
real Hermes is importable or the import does not come from plugin code; else it serves the
compatible module object itself (:data:`~.SERVED`), resolves ``plugins.<key path>[.<module>]`` to
the loaded plugin and ``plugins.<category>`` to the plugin roots, and fails any other Hermes
module with a one-line ``ModuleNotFoundError`` naming the subsystem it needs.

The finder never runs plugin code and raises nothing but ``ModuleNotFoundError``; what it serves
runs inside the plugin's own call, under its time limit and isolation.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import HERMES_TOP_LEVEL, SERVED, subsystem_of

__all__ = ["HermesCompatFinder", "install", "uninstall", "register_plugin", "unregister_plugin",
           "set_plugin_roots", "real_hermes_available", "HermesModuleMissing"]

_THIS_FILE = __file__
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: the served names that are packages
_PACKAGES = frozenset({"agent", "tools", "hermes_cli"})
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__)) + os.sep
_lock = threading.Lock()


class HermesModuleMissing(ModuleNotFoundError):
    """A plugin imported a Hermes module this host does not provide."""


@dataclass(frozen=True)
class _Plugin:
    key: str
    path: str  # resolved directory, with a trailing separator
    module_name: str  # the manager's module name (hermes_plugins.<key>)
    home: Path | None = None  # the home of the manager that loaded it


_plugins: dict[str, _Plugin] = {}  # dotted key path ("memory.honcho") -> plugin
_dirs: dict[str, _Plugin] = {}  # plugin directory -> plugin
_known: dict[str, str] = {}  # dotted key path -> key, for every discovered plugin (loaded or not)
_roots: tuple[str, ...] = ()
_real: bool | None = None


def real_hermes_available() -> bool:
    """True when the real Hermes packages are importable (then nothing here is served)."""
    global _real
    if _real is None:
        try:
            _real = importlib.machinery.PathFinder.find_spec("hermes_cli") is not None and \
                importlib.machinery.PathFinder.find_spec("agent") is not None
        except (ImportError, ValueError):
            _real = False
    return _real


def _dotted(key: str) -> str | None:
    parts = key.split("/")
    return ".".join(parts) if all(p.isidentifier() for p in parts) else None


def register_plugin(key: str, path: Path, module_name: str, home: Path | None = None) -> None:
    """A plugin being loaded: its directory is plugin code, ``plugins.<key>`` is its package,
    ``home`` the home its SDK calls act on (``get_hermes_home()``)."""
    resolved = os.path.realpath(path) + os.sep
    entry = _Plugin(key, resolved, module_name, Path(home) if home is not None else None)
    with _lock:
        _dirs[resolved] = entry
        dotted = _dotted(key)
        if dotted is not None:
            _plugins[dotted] = entry


def unregister_plugin(key: str, path: Path | None = None) -> None:
    with _lock:
        dotted = _dotted(key)
        if dotted is not None and dotted in _plugins:
            entry = _plugins.pop(dotted)
            _dirs.pop(entry.path, None)
        if path is not None:
            _dirs.pop(os.path.realpath(path) + os.sep, None)


def set_plugin_roots(roots: list[Path], keys: list[str]) -> None:
    """The plugin roots scanned (``plugins`` maps onto them) and every key discovered."""
    global _roots
    with _lock:
        _roots = tuple(str(r) for r in roots if Path(r).is_dir())
        for key in keys:
            dotted = _dotted(key)
            if dotted is not None:
                _known[dotted] = key


def _plugin_frame() -> bool:
    """Is the import being made by plugin code (a registered plugin directory, or this package)?"""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename == _THIS_FILE or filename.startswith("<frozen importlib") or filename.startswith(_IMPORTLIB_DIR):
            frame = frame.f_back
            continue
        if filename.startswith(_PACKAGE_DIR):
            return True
        real = os.path.realpath(filename) if not filename.startswith("<") else filename
        return any(real.startswith(d) for d in list(_dirs))
    return False


def caller_home() -> Path | None:
    """The home of the plugin whose code is running on this thread (the nearest plugin frame)."""
    entry = _caller()
    return entry.home if entry is not None else None


def caller_plugin_key() -> str | None:
    """The key of the plugin whose code is running on this thread (the nearest plugin frame)."""
    entry = _caller()
    return entry.key if entry is not None else None


def _caller() -> _Plugin | None:
    frame = sys._getframe(2)
    dirs = list(_dirs.items())
    if not dirs:
        return None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(("<", _PACKAGE_DIR)):
            for directory, entry in dirs:
                if filename.startswith(directory) or os.path.realpath(filename).startswith(directory):
                    return entry
        frame = frame.f_back
    return None


class _AliasLoader:
    """Loads a name as an existing module (``agent.x`` -> the compat module; ``plugins.k.m`` -> the plugin's)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: Any) -> types.ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _PackageLoader:
    """An empty package whose children are found on ``path`` (``plugins``, ``plugins.<category>``)."""

    def __init__(self, path: list[str]) -> None:
        self.path = path

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name, "Plugins of this host under their Hermes package path.")
        module.__path__ = list(self.path)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _missing(name: str, message: str) -> HermesModuleMissing:
    return HermesModuleMissing(message, name=name)


class HermesCompatFinder:
    """See the module docstring."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.partition(".")[0]
        if top not in HERMES_TOP_LEVEL:
            return None
        if top == "plugins":
            return self._plugins_spec(fullname)
        if real_hermes_available() or not _plugin_frame():
            return None
        served = SERVED.get(fullname)
        if served is not None:
            return importlib.util.spec_from_loader(fullname, _AliasLoader(served), is_package=fullname in _PACKAGES)
        raise _missing(fullname, f"this plugin needs Hermes's {subsystem_of(fullname)} ({fullname}), "
                                 "which plugin-llm does not provide")

    def _plugins_spec(self, fullname: str) -> Any:
        rest = fullname.split(".")[1:]
        with _lock:
            plugins, known, roots = dict(_plugins), dict(_known), _roots
        for n in range(len(rest), 0, -1):  # the longest key path that is a plugin
            dotted = ".".join(rest[:n])
            entry = plugins.get(dotted)
            if entry is not None:
                target = ".".join([entry.module_name, *rest[n:]])
                if n == len(rest):
                    is_package = True
                else:
                    try:
                        found = importlib.util.find_spec(target)
                    except (ImportError, ValueError):
                        found = None
                    if found is None:
                        return None  # the path finder reports it missing, as for any module
                    is_package = found.submodule_search_locations is not None
                return importlib.util.spec_from_loader(fullname, _AliasLoader(target), is_package=is_package)
            if dotted in known:
                if not _plugin_frame():
                    return None
                raise _missing(fullname, f"{fullname} belongs to plugin '{known[dotted]}', which is not loaded "
                                         f"(enable it: plugin-llm plugins enable {known[dotted]})")
        if real_hermes_available() or not _plugin_frame():
            return None
        if not rest:
            return importlib.util.spec_from_loader(fullname, _PackageLoader(list(roots)), is_package=True)
        if len(rest) == 1:
            dirs = [os.path.join(r, rest[0]) for r in roots if os.path.isdir(os.path.join(r, rest[0]))]
            if dirs:
                return importlib.util.spec_from_loader(fullname, _PackageLoader(dirs), is_package=True)
        return None  # a shared file of a root or category (plugins/plugin_utils.py): the path finder


_finder = HermesCompatFinder()


def install() -> None:
    """Put the finder at the front of ``sys.meta_path`` (once)."""
    with _lock:
        if not any(type(f) is HermesCompatFinder for f in sys.meta_path):
            sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    with _lock:
        sys.meta_path[:] = [f for f in sys.meta_path if type(f) is not HermesCompatFinder]
