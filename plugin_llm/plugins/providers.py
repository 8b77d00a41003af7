"""Which provider plugin is in effect: the context engine, the memory provider, the image generator.

Each is the one config.yaml names (``context.engine``, ``memory.provider``, ``image_gen.provider``)
among those loaded plugins registered; a name no plugin registered is said once and the host's
built-in is used. A mixin of :class:`.manager.PluginManager`.
"""

from __future__ import annotations

from typing import Any, Iterable

from .engines import ContextEngine, MemoryProvider
from .registry import ProviderEntry
from .settings import BUILTIN_CONTEXT_ENGINES, BUILTIN_MEMORY_PROVIDERS
from .untrusted import error_text


class ProvidersMixin:
    """The provider plugins in effect.

    The state it uses (made by ``PluginManager.__init__``): ``_records``, ``_registry``, ``_settings``.
    """

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

    def active_context_engine(self) -> tuple[Any, str] | None:
        engine = self.context_engine
        if engine is None:
            return None
        for entry in list(self._registry.context_engines):
            if entry.provider is engine:
                return engine, entry.plugin_key
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
            self._say_once(f"memory provider {match.name!r}: is_available() raised {error_text(exc)}")
            available = False
        if not available:
            self._say_once(f"memory provider {match.name!r} is not available; built-in memory only")
            return None
        return match.provider

    def active_memory(self) -> tuple[Any, str] | None:
        """``(provider, plugin key)`` of the memory provider in effect, or None."""
        provider = self.memory_provider
        if provider is None:
            return None
        for entry in list(self._registry.memory_providers.values()):
            if entry.provider is provider:
                return provider, entry.plugin_key
        return None

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
