"""The ``ctx`` contract: every public member of a plugin's ``ctx``, with one signature each.

``PluginContext`` (in process) and the isolated plugin's ``ctx`` (:mod:`.isolation.worker`) both
bind their arguments here (:func:`bind`), so the call forms, defaults and ``TypeError``\\ s are the
same; the isolated ``ctx`` forwards each call to the host by name (:mod:`.isolation.remote` applies
it through the very same ``PluginContext`` method). A method added here and to ``PluginContext``
works out of process without more code. Imports nothing heavy: the plugin's process loads it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from plugin_llm.api import CtxLlm

__all__ = ["Ctx", "METHODS", "PROPERTIES", "LOCAL", "NOT_ACROSS", "PROVIDER_PARAMS", "UNTIMED", "SET_ON_HOST",
           "HERMES_ONLY_REGISTRATIONS", "NOT_IN_A_GATEWAY", "HermesSubsystemMissing", "signature_of", "bind", "spread", "implements",
           "is_registration", "missing_attribute"]


class Ctx(Protocol):
    """``ctx``: what a plugin's ``register(ctx)`` may call (see ``PluginContext`` for what each does)."""

    @property
    def llm(self) -> "CtxLlm": ...

    @property
    def manifest(self) -> Any: ...

    @property
    def profile_name(self) -> str: ...

    @property
    def plugin_id(self) -> str: ...

    @property
    def state(self) -> Any: ...

    def has_capability(self, name: str) -> bool: ...

    def has_plugin(self, plugin_id: str) -> bool: ...

    def get_config(self, key: str, default: Any = None) -> Any: ...

    def on_unload(self, callback: Callable[[], Any]) -> Any: ...

    def spawn_task(self, coro: Any, *, name: str | None = None) -> Any: ...

    def set_config(self, key: str, value: Any) -> None: ...

    def register_tool(self, name: str, toolset: str | None = None, schema: Mapping[str, Any] | None = None,
                      handler: Callable[..., Any] | None = None, check_fn: Callable[[], Any] | None = None,
                      requires_env: Any = None, is_async: bool = False, description: str = "", emoji: str = "",
                      override: bool = False) -> Any: ...

    def register_hook(self, name: str, callback: Callable[..., Any]) -> Any: ...

    def register_middleware(self, kind: str, callback: Callable[..., Any]) -> Any: ...

    def register_command(self, name: str, handler: Callable[[str], Any], description: str = "",
                         args_hint: str = "", argument_mode: str | None = None) -> Any: ...

    def register_cli_command(self, name: str, help: str, setup_fn: Callable[[Any], Any],
                             handler_fn: Callable[[Any], Any] | None = None, description: str = "") -> Any: ...

    def register_context_engine(self, engine: Any) -> bool: ...

    def register_memory_provider(self, provider: Any) -> bool: ...

    def register_image_gen_provider(self, provider: Any) -> bool: ...

    def register_platform(self, name: str, label: str, adapter_factory: Callable[..., Any],
                          check_fn: Callable[[], Any], **kw: Any) -> Any: ...

    def register_skill(self, name: str, path: Any, description: str = "",
                       frontmatter: Mapping[str, Any] | None = None) -> Any: ...

    def register_redaction_patterns(self, patterns: Any) -> int: ...

    def register_auxiliary_task(self, key: str, *, display_name: str, description: str,
                                defaults: Mapping[str, Any] | None = None) -> Any: ...

    def emit(self, event: str, payload: dict | None = None) -> int: ...

    def subscribe(self, event: str, callback: Callable[..., Any]) -> Any: ...

    def register_system_prompt_section(self, id: str, content: Any, *, position: str = "after_memory",
                                       max_chars: int = 4000) -> Any: ...

    def inject_message(self, content: str, role: str = "user", *, session_key: str | None = None) -> bool: ...

    def dispatch_tool(self, tool_name: str, args: dict, **kw: Any) -> str: ...

    def call_mcp(self, server: str, tool: str, arguments: dict | None = None, timeout: Any = 30) -> dict: ...


class _ShortForms(Protocol):
    """Second call forms: Hermes's ``register_tool(name, schema, handler)`` (toolset = the plugin's key)."""

    def register_tool(self, name: str, schema: Mapping[str, Any] | None = None,
                      handler: Callable[..., Any] | None = None, check_fn: Callable[[], Any] | None = None,
                      requires_env: Any = None, is_async: bool = False, description: str = "", emoji: str = "",
                      override: bool = False, *, toolset: str | None = None) -> Any: ...


#: when a call takes the short form: the argument after ``name`` is the schema (a mapping)
_SHORT_FORM: dict[str, Callable[[tuple[Any, ...]], bool]] = {
    "register_tool": lambda args: len(args) > 1 and isinstance(args[1], Mapping),
}

#: the contract's properties and methods, in the order the docs list them
PROPERTIES = ("llm", "manifest", "profile_name", "plugin_id", "state")
METHODS = tuple(name for name in vars(Ctx) if not name.startswith("_") and name not in PROPERTIES)

# --- how each member reaches the host from an isolated plugin's process -----------------------

