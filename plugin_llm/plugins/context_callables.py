"""What a plugin registers for the host to call: tools, hooks, middleware, slash and CLI commands.

Each method checks its input at the boundary and names the plugin in its errors; a name already
taken or a built-in one is refused with a warning (``None``). A mixin of :class:`.context.PluginContext`.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Mapping
from typing import Any, Callable

from .ctx_api import implements
from .registry import BUILTIN_COMMANDS, CliCommandEntry, CommandEntry, ToolEntry, normalize_command_name

_log = logging.getLogger("plugin_llm.plugins")

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_CLI_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARGUMENT_MODES = frozenset({"options", "text", "mixed"})


class CallablesMixin:
    """``register_tool``, ``register_hook``, ``register_middleware``, ``register_command`` and
    ``register_cli_command``.

    The state it uses (made by ``PluginContext.__init__``): ``_manager``, ``_key``; and ``_live``, ``_refuse``.
    """

    __slots__ = ()

    # --- tools ------------------------------------------------------------------------

    @implements
    def register_tool(
        self,
        name: Any,
        toolset: Any = None,
        schema: Any = None,
        handler: Any = None,
        check_fn: Any = None,
        requires_env: Any = None,
        is_async: Any = False,
        description: Any = "",
        emoji: Any = "",
        override: Any = False,
    ) -> ToolEntry | None:
        """Offer a tool to the model.

        ``register_tool(name, toolset, schema, handler, check_fn=None, requires_env=None,
        is_async=False, description="", emoji="")``, or the short Hermes form
        ``register_tool(name, schema, handler)`` (toolset = the plugin's key).
        ``schema`` is an OpenAI function schema (``{"name", "description",
        "parameters"}``); ``handler(args, **kw)`` returns a string (other values
        are JSON-encoded). A name already taken is refused with a warning.
        """
        who = f"plugin {self._key}: register_tool({name!r})"
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise ValueError(f"{who}: tool name must be 1-64 characters of letters, digits, '_', '-', '.'")
        if toolset is None or toolset == "":
            toolset = self._key
        if not isinstance(toolset, str):
            raise TypeError(f"{who}: toolset must be a string, got {type(toolset).__name__}")
        if not isinstance(schema, Mapping):
            raise TypeError(f"{who}: schema must be a dict (OpenAI function schema), got {type(schema).__name__}")
        if not callable(handler):
            raise TypeError(f"{who}: handler must be callable, got {type(handler).__name__}")
        if check_fn is not None and not callable(check_fn):
            raise TypeError(f"{who}: check_fn must be callable or None")
        if not isinstance(description, str) or not isinstance(emoji, str):
            raise TypeError(f"{who}: description and emoji must be strings")
        schema = dict(schema)
        if schema.get("type") == "function" and isinstance(schema.get("function"), Mapping):
            schema = dict(schema["function"])  # accept the wrapped OpenAI tool form too
        if schema.get("name") not in (None, name):
            _log.warning("%s: schema name %r differs; the tool is registered as %r", who, schema["name"], name)
        parameters = schema.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        elif not isinstance(parameters, Mapping):
            raise TypeError(f"{who}: schema['parameters'] must be a JSON Schema object")
        description = description or schema.get("description") or ""
        if not isinstance(description, str):
            raise TypeError(f"{who}: schema['description'] must be a string")
        schema.update(name=name, description=description, parameters=dict(parameters))
        env = _env_names(requires_env, who)
        entry = ToolEntry(
            name=name,
            toolset=toolset,
            schema=schema,
            handler=handler,
            check_fn=check_fn,
            requires_env=env,
            is_async=bool(is_async) or inspect.iscoroutinefunction(handler),
            description=description,
            emoji=emoji,
            plugin_key=self._key,
        )
        if not self._live("register_tool"):
            return None
        owner = self._manager._add_tool(entry)
        if owner is None:
            return entry
        if override is not True:
            self._refuse(f"tool {name!r} refused: the name is already registered by {owner} "
                         "(it loads first: the first plugin to register a name keeps it)")
            return None
        if "tools.override" not in self._manager.granted_capabilities(self._key):
            self._refuse(
                f"tool {name!r}: override=True refused ({owner} registered it): the operator has not set "
                f"plugins.entries.{self._key}.allow_tool_override: true in config.yaml (nor granted the "
                f"capability tools.override: plugin-llm plugins consent {self._key})"
            )
            return None
        replaced = self._manager._replace_tool(entry)
        _log.warning("plugin %s: tool %r replaces the one of %s (tools.override)", self._key, name, replaced)
        return entry

    # --- hooks ------------------------------------------------------------------------

    @implements
    def register_hook(self, name: str, callback: Callable[..., Any]) -> Any:
        """Call ``callback(**kwargs)`` at a lifecycle point (see ``VALID_HOOKS``).

        The callback receives only the keyword arguments its signature names
        (``params`` is an alias of ``args``). Unknown hook names warn but are kept.
        Returns a handle whose ``dispose()`` removes this callback.
        """
        if not self._live("register_hook"):
            return None
        hooks = self._manager._hooks
        entry = hooks.register(name, self._key, callback)
        return self._manager._holdings_of(self._key).track("hook", entry.hook, lambda: hooks.unregister(entry))

    @implements
    def register_middleware(self, kind: str, callback: Callable[..., Any]) -> Any:
        """Rewrite (``llm_request``, ``tool_request``) or wrap (``llm_execution``, ``tool_execution``)
        the host's model requests and tool calls (see :mod:`.middleware`). Unknown kinds are kept
        with a warning and never run. Returns a handle whose ``dispose()`` removes this callback."""
        from .middleware import VALID_MIDDLEWARE, MiddlewareEntry

        if not isinstance(kind, str) or not kind.strip():
            raise TypeError(f"plugin {self._key}: register_middleware: kind must be a non-empty string")
        if not callable(callback):
            raise TypeError(f"plugin {self._key}: register_middleware({kind!r}): callback must be callable")
        if not self._live("register_middleware"):
            return None
        kind = kind.strip()
        if kind not in VALID_MIDDLEWARE:
            self._refuse(f"middleware kind {kind!r} is unknown (valid: {', '.join(sorted(VALID_MIDDLEWARE))}); "
                         "kept, never run")
        entry = MiddlewareEntry.create(kind, self._key, callback)
        self._manager._add_middleware(entry)
        return self._manager._holdings_of(self._key).track("middleware", kind,
                                                           lambda: self._manager._remove_middleware(entry))

    # --- commands ---------------------------------------------------------------------

    @implements
    def register_command(self, name: str, handler: Callable[[str], Any], description: str = "", args_hint: str = "",
                         argument_mode: str | None = None) -> CommandEntry | None:
        """A slash command ``/name raw args``; ``handler(raw_args) -> str | None``, sync or async.

        Names are normalised (``"/MyCmd "`` -> ``mycmd``); built-in names
        (``help``, ``exit``, ...) and names already taken are refused.
        """
        if not callable(handler):
            raise TypeError(f"plugin {self._key}: register_command({name!r}): handler must be callable")
        if not isinstance(description, str) or not isinstance(args_hint, str):
            raise TypeError(f"plugin {self._key}: register_command({name!r}): description and args_hint must be strings")
        try:
            normalized = normalize_command_name(name.strip().replace(" ", "-") if isinstance(name, str) else name)
        except (TypeError, ValueError) as exc:  # Hermes skips such a command with a warning
            self._refuse(f"command skipped: {exc}")
            return None
        description = description.strip() or "Plugin command"
        args_hint = args_hint.strip()
        mode = argument_mode.strip().lower() if isinstance(argument_mode, str) else None
        if mode not in _ARGUMENT_MODES:  # Hermes: anything else is "text" with an args_hint, else unset
            if argument_mode is not None:
                self._refuse(f"command /{normalized}: argument_mode {str(argument_mode)[:40]!r} is not one of "
                             f"{', '.join(sorted(_ARGUMENT_MODES))}; using {'text' if args_hint else 'none'}")
            mode = "text" if args_hint else None
        if not self._live("register_command"):
            return None
        if normalized in BUILTIN_COMMANDS:
            self._refuse(f"command /{normalized} refused: it is a built-in command")
            return None
        entry = CommandEntry(normalized, handler, description, args_hint, self._key, mode)
        owner = self._manager._add_named("commands", entry)
        if owner is not None:
            self._refuse(f"command /{normalized} refused: already registered by {owner}")
            return None
        return entry

    @implements
    def register_cli_command(
        self,
        name: str,
        help: str,
        setup_fn: Callable[[Any], Any],
        handler_fn: Callable[[Any], Any] | None = None,
        description: str = "",
    ) -> CliCommandEntry | None:
        """``plugin-llm <name> ...``: ``setup_fn(argparse parser)``, then ``handler_fn(args)``.

        Without ``handler_fn``, ``setup_fn`` should ``parser.set_defaults(func=...)``.
        """
        who = f"plugin {self._key}: register_cli_command({name!r})"
        if not isinstance(name, str) or not _CLI_NAME.match(name.strip().lower()):
            raise ValueError(f"{who}: name must be lowercase letters, digits, '-' or '_'")
        if not isinstance(help, str) or not isinstance(description, str):
            raise TypeError(f"{who}: help and description must be strings")
        if not callable(setup_fn):
            raise TypeError(f"{who}: setup_fn must be callable")
        if handler_fn is not None and not callable(handler_fn):
            raise TypeError(f"{who}: handler_fn must be callable or None")
        if not self._live("register_cli_command"):
            return None
        name = name.strip().lower()
        if name in _builtin_cli_commands():
            self._refuse(f"CLI command {name!r} refused: 'plugin-llm {name}' is a built-in command")
            return None
        entry = CliCommandEntry(name, help, setup_fn, handler_fn, self._key, description)
        owner = self._manager._add_named("cli_commands", entry)
        if owner is not None:
            self._refuse(f"CLI command {name!r} refused: already registered by {owner}")
            return None
        return entry


def _env_names(requires_env: Any, who: str) -> tuple[str, ...]:
    if requires_env is None:
        return ()
    if isinstance(requires_env, str):
        requires_env = [requires_env]
    names = []
    for item in requires_env:
        if isinstance(item, Mapping):
            item = item.get("name")
        if not isinstance(item, str) or not _ENV_NAME.match(item):
            raise ValueError(f"{who}: requires_env entries must be environment variable names, got {item!r}")
        names.append(item)
    return tuple(names)


def _builtin_cli_commands() -> frozenset[str]:
    from plugin_llm.commands import BUILTIN_NAMES

    return BUILTIN_NAMES
