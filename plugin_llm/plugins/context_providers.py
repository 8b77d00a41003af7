"""The providers a plugin offers the host: a context engine, memory providers, image generators, platforms.

The host's own base classes and Hermes's are accepted (:func:`is_hermes_memory_provider`,
:func:`is_hermes_context_engine`; an object with Hermes's required memory-provider methods is
taken as one, :func:`coerce_hermes_memory_provider`). There is one context engine in all; config
chooses the active memory provider and image generator. A mixin of :class:`.context.PluginContext`.
"""

from __future__ import annotations

from typing import Any, Callable

from .ctx_api import implements
from .engines import ContextEngine, MemoryProvider
from .registry import PlatformEntry, ProviderEntry


class ProvidersMixin:
    """``register_context_engine``, ``register_memory_provider``, ``register_image_gen_provider`` and
    ``register_platform``.

    The state it uses (made by ``PluginContext.__init__``): ``_manager``, ``_key``, ``_manifest``; and
    ``_live``, ``_refuse``.
    """

    __slots__ = ()

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


def _provider_name(provider: Any, default: str) -> str:
    name = getattr(provider, "name", "")
    return name.strip() if isinstance(name, str) and name.strip() else default
