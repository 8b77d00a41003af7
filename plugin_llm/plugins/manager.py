"""``PluginManager``: discover, gate, load and isolate plugins; run their hooks, tools and commands.

One manager per home (``get_plugin_manager``). Its parts, one module each: finding and loading
(:mod:`.loading`), unloading (:mod:`.unloading`), the registration tables (:mod:`.registrations`),
the listing (:mod:`.listing`), tool dispatch with middleware (:mod:`.tool_dispatch`), hooks
(:mod:`.hook_calls`), slash commands (:mod:`.slash_commands`) and provider selection
(:mod:`.providers`). This module holds the state they share and what they all call: the settings,
the time limit, running one piece of plugin code (``call_plugin``) and audit events.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

from .hook_calls import HookCallsMixin
from .hooks import HookEntry, HookRunner, call_limited
from .listing import ListingMixin
from .loading import MODULE_NAMESPACE, LoadingMixin, PluginRecord
from .middleware import MiddlewareEntry
from .providers import ProvidersMixin
from .registrations import RegistrationsMixin
from .registry import BUILTIN_COMMANDS, PluginRegistry
from .settings import PluginSettings, SettingsSource, default_home
from .slash_commands import CommandsMixin, PluginCommandError, UnknownCommandError
from .tool_dispatch import ToolDispatchMixin
from .tracebacks import FailureReporter
from .unloading import UnloadingMixin

__all__ = ["PluginManager", "BUILTIN_COMMANDS", "UnknownCommandError", "PluginCommandError", "MODULE_NAMESPACE"]

_log = logging.getLogger("plugin_llm.plugins")


class PluginManager(LoadingMixin, UnloadingMixin, RegistrationsMixin, ListingMixin, ToolDispatchMixin, HookCallsMixin,
                    CommandsMixin, ProvidersMixin):
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
        self._records: dict[str, PluginRecord] = {}
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

    def _audit(self, event: str, **fields: Any) -> None:
        """Operational event in ``<home>/logs/agent.log`` when the audit package is present."""
        if not self._audit_events:
            return
        from plugin_llm.auditing import write_event  # on first use: it loads PyYAML

        write_event(self.home, event, **fields)
