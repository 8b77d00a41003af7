"""``PluginManager``: discover, gate, load and isolate plugins; run their hooks, tools and commands.

One manager per home (``get_plugin_manager``). ``discover_plugins()`` finds every plugin
(:mod:`.discovery`), loads only those enabled in ``plugins.enabled`` (``plugins.disabled`` always
wins) or, for an ``exclusive`` plugin, selected by ``<category>.provider``, and records the rest
so ``list_plugins()`` can say why each is or is not active; a ``model-provider`` is never
imported. Loading means installing the Hermes SDK import hook, importing the plugin under
``hermes_plugins.<key>`` and calling ``register(ctx)``; anything that goes wrong marks that plugin
failed, removes whatever it had registered, and the others load.

``dispatch_tool`` is the host's one tool execution path: pre_tool_call guards (fail closed) ->
handler -> transform_tool_result -> post_tool_call.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import re
import sys
import threading
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable

from .context import PluginContext
from .discovery import (
    SOURCE_ENTRY_POINT,
    PluginCandidate,
    candidate_location,
    dependency_order,
    discover_all_candidates,
)
from .manifest import (
    KIND_EXCLUSIVE,
    KIND_MODEL_PROVIDER,
    KIND_PLATFORM,
    KIND_STANDALONE,
    config_schema_warnings,
    requires_hermes_error,
)
from .engines import ContextEngine, MemoryProvider
from .hooks import FAIL_CLOSED_HOOKS, HookEntry, HookOutcome, HookRunner, call_limited
from .middleware import REQUEST_KINDS, RUN_KINDS, MiddlewareEntry, apply_requests, run_chain
from .untrusted import (
    MAX_TEXT,
    SIGINT_WATCH,
    UnusableValue,
    bounded,
    error_text,
    exact_str,
    plain,
    safe_str,
    shown,
    type_name,
)
from .tracebacks import FailureReporter, frames_text, plugin_dir_of, plugin_frames, release_frames
from .registry import (
    load_order,
    BUILTIN_COMMANDS,
    CliCommandEntry,
    CommandEntry,
    PlatformEntry,
    PluginRegistry,
    ProviderEntry,
    SkillEntry,
    ToolEntry,
    normalize_command_name,
)
from .settings import BUILTIN_CONTEXT_ENGINES, BUILTIN_MEMORY_PROVIDERS, PluginSettings, SettingsSource, default_home

__all__ = ["PluginManager", "BUILTIN_COMMANDS", "UnknownCommandError", "PluginCommandError", "MODULE_NAMESPACE"]

_log = logging.getLogger("plugin_llm.plugins")

#: Parent package of every directory plugin's module (``hermes_plugins.<sanitised key>``).
MODULE_NAMESPACE = "hermes_plugins"

STATUS_ENABLED = "enabled"
STATUS_DISABLED = "disabled"
STATUS_NOT_ENABLED = "not enabled"
STATUS_FAILED = "failed"
#: recognised but never loaded here (a model-provider plugin)
STATUS_SKIPPED = "skipped"
_STATUS_LOADING = "loading"
MODEL_PROVIDER_NOTE = ("model-provider plugin: recognised, not loaded — model routing is this host's core "
                       "(the operator picks the route, never a plugin); configure the provider under model: in "
                       "config.yaml")


class UnknownCommandError(LookupError):
    """``run_command``/``arun_command`` for a name no plugin registered."""


class PluginCommandError(RuntimeError):
    """A command handler raised something that is not an ``Exception`` (``SystemExit``,
    its own ``KeyboardInterrupt``, ...); the message names the command and plugin."""


#: Characters of a plugin's failure kept in ``list_plugins()``' ``error`` and the audit event.
_MAX_LOAD_ERROR = 1000


@dataclass
class _PluginRecord:
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


_error_text = error_text  # every exception from plugin code is formatted without trusting it


def _sanitise(key: str) -> str:
    name = re.sub(r"\W", "_", key.replace("/", "__"))
    return name if not name[:1].isdigit() else "_" + name


def _purge_modules(name: str) -> None:
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
    from plugin_llm.compat.hermes.finder import HermesModuleMissing

    return type(error) is HermesModuleMissing


def _register_entry_point_dir(key: str, entry_point: Any, home: Path) -> None:
    """The directory of a pip plugin's package counts as plugin code for the Hermes SDK hook."""
    from importlib.util import find_spec

    from plugin_llm.compat.hermes import finder

    top = str(getattr(entry_point, "value", "")).partition(":")[0].partition(".")[0].strip()
    try:
        spec = find_spec(top) if top else None
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None) if spec is not None else None
    if origin:
        finder.register_plugin(key, Path(origin).parent, top, home)


def _run_awaitable(awaitable: Any) -> Any:
    """Run an awaitable to completion from sync code, even if this thread runs an event loop."""

    import asyncio  # deferred: listing plugins never needs an event loop

    async def _await() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await())
    box: dict[str, Any] = {}

    def _in_thread() -> None:
        try:
            box["value"] = asyncio.run(_await())
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=_in_thread, name="plugin-await", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


#: what a transform_api_error_classification verdict may carry (Hermes's ClassifiedError fields)
_CLASSIFICATION_FIELDS = ("reason", "retryable", "should_compress", "should_rotate_credential", "should_fallback",
                          "message", "error_context")


def _fail_closed_message(hook: str, outcome: HookOutcome) -> str:
    """Hermes's block directive text for a fail-closed hook whose callback gave no decision."""
    if outcome.timed_out:
        return f"{hook} plugin callback timed out or is still running"
    callback = getattr(outcome.entry.callback, "__name__", None)
    name = exact_str(callback) if issubclass(type(callback), str) else type_name(outcome.entry.callback)
    return f"{hook} plugin callback {bounded(name, 100)} raised {bounded(outcome.error_text or '', 240)}"


def _home_profile_name(home: Path) -> str:
    """Hermes's profile name of a home directory (``hermes_cli.profiles.get_active_profile_name``)."""
    try:
        resolved = home.expanduser().resolve()
        default = (Path.home() / ".hermes").resolve()
    except (OSError, RuntimeError):
        return "custom"
    if resolved == default:
        return "default"
    if resolved.parent == default / "profiles" and re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", resolved.name):
        return resolved.name
    return "custom"


def _manifest_v2_fields(manifest: Any) -> dict[str, Any]:
    """The manifest v2 fields of a listing (empty values without a manifest)."""
    if manifest is None:
        return {"manifest_version": 1, "api_version": None, "requires_hermes": "", "requires_plugins": [],
                "python_dependencies": [], "config_schema": {}, "license": "", "homepage": "", "tags": [],
                "emits": [], "listens": []}
    return {
        "manifest_version": manifest.manifest_version, "api_version": manifest.api_version,
        "requires_hermes": manifest.requires_hermes,
        "requires_plugins": [{"id": d.id, "version_range": d.version_range} for d in manifest.requires_plugins],
        "python_dependencies": list(manifest.python_dependencies),
        "config_schema": {k: dict(v) for k, v in manifest.config_schema.items()},
        "license": manifest.license, "homepage": manifest.homepage, "tags": list(manifest.tags),
        "emits": list(manifest.emits), "listens": list(manifest.listens),
    }


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


