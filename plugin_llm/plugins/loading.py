"""Finding and loading plugins: the manager's discovery, gates, imports and load failures.

``discover_plugins()`` finds every plugin (:mod:`.discovery`), loads only those enabled in
``plugins.enabled`` (``plugins.disabled`` always wins) or, for an ``exclusive`` plugin, selected by
``<category>.provider``, and records the rest so ``list_plugins()`` can say why each is or is not
active; a ``model-provider`` is never imported. Loading means installing the Hermes SDK import hook,
importing the plugin under ``hermes_plugins.<key>`` and calling ``register(ctx)`` (or starting its
process, :mod:`.isolation.remote`); anything that goes wrong marks that plugin failed, removes whatever it
had registered, and the others load. A mixin of :class:`.manager.PluginManager`.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import re
import sys
import time
import types
from dataclasses import dataclass, field
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from typing import Any

from .context import PluginContext
from .discovery import (
    SOURCE_ENTRY_POINT,
    PluginCandidate,
    candidate_location,
    dependency_order,
    discover_all_candidates,
)
from .guarded import run_awaitable
from .hooks import call_limited
from .manifest import (
    KIND_EXCLUSIVE,
    KIND_MODEL_PROVIDER,
    KIND_PLATFORM,
    KIND_STANDALONE,
    config_schema_warnings,
    requires_hermes_error,
)
from .registry import load_order
from .settings import ISOLATION_IN_PROCESS, ISOLATION_PROCESS
from .tracebacks import frames_text, plugin_frames
from .untrusted import bounded, exact_str, type_name

_log = logging.getLogger("plugin_llm.plugins")


#: Parent package of every directory plugin's module (``hermes_plugins.<sanitised key>``).
MODULE_NAMESPACE = "hermes_plugins"


STATUS_ENABLED = "enabled"


STATUS_DISABLED = "disabled"


STATUS_NOT_ENABLED = "not enabled"


STATUS_FAILED = "failed"


#: recognised but never loaded here (a model-provider plugin)
STATUS_SKIPPED = "skipped"


STATUS_LOADING = "loading"


MODEL_PROVIDER_NOTE = ("model-provider plugin: recognised, not loaded — model routing is this host's core "
                       "(the operator picks the route, never a plugin); configure the provider under model: in "
                       "config.yaml")


#: Characters of a plugin's failure kept in ``list_plugins()``' ``error`` and the audit event.
_MAX_LOAD_ERROR = 1000


@dataclass
class PluginRecord:
    """Mutable bookkeeping for one discovered plugin."""

    candidate: PluginCandidate
    status: str = STATUS_NOT_ENABLED
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    module_name: str | None = None
    generation: int = 0
    load_ms: float | None = None
    note: str | None = None
    #: the plugin's own frames of its load failure (``file:line in func: source``), see .tracebacks
    frames: list[str] = field(default_factory=list)
    #: the plugin's process when it runs out of process (``isolation: process``, see .remote)
    remote: Any = None

    @property
    def key(self) -> str:
        return self.candidate.key


def _sanitise(key: str) -> str:
    name = re.sub(r"\W", "_", key.replace("/", "__"))
    return name if not name[:1].isdigit() else "_" + name


def purge_modules(name: str) -> None:
    if name not in sys.modules:  # a plugin's submodules never outlive its package module here
        return
    prefix = name + "."
    for mod in [m for m in sys.modules if m == name or m.startswith(prefix)]:
        del sys.modules[mod]


def _ensure_namespace() -> None:
    if MODULE_NAMESPACE not in sys.modules:
        ns = types.ModuleType(MODULE_NAMESPACE, "Namespace of directory plugins loaded by plugin_llm.")
        ns.__path__ = []  # a package with no location of its own: children are loaded explicitly
        sys.modules[MODULE_NAMESPACE] = ns


def _module_dir(module: Any) -> Path | None:
    filename = getattr(module, "__file__", None)
    return Path(filename).resolve().parent if filename else None


def _is_missing_hermes_module(error: BaseException) -> bool:
    from plugin_llm.compat.hermes.finder import HermesModuleMissing  # on first use: the isolated child starts light

    return type(error) is HermesModuleMissing


def _register_entry_point_dir(key: str, entry_point: Any, home: Path) -> None:
    """The directory of a pip plugin's package counts as plugin code for the Hermes SDK hook."""
    from importlib.util import find_spec

    from plugin_llm.compat.hermes import finder  # on first use: the isolated child starts light

    top = str(getattr(entry_point, "value", "")).partition(":")[0].partition(".")[0].strip()
    try:
        spec = find_spec(top) if top else None
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None) if spec is not None else None
    if origin:
        finder.register_plugin(key, Path(origin).parent, top, home)


