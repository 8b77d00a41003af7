"""What plugins registered: the tables ``PluginContext`` adds to, and their read-only views.

A name is held by the first plugin that registers it (``_add_named``); a registration's handle
removes it only while it is still the one registered. The event bus and the system prompt sections
are made here too. A mixin of :class:`.manager.PluginManager`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .engines import MemoryProvider
from .loading import STATUS_ENABLED, STATUS_LOADING
from .registry import CliCommandEntry, CommandEntry, PlatformEntry, ProviderEntry, SkillEntry, ToolEntry

_log = logging.getLogger("plugin_llm.plugins")


class RegistrationsMixin:
    """The registration callbacks ``PluginContext`` uses, and the registries' views.

    The state it uses (made by ``PluginManager.__init__``): ``_event_bus``, ``_prompt_sections``, ``_records``,
    ``_registry``, ``_registry_lock``, ``home``.
    """

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
            and record.status in (STATUS_LOADING, STATUS_ENABLED)
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

    def _events(self) -> Any:
        """The plugins' event bus (``ctx.emit`` / ``ctx.subscribe``)."""
        if self._event_bus is None:
            from .events import EventBus  # on first use: the isolated child starts light

            with self._registry_lock:
                if self._event_bus is None:
                    self._event_bus = EventBus(lambda sub, payload: self.call_plugin(
                        f"event {sub.event}", sub.plugin_key, sub.callback, payload))
        return self._event_bus

    def get_plugin_subscriptions(self) -> dict[str, list[str]]:
        """Event name -> the plugins subscribed to it."""
        return self._event_bus.subscriptions() if self._event_bus is not None else {}

    def _add_prompt_section(self, entry: Any, who: str) -> None:
        from .prompt_sections import MAX_SECTIONS  # on first use: the isolated child starts light

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
        from .prompt_sections import render  # on first use: the isolated child starts light

        sections = list(self._prompt_sections.values())
        if not sections:
            return ""
        return render(sections, lambda e, info: self.call_plugin(f"system prompt section {e.id}", e.plugin_key,
                                                                 e.content, info), dict(session_info))

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

    @property
    def auxiliary_tasks(self) -> Mapping[str, Any]:
        """The auxiliary tasks plugins registered (``ctx.register_auxiliary_task``), by key."""
        return MappingProxyType(dict(self._registry.auxiliary_tasks))

    def auxiliary_task_owner(self, key: str) -> str | None:
        """The plugin that registered auxiliary task ``key``, or None: the task gate of ``ctx.llm``."""
        entry = self._registry.auxiliary_tasks.get(key)
        return entry.plugin_key if entry is not None else None

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