#: answered in the plugin's process (``ctx.llm`` is itself a proxy, see plugin_llm.api)
#: (``ctx.state`` is the file in the plugin's data directory, which is its process's HOME; unload
#: callbacks and tasks live with the plugin's code, and the host asks its process to run them)
LOCAL = frozenset({"llm", "manifest", "plugin_id", "state", "on_unload", "spawn_task"})
#: what cannot cross to the host, and why: refused with a warning (the arguments are still bound)
NOT_ACROSS: dict[str, str] = {
    "register_platform": "a platform adapter is built and run inside the host's messaging gateway",
}
#: object arguments that stay in the plugin's process: the host gets a stand-in of the same base
#: class whose public methods call them
PROVIDER_PARAMS: dict[str, str] = {
    "register_context_engine": "engine",
    "register_memory_provider": "provider",
    "register_image_gen_provider": "provider",
}
#: callables that have no time limit in process (tools, commands): none out of process either;
#: every other callable a plugin registers runs under ``plugins.hook_timeout``
UNTIMED = frozenset({("register_tool", "handler"), ("register_command", "handler"),
                     ("register_cli_command", "setup_fn")})
#: arguments the host sets when it applies an isolated plugin's call: its proxies of the plugin's
#: callables are synchronous (the plugin's process awaits a coroutine function itself)
SET_ON_HOST: dict[str, dict[str, Any]] = {"register_tool": {"is_async": False}}

#: ``ctx`` methods of current Hermes for subsystems this host does not have
HERMES_ONLY_REGISTRATIONS = {
    "register_video_gen_provider": "video generation",
    "register_web_search_provider": "web search",
    "register_browser_provider": "browser automation",
    "register_secret_source": "secret sources",
    "register_tts_provider": "text to speech",
    "register_transcription_provider": "speech transcription",
    "register_dashboard_auth_provider": "dashboard auth",
    "register_slack_action_handler": "Slack messaging gateway",
}


#: members of Hermes 0.21's ``ctx`` with no counterpart in a gateway, and what they need
NOT_IN_A_GATEWAY = {
    "platform_actions": "messaging platforms",
    "register_platform_handler": "messaging platforms",
    "register_telegram_handler": "messaging platforms",
    "subagent_lifecycle": "subagents",
    "register_approval_transport": "human-approval UI",
    "register_context_reference": "@-references in user input",
    "register_terminal_environment_provider": "terminal backends",
}


class HermesSubsystemMissing(AttributeError):
    """A plugin registered with a Hermes subsystem this host does not provide."""


def missing_attribute(name: str) -> AttributeError:
    """What ``ctx.<name>`` raises for a member the contract does not have."""
    needs = NOT_IN_A_GATEWAY.get(name)
    if needs is not None:
        return HermesSubsystemMissing(f"ctx.{name} needs Hermes's {needs}, which a gateway like plugin-llm does not "
                                      "have (see docs/hermes-compatibility.md)")
    subsystem = HERMES_ONLY_REGISTRATIONS.get(name)
    if subsystem is not None:
        return HermesSubsystemMissing(
            f"ctx.{name}() registers with Hermes's {subsystem}, which plugin-llm does not provide")
    return AttributeError(f"'PluginContext' object has no attribute {name!r}")


def is_registration(method: str) -> bool:
    """A ``register_*`` method or ``subscribe``: its callables stay with the plugin, the host gets proxies
    (an isolated plugin may call these only while ``register(ctx)`` runs)."""
    return method.startswith("register_") or method == "subscribe"


@functools.lru_cache(maxsize=None)
def signature_of(method: str) -> inspect.Signature:
    """The contract's signature of ``method`` (``self`` included)."""
    if method not in METHODS:
        raise AttributeError(f"ctx has no method {method!r} in its contract (plugin_llm/plugins/ctx_api.py)")
    return inspect.signature(getattr(Ctx, method)).replace(return_annotation=inspect.Signature.empty)


@functools.lru_cache(maxsize=None)
def _short_signature(method: str) -> inspect.Signature:
    return inspect.signature(getattr(_ShortForms, method))


def bind(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call of ``ctx.<method>(*args, **kwargs)`` as its arguments by name, defaults included, in the
    contract's order (a ``**kw`` parameter is one entry holding a dict). Misuse is a ``TypeError``."""
    canonical = signature_of(method)
    short = _SHORT_FORM.get(method)
    signature = _short_signature(method) if short is not None and short(args) else canonical
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"ctx.{method}() {exc}") from None
    bound.apply_defaults()
    return {name: bound.arguments[name] for name in canonical.parameters if name != "self"}


def spread(method: str, named: Mapping[str, Any]) -> dict[str, Any]:
    """Bound arguments as keywords for a call (a ``**kw`` parameter's dict spread out)."""
    out: dict[str, Any] = {}
    for param in list(signature_of(method).parameters.values())[1:]:
        if param.name not in named:
            continue
        value = named[param.name]
        if param.kind is param.VAR_KEYWORD:
            if not isinstance(value, Mapping):
                raise TypeError(f"ctx.{method}(): **{param.name} must be a mapping")
            for key in value:
                if key in out or not isinstance(key, str):
                    raise TypeError(f"ctx.{method}(): bad keyword argument {str(key)[:60]!r}")
            out.update(value)
        else:
            out[param.name] = value
    return out


F = TypeVar("F", bound=Callable[..., Any])


def implements(fn: F) -> F:
    """A ``ctx`` method: its arguments are bound by :func:`bind` (the contract's forms and errors), then
    passed by keyword to ``fn``, whose own signature must be the contract's (checked here, at import)."""
    method = fn.__name__
    contract = signature_of(method)
    if _shape(inspect.signature(fn)) != _shape(contract):
        raise TypeError(f"{fn.__qualname__}{inspect.signature(fn)} differs from the ctx contract's "
                        f"{method}{contract} (plugin_llm/plugins/ctx_api.py)")

    @functools.wraps(fn)
    def bound(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(self, **spread(method, bind(method, args, kwargs)))

    bound.__signature__ = contract  # type: ignore[attr-defined]
    return bound  # type: ignore[return-value]


def _shape(signature: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]