def _tool_error(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


def _readable_action(action: Any) -> bool:
    """A guard's ``action`` the host can read: absent/None (no verdict) or a string."""
    return action is None or type(action) is str


def _guarded(fn: Callable[..., Any], *args: Any) -> tuple[Any, BaseException | None]:
    """``fn(*args)`` (plugin code, on this thread): ``(value, None)`` or ``(None, what it raised)``.

    Nothing escapes but the operator's Ctrl-C, which is re-raised even when the
    plugin swallowed it; a ``KeyboardInterrupt`` the plugin raises itself is returned.
    """
    sigint = SIGINT_WATCH.enter()
    try:
        value, error = fn(*args), None
    except BaseException as exc:
        value, error = None, exc
    finally:
        interrupted = SIGINT_WATCH.leave(sigint)
    if interrupted:
        raise KeyboardInterrupt
    return value, error


async def _aguarded(awaitable: Any) -> tuple[Any, BaseException | None]:
    """:func:`_guarded` for an awaitable run on this loop; the host cancelling this task propagates."""
    import asyncio

    sigint = SIGINT_WATCH.enter()
    try:
        value, error = await awaitable, None
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # a real cancellation of the host's task
            raise
        value, error = None, exc  # raised by the plugin itself
    except BaseException as exc:
        value, error = None, exc
    finally:
        interrupted = SIGINT_WATCH.leave(sigint)
    if interrupted:
        raise KeyboardInterrupt
    return value, error


def _opaque_text(obj: Any) -> str:
    text = safe_str(obj, MAX_TEXT)
    return text if text is not None else f"<{type_name(obj)}>"


def _tool_text(result: Any) -> str:
    """A tool handler's return value as the result string: strings as they are, other values
    JSON-encoded; read as plain data (see :mod:`.untrusted`), bounded to ``MAX_TEXT``."""
    if type(result) is str:
        return bounded(result, MAX_TEXT)
    result = plain(result)
    if type(result) is str:
        return result
    try:
        text = json.dumps(result, ensure_ascii=False, default=_opaque_text)
    except (TypeError, ValueError):  # e.g. an int too long to print
        text = _opaque_text(result)
    return bounded(text, MAX_TEXT)


def _tool_args_payload(value: Any) -> dict[str, Any]:
    """Arguments a ``tool_execution`` middleware hands to ``next_call``: a JSON object, as plain data."""
    value = plain(value)
    if type(value) is not dict:
        raise ValueError(f"tool arguments must be a dict, got {type_name(value)}")
    return value


def _tool_result_value(value: Any) -> str:
    """A ``tool_execution`` middleware's result as the tool's result string."""
    if value is None:
        raise ValueError("it returned None")
    return _tool_text(value)


def _command_text(result: Any) -> str | None:
    """A command handler's return value as text (None stays None)."""
    if result is None:
        return None
    if issubclass(type(result), str):
        return bounded(exact_str(result), MAX_TEXT)
    return _opaque_text(plain(result))


def _command_failure(entry: CommandEntry, exc: BaseException) -> Exception:
    """What ``run_command`` raises for a failed handler: its own ``Exception`` unchanged (callers
    format it with ``error_text``), anything else as a :class:`PluginCommandError`."""
    if issubclass(type(exc), Exception):
        return exc  # type: ignore[return-value]
    return PluginCommandError(f"/{entry.name} (plugin {entry.plugin_key}) raised {error_text(exc)}")


def _handler_kwargs(handler: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``offered`` keyword arguments the handler's signature accepts."""
    if not offered:
        return offered
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return {}
    names = set()
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            return offered
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.add(p.name)
    return {k: v for k, v in offered.items() if k in names}


class PluginManager:
    """Discovers and loads the plugins of one home, and runs what they registered.

    ``project_dir`` is the project root whose ``.hermes/plugins/`` is scanned when
    ``HERMES_ENABLE_PROJECT_PLUGINS`` is on (default: the current directory).
    ``entry_points`` replaces ``importlib.metadata.entry_points(group=...)``
    (tests, embedding hosts).
    """

    def __init__(self, home: Path | str | None = None, *, project_dir: Path | str | None = None,
                 entry_points: Iterable[Any] | None = None, audit_events: bool = True) -> None:
        self.home: Path = Path(home).expanduser() if home is not None else default_home()
        #: write plugin_load_failed / hook_error events to the audit log (False: read-only tools like doctor)
        self._audit_events = audit_events
        self.project_dir: Path | None = Path(project_dir) if project_dir is not None else None
        self._entry_points = list(entry_points) if entry_points is not None else None
        self._settings = SettingsSource(self.home)
        self._registry = PluginRegistry()
        self._hooks = HookRunner(self._hook_timeout, self._on_hook_error, self._hook_callback_timeout)
        #: tool and middleware failures: logged and audited once each, with the plugin's frames
        self._failures = FailureReporter(_log, self._audit)
        self._records: dict[str, _PluginRecord] = {}
        self._discover_lock = threading.RLock()
        self._registry_lock = threading.Lock()
        self._discovered = False
        self._middleware: dict[str, tuple[MiddlewareEntry, ...]] = {}  # replaced, never mutated
        self._generation = 0
        #: per plugin: its on_unload callbacks and tasks (.lifecycle), released when it is unloaded
        self._holdings: dict[str, Any] = {}
        #: ctx.register_system_prompt_section entries by id (.prompt_sections); replaced, never mutated
        self._prompt_sections: dict[str, Any] = {}
        self._event_bus: Any = None  # .events.EventBus, made on first use
        self._said: set[str] = set()
        #: The host ``Session`` currently attached (``ctx.inject_message`` / ``dispatch_tool``).
        self.active_session: Any = None

    def __repr__(self) -> str:
        return f"PluginManager(home={str(self.home)!r}, plugins={len(self._records)})"

    # --- configuration ----------------------------------------------------------------

    @property
    def settings(self) -> PluginSettings:
        """The plugin view of the current config.yaml."""
        return self._settings.current()

    def _hook_timeout(self) -> float:
        return self._settings.current().hook_timeout

    def _hook_callback_timeout(self) -> float | None:
        return self._settings.current().hook_callback_timeout

    def _say_once(self, message: str, level: int = logging.WARNING) -> None:
        if message not in self._said:
            self._said.add(message)
            _log.log(level, "%s", message)

    # --- discovery and loading --------------------------------------------------------

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
                record = _PluginRecord(candidate, generation=self._generation)
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

    def _preload_warnings(self, record: _PluginRecord) -> None:
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
        from plugin_llm.compat.hermes import _home, finder

        _home.set_active_home(self.home)
        roots = [self.home / "plugins"]
        if self.project_dir is not None:
            roots.append(self.project_dir / ".hermes" / "plugins")
        finder.set_plugin_roots(roots, [c.key for c in candidates])  # failed ones too: never importable
        finder.install()

    def _unload_all(self) -> None:
        from plugin_llm.compat.hermes import finder

        for record in reversed(list(self._records.values())):  # the last loaded first, as Hermes does
            self._release(record)
        for record in self._records.values():
            if record.remote is not None:
                record.remote.stop()
            finder.unregister_plugin(record.key, record.candidate.path)
            if record.module_name:
                _purge_modules(record.module_name)
        self._records.clear()
        with self._registry_lock:
            self._registry.clear()
            self._middleware = {}
            self._prompt_sections = {}
        if self._event_bus is not None:
            self._event_bus.clear()
        self._hooks.clear()

    def unload(self, plugin: str | None = None) -> list[str]:
        """Unload one plugin (by key or manifest name) or every loaded one: its ``on_unload`` callbacks run
        (the last registered first), its tasks are cancelled, every registration of it is removed and its
        process stopped. It is listed as not enabled until the next (forced) discovery. The keys unloaded."""
        with self._discover_lock:
            records = [r for r in self._records.values() if r.status == STATUS_ENABLED and (
                plugin is None or plugin in (r.key, r.candidate.manifest.name if r.candidate.manifest else None))]
            for record in reversed(records):
                self._unload_one(record)
            return [r.key for r in records]

    def _unload_one(self, record: _PluginRecord) -> None:
        from plugin_llm.compat.hermes import finder

        record.status, record.note = STATUS_NOT_ENABLED, "unloaded (plugins are loaded again at the next discovery)"
        self._release(record)
        self._unregister(record.key)
        if record.remote is not None:
            record.remote.stop()
        finder.unregister_plugin(record.key, record.candidate.path)
        if record.module_name:
            _purge_modules(record.module_name)
            record.module_name = None

    def _events(self) -> Any:
        """The plugins' event bus (``ctx.emit`` / ``ctx.subscribe``)."""
        if self._event_bus is None:
            from .events import EventBus

            with self._registry_lock:
                if self._event_bus is None:
                    self._event_bus = EventBus(lambda sub, payload: self.call_plugin(
                        f"event {sub.event}", sub.plugin_key, sub.callback, payload))
        return self._event_bus

    def get_plugin_subscriptions(self) -> dict[str, list[str]]:
        """Event name -> the plugins subscribed to it."""
        return self._event_bus.subscriptions() if self._event_bus is not None else {}

    def _add_prompt_section(self, entry: Any, who: str) -> None:
        from .prompt_sections import MAX_SECTIONS

        with self._registry_lock:
            if entry.id in self._prompt_sections:
                raise ValueError(f"{who}: a section {entry.id!r} is already registered "
                                 f"(by plugin {self._prompt_sections[entry.id].plugin_key})")
            if len(self._prompt_sections) >= MAX_SECTIONS:
                raise ValueError(f"{who}: there are {MAX_SECTIONS} system prompt sections already (the most)")
            self._prompt_sections = {**self._prompt_sections, entry.id: entry}

    def _remove_prompt_section(self, entry: Any) -> None:
        with self._registry_lock:
            if self._prompt_sections.get(entry.id) is entry:
                self._prompt_sections = {k: v for k, v in self._prompt_sections.items() if k != entry.id}

    def render_system_prompt_sections(self, session_info: Mapping[str, Any]) -> str:
        """The plugins' system prompt sections for a new session (see :mod:`.prompt_sections`)."""
        from .prompt_sections import render

        sections = list(self._prompt_sections.values())
        if not sections:
            return ""
        return render(sections, lambda e, info: self.call_plugin(f"system prompt section {e.id}", e.plugin_key,
                                                                 e.content, info), dict(session_info))

    def _holdings_of(self, key: str) -> Any:
        """Plugin ``key``'s on_unload callbacks and tasks (created on first use)."""
        from .lifecycle import Holdings

        with self._registry_lock:
            holdings = self._holdings.get(key)
            if holdings is None:
                holdings = self._holdings[key] = Holdings(key, lambda what, fn: self._run_release(key, what, fn))
            return holdings

    def _run_release(self, key: str, what: str, fn: Callable[[], Any]) -> None:
        """One of a plugin's releases (its on_unload callback), under ``plugins.hook_timeout``; failures logged."""
        def release() -> None:
            result = fn()
            if result is not None and inspect.isawaitable(result):
                _run_awaitable(result)

        outcome = call_limited("on_unload", key, release, self._hook_timeout())
        if outcome.error is not None:
            _log.warning("plugin %s: %s %s", key, what,
                         "did not finish in time (plugins.hook_timeout)" if outcome.timed_out
                         else f"raised while it was released: {outcome.error_text}")

    def _release(self, record: _PluginRecord) -> None:
        """Run what the plugin holds until its unload: in its own process too when it runs isolated."""
        if record.remote is not None:
            record.remote.unload(self._hook_timeout())
        with self._registry_lock:
            holdings = self._holdings.pop(record.key, None)
        if holdings is not None:
            holdings.release_all()

    def isolation_of(self, record: _PluginRecord) -> str:
        """``process`` when the operator (``plugins.entries.<key>.isolation``) or the manifest
        (``isolation: process``) asks for it; the manifest can only ask for more isolation."""
        from .settings import ISOLATION_IN_PROCESS, ISOLATION_PROCESS

        manifest = record.candidate.manifest
        if self._settings.current().entry(record.key).isolation == ISOLATION_PROCESS:
            return ISOLATION_PROCESS
        if manifest is not None and manifest.isolation == ISOLATION_PROCESS:
            return ISOLATION_PROCESS
        return ISOLATION_IN_PROCESS

    def _load_remote(self, record: _PluginRecord) -> None:
        """Load an ``isolation: process`` plugin in its own process (see :mod:`.remote`)."""
        from .remote import RemoteLoadError, RemotePlugin
        from .settings import ISOLATION_PROCESS

        candidate = record.candidate
        assert candidate.manifest is not None
        record.status = _STATUS_LOADING
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

    def _load(self, record: _PluginRecord) -> None:
        """Import the plugin and call ``register(ctx)``, isolated and under ``plugins.hook_timeout``.

        Whatever goes wrong (an exception or any other BaseException, a hang)
        marks the plugin failed; only the operator's Ctrl-C propagates.
        """
        candidate = record.candidate
        assert candidate.manifest is not None
        from .settings import ISOLATION_PROCESS

        if self.isolation_of(record) == ISOLATION_PROCESS:
            return self._load_remote(record)
        record.status = _STATUS_LOADING
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
                _run_awaitable(result)

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

    def _discard(self, record: _PluginRecord) -> None:
        """Remove what a plugin that failed to load registered, and its modules."""
        from plugin_llm.compat.hermes import finder

        self._unregister(record.key)
        if record.remote is not None:
            record.remote.stop()
        finder.unregister_plugin(record.key, record.candidate.path)
        if record.module_name:
            _purge_modules(record.module_name)
            record.module_name = None

    def _import(self, record: _PluginRecord) -> tuple[Any, Path | None]:
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
        _purge_modules(module_name)  # a forced re-discovery re-executes the plugin's code
        _ensure_namespace()
        spec = spec_from_file_location(module_name, init, submodule_search_locations=[str(path)])
        if spec is None or spec.loader is None:  # pragma: no cover - a file path always has a loader
            raise _LoadError(f"cannot import {init}")
        module = module_from_spec(spec)
        sys.modules[module_name] = module
        from plugin_llm.compat.hermes import finder

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

    def _mark_failed(self, record: _PluginRecord, message: str, exc_info: BaseException | None = None) -> None:
        message = bounded(exact_str(message), _MAX_LOAD_ERROR)
        frames = plugin_frames(exc_info, record.candidate.path)  # the plugin's own frames: plugins info, audit, --debug
        record.status = STATUS_FAILED
        record.error, record.frames = message, frames
        _log.warning("plugin %s failed to load: %s", record.key, message)
        if frames:
            _log.debug("plugin %s failed to load:%s", record.key, frames_text(exc_info, record.candidate.path))
        self._audit("plugin_load_failed", plugin_id=record.key, key=record.key, source=record.candidate.source,
                    error=message, **({"frames": frames} if frames else {}))

    def _unregister(self, key: str) -> None:
        with self._registry_lock:
            holdings = self._holdings.pop(key, None)
        if holdings is not None:  # a failed register(), a failed process: its callbacks still run
            holdings.release_all()
        with self._registry_lock:
            self._registry.remove_plugin(key)
            self._middleware = {k: tuple(e for e in v if e.plugin_key != key) for k, v in self._middleware.items()}
            self._prompt_sections = {k: v for k, v in self._prompt_sections.items() if v.plugin_key != key}
        if self._event_bus is not None:
            self._event_bus.remove_plugin(key)
        self._hooks.remove_plugin(key)

    # --- middleware -------------------------------------------------------------------

    def _add_middleware(self, entry: MiddlewareEntry) -> None:
        with self._registry_lock:
            self._middleware = {**self._middleware, entry.kind: self._middleware.get(entry.kind, ()) + (entry,)}

    def _remove_middleware(self, entry: MiddlewareEntry) -> None:
        with self._registry_lock:
            kept = tuple(e for e in self._middleware.get(entry.kind, ()) if e is not entry)
            self._middleware = {**{k: v for k, v in self._middleware.items() if k != entry.kind},
                                **({entry.kind: kept} if kept else {})}

    def has_middleware(self, kind: str) -> bool:
        return bool(self._middleware.get(kind))

    def middleware_of(self, key: str) -> list[str]:
        return [kind for kind, entries in self._middleware.items() if any(e.plugin_key == key for e in entries)]

    def run_middleware(self, kind: str, terminal: Callable[[Any], Any], payload: Any, *, payload_key: str,
                       context: dict[str, Any], accept_payload: Callable[[Any], Any],
                       accept_result: Callable[[Any], Any]) -> Any:
        """``terminal(payload)`` wrapped by the ``kind`` middleware (see :mod:`.middleware`)."""
        entries = list(self._middleware.get(kind, ()))
        if not entries or kind not in RUN_KINDS:
            return terminal(payload)
        return run_chain(kind, entries, terminal, payload, payload_key=payload_key, context=context,
                         timeout=self._hook_timeout(), accept_payload=accept_payload,
                         accept_result=accept_result, on_error=self._on_middleware_error)

    def apply_request_middleware(self, kind: str, payload: Any, *, payload_key: str, context: dict[str, Any],
                                 accept_payload: Callable[[Any], Any]) -> Any:
        """``payload`` as the ``kind`` request middleware (``llm_request``/``tool_request``) rewrote it."""
        entries = list(self._middleware.get(kind, ()))
        if not entries or kind not in REQUEST_KINDS:
            return payload
        return apply_requests(kind, entries, payload, payload_key=payload_key, context=context,
                              timeout=self._hook_timeout(), accept_payload=accept_payload,
                              on_error=self._on_middleware_error)

    def _tool_request(self, tool_name: str, args: Any, hook_kw: dict[str, Any]) -> Any:
        if not self._middleware.get("tool_request"):
            return args
        context = {k: v for k, v in hook_kw.items() if k in ("session_id", "tool_call_id")}
        return self.apply_request_middleware("tool_request", plain(args), payload_key="args",
                                             context={**context, "tool_name": tool_name},
                                             accept_payload=_tool_args_payload)

    def invoke_middleware(self, kind: str, **kwargs: Any) -> list[Any]:
        """Hermes's direct call of every ``kind`` middleware callback with keyword arguments (no chain,
        no ``next_call``): their non-None results in registration order, each isolated and under
        ``plugins.hook_timeout``, a failing one reported and skipped."""
        results = []
        for entry in self._middleware.get(kind, ()):
            offered = entry._hook.select_kwargs(kwargs)
            outcome = call_limited(f"middleware {kind}", entry.plugin_key,
                                   lambda e=entry, k=offered: e.callback(**k), self._hook_timeout())
            if outcome.error is not None:
                self._on_middleware_error(entry, outcome.error_text or "", outcome.error)
            elif outcome.value is not None:
                results.append(outcome.value)
        return results

    def _on_middleware_error(self, entry: MiddlewareEntry, what: str, error: BaseException | None = None) -> None:
        self._failures.report("hook_error", entry.plugin_key, f"middleware {entry.kind}", what, error=error,
                              plugin_dir=plugin_dir_of(self, entry.plugin_key), hook=f"middleware:{entry.kind}")

    # --- calling provider plugins (memory providers, context engines) -----------------

    def call_plugin(self, what: str, plugin_key: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` — plugin code — isolated and under ``plugins.hook_timeout``, like a
        hook (only the keywords ``fn``'s signature accepts are passed). Its result as plain data
        (see :mod:`.untrusted`), or None when it failed (logged once and audited as ``hook_error``)."""
        if kwargs:
            kwargs = HookEntry.create(what, plugin_key, fn).select_kwargs(kwargs)
        outcome = call_limited(what, plugin_key, lambda: fn(*args, **kwargs), self._hook_timeout())
        if outcome.error is not None:
            self._say_once(f"plugin {plugin_key}: {what} failed: {outcome.error_text}")
            self._on_hook_error(outcome.entry, outcome.error, outcome.error_text)
            return None
        return outcome.value

    def active_memory(self) -> tuple[Any, str] | None:
        """``(provider, plugin key)`` of the memory provider in effect, or None."""
        provider = self.memory_provider
        if provider is None:
            return None
        for entry in list(self._registry.memory_providers.values()):
            if entry.provider is provider:
                return provider, entry.plugin_key
        return None

    def active_context_engine(self) -> tuple[Any, str] | None:
        engine = self.context_engine
        if engine is None:
            return None
        for entry in list(self._registry.context_engines):
            if entry.provider is engine:
                return engine, entry.plugin_key
        return None

    def dispatch_provider_tool(self, tool_name: str, args: Any, handler: Callable[[str, Any], Any], plugin_key: str,
                               **kw: Any) -> str:
        """A tool a provider plugin answers (a memory provider's ``handle_tool_call``) through the
        same path as registered tools: pre_tool_call guards -> tool_execution middleware -> the
        handler (isolated, time-limited) -> transform_tool_result -> post_tool_call."""
        if issubclass(type(args), str):
            try:
                args = json.loads(exact_str(args)) if exact_str(args).strip() else {}
            except ValueError as exc:
                return _tool_error(f"Tool '{shown(tool_name)}': arguments are not valid JSON: {exc}")
        args = plain(args) if args is not None else {}
        if type(args) is not dict:
            return _tool_error(f"Tool '{shown(tool_name)}': arguments must be a JSON object")
        args = self._tool_request(tool_name, args, kw)
        block = self.get_pre_tool_call_block_message(tool_name, args, **kw)
        if block is not None:
            return _tool_error(f"Tool '{tool_name}' was blocked by plugin policy: {block}")

        def terminal(a: Any) -> str:
            value = self.call_plugin(f"tool {tool_name}", plugin_key, handler, tool_name, a)
            return _tool_text(value) if value is not None else _tool_error(f"Tool '{tool_name}' failed")

        if self._middleware.get("tool_execution"):
            context = {k: v for k, v in kw.items() if k in ("session_id", "tool_call_id")}
            result = self.run_middleware("tool_execution", terminal, args, payload_key="args",
                                         context={**context, "tool_name": tool_name},
                                         accept_payload=_tool_args_payload, accept_result=_tool_result_value)
        else:
            result = terminal(args)
        return self._after_tool(tool_name, args, result, kw)

    # --- consent and identity ---------------------------------------------------------

    def granted_capabilities(self, key: str) -> list[str]:
        """The capabilities plugin ``key`` has, as Hermes's ``plugin_capability_granted`` counts them: requested
        by its manifest and granted by ``plugins.entries.<key>.granted_capabilities`` (bound by this host's
        consent, or written by Hermes), or whose older ``allow_*`` key is true. An unreadable config: none."""
        from plugin_llm.trust import CAPABILITY_FOR, FLAG_KEYS

        record = self._records.get(key)
        manifest = record.candidate.manifest if record is not None else None
        try:
            from plugin_llm.config import get_config_source

            policy = get_config_source(self.home).current().trust_for(key)
            entry = self.settings.entry(key)
        except Exception:  # an unreadable config grants nothing
            return []
        out = [c for c in (manifest.capabilities if manifest is not None else ()) if c in policy.granted_capabilities]
        legacy = set(entry.legacy_capabilities) | ({"tools.override"} if entry.allow_tool_override else set())
        legacy |= {CAPABILITY_FOR[name] for name, flag in FLAG_KEYS.items() if getattr(policy, flag)}
        return out + sorted(legacy - set(out))

    def profile_name(self) -> str:
        """The active credential profile's name (``auth.json`` ``default_profile``), else Hermes's name
        of the home: ``default`` for ``~/.hermes``, ``<name>`` for ``~/.hermes/profiles/<name>``, ``custom``
        for any other home."""
        try:
            from auth.authfile import load_auth

            spec, _ = load_auth(self.home / "auth.json")
            name = spec.default_profile
        except Exception:
            name = None
        return name if isinstance(name, str) and name else _home_profile_name(self.home)

    # --- registration callbacks used by PluginContext ---------------------------------

    def is_plugin_loaded(self, name: str) -> bool:
        """A plugin loaded and enabled whose key or manifest name is ``name`` (``ctx.has_plugin``)."""
        for record in list(self._records.values()):
            manifest = record.candidate.manifest
            if record.status == STATUS_ENABLED and (record.key == name or (manifest is not None and manifest.name == name)):
                return True
        return False

    def _is_current(self, key: str, generation: int) -> bool:
        record = self._records.get(key)
        return (
            record is not None
            and record.generation == generation
            and record.status in (_STATUS_LOADING, STATUS_ENABLED)
        )

    def _plugin_warning(self, key: str, message: str, *, log: bool = True) -> None:
        record = self._records.get(key)
        if record is not None:
            record.warnings.append(message)
        if log:
            _log.warning("plugin %s: %s", key, message)

    def _add_tool(self, entry: ToolEntry) -> str | None:
        return self._add_named("tools", entry)

    def _add_named(self, table: str, entry: Any) -> str | None:
        """Add ``entry`` unless its name is taken; returns who holds the name when refused."""
        name = entry.name if table != "skills" else entry.qualified_name
        with self._registry_lock:
            registered = getattr(self._registry, table)
            existing = registered.get(name)
            if existing is not None:
                return f"plugin {existing.plugin_key}"
            registered[name] = entry
        self._bind_handle(table, name, entry)
        return None

    def _bind_handle(self, table: str, name: str, entry: Any) -> None:
        """``entry.dispose()`` removes it (only while it is the one registered under ``name``)."""
        if not hasattr(entry, "_bind_handle"):
            return

        def release() -> None:
            with self._registry_lock:
                registered = getattr(self._registry, table)
                if registered.get(name) is entry:
                    del registered[name]

        entry._bind_handle(release, lambda: getattr(self._registry, table).get(name) is entry)

    def _replace_tool(self, entry: ToolEntry) -> str:
        """Put ``entry`` in place of the tool of the same name (``allow_tool_override``); who held it."""
        with self._registry_lock:
            old = self._registry.tools.get(entry.name)
            self._registry.tools[entry.name] = entry

        def release() -> None:  # the tool it replaced comes back (if it is still loaded)
            with self._registry_lock:
                if self._registry.tools.get(entry.name) is entry:
                    holder = self._records.get(old.plugin_key) if old is not None else None
                    if old is not None and holder is not None and holder.status == STATUS_ENABLED:
                        self._registry.tools[entry.name] = old
                    else:
                        del self._registry.tools[entry.name]

        entry._bind_handle(release, lambda: self._registry.tools.get(entry.name) is entry)
        return f"plugin {old.plugin_key}" if old is not None else "nobody"

    def _add_context_engine(self, entry: ProviderEntry) -> str | None:
        with self._registry_lock:
            if self._registry.context_engines:
                return f"plugin {self._registry.context_engines[0].plugin_key}"
            self._registry.context_engines.append(entry)
        return None

    # --- listing ----------------------------------------------------------------------

    def list_plugins(self) -> list[dict[str, Any]]:
        """One dict per plugin found (enabled or not, loaded or failed), in discovery order."""
        with self._discover_lock:  # a concurrent forced re-discovery must not tear the listing
            self.discover_plugins()
            records = list(self._records.values())
        return [self._describe(r, list(dict.fromkeys(self._hooks.hooks_of(r.key)))) for r in records]

    def get_plugin(self, name: str) -> dict[str, Any] | None:
        """``list_plugins()`` entry for a key, or for a bare name when it is unambiguous."""
        plugins = self.list_plugins()
        for p in plugins:
            if p["key"] == name:
                return p
        matches = [p for p in plugins if p["name"] == name]
        return matches[0] if len(matches) == 1 else None

    def _describe(self, record: _PluginRecord, hooks: list[str]) -> dict[str, Any]:
        candidate, manifest = record.candidate, record.candidate.manifest
        with self._registry_lock:
            owned = self._registry.owned_by(record.key)
        required = list(manifest.required_env_names) if manifest else []
        missing = [name for name in required if not os.environ.get(name)]
        status = record.status
        hint = f"plugin-llm plugins enable {record.key}" if status in (STATUS_NOT_ENABLED, STATUS_DISABLED) else None
        settings = self._settings.current()
        kind = manifest.kind if manifest else KIND_STANDALONE
        # what the operator configured (loaded or not): plugins.enabled, or <category>.provider for an
        # exclusive plugin, and not plugins.disabled (the CLI reports this as `enabled`)
        wanted = not settings.is_disabled(record.key, candidate.name) and (
            settings.is_enabled(record.key, candidate.name)
            or (kind == KIND_EXCLUSIVE and settings.is_selected(record.key, candidate.name)))
        return {
            "name": manifest.name if manifest else candidate.name,
            "key": record.key,
            "version": manifest.version if manifest else "",
            "description": manifest.description if manifest else "",
            "author": manifest.author if manifest else "",
            "kind": manifest.kind if manifest else "",
            "declared_kind": manifest.declared_kind if manifest else "",
            "capabilities": list(manifest.capabilities) if manifest else [],
            "granted_capabilities": self.granted_capabilities(record.key),
            "note": record.note,
            "source": candidate.source,
            "path": str(candidate.path) if candidate.path else None,
            "module": record.module_name,
            "entry_point": candidate.entry_point.value if candidate.entry_point is not None else None,
            "enabled": status == STATUS_ENABLED,
            "enabled_in_config": wanted,
            "status": status,
            "tools": owned["tools"],
            "hooks": hooks,
            "middleware": self.middleware_of(record.key),
            "commands": owned["commands"],
            "cli_commands": owned["cli_commands"],
            "skills": owned["skills"],
            "platforms": owned["platforms"],
            "memory_providers": owned["memory_providers"],
            "context_engines": owned["context_engines"],
            "image_gen_providers": owned["image_gen_providers"],
            "provides_tools": list(manifest.provides_tools) if manifest else [],
            "provides_hooks": list(manifest.provides_hooks) if manifest else [],
            "requires_env": required,
            "missing_env": missing,
            **_manifest_v2_fields(manifest),
            "error": record.error,
            "error_frames": list(record.frames),
            "warnings": list(record.warnings),
            "enable_hint": hint,
            "load_ms": round(record.load_ms, 3) if record.load_ms is not None else None,
            **self._isolation_fields(record),
        }

    def _isolation_fields(self, record: _PluginRecord) -> dict[str, Any]:
        """``isolation`` (process | in_process) and, out of process, ``confinement`` (bubblewrap | process),
        ``pid``, ``restarts`` and the last fault of its process."""
        isolation = self.isolation_of(record) if record.candidate.manifest is not None else "in_process"
        fields: dict[str, Any] = {"isolation": isolation, "confinement": None}
        remote = record.remote
        if remote is not None:
            info = remote.describe()
            fields.update(confinement=info["confinement"], confinement_reason=info["confinement_reason"],
                          pid=info["pid"], restarts=info["restarts"], process_state=info["state"],
                          last_fault=info["last_fault"], isolation_limits=info["limits"],
                          isolation_network=info["network"], data_dir=info["data_dir"])
        return fields

    # --- registries -------------------------------------------------------------------

    @property
    def tools(self) -> Mapping[str, ToolEntry]:
        return MappingProxyType(self._registry.tools)

    @property
    def commands(self) -> Mapping[str, CommandEntry]:
        return MappingProxyType(self._registry.commands)

    @property
    def cli_commands(self) -> Mapping[str, CliCommandEntry]:
        return MappingProxyType(self._registry.cli_commands)

    @property
    def skills(self) -> Mapping[str, SkillEntry]:
        return MappingProxyType(self._registry.skills)

    @property
    def platforms(self) -> Mapping[str, PlatformEntry]:
        return MappingProxyType(self._registry.platforms)

    @property
    def image_gen_providers(self) -> Mapping[str, Any]:
        return MappingProxyType({name: e.provider for name, e in self._registry.image_gen_providers.items()})

    @property
    def memory_providers(self) -> Mapping[str, MemoryProvider]:
        return MappingProxyType({name: e.provider for name, e in self._registry.memory_providers.items()})

    def find_skill(self, qualified_name: str) -> SkillEntry | None:
        return self._registry.skills.get(qualified_name.strip()) if isinstance(qualified_name, str) else None

    def skill_index(self) -> list[str]:
        """The home's own skills (``<home>/skills/``): a directory with ``SKILL.md`` or a
        ``.md`` file, as relative names. Plugin skills are never part of it."""
        root = self.home / "skills"
        if not root.is_dir():
            return []
        names: set[str] = set()
        for path in root.rglob("*.md"):
            rel = path.relative_to(root)
            if any(part.startswith(".") for part in rel.parts):
                continue
            if path.name == "SKILL.md":
                names.add(rel.parent.as_posix())
            elif not (path.parent / "SKILL.md").is_file():
                names.add(rel.with_suffix("").as_posix())
        return sorted(n for n in names if n and n != ".")

    def toolsets(self) -> list[tuple[str, str, str]]:
        """``(toolset, label, description)`` for each toolset plugins registered tools in."""
        grouped: dict[str, list[ToolEntry]] = {}
        for entry in list(self._registry.tools.values()):
            grouped.setdefault(entry.toolset, []).append(entry)
        out = []
        for toolset, entries in grouped.items():
            record = self._records.get(entries[0].plugin_key)
            manifest = record.candidate.manifest if record else None
            label = f"{toolset} (plugin {entries[0].plugin_key})"
            description = (manifest.description if manifest and manifest.description else "") or ", ".join(e.name for e in entries)
            out.append((toolset, label, description))
        return out

    def _match_provider(self, choice: str, entries: Iterable[ProviderEntry]) -> ProviderEntry | None:
        wanted = choice.strip().lower()
        for entry in entries:
            record = self._records.get(entry.plugin_key)
            names = {entry.name.lower(), entry.plugin_key.lower()}
            if record is not None:
                names.add(record.candidate.name.lower())
            if wanted in names:
                return entry
        return None

    @property
    def context_engine(self) -> ContextEngine | None:
        """The plugin context engine in effect: the one ``context.engine`` names, or the only
        one registered when it is unset; None means the host's built-in compressor."""
        engines = list(self._registry.context_engines)
        if not engines:
            return None
        choice = self._settings.current().context_engine
        if not choice:
            return engines[0].provider
        match = self._match_provider(choice, engines)
        if match is not None:
            return match.provider
        if choice.lower() not in BUILTIN_CONTEXT_ENGINES:
            self._say_once(f"context.engine {choice!r} is not registered by any loaded plugin; using the built-in compressor")
        return None

    @property
    def memory_provider(self) -> MemoryProvider | None:
        """The memory provider ``memory.provider`` names, if loaded and available (else None)."""
        choice = self._settings.current().memory_provider
        if not choice or choice.lower() in BUILTIN_MEMORY_PROVIDERS:
            return None
        match = self._match_provider(choice, list(self._registry.memory_providers.values()))
        if match is None:
            self._say_once(f"memory.provider {choice!r} is not registered by any loaded plugin; built-in memory only")
            return None
        try:
            available = bool(match.provider.is_available())
        except Exception as exc:
            self._say_once(f"memory provider {match.name!r}: is_available() raised {_error_text(exc)}")
            available = False
        if not available:
            self._say_once(f"memory provider {match.name!r} is not available; built-in memory only")
            return None
        return match.provider

    @property
    def image_gen_provider(self) -> Any:
        """The image generation provider ``image_gen.provider`` names (None when unset/unknown)."""
        choice = self._settings.current().image_gen_provider
        if not choice:
            return None
        match = self._match_provider(choice, list(self._registry.image_gen_providers.values()))
        if match is None:
            self._say_once(f"image_gen.provider {choice!r} is not registered by any loaded plugin")
            return None
        return match.provider

    # --- hooks ------------------------------------------------------------------------

    def has_hook(self, name: str) -> bool:
        return self._hooks.has_hook(name)

    def invoke_hook(self, name: str, **kwargs: Any) -> list[Any]:
        """Call every callback of ``name`` (keyword arguments only); their non-None
        results in registration order. Each callback is isolated and time-limited; for a
        fail-closed hook (``pre_tool_call``) a callback that timed out, is suppressed or
        raised contributes Hermes's block directive instead."""
        if name not in FAIL_CLOSED_HOOKS:
            return self._hooks.results(name, kwargs)
        results = []
        for outcome in self._hooks.run(name, kwargs):
            if outcome.error is None:
                if outcome.value is not None:
                    results.append(outcome.value)
            else:
                results.append({"action": "block", "message": _fail_closed_message(name, outcome)})
        return results

    async def ainvoke_hook(self, name: str, **kwargs: Any) -> list[Any]:
        """``invoke_hook`` without blocking the event loop."""
        if not self._hooks.has_hook(name):
            return []
        import asyncio

        return await asyncio.to_thread(self._hooks.results, name, kwargs)

    def get_pre_tool_call_block_message(self, tool_name: str, args: Any, **kw: Any) -> str | None:
        """The first valid block message of the pre_tool_call guards, or None.

        Valid: a dict with ``action == "block"`` and a non-empty string ``message``;
        other return values are ignored. A guard that raises, times out or returns a
        verdict that cannot be read (reading it raised, too large or deep, an ``action``
        that is not a string) blocks (fail-closed) with a message naming its plugin.
        """
        action, message, _ = self._pre_tool_call(tool_name, args, kw)
        return message if action == "block" else None

    def get_pre_tool_call_directive(self, tool_name: str, args: Any, **kw: Any) -> tuple[str | None, str | None]:
        """Hermes's ``(directive, message)``: ``("block", message)``, ``("approve", message or None)``
        (the first of the two wins) or ``(None, None)``."""
        action, message, _ = self._pre_tool_call(tool_name, args, kw)
        return action, message

    def _pre_tool_call(self, tool_name: str, args: Any, kw: dict[str, Any]) -> tuple[str | None, str | None, Any]:
        """(directive, message, args): the first block/approve directive (a failing guard blocks), and
        ``args`` with every ``{"action": "modify", "args": {...}}`` shallow-merged in order (later wins)."""
        modified: dict[str, Any] = {}
        for outcome in self._hooks.run("pre_tool_call", {**kw, "tool_name": tool_name, "args": args}):
            value = outcome.value  # plain data: exact types only (see hooks.HookOutcome)
            if outcome.error is None and type(value) is dict and not _readable_action(value.get("action")):
                outcome = HookOutcome(outcome.entry, None, UnusableValue(
                    f"its 'action' is a {type_name(value.get('action'))}, not a string such as 'block'"))
                self._hooks.report(outcome)  # audited as a failing guard is
            if outcome.error is not None:
                what = ("timed out" if outcome.timed_out else
                        "returned a verdict that could not be read" if outcome.unreadable else "failed")
                name = bounded(exact_str(tool_name), 100) if issubclass(type(tool_name), str) else type_name(tool_name)
                return "block", (
                    f"the pre_tool_call guard of plugin '{outcome.entry.plugin_key}' {what} "
                    f"({outcome.error_text}); '{name}' is blocked (fail-closed)"
                ), args
            if type(value) is not dict:
                continue
            action, message = value.get("action"), value.get("message")
            message = message.strip() if type(message) is str and message.strip() else None
            if action == "block" and message:
                return "block", message, args
            if action == "approve":
                return "approve", message, args
            if action == "modify" and type(value.get("args")) is dict:
                modified.update(value["args"])
        if modified and isinstance(args, Mapping):
            args = {**args, **modified}
        return None, None, args

    def get_pre_verify_continue_message(self, **kw: Any) -> str | None:
        """Hermes's pre_verify verdict: the first ``{"action": "continue", "message"}`` or
        ``{"decision": "block", "reason"}`` with a non-empty text keeps the turn going (its text)."""
        kw.setdefault("changed_paths", [])
        for value in self._hooks.results("pre_verify", kw):
            if type(value) is not dict:
                continue
            action = value.get("action") or value.get("decision") or ""
            if type(action) is not str or action.strip().lower() not in ("continue", "block"):
                continue
            message = value.get("message") or value.get("reason")
            if type(message) is str and message.strip():
                return message.strip()
        return None

    def get_plugin_error_classification(self, **kw: Any) -> dict[str, Any] | None:
        """transform_api_error_classification: every callback runs, the first dict naming a
        ``reason`` wins (only Hermes's fields are kept)."""
        for value in self._hooks.results("transform_api_error_classification", kw):
            if type(value) is dict and type(value.get("reason")) is str and value["reason"].strip():
                return {k: value[k] for k in _CLASSIFICATION_FIELDS if k in value}
        return None

    def fire_pre_command_hook(self, *, surface: str, command: str, alias_used: str | None = None,
                              args_raw: str = "", session_key: str | None = None,
                              platform: str | None = None) -> None:
        """Hermes's ``pre_command`` observer, before a slash command runs (return values ignored)."""
        self._hooks.run("pre_command", dict(surface=surface, command=command, alias_used=alias_used,
                                            args_raw=args_raw, session_key=session_key, platform=platform))

    def get_pre_llm_call_context(self, **kw: Any) -> str:
        """pre_llm_call contributions (a string or ``{"context": str}``), joined with a blank line."""
        parts = []
        for value in self._hooks.results("pre_llm_call", kw):  # plain data: exact types only
            if type(value) is dict:
                value = value.get("context")
            if type(value) is str and value.strip():
                parts.append(value.strip("\n"))
        return "\n\n".join(parts)

    def _on_hook_error(self, entry: HookEntry, error: BaseException, text: str) -> None:
        release_frames(error)
        name = type_name(error)
        message = text[len(name) + 2:] if text.startswith(name + ": ") else text
        self._audit(
            "hook_error",
            hook=entry.hook,
            plugin=entry.plugin_key,
            plugin_id=entry.plugin_key,
            message=message[:500],
            frames=plugin_frames(error, plugin_dir_of(self, entry.plugin_key)),
            **{"error.type": name},
        )

    # --- commands ---------------------------------------------------------------------

    def plugin_commands(self) -> dict[str, dict[str, Any]]:
        """Hermes's ``get_plugin_commands()`` shape: ``{name: {handler, description, plugin, args_hint}}``."""
        return {name: {"handler": e.handler, "description": e.description or "Plugin command",
                       "plugin": e.plugin_key, "args_hint": e.args_hint}
                for name, e in self.commands.items()}

    def get_plugin_command_handler(self, name: str) -> Callable[[str], Any] | None:
        entry = self._command(name)
        return entry.handler if entry else None

    def _command(self, name: Any) -> CommandEntry | None:
        try:
            return self._registry.commands.get(normalize_command_name(name))
        except (TypeError, ValueError):
            return None

    def _require_command(self, name: str) -> CommandEntry:
        entry = self._command(name)
        if entry is None:
            known = ", ".join("/" + n for n in sorted(self._registry.commands)) or "none"
            raise UnknownCommandError(f"unknown command /{str(name).strip().lstrip('/')} (plugin commands: {known})")
        return entry

    async def arun_command(self, name: str, raw_args: str = "") -> str | None:
        """Run a plugin slash command; async handlers are awaited on this loop, sync ones
        run in a worker thread so they may block (e.g. call ``ctx.llm.complete``).
        Raises :class:`UnknownCommandError` for an unknown name; a handler's ``Exception``
        propagates, anything else it raises becomes a :class:`PluginCommandError`."""
        import asyncio

        entry = self._require_command(name)
        handler = entry.handler
        try:
            is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None))
        except Exception:
            is_async = False
        if is_async:
            result, failure = await _aguarded(handler(raw_args))
        else:
            result, failure = await asyncio.to_thread(_guarded, handler, raw_args)
            if failure is None and result is not None and inspect.isawaitable(result):
                result, failure = await _aguarded(result)
        if failure is None:
            result, failure = _guarded(_command_text, result)
        if failure is not None:
            raise self._command_failed(entry, failure)
        return result

    def run_command(self, name: str, raw_args: str = "") -> str | None:
        """Sync twin of :meth:`arun_command` (usable with or without a running loop)."""
        entry = self._require_command(name)
        result, failure = _guarded(self._run_command_handler, entry, raw_args)
        if failure is not None:
            raise self._command_failed(entry, failure)
        return result

    def _command_failed(self, entry: CommandEntry, failure: BaseException) -> Exception:
        """Audit a failed command (``command_error``, with the plugin's frames) and return what to raise.
        Not logged: whoever ran it prints the error (the CLI once, with --debug the frames)."""
        self._failures.report("command_error", entry.plugin_key, f"command /{entry.name}", error_text(failure),
                              error=failure, plugin_dir=plugin_dir_of(self, entry.plugin_key), log=False,
                              command=entry.name)
        return _command_failure(entry, failure)

    @staticmethod
    def _run_command_handler(entry: CommandEntry, raw_args: str) -> str | None:
        result = entry.handler(raw_args)
        if result is not None and inspect.isawaitable(result):
            result = _run_awaitable(result)
        return _command_text(result)

    # --- tools ------------------------------------------------------------------------

    def _tool_for(self, tool_name: str, args: Any) -> tuple[ToolEntry | None, Any, str | None]:
        name = exact_str(tool_name) if issubclass(type(tool_name), str) else None  # no subclass __hash__/__eq__
        entry = self._registry.tools.get(name) if name is not None else None
        if entry is None:
            return None, args, _tool_error(f"Unknown tool: {shown(tool_name)}")
        if issubclass(type(args), str):  # raw JSON arguments as the model sent them
            args = exact_str(args)
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as exc:
                return None, args, _tool_error(f"Tool '{tool_name}': arguments are not valid JSON: {exc}")
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            return None, args, _tool_error(f"Tool '{tool_name}': arguments must be a JSON object")
        missing = entry.missing_env()
        if missing:
            return None, args, _tool_error(f"Tool '{tool_name}' is unavailable: missing environment variable(s) {', '.join(missing)}")
        if entry.check_fn is not None:
            ok, failure = _guarded(lambda: bool(entry.check_fn()))
            if failure is not None:
                _log.warning("tool %s: check_fn raised %s", entry.name, error_text(failure))
            if not ok:
                return None, args, _tool_error(f"Tool '{tool_name}' is unavailable right now (its availability check failed)")
        return entry, args, None

    @staticmethod
    def _hook_kwargs(kw: dict[str, Any], parent_agent: Any) -> dict[str, Any]:
        if parent_agent is not None and "session_id" not in kw:
            session_id = getattr(parent_agent, "session_id", None)
            if session_id is not None:
                return {**kw, "session_id": session_id}
        return kw

    def _handler_call(self, entry: ToolEntry, args: Any, parent_agent: Any, kw: dict[str, Any]) -> Any:
        offered = dict(kw)
        if parent_agent is not None:
            offered["parent_agent"] = parent_agent
        return entry.handler(args, **_handler_kwargs(entry.handler, offered))

    def _run_handler(self, entry: ToolEntry, args: Any, parent_agent: Any, kw: dict[str, Any]) -> str:
        value = self._handler_call(entry, args, parent_agent, kw)
        if value is not None and inspect.isawaitable(value):
            value = _run_awaitable(value)
        return _tool_text(value)

    async def _arun_handler(self, entry: ToolEntry, args: Any, parent_agent: Any, kw: dict[str, Any]) -> str:
        value = self._handler_call(entry, args, parent_agent, kw)
        if value is not None and inspect.isawaitable(value):
            value = await value
        return _tool_text(value)

    def _tool_failed(self, entry: ToolEntry, exc: BaseException) -> str:
        text = error_text(exc)
        self._failures.report("tool_error", entry.plugin_key, f"tool {entry.name}", text, error=exc,
                              plugin_dir=plugin_dir_of(self, entry.plugin_key), tool=entry.name)
        return _tool_error(f"Tool '{entry.name}' failed: {text}")

    def _after_tool(self, tool_name: str, args: Any, result: str, hook_kw: dict[str, Any]) -> str:
        payload = {**hook_kw, "tool_name": tool_name, "args": args, "result": result}
        for value in self._hooks.results("transform_tool_result", payload):
            if type(value) is str:  # plain data: a str subclass arrives as an exact str
                result = value
                payload["result"] = result
                break
        self._hooks.run("post_tool_call", payload)
        return result

    def dispatch_tool(self, tool_name: str, args: Any, *, parent_agent: Any = None, **kw: Any) -> str:
        """Run a tool call and return its result string (errors as a JSON ``{"error": ...}``).

        pre_tool_call guards (a block or a failing guard stops the call) ->
        the handler (sync, or async run to completion; it gets ``args`` plus the
        keyword arguments its signature accepts, ``parent_agent`` only when given) ->
        transform_tool_result (first string wins) -> post_tool_call. Always returns a
        ``str``: whatever the handler returns or raises is read through :mod:`.untrusted`.
        """
        entry, args, error = self._tool_for(tool_name, args)
        if entry is None:
            return error  # type: ignore[return-value]
        tool_name = entry.name
        hook_kw = self._hook_kwargs(kw, parent_agent)
        args = self._tool_request(tool_name, args, hook_kw)
        block, args = self._tool_verdict(tool_name, args, hook_kw)
        if block is not None:
            return block
        result = self._execute_tool(entry, tool_name, args, parent_agent, kw, hook_kw)
        return self._after_tool(tool_name, args, result, hook_kw)

    def _tool_verdict(self, tool_name: str, args: Any, hook_kw: dict[str, Any]) -> tuple[str | None, Any]:
        """(the tool error when the guards block it, the arguments after their ``modify`` directives).
        ``approve`` blocks too: this host has no human-approval prompt (fail-closed)."""
        if not self._hooks.has_hook("pre_tool_call"):
            return None, args
        action, message, args = self._pre_tool_call(tool_name, args, hook_kw)
        if action == "approve":
            message = (f"plugin approval required for {tool_name}" + (f" ({message})" if message else "")
                       + "; this host has no approval prompt, so the call is refused (fail-closed)")
        if action is None:
            return None, args
        _log.info("tool %s blocked: %s", tool_name, message)
        return _tool_error(f"Tool '{tool_name}' was blocked by plugin policy: {message}"), args

    def _run_tool_terminal(self, entry: ToolEntry, args: Any, parent_agent: Any, kw: dict[str, Any]) -> str:
        result, failure = _guarded(self._run_handler, entry, args, parent_agent, kw)
        return self._tool_failed(entry, failure) if failure is not None else result

    def _execute_tool(self, entry: ToolEntry, tool_name: str, args: Any, parent_agent: Any, kw: dict[str, Any],
                      hook_kw: dict[str, Any]) -> str:
        """The handler's result string, through the ``tool_execution`` middleware when there is any."""
        if not self._middleware.get("tool_execution"):
            return self._run_tool_terminal(entry, args, parent_agent, kw)
        context = {k: v for k, v in hook_kw.items() if k in ("session_id", "tool_call_id")}
        context["tool_name"] = tool_name
        return self.run_middleware(
            "tool_execution", lambda a: self._run_tool_terminal(entry, a, parent_agent, kw), plain(args),
            payload_key="args", context=context, accept_payload=_tool_args_payload, accept_result=_tool_result_value,
        )

    async def adispatch_tool(self, tool_name: str, args: Any, *, parent_agent: Any = None, **kw: Any) -> str:
        """:meth:`dispatch_tool` for async hosts: async handlers run on this loop; sync
        handlers and hooks run in worker threads so the loop never blocks."""
        import asyncio

        entry, args, error = self._tool_for(tool_name, args)
        if entry is None:
            return error  # type: ignore[return-value]
        tool_name = entry.name
        hook_kw = self._hook_kwargs(kw, parent_agent)
        if self._middleware.get("tool_request"):
            args = await asyncio.to_thread(self._tool_request, tool_name, args, hook_kw)
        if self._hooks.has_hook("pre_tool_call"):
            block, args = await asyncio.to_thread(self._tool_verdict, tool_name, args, hook_kw)
            if block is not None:
                return block
        if self._middleware.get("tool_execution"):
            result, failure = await asyncio.to_thread(
                _guarded, self._execute_tool, entry, tool_name, args, parent_agent, kw, hook_kw)
        elif entry.is_async or inspect.iscoroutinefunction(entry.handler):
            result, failure = await _aguarded(self._arun_handler(entry, args, parent_agent, kw))
        else:
            result, failure = await asyncio.to_thread(_guarded, self._run_handler, entry, args, parent_agent, kw)
        if failure is not None:
            result = self._tool_failed(entry, failure)
        if self._hooks.has_hook("transform_tool_result") or self._hooks.has_hook("post_tool_call"):
            return await asyncio.to_thread(self._after_tool, tool_name, args, result, hook_kw)
        return result

    # --- audit ------------------------------------------------------------------------

    def _audit(self, event: str, **fields: Any) -> None:
        """Operational event in ``<home>/logs/agent.log`` when the audit package is present."""
        if not self._audit_events:
            return
        from plugin_llm.auditing import write_event

        write_event(self.home, event, **fields)


class _LoadError(Exception):
    """A plugin that cannot be loaded for a reason we can state precisely."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
