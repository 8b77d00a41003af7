"""Which plugins are enabled, as config edits: the pure part of ``plugins enable/disable``
and of the interactive ``plugins`` checklist.

Nothing here imports a plugin or prints: plugins are known from discovery (manifests and
entry-point names), and every change is a ruamel document edit made through
:mod:`plugin_llm.config_edit`. The functions return one human-readable line per change.
Plugins are opt-in and ``plugins.disabled`` always wins; a bare name shared by several plugins is
never removed silently (it is replaced by the keys of the others it covered); unticking in the
checklist only removes a plugin from ``enabled``. The rules in full: docs/design.md, "The CLI
process".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from plugin_llm.config_edit import get_value, list_add, list_remove, set_value
from plugin_llm.plugins.discovery import discover_candidates
from plugin_llm.plugins.settings import BUILTIN_CONTEXT_ENGINES, BUILTIN_MEMORY_PROVIDERS, settings_from_raw

__all__ = [
    "PluginRef",
    "known_plugins",
    "enable_in",
    "disable_in",
    "unenable_in",
    "MenuItem",
    "Choice",
    "Picker",
    "MenuModel",
    "build_menu",
    "apply_menu",
    "is_memory_plugin",
    "is_context_plugin",
]

ENABLED = ("plugins", "enabled")
DISABLED = ("plugins", "disabled")
MEMORY_KEY = ("memory", "provider")
CONTEXT_KEY = ("context", "engine")
BUILTIN_CONTEXT = "compressor"
_MEMORY_KINDS = frozenset({"memory", "memory_provider", "memory-provider", "exclusive"})
_CONTEXT_KINDS = frozenset({"context_engine", "context-engine", "context"})


@dataclass(frozen=True)
class PluginRef:
    """A discovered plugin, as far as enabling it is concerned."""

    key: str
    name: str
    source: str = "user"
    kind: str = ""
    description: str = ""
    requires_env: tuple[str, ...] = ()
    error: str | None = None


def known_plugins(home: Path) -> list[PluginRef]:
    """Every plugin discovery finds for ``home`` (user, project when enabled, entry points),
    without importing any of them."""
    refs = []
    for key, cand in discover_candidates(home).items():
        manifest = cand.manifest
        refs.append(
            PluginRef(
                key=key,
                name=manifest.name if manifest else cand.name,
                source=cand.source,
                kind=((manifest.declared_kind or manifest.kind) if manifest else "") or "",
                description=(manifest.description if manifest else "") or "",
                requires_env=tuple(manifest.required_env_names) if manifest else (),
                error=cand.error,
            )
        )
    return refs


def _names(doc: Any, keys: tuple[str, ...]) -> list[str]:
    value = get_value(doc, keys)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return [str(v).strip() for v in value if isinstance(v, str)]


def _others_named(label: str, target: PluginRef, refs: Iterable[PluginRef]) -> list[PluginRef]:
    return [r for r in refs if r.key != target.key and label in (r.key, r.name)]


def _drop_label(doc: Any, keys: tuple[str, ...], label: str, target: PluginRef, refs: list[PluginRef]) -> list[str]:
    """Remove ``label`` from the list at ``keys``; a bare name that also covers other
    plugins is replaced by their keys so that only ``target`` changes."""
    where = ".".join(keys)
    if label not in _names(doc, keys):
        return []
    others = _others_named(label, target, refs) if label != target.key else []
    list_remove(doc, keys, label)
    changes = [f"removed {label} from {where}"]
    for other in others:
        if list_add(doc, keys, other.key):
            changes.append(f"added {other.key} to {where} (it was covered by the bare name {label!r})")
    return changes


def enable_in(doc: Any, target: PluginRef, refs: list[PluginRef]) -> list[str]:
    """Edit ``doc`` so ``target`` loads; returns the changes (empty: already enabled)."""
    changes: list[str] = []
    for label in dict.fromkeys((target.key, target.name)):
        changes += _drop_label(doc, DISABLED, label, target, refs)
    enabled = _names(doc, ENABLED)
    bare_ok = target.name in enabled and not _others_named(target.name, target, refs)
    if target.key not in enabled and not bare_ok:
        list_add(doc, ENABLED, target.key)
        changes.append(f"added {target.key} to plugins.enabled")
    return changes


def unenable_in(doc: Any, target: PluginRef, refs: list[PluginRef]) -> list[str]:
    """Take ``target`` out of ``plugins.enabled`` (key and bare name) without disabling it."""
    changes: list[str] = []
    for label in dict.fromkeys((target.key, target.name)):
        changes += _drop_label(doc, ENABLED, label, target, refs)
    return changes


def disable_in(doc: Any, target: PluginRef, refs: list[PluginRef]) -> list[str]:
    """Edit ``doc`` so ``target`` never loads; returns the changes (empty: already disabled)."""
    changes = unenable_in(doc, target, refs)
    disabled = _names(doc, DISABLED)
    if target.key not in disabled and target.name not in disabled:
        list_add(doc, DISABLED, target.key)
        changes.append(f"added {target.key} to plugins.disabled")
    return changes


# --------------------------------------------------------------------------- checklist model


def is_memory_plugin(ref: PluginRef) -> bool:
    return ref.kind.strip().lower() in _MEMORY_KINDS or ref.key.startswith("memory/")


def is_context_plugin(ref: PluginRef) -> bool:
    return ref.kind.strip().lower() in _CONTEXT_KINDS or ref.key.startswith("context_engine/")


@dataclass
class MenuItem:
    """One general plugin in the checklist."""

    ref: PluginRef
    checked: bool
    initially: bool

    @property
    def label(self) -> str:
        text = self.ref.key
        if self.ref.description:
            text += f" — {self.ref.description}"
        if self.ref.error:
            text += " (broken: see plugins list)"
        return text


@dataclass(frozen=True)
class Choice:
    """One option of a single-choice picker: ``value`` is what config.yaml gets."""

    value: str
    label: str
    ref: PluginRef | None = None


@dataclass
class Picker:
    title: str
    config_key: tuple[str, ...]
    choices: list[Choice]
    selected: int
    initially: int

    @property
    def current(self) -> Choice:
        return self.choices[self.selected]


@dataclass
class MenuModel:
    general: list[MenuItem]
    memory: Picker
    context: Picker
    refs: list[PluginRef] = field(default_factory=list)

    def changed(self) -> bool:
        return (
            any(i.checked != i.initially for i in self.general)
            or self.memory.selected != self.memory.initially
            or self.context.selected != self.context.initially
        )


def _choice_for(current: str, choices: list[Choice], builtin: Iterable[str]) -> int | None:
    wanted = current.strip().lower()
    if wanted in {b.lower() for b in builtin}:
        return 0
    for i, choice in enumerate(choices):
        if choice.ref is not None and wanted in {choice.ref.key.lower(), choice.ref.name.lower(), choice.value.lower()}:
            return i
    return None


def build_menu(refs: list[PluginRef], raw: Mapping[str, Any] | None) -> MenuModel:
    """The checklist for the current config (``raw`` is the parsed config.yaml)."""
    settings = settings_from_raw(raw)
    general = [
        MenuItem(r, settings.is_enabled(r.key, r.name), settings.is_enabled(r.key, r.name))
        for r in refs
        if not is_memory_plugin(r) and not is_context_plugin(r)
    ]

    memory_choices = [Choice("", "built-in only")] + [
        Choice(r.name, f"{r.key}" + (f" — {r.description}" if r.description else ""), r) for r in refs if is_memory_plugin(r)
    ]
    current_memory = settings.memory_provider
    index = _choice_for(current_memory, memory_choices, BUILTIN_MEMORY_PROVIDERS)
    if index is None:  # configured, but not installed: keep it selectable so confirming changes nothing
        memory_choices.append(Choice(current_memory, f"{current_memory} (not installed)"))
        index = len(memory_choices) - 1

    context_choices = [Choice(BUILTIN_CONTEXT, "compressor (built-in)")] + [
        Choice(r.name, f"{r.key}" + (f" — {r.description}" if r.description else ""), r) for r in refs if is_context_plugin(r)
    ]
    current_context = settings.context_engine
    if current_context:
        cindex = _choice_for(current_context, context_choices, BUILTIN_CONTEXT_ENGINES)
        if cindex is None:
            context_choices.append(Choice(current_context, f"{current_context} (not installed)"))
            cindex = len(context_choices) - 1
    else:  # unset: the enabled engine plugin, if any, else the built-in
        cindex = next(
            (i for i, c in enumerate(context_choices) if c.ref is not None and settings.is_enabled(c.ref.key, c.ref.name)),
            0,
        )
    return MenuModel(
        general=general,
        memory=Picker("Memory provider", MEMORY_KEY, memory_choices, index, index),
        context=Picker("Context engine", CONTEXT_KEY, context_choices, cindex, cindex),
        refs=list(refs),
    )


def _apply_picker(doc: Any, picker: Picker, refs: list[PluginRef]) -> list[str]:
    if picker.selected == picker.initially:
        return []
    old, new = picker.choices[picker.initially], picker.current
    changes = []
    if set_value(doc, picker.config_key, new.value):
        changes.append(f"set {'.'.join(picker.config_key)} to {new.value!r}")
    if old.ref is not None and old.ref.key != (new.ref.key if new.ref else None):
        changes += unenable_in(doc, old.ref, refs)  # one provider active at a time
    if new.ref is not None:
        changes += enable_in(doc, new.ref, refs)
    return changes


def apply_menu(doc: Any, model: MenuModel) -> list[str]:
    """Write the checklist's choices into ``doc`` (only what changed); returns the changes."""
    changes: list[str] = []
    for item in model.general:
        if item.checked == item.initially:
            continue
        changes += enable_in(doc, item.ref, model.refs) if item.checked else unenable_in(doc, item.ref, model.refs)
    changes += _apply_picker(doc, model.memory, model.refs)
    changes += _apply_picker(doc, model.context, model.refs)
    return changes
