"""The plugin manager: Hermes-compatible plugins on top of the gateway.

A plugin is a directory with ``plugin.yaml`` and an ``__init__.py`` exposing
``register(ctx)`` (or a ``hermes_agent.plugins`` entry point). Module-level
functions act on the manager of the default home (``$HERMES_HOME``); call
:func:`discover_plugins` once before using them. Hosts and tests can build a
:class:`PluginManager` for any home directly.

Importing this package imports neither litellm nor any plugin.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from .context import PluginContext
from .engines import ContextEngine, MemoryProvider
from .hooks import VALID_HOOKS
from .manager import BUILTIN_COMMANDS, PluginManager, UnknownCommandError
from .manifest import ManifestError, PluginManifest
from .registry import CommandEntry, SkillEntry, ToolEntry
from .settings import default_home

__all__ = [
    "get_plugin_manager",
    "discover_plugins",
    "invoke_hook",
    "invoke_middleware",
    "get_pre_tool_call_directive",
    "get_pre_verify_continue_message",
    "get_plugin_error_classification",
    "fire_pre_command_hook",
    "has_hook",
    "has_middleware",
    "get_plugin_image_gen_provider",
    "get_pre_tool_call_block_message",
    "get_pre_llm_call_context",
    "get_plugin_command_handler",
    "get_plugin_commands",
    "get_plugin_toolsets",
    "get_plugin_context_engine",
    "get_plugin_memory_provider",
    "find_plugin_skill",
    "PluginManager",
    "PluginContext",
    "PluginManifest",
    "ManifestError",
    "ContextEngine",
    "MemoryProvider",
    "VALID_HOOKS",
    "BUILTIN_COMMANDS",
    "ToolEntry",
    "CommandEntry",
    "SkillEntry",
    "UnknownCommandError",
]

_MANAGERS: dict[Path, PluginManager] = {}
_MANAGERS_LOCK = threading.Lock()


def get_plugin_manager(home: Path | str | None = None) -> PluginManager:
    """The process-wide manager of a home (default ``$HERMES_HOME``), one per resolved path."""
    path = Path(home).expanduser() if home is not None else default_home()
    key = path.resolve()
    with _MANAGERS_LOCK:
        manager = _MANAGERS.get(key)
        if manager is None:
            manager = _MANAGERS[key] = PluginManager(path)
        return manager


def discover_plugins(force: bool = False) -> None:
    """Discover plugins of the default home and load the enabled ones (idempotent)."""
    get_plugin_manager().discover_plugins(force=force)


def _discovered() -> PluginManager:
    """The default manager, after discovery (Hermes's ``_ensure_plugins_discovered``)."""
    manager = get_plugin_manager()
    manager.discover_plugins()
    return manager


def invoke_hook(name: str, **kwargs: Any) -> list[Any]:
    """Fire a hook on the default manager; non-None results in registration order."""
    return _discovered().invoke_hook(name, **kwargs)


def has_hook(name: str) -> bool:
    return _discovered().has_hook(name)


def has_middleware(kind: str) -> bool:
    return _discovered().has_middleware(kind)


def get_pre_tool_call_block_message(tool_name: str, args: Any, **kw: Any) -> str | None:
    return _discovered().get_pre_tool_call_block_message(tool_name, args, **kw)


def get_pre_llm_call_context(**kw: Any) -> str:
    return _discovered().get_pre_llm_call_context(**kw)


def get_plugin_command_handler(name: str) -> Callable[[str], Any] | None:
    return _discovered().get_plugin_command_handler(name)


def get_plugin_commands() -> dict[str, dict[str, Any]]:
    """Plugin slash commands by normalised name, as Hermes's dicts:
    ``{handler, description, plugin, args_hint}``."""
    return _discovered().plugin_commands()


def get_pre_tool_call_directive(tool_name: str, args: Any, **kw: Any) -> tuple[str | None, str | None]:
    return _discovered().get_pre_tool_call_directive(tool_name, args, **kw)


def get_pre_verify_continue_message(**kw: Any) -> str | None:
    return _discovered().get_pre_verify_continue_message(**kw)


def get_plugin_error_classification(**kw: Any) -> dict[str, Any] | None:
    return _discovered().get_plugin_error_classification(**kw)


def fire_pre_command_hook(**kw: Any) -> None:
    _discovered().fire_pre_command_hook(**kw)


def invoke_middleware(kind: str, **kwargs: Any) -> list[Any]:
    return _discovered().invoke_middleware(kind, **kwargs)


def get_plugin_toolsets() -> list[tuple[str, str, str]]:
    """``(toolset, label, description)`` of the toolsets plugins registered tools in."""
    return _discovered().toolsets()


def get_plugin_context_engine() -> ContextEngine | None:
    return _discovered().context_engine


def get_plugin_memory_provider() -> MemoryProvider | None:
    return _discovered().memory_provider


def get_plugin_image_gen_provider() -> Any:
    return _discovered().image_gen_provider


def find_plugin_skill(qualified_name: str) -> SkillEntry | None:
    """A plugin skill by ``<plugin>:<skill>`` name (plugin skills are not in the skill index)."""
    return _discovered().find_skill(qualified_name)
