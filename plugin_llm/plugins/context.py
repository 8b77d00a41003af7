"""``PluginContext`` (``ctx``): the only object a plugin's ``register(ctx)`` sees.

Each method validates its input at the boundary and names the plugin in its
errors. Refusals that are not programming errors (a tool name that is already
taken, a command that clashes with a built-in, a second context engine) are
logged as warnings, shown in ``plugins list`` and return ``None``/``False``;
wrong types raise ``TypeError``/``ValueError`` so the author sees them at once.
The registrations are mixins, one module each: :mod:`.context_callables`,
:mod:`.context_providers` and :mod:`.context_content`.

``ctx`` deliberately exposes nothing of the host beyond these methods: no
config, no credentials, no manager. ``ctx.llm`` is a ``PluginLlm`` bound to the
plugin's key — the identity the operator's trust block is written for.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .context_callables import CallablesMixin
from .context_content import ContentMixin
from .context_providers import (
    ProvidersMixin,
    coerce_hermes_memory_provider,
    is_hermes_context_engine,
    is_hermes_memory_provider,
)
from .ctx_api import HERMES_ONLY_REGISTRATIONS, HermesSubsystemMissing, implements, missing_attribute
from .untrusted import UnusableValue, plain
from .manifest import PluginManifest

if TYPE_CHECKING:  # pragma: no cover
    from plugin_llm.llm import PluginLlm

    from .manager import PluginManager
    from .state import PluginState

#: the Hermes shape checks are re-exported: the host's session imports them from here
__all__ = ["PluginContext", "HermesSubsystemMissing", "HERMES_ONLY_REGISTRATIONS", "is_hermes_memory_provider",
           "is_hermes_context_engine", "coerce_hermes_memory_provider"]

_log = logging.getLogger("plugin_llm.plugins")


class PluginContext(CallablesMixin, ProvidersMixin, ContentMixin):
    """Registration API handed to one plugin's ``register(ctx)``.

    Methods: ``llm``, ``profile_name``, ``has_capability``, ``register_tool``,
    ``register_hook``, ``register_middleware``, ``register_command``,
    ``register_cli_command``, ``register_context_engine``,
    ``register_memory_provider``, ``register_skill``, ``register_platform``,
    ``register_image_gen_provider``, ``inject_message``, ``dispatch_tool``.
    The provider registrations accept this host's base classes and Hermes's
    (``agent.memory_provider.MemoryProvider``, ``agent.context_engine.ContextEngine``,
    ``agent.image_gen_provider.ImageGenProvider``). Each public member is declared in
    :mod:`.ctx_api` (``@implements`` binds the arguments there), which the isolated ``ctx`` shares.
    """

    __slots__ = ("_manager", "_key", "_manifest", "_plugin_dir", "_generation", "_llm", "_state")

    def __init__(self, manager: "PluginManager", manifest: PluginManifest, plugin_dir: Path | None, generation: int) -> None:
        self._manager = manager
        self._key = manifest.key
        self._manifest = manifest
        self._plugin_dir = plugin_dir
        self._generation = generation
        self._llm: Any = None
        self._state: Any = None

    def __repr__(self) -> str:
        return f"PluginContext(plugin={self._key!r})"

    def __getattr__(self, name: str) -> Any:
        """A Hermes registration this host has no subsystem for: one clear error naming it."""
        raise missing_attribute(name)

    # --- identity ---------------------------------------------------------------------

    @property
    def manifest(self) -> PluginManifest:
        """This plugin's manifest (read-only)."""
        return self._manifest

    @property
    def llm(self) -> "PluginLlm":
        """``PluginLlm`` bound to this plugin's key (created on first use)."""
        if self._llm is None:
            from plugin_llm.llm import PluginLlm

            self._llm = PluginLlm(plugin_id=self._key, home=self._manager.home,
                                  task_owner=self._manager.auxiliary_task_owner)
        return self._llm

    @property
    def profile_name(self) -> str:
        """The name of the active credential profile (never anything of its keys)."""
        return self._manager.profile_name()

    @property
    def plugin_id(self) -> str:
        """This plugin's key (``image_gen/openai`` for a category plugin): what its config and trust are under."""
        return self._key

    @property
    def state(self) -> "PluginState":
        """Durable JSON key/value state in ``<home>/plugin-data/<key>/state.json`` (10 MiB quota)."""
        if self._state is None:
            from .isolation import sandbox
            from .state import PluginState

            home, key = self._manager.home, self._key
            self._state = PluginState(sandbox.plugin_data_path(home, key), lambda: sandbox.plugin_data_dir(home, key))
        return self._state

    @implements
    def has_plugin(self, plugin_id: str) -> bool:
        """True when another plugin is loaded and enabled, named by its key or its manifest name."""
        if not isinstance(plugin_id, str) or not plugin_id.strip():
            return False
        return self._manager.is_plugin_loaded(plugin_id.strip())

    @implements
    def get_config(self, key: str, default: Any = None) -> Any:
        """``plugins.entries.<key>.settings.<key>`` (dotted, plugin-relative), else the legacy ``…config``
        section, else ``default``."""
        from plugin_llm.config import get_config_source

        from .plugin_config import read_setting, setting_segments

        segments = setting_segments(key, f"plugin {self._key}: get_config()")
        try:
            raw = get_config_source(self._manager.home).current().raw
        except Exception:  # an unreadable config.yaml has no settings
            return default
        return read_setting(raw, self._key, segments, default)

    @implements
    def set_config(self, key: str, value: Any) -> None:
        """Write one value under this plugin's own ``settings`` (atomic, the rest of config.yaml kept)."""
        from .plugin_config import setting_segments, write_setting

        who = f"plugin {self._key}: set_config()"
        write_setting(self._manager.home, self._key, setting_segments(key, who), value, who)

    # --- lifecycle --------------------------------------------------------------------

    @implements
    def on_unload(self, callback: Callable[[], Any]) -> Any:
        """``callback()`` when the plugin is unloaded (or reloaded, or its ``register`` fails), the last
        registered first; a ``PluginRegistration`` whose ``dispose()`` runs it early."""
        if not callable(callback):
            raise TypeError(f"plugin {self._key}: on_unload callback must be callable, got {type(callback).__name__}")
        if not self._live("on_unload"):
            return None
        name = getattr(callback, "__name__", None)
        return self._manager._holdings_of(self._key).track("on_unload", name if isinstance(name, str) else "callback",
                                                           callback)

    @implements
    def spawn_task(self, coro: Any, *, name: str | None = None) -> Any:
        """``coro`` as an ``asyncio.Task`` on the running loop, cancelled when the plugin is unloaded."""
        from .lifecycle import spawn_task

        if not self._live("spawn_task"):
            if hasattr(coro, "close"):
                coro.close()
            return None
        return spawn_task(self._manager._holdings_of(self._key), coro, name, f"plugin:{self._key}:task")

    @implements
    def has_capability(self, name: str) -> bool:
        """True when the operator granted capability ``name``: consented to it (the manifest requests it), or
        set its older ``allow_*`` key (``allow_tool_override`` for ``tools.override``, ...). Unknown: False."""
        return isinstance(name, str) and name.strip() in self._manager.granted_capabilities(self._key)

    # --- helpers ----------------------------------------------------------------------

    def _live(self, what: str) -> bool:
        """False (with a warning) when this ctx belongs to an unloaded plugin."""
        if self._manager._is_current(self._key, self._generation):
            return True
        _log.warning("plugin %s: %s ignored: the plugin is no longer loaded (stale ctx)", self._key, what)
        return False

    def _refuse(self, message: str) -> None:
        self._manager._plugin_warning(self._key, message)

    # --- events -----------------------------------------------------------------------

    @implements
    def emit(self, event: str, payload: dict | None = None) -> int:
        """Publish ``<plugin_id>:<event>`` with a copy of ``payload`` (a dict) to its subscribers, in the
        background; returns how many there are (0 when none, or when the event was dropped)."""
        if not self._live("emit"):
            return 0
        return self._manager._events().emit(self._key, event, payload)

    @implements
    def subscribe(self, event: str, callback: Callable[..., Any]) -> Any:
        """``callback(payload)`` for each ``<plugin>:<event>`` published (sync or async; its own copy of the
        payload); a handle whose ``dispose()`` unsubscribes. Removed when the plugin is unloaded."""
        bus = self._manager._events()
        if not self._live("subscribe"):
            return None
        entry = bus.subscribe(self._key, event, callback)
        return self._manager._holdings_of(self._key).track("subscription", entry.event,
                                                           lambda: bus.unsubscribe(entry))

    # --- talking to the host ----------------------------------------------------------

    @implements
    def inject_message(self, content: str, role: str = "user", *, session_key: str | None = None) -> bool:
        """Queue a message into the active session (an interrupt while a turn runs,
        the next input otherwise). False when no session is attached. ``session_key`` names a
        messaging-gateway session, which this host has none of: False (as Hermes without a live gateway)."""
        if not isinstance(content, str):
            raise TypeError(f"plugin {self._key}: inject_message content must be a string")
        if not isinstance(role, str) or not role.strip():
            raise TypeError(f"plugin {self._key}: inject_message role must be a non-empty string")
        if session_key is not None:
            if not isinstance(session_key, str):
                raise TypeError(f"plugin {self._key}: inject_message session_key must be a string or None")
            return False
        session = self._manager.active_session
        if session is None:
            return False
        try:
            return bool(session.inject(content, role))
        except Exception as exc:
            _log.warning("plugin %s: inject_message failed: %s: %s", self._key, type(exc).__name__, exc)
            return False

    @implements
    def dispatch_tool(self, tool_name: str, args: dict, **kw: Any) -> str:
        """Run a registered tool through the host's one execution path (guards and
        hooks included). The active session, if any, is passed as ``parent_agent``.

        Always returns a string (errors as JSON ``{"error": ...}``). The name,
        arguments and keywords are copied into plain data first, so the other
        plugins' hooks and the handler never see this plugin's objects.
        """
        try:
            name, args, kw = plain(tool_name), plain(args), plain(kw)
        except UnusableValue as exc:
            return json.dumps({"error": f"plugin {self._key}: dispatch_tool(): an argument cannot be used: {exc}"})
        kw.pop("parent_agent", None)  # the host decides who the parent is
        return self._manager.dispatch_tool(name, args, parent_agent=self._manager.active_session, **kw)

    @implements
    def call_mcp(self, server: str, tool: str, arguments: dict | None = None, timeout: Any = 30) -> dict:
        """Call ``tool`` on the MCP server ``mcp_servers.<server>`` of config.yaml, if this plugin's
        ``mcp_allowlist`` names it (else ``PermissionError``); Hermes's result envelope (see
        :mod:`plugin_llm.mcp_client`). Audited and counted under the plugin's limits."""
        from plugin_llm.config import get_config_source
        from plugin_llm.mcp_client import call_mcp

        config = get_config_source(self._manager.home).current()
        return call_mcp(config, self._key, server, tool, arguments, timeout)