def _distribution_installed(requirement: str) -> bool:
    """Whether the distribution a requirement string names is installed (its version is not checked;
    a requirement whose name cannot be read counts as installed)."""
    import importlib.metadata

    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]{0,200})", requirement)
    if match is None:
        return True
    try:
        importlib.metadata.distribution(match.group(1))
    except importlib.metadata.PackageNotFoundError:
        return False
    except Exception:
        return True
    return True


class _LoadError(Exception):
    """A plugin that cannot be loaded for a reason we can state precisely."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LoadingMixin:
    """Discovery and loading.

    The state it uses (made by ``PluginManager.__init__``): ``_discover_lock``, ``_discovered``,
    ``_entry_points``, ``_generation``, ``_records``, ``_settings``, ``home``, ``project_dir``.
    """

    def discover_plugins(self, force: bool = False) -> None:
        """Find every plugin and load the enabled ones. Idempotent; ``force=True``
        unloads everything (registrations and modules) and starts over."""
        with self._discover_lock:
            if self._discovered and not force:
                return
            if self._discovered:
                self._unload_all()
            self._generation += 1
            settings = self._settings.current()
            candidates = discover_all_candidates(self.home, self.project_dir, self._entry_points)
            listed = {id(c): i for i, c in enumerate(candidates)}  # listings keep the discovery order
            candidates = load_order(candidates, self.home)  # a clashing name stays with the plugin there first
            candidates, order_warnings = dependency_order(candidates)  # requires_plugins load first
            for warning in order_warnings:
                self._say_once(warning)
            self._prepare_compat(candidates)
            for candidate in candidates:
                key = candidate.key
                record = PluginRecord(candidate, generation=self._generation)
                # Several plugins claiming one key all fail (discovery); each is still listed.
                record_id = key if key not in self._records else f"{key}@{candidate_location(candidate)}"
                self._records[record_id] = record
                kind = candidate.manifest.kind if candidate.manifest is not None else KIND_STANDALONE
                if candidate.manifest is not None:
                    record.warnings.extend(candidate.manifest.notes)
                if candidate.error is not None:
                    self._mark_failed(record, candidate.error)
                elif settings.is_disabled(key, candidate.name):
                    record.status = STATUS_DISABLED
                elif kind == KIND_MODEL_PROVIDER:
                    record.status, record.note = STATUS_SKIPPED, MODEL_PROVIDER_NOTE
                elif settings.is_enabled(key, candidate.name) or (
                    kind == KIND_EXCLUSIVE and settings.is_selected(key, candidate.name)
                ):
                    refusal = requires_hermes_error(candidate.manifest) if candidate.manifest is not None else None
                    if refusal is not None:  # never imported
                        self._mark_failed(record, refusal)
                        continue
                    self._preload_warnings(record)
                    self._load(record)
                else:
                    record.status = STATUS_NOT_ENABLED
                    if kind == KIND_EXCLUSIVE:
                        category = key.rpartition("/")[0] or "memory"
                        setting = "context.engine" if category == "context_engine" else f"{category}.provider"
                        record.note = (f"exclusive plugin: select it with {setting}: "
                                       f"{key.rpartition('/')[2]} in config.yaml")
            self._records = dict(sorted(self._records.items(), key=lambda item: listed[id(item[1].candidate)]))
            self._discovered = True
            loaded = sum(1 for r in self._records.values() if r.status == STATUS_ENABLED)
            _log.debug("plugins: %d found, %d loaded from %s", len(self._records), loaded, self.home)

    def _preload_warnings(self, record: PluginRecord) -> None:
        """Hermes's advisory manifest checks before a load (warnings, never a refusal): a
        ``requires_plugins`` entry that is not loaded, a ``python_dependencies`` requirement that is
        not installed (never installed here), settings that do not match ``config_schema``."""
        manifest = record.candidate.manifest
        assert manifest is not None
        warnings: list[str] = []
        loaded = {r.key for r in self._records.values() if r.status == STATUS_ENABLED}
        loaded |= {r.candidate.name for r in self._records.values() if r.status == STATUS_ENABLED}
        for dep in manifest.requires_plugins:
            if dep.id not in loaded:
                warnings.append(f"requires plugin '{dep.id}', which is not loaded (not installed or not enabled); "
                                f"loading anyway (enable it with: plugin-llm plugins enable {dep.id})")
        for requirement in manifest.python_dependencies:
            if not _distribution_installed(requirement):
                warnings.append(f"python dependency '{requirement}' is not installed; this host never installs "
                                "plugin dependencies (install it into the host's environment)")
        if manifest.config_schema:
            warnings += config_schema_warnings(record.key, manifest.config_schema, self._plugin_settings(record.key))
        for warning in warnings:
            record.warnings.append(warning)
            _log.warning("plugin %s: %s", record.key, warning)

    def _plugin_settings(self, key: str) -> Any:
        """``plugins.entries.<key>.settings`` as written in config.yaml (None when absent or unreadable)."""
        try:
            raw = self._settings._config_source().current().raw
            return raw["plugins"]["entries"][key]["settings"]
        except Exception:
            return None

    def _prepare_compat(self, candidates: list[PluginCandidate]) -> None:
        """Install the Hermes SDK import hook for this home's plugins (before any plugin code runs)."""
        from plugin_llm.compat.hermes import _home, finder  # on first use: the isolated child starts light

        _home.set_active_home(self.home)
        roots = [self.home / "plugins"]
        if self.project_dir is not None:
            roots.append(self.project_dir / ".hermes" / "plugins")
        finder.set_plugin_roots(roots, [c.key for c in candidates])  # failed ones too: never importable
        finder.install()

    def isolation_of(self, record: PluginRecord) -> str:
        """``process`` when the operator (``plugins.entries.<key>.isolation``) or the manifest
        (``isolation: process``) asks for it; the manifest can only ask for more isolation."""
        manifest = record.candidate.manifest
        if self._settings.current().entry(record.key).isolation == ISOLATION_PROCESS:
            return ISOLATION_PROCESS
        if manifest is not None and manifest.isolation == ISOLATION_PROCESS:
            return ISOLATION_PROCESS
        return ISOLATION_IN_PROCESS

    def _load_remote(self, record: PluginRecord) -> None:
        """Load an ``isolation: process`` plugin in its own process (see :mod:`.isolation.remote`)."""
        from .isolation.remote import RemoteLoadError, RemotePlugin  # on first use: the isolated child starts light

        candidate = record.candidate
        assert candidate.manifest is not None
        record.status = STATUS_LOADING
        started = time.perf_counter()
        if candidate.path is None:
            record.load_ms = 0.0
            self._mark_failed(record, f"{ISOLATION_PROCESS} isolation needs a directory plugin; the entry point "
                                      f"{candidate.entry_point.value} runs in process only (remove "
                                      f"plugins.entries.{record.key}.isolation)")
            return
        record.module_name = self._module_name(record.key, candidate.path)
        remote = record.remote = RemotePlugin(self, record, self._settings.current().limits_for(record.key))
        ctx = PluginContext(self, candidate.manifest, candidate.path, record.generation)
        try:
            remote.load(ctx, self._hook_timeout())
        except RemoteLoadError as exc:
            record.status = STATUS_FAILED
            self._discard(record)
            hint = "; raise plugins.hook_timeout in config.yaml if it needs longer" if exc.timed_out else ""
            self._mark_failed(record, exc.message + hint)
            return
        except KeyboardInterrupt:
            record.status, record.error = STATUS_FAILED, "loading was interrupted (Ctrl-C)"
            self._discard(record)
            raise
        finally:
            record.load_ms = (time.perf_counter() - started) * 1000
        record.status = STATUS_ENABLED

    def _remote_failed(self, key: str, message: str | None) -> None:
        """An isolated plugin whose process kept failing: its registrations go, it is listed as failed."""
        record = self._records.get(key)
        if record is None:
            return
        record.status, record.error = STATUS_FAILED, bounded(exact_str(message or "its process failed"), _MAX_LOAD_ERROR)
        self._unregister(key)

    def shutdown(self) -> None:
        """Stop the processes of the plugins running out of process (the registrations stay listed)."""
        for record in list(self._records.values()):
            if record.remote is not None:
                record.remote.stop()

    def _load(self, record: PluginRecord) -> None:
        """Import the plugin and call ``register(ctx)``, isolated and under ``plugins.hook_timeout``.

        Whatever goes wrong (an exception or any other BaseException, a hang)
        marks the plugin failed; only the operator's Ctrl-C propagates.
        """
        candidate = record.candidate
        assert candidate.manifest is not None

        if self.isolation_of(record) == ISOLATION_PROCESS:
            return self._load_remote(record)
        record.status = STATUS_LOADING
        started = time.perf_counter()
        timeout = self._hook_timeout()
        registering = [False]
        where = candidate.path / "__init__.py" if candidate.path else candidate.entry_point.value

        def load() -> None:  # plugin code from here on: runs under the time limit
            register, plugin_dir = self._import(record)
            if register is None:
                raise _LoadError(f"no register() function (expected register(ctx) in {where})")
            if not callable(register):
                raise _LoadError(f"register is not callable ({type_name(register)})")
            ctx = PluginContext(self, candidate.manifest, plugin_dir, record.generation)
            registering[0] = True
            result = register(ctx)
            if result is not None and inspect.isawaitable(result):
                run_awaitable(result)

        try:
            outcome = call_limited("register", record.key, load, timeout)
        except KeyboardInterrupt:  # the operator's Ctrl-C: leave nothing half-registered, then stop
            record.status, record.error = STATUS_FAILED, "loading was interrupted (Ctrl-C)"
            self._discard(record)
            raise
        finally:
            record.load_ms = (time.perf_counter() - started) * 1000
        error = outcome.error
        if error is None:
            record.status = STATUS_ENABLED
            return
        record.status = STATUS_FAILED  # first: a register() still running on a worker is refused from now on
        self._discard(record)
        if type(error) is _LoadError:
            self._mark_failed(record, error.message)
        elif outcome.timed_out:
            text = str(error) if registering[0] else str(error).replace("did not return", "did not finish", 1)
            what = f"register() {text}" if registering[0] else f"importing {where} {text}"
            self._mark_failed(record, f"{what}; raise plugins.hook_timeout in config.yaml if it needs longer")
        elif not registering[0] and _is_missing_hermes_module(error) and candidate.manifest.kind == KIND_PLATFORM:
            self._mark_failed(record, (
                f"platform plugin: needs Hermes's messaging gateway, which plugin-llm does not provide "
                f"(it imports {bounded(exact_str(str(getattr(error, 'name', '') or '?')), 100)})"))
        else:
            phase = "register() raised" if registering[0] else "import failed"
            self._mark_failed(record, f"{phase}: {outcome.error_text}", exc_info=error)

    def _discard(self, record: PluginRecord) -> None:
        """Remove what a plugin that failed to load registered, and its modules."""
        from plugin_llm.compat.hermes import finder  # on first use: the isolated child starts light

        self._unregister(record.key)
        if record.remote is not None:
            record.remote.stop()
        finder.unregister_plugin(record.key, record.candidate.path)
        if record.module_name:
            purge_modules(record.module_name)
            record.module_name = None

    def _import(self, record: PluginRecord) -> tuple[Any, Path | None]:
        """The plugin's ``register`` (or None) and its directory."""
        candidate = record.candidate
        if candidate.source == SOURCE_ENTRY_POINT:
            _register_entry_point_dir(record.key, candidate.entry_point, self.home)
            target = candidate.entry_point.load()
            if isinstance(target, types.ModuleType):
                return getattr(target, "register", None), _module_dir(target)
            if callable(target):
                return target, _module_dir(sys.modules.get(getattr(target, "__module__", ""), None))
            raise _LoadError(
                f"entry point {candidate.entry_point.value!r} must name a register(ctx) callable "
                f"or a module with register(), got {type(target).__name__}"
            )
        path = candidate.path
        assert path is not None
        init = path / "__init__.py"
        if not init.is_file():
            raise _LoadError(f"{path}: no __init__.py (a directory plugin is a Python package with register(ctx))")
        module_name = self._module_name(record.key, path)
        record.module_name = module_name
        purge_modules(module_name)  # a forced re-discovery re-executes the plugin's code
        _ensure_namespace()
        spec = spec_from_file_location(module_name, init, submodule_search_locations=[str(path)])
        if spec is None or spec.loader is None:  # pragma: no cover - a file path always has a loader
            raise _LoadError(f"cannot import {init}")
        module = module_from_spec(spec)
        sys.modules[module_name] = module
        from plugin_llm.compat.hermes import finder  # on first use: the isolated child starts light

        finder.register_plugin(record.key, path, module_name, self.home)  # its code may import Hermes SDK modules
        spec.loader.exec_module(module)
        return getattr(module, "register", None), path

    @staticmethod
    def _module_name(key: str, path: Path) -> str:
        """``hermes_plugins.<key>``, suffixed with a path hash if another directory already uses it."""
        base = f"{MODULE_NAMESPACE}.{_sanitise(key)}"
        existing = sys.modules.get(base)
        if existing is None or getattr(existing, "__file__", None) == str(path / "__init__.py"):
            return base
        if _module_dir(existing) == path.resolve():
            return base
        return f"{base}_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:10]}"

    def _mark_failed(self, record: PluginRecord, message: str, exc_info: BaseException | None = None) -> None:
        message = bounded(exact_str(message), _MAX_LOAD_ERROR)
        frames = plugin_frames(exc_info, record.candidate.path)  # the plugin's own frames: plugins info, audit, --debug
        record.status = STATUS_FAILED
        record.error, record.frames = message, frames
        _log.warning("plugin %s failed to load: %s", record.key, message)
        if frames:
            _log.debug("plugin %s failed to load:%s", record.key, frames_text(exc_info, record.candidate.path))
        self._audit("plugin_load_failed", plugin_id=record.key, key=record.key, source=record.candidate.source,
                    error=message, **({"frames": frames} if frames else {}))
