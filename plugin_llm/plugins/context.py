"""``PluginContext`` (``ctx``): the only object a plugin's ``register(ctx)`` sees.

Each method validates its input at the boundary and names the plugin in its
errors. Refusals that are not programming errors (a tool name that is already
taken, a command that clashes with a built-in, a second context engine) are
logged as warnings, shown in ``plugins list`` and return ``None``/``False``;
wrong types raise ``TypeError``/``ValueError`` so the author sees them at once.

``ctx`` deliberately exposes nothing of the host beyond these methods: no
config, no credentials, no manager. ``ctx.llm`` is a ``PluginLlm`` bound to the
plugin's key — the identity the operator's trust block is written for.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable

from plugin_llm.hardened.safe_files import read_text_inside, resolve_inside

from .ctx_api import HERMES_ONLY_REGISTRATIONS, HermesSubsystemMissing, implements, missing_attribute
from .engines import ContextEngine, MemoryProvider
from .untrusted import UnusableValue, plain
from .manifest import PluginManifest
from .registry import (
    BUILTIN_COMMANDS,
    MAX_SKILL_BYTES,
    AuxiliaryTaskEntry,
    CliCommandEntry,
    CommandEntry,
    PlatformEntry,
    ProviderEntry,
    SkillEntry,
    ToolEntry,
    normalize_command_name,
    scan_for_injection,
)

if TYPE_CHECKING:  # pragma: no cover
    from plugin_llm.llm import PluginLlm

    from .manager import PluginManager
    from .state import PluginState

__all__ = ["PluginContext", "HermesSubsystemMissing", "HERMES_ONLY_REGISTRATIONS"]

_log = logging.getLogger("plugin_llm.plugins")

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_CLI_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARGUMENT_MODES = frozenset({"options", "text", "mixed"})
_MAX_FRONTMATTER_BYTES = 16 * 1024


class PluginContext:
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

    # --- single-choice providers ------------------------------------------------------

    @implements
    def register_context_engine(self, engine: ContextEngine) -> bool:
        """Replace the built-in context compressor (one engine in total; a second is refused)."""
        if isinstance(engine, type) or not (isinstance(engine, ContextEngine) or is_hermes_context_engine(engine)):
            hint = " (pass an instance, not the class)" if isinstance(engine, type) else ""
            raise TypeError(
                f"plugin {self._key}: register_context_engine needs an instance of a "
                f"plugin_llm.plugins.ContextEngine or agent.context_engine.ContextEngine subclass{hint}, "
                f"got {type(engine).__name__}"
            )
        if not self._live("register_context_engine"):
            return False
        name = _provider_name(engine, self._manifest.name)
        owner = self._manager._add_context_engine(ProviderEntry(name, engine, self._key))
        if owner is not None:
            self._refuse(f"context engine {name!r} refused: {owner} already registered one (only one is allowed)")
            return False
        return True

    @implements
    def register_memory_provider(self, provider: MemoryProvider) -> bool:
        """Offer a memory provider; the active one is chosen by ``memory.provider``. An object with the
        methods Hermes's ``MemoryProvider`` requires (``name``, ``is_available``, ``initialize``,
        ``get_tool_schemas``) that is not a subclass is taken as one, the others its defaults (as Hermes)."""
        if not isinstance(provider, type) and not isinstance(provider, MemoryProvider) \
                and not is_hermes_memory_provider(provider) and _has_hermes_memory_shape(provider):
            provider = coerce_hermes_memory_provider(provider)
        if isinstance(provider, type) or not (isinstance(provider, MemoryProvider) or is_hermes_memory_provider(provider)):
            hint = " (pass an instance, not the class)" if isinstance(provider, type) else ""
            raise TypeError(
                f"plugin {self._key}: register_memory_provider needs an instance of a "
                f"plugin_llm.plugins.MemoryProvider or agent.memory_provider.MemoryProvider subclass{hint}, "
                f"got {type(provider).__name__}"
            )
        if not self._live("register_memory_provider"):
            return False
        name = _provider_name(provider, self._manifest.name)
        owner = self._manager._add_named("memory_providers", ProviderEntry(name, provider, self._key))
        if owner is not None:
            self._refuse(f"memory provider {name!r} refused: already registered by {owner}")
            return False
        return True

    @implements
    def register_image_gen_provider(self, provider: Any) -> bool:
        """Offer an image generator (an object with ``name`` and ``generate(...)``);
        the active one is chosen by ``image_gen.provider``."""
        name = getattr(provider, "name", None)
        if isinstance(provider, type) or not isinstance(name, str) or not name.strip() or not callable(getattr(provider, "generate", None)):
            raise TypeError(
                f"plugin {self._key}: register_image_gen_provider needs an object with a non-empty "
                f"'name' string and a callable 'generate' method, got {provider!r}"
            )
        if not self._live("register_image_gen_provider"):
            return False
        owner = self._manager._add_named("image_gen_providers", ProviderEntry(name.strip(), provider, self._key))
        if owner is not None:
            self._refuse(f"image generation provider {name!r} refused: already registered by {owner}")
            return False
        return True

    @implements
    def register_platform(
        self,
        name: str,
        label: str,
        adapter_factory: Callable[..., Any],
        check_fn: Callable[[], Any],
        **kw: Any,
    ) -> PlatformEntry | None:
        """A messaging platform adapter: ``adapter_factory(...)`` builds it, ``check_fn()`` says
        whether it can run here; extra keywords are kept as options."""
        who = f"plugin {self._key}: register_platform({name!r})"
        if not isinstance(name, str) or not name.strip() or not isinstance(label, str):
            raise TypeError(f"{who}: name and label must be strings (name non-empty)")
        if not callable(adapter_factory):
            raise TypeError(f"{who}: adapter_factory must be callable")
        if not callable(check_fn):
            raise TypeError(f"{who}: check_fn must be callable")
        if not self._live("register_platform"):
            return None
        entry = PlatformEntry(name.strip().lower(), label, adapter_factory, check_fn, dict(kw), self._key)
        owner = self._manager._add_named("platforms", entry)
        if owner is not None:
            self._refuse(f"platform {entry.name!r} refused: already registered by {owner}")
            return None
        return entry

    # --- skills -----------------------------------------------------------------------

    @implements
    def register_skill(self, name: str, path: str | Path, description: str = "",
                       frontmatter: Mapping[str, Any] | None = None) -> SkillEntry | None:
        """Ship a read-only skill addressed as ``<plugin>:<name>``.

        ``path`` is a Markdown file, or a directory with ``SKILL.md``; relative
        paths are relative to the plugin directory. The skill is not added to
        the home's skill index, and it is scanned for prompt-injection patterns
        (hits are logged and listed in ``injection_findings``).
        """
        who = f"plugin {self._key}: register_skill({name!r})"
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{who}: skill name must be a non-empty string")
        name = name.strip()
        if ":" in name:
            raise ValueError(f"{who}: ':' is not allowed in a skill name (the qualified name is '{self._key}:<name>')")
        if "/" in name or "\\" in name:
            raise ValueError(f"{who}: a skill name cannot contain path separators")
        if not isinstance(description, str):
            raise TypeError(f"{who}: description must be a string")
        if not isinstance(path, (str, Path)):
            raise TypeError(f"{who}: path must be a str or Path")
        meta = _frontmatter(frontmatter, who)
        if self._plugin_dir is None:
            raise PermissionError(f"{who}: this plugin has no directory of its own, and a skill must be a file "
                                  "inside it")
        # every link resolved; refused when it leaves the plugin's directory (a SKILL.md linked to auth.json)
        skill_path = resolve_inside(path, self._plugin_dir, who=who)
        if skill_path.is_dir():
            skill_path = resolve_inside(skill_path / "SKILL.md", self._plugin_dir, who=who)
        # bounded; a FIFO is refused, never opened; the opened file is checked to be inside the directory again
        text = read_text_inside(skill_path, self._plugin_dir, who=who, max_bytes=MAX_SKILL_BYTES)
        if text is None:
            raise FileNotFoundError(f"{who}: skill file not found: {skill_path}")
        findings = scan_for_injection(text)
        if not self._live("register_skill"):
            return None
        qualified = f"{self._key}:{name}"
        manager = self._manager
        key = self._key
        entry = SkillEntry(
            qualified_name=qualified,
            plugin_key=key,
            name=name,
            path=skill_path,
            root=Path(self._plugin_dir),
            description=description,
            injection_findings=findings,
            frontmatter=meta,
            _siblings=lambda: manager._registry.skill_names_of(key),
        )
        owner = manager._add_named("skills", entry)
        if owner is not None:
            self._refuse(f"skill {qualified!r} refused: already registered")
            return None
        if findings:
            message = f"skill {qualified} ({skill_path}) looks like a prompt injection: {'; '.join(findings)}"
            _log.warning("plugin %s: %s", key, message)
            manager._plugin_warning(key, message, log=False)
        return entry

    # --- redaction --------------------------------------------------------------------

    @implements
    def register_redaction_patterns(self, patterns: Any) -> int:
        """More secret shapes for the host's redactor (audit log, logs, output): regexes of a bounded-cost
        subset (see :mod:`.redaction_patterns`), each starting with two literal characters. Refused ones
        are listed as warnings; returns how many were added. Removed when the plugin is unloaded."""
        from auth.redaction import add_pattern_rules, pattern_rule_count, pattern_rules_of, remove_pattern_rules

        from .redaction_patterns import MAX_PER_PLUGIN, MAX_PLUGIN_CHOICES, compile_pattern, cost_of

        if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)):
            raise TypeError(f"plugin {self._key}: register_redaction_patterns() needs a list of regex strings")
        if not self._live("register_redaction_patterns"):
            return 0
        owner = f"plugin:{self._key}"
        held = pattern_rule_count(owner)
        spent = sum(cost_of(regex) for _, regex in pattern_rules_of(owner))
        accepted: list[tuple[str, Any]] = []
        for pattern in patterns:
            shown = repr(pattern[:60]) if isinstance(pattern, str) else type(pattern).__name__
            if held + len(accepted) >= MAX_PER_PLUGIN:
                self._refuse(f"redaction pattern {shown} refused: a plugin may add at most {MAX_PER_PLUGIN}")
                continue
            try:
                trigger, regex = compile_pattern(pattern)
            except ValueError as exc:
                self._refuse(f"redaction pattern {shown} refused: {exc}")
                continue
            if spent + cost_of(regex) > MAX_PLUGIN_CHOICES:
                self._refuse(f"redaction pattern {shown} refused: the plugin's patterns would allow over "
                             f"{MAX_PLUGIN_CHOICES} combinations per position in all; narrow their ranges")
                continue
            spent += cost_of(regex)
            accepted.append((trigger, regex))
        if accepted:
            add_pattern_rules(owner, accepted)
            self._manager._holdings_of(self._key).track("redaction patterns", owner, lambda: remove_pattern_rules(owner))
        return len(accepted)

    # --- auxiliary tasks --------------------------------------------------------------

    @implements
    def register_auxiliary_task(self, key: str, *, display_name: str, description: str,
                                defaults: Mapping[str, Any] | None = None) -> AuxiliaryTaskEntry | None:
        """An auxiliary task of this plugin: ``ctx.llm.complete(..., task=key)`` then runs on the
        operator's ``auxiliary.<key>`` route of config.yaml (the default route when there is none).
        ``key`` is letters, digits and ``_``; a built-in task's key or another plugin's is a ValueError.
        ``defaults`` (Hermes's provider/model/timeout suggestions) are kept for listings, never applied.
        Returns a handle whose ``dispose()`` removes the task."""
        from plugin_llm.config.auxiliary import TASK_KEY
        from plugin_llm.trust import BUILTIN_TASKS

        who = f"plugin {self._key}: register_auxiliary_task({str(key)[:64]!r})"
        if not isinstance(key, str) or not TASK_KEY.match(key):
            raise ValueError(f"{who}: the key must be 1-64 letters, digits or '_' (it names auxiliary.<key> of "
                             "config.yaml)")
        if key in BUILTIN_TASKS:
            raise ValueError(f"{who}: {key!r} is reserved for a built-in task; pick a key of the plugin's own "
                             f"(e.g. '{self._key.replace('-', '_').replace('/', '_')}_{key}')")
        for name, value, most in (("display_name", display_name, 200), ("description", description, 2000)):
            if not isinstance(value, str):
                raise TypeError(f"{who}: {name} must be a string, got {type(value).__name__}")
            if len(value) > most:
                raise ValueError(f"{who}: {name} must be at most {most} characters, got {len(value):,}")
        kept = _task_defaults(defaults, who)
        if not self._live("register_auxiliary_task"):
            return None
        entry = AuxiliaryTaskEntry(key, display_name, description, kept, self._key)
        manager = self._manager
        with manager._registry_lock:
            tasks = manager._registry.auxiliary_tasks
            existing = tasks.get(key)
            if existing is not None and existing.plugin_key != self._key:
                raise ValueError(f"{who}: the task is already registered by plugin {existing.plugin_key!r}")
            tasks[key] = entry  # the plugin's own key again: the new entry replaces it, as in Hermes
        manager._bind_handle("auxiliary_tasks", key, entry)
        return entry

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

    # --- system prompt sections ---------------------------------------------------------

    @implements
    def register_system_prompt_section(self, id: str, content: Any, *, position: str = "after_memory",
                                       max_chars: int = 4000) -> Any:
        """A block of every new session's system prompt (``## Plugin Context: <id>``): a string or a
        ``callable(session_info)`` run once per session. At most 32 sections and 8,000 characters in all;
        a duplicate id is a ValueError. Returns a handle whose ``dispose()`` removes it."""
        from .prompt_sections import SectionEntry, check_section

        who = f"plugin {self._key}: register_system_prompt_section({str(id)[:60]!r})"
        check_section(id, content, position, max_chars, who)
        if not self._live("register_system_prompt_section"):
            return None
        entry = SectionEntry(id, content, position, max_chars, self._key)
        self._manager._add_prompt_section(entry, who)
        return self._manager._holdings_of(self._key).track(
            "system prompt section", id, lambda: self._manager._remove_prompt_section(entry))

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


_HERMES_MEMORY_METHODS = ("is_available", "initialize", "prefetch", "sync_turn", "get_tool_schemas")
_HERMES_ENGINE_METHODS = ("compress", "should_compress", "update_from_response")


def is_hermes_memory_provider(obj: Any) -> bool:
    """A Hermes ``MemoryProvider`` (the compat base class, or the real one's interface)."""
    from plugin_llm.compat.hermes.agent.memory_provider import MemoryProvider as HermesMemoryProvider

    if isinstance(obj, HermesMemoryProvider):
        return True
    return not isinstance(obj, MemoryProvider) and all(callable(getattr(type(obj), m, None)) for m in _HERMES_MEMORY_METHODS)


_HERMES_MEMORY_REQUIRED = ("is_available", "initialize", "get_tool_schemas")  # and ``name``: the ABC's abstracts


def _has_hermes_memory_shape(obj: Any) -> bool:
    name = getattr(obj, "name", None)
    return isinstance(name, str) and bool(name.strip()) and all(
        callable(getattr(obj, m, None)) for m in _HERMES_MEMORY_REQUIRED)


def coerce_hermes_memory_provider(obj: Any) -> Any:
    """``obj`` (Hermes's required memory-provider methods, not its base class) as a Hermes ``MemoryProvider``:
    the methods it has are its own (bound, with their signatures), the others the base class's defaults."""
    from plugin_llm.compat.hermes.agent.memory_provider import MemoryProvider as HermesMemoryProvider

    class CoercedMemoryProvider(HermesMemoryProvider):
        name = str(obj.name).strip()  # type: ignore[assignment]

        def is_available(self) -> bool:  # replaced by obj's own below
            return False

        def initialize(self, session_id: str, **kwargs: Any) -> None:
            return None

        def get_tool_schemas(self) -> list:
            return []

    coerced = CoercedMemoryProvider()
    for attr in dir(HermesMemoryProvider):
        own = getattr(obj, attr, None) if not attr.startswith("_") and attr != "name" else None
        if callable(own):
            setattr(coerced, attr, own)
    coerced.wrapped = obj  # type: ignore[attr-defined]
    return coerced


def is_hermes_context_engine(obj: Any) -> bool:
    """A Hermes ``ContextEngine`` (the compat base class, or the real one's interface)."""
    from plugin_llm.compat.hermes.agent.context_engine import ContextEngine as HermesContextEngine

    if isinstance(obj, HermesContextEngine):
        return True
    return not isinstance(obj, ContextEngine) and all(callable(getattr(type(obj), m, None)) for m in _HERMES_ENGINE_METHODS)


def _frontmatter(frontmatter: Any, who: str) -> Mapping[str, Any] | None:
    """A skill's frontmatter as a read-only copy of plain data (bounded), or None."""
    if frontmatter is None:
        return None
    if not isinstance(frontmatter, Mapping):
        raise TypeError(f"{who}: frontmatter must be a mapping or None, got {type(frontmatter).__name__}")
    try:
        copy = plain(dict(frontmatter))
        size = len(json.dumps(copy, ensure_ascii=False))
    except (UnusableValue, TypeError, ValueError) as exc:
        raise ValueError(f"{who}: frontmatter must be plain data (strings, numbers, lists, mappings): {exc}") from None
    if size > _MAX_FRONTMATTER_BYTES or not all(isinstance(k, str) for k in copy):
        raise ValueError(f"{who}: frontmatter must have string keys and stay under {_MAX_FRONTMATTER_BYTES} bytes as JSON")
    from types import MappingProxyType

    return MappingProxyType(copy)


#: what a task's ``defaults`` may not carry at all: a plugin never names an endpoint or a key
_SECRET_DEFAULTS = frozenset({"api_key", "base_url", "api_base", "headers", "extra_headers"})


def _task_defaults(defaults: Any, who: str) -> Mapping[str, Any]:
    """A task's ``defaults`` as a read-only copy of plain data (bounded), without endpoint or key fields."""
    if defaults is None:
        return MappingProxyType({})
    if not isinstance(defaults, Mapping):
        raise TypeError(f"{who}: defaults must be a mapping or None, got {type(defaults).__name__}")
    refused = sorted(str(k) for k in defaults if k in _SECRET_DEFAULTS and defaults[k] not in (None, ""))
    if refused:
        _log.warning("%s: defaults %s ignored: plugins never choose an endpoint or a key", who, ", ".join(refused))
    try:
        copy = plain({k: v for k, v in defaults.items() if k not in _SECRET_DEFAULTS})
        size = len(json.dumps(copy, ensure_ascii=False))
    except (UnusableValue, TypeError, ValueError) as exc:
        raise ValueError(f"{who}: defaults must be plain data (strings, numbers, lists, mappings): {exc}") from None
    if size > _MAX_FRONTMATTER_BYTES or not all(isinstance(k, str) for k in copy):
        raise ValueError(f"{who}: defaults must have string keys and stay under {_MAX_FRONTMATTER_BYTES} bytes as JSON")
    return MappingProxyType(copy)


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


def _provider_name(provider: Any, default: str) -> str:
    name = getattr(provider, "name", "")
    return name.strip() if isinstance(name, str) and name.strip() else default


def _builtin_cli_commands() -> frozenset[str]:
    from plugin_llm.commands import BUILTIN_NAMES

    return BUILTIN_NAMES
