"""What a plugin adds for the host to read and route: skills, prompt sections, redaction patterns, tasks.

A skill is a file inside the plugin's directory (read bounded, scanned for prompt injection); a
system prompt section a string or a callable run once per session; redaction patterns regexes of a
bounded-cost subset; an auxiliary task a key the operator routes under ``auxiliary.<key>``. What the
plugin passes is copied into plain data first. A mixin of :class:`.context.PluginContext`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from plugin_llm.hardened.safe_files import read_text_inside, resolve_inside

from .ctx_api import implements
from .registry import MAX_SKILL_BYTES, AuxiliaryTaskEntry, SkillEntry, scan_for_injection
from .untrusted import UnusableValue, plain

_log = logging.getLogger("plugin_llm.plugins")

_MAX_FRONTMATTER_BYTES = 16 * 1024


class ContentMixin:
    """``register_skill``, ``register_redaction_patterns``, ``register_auxiliary_task`` and
    ``register_system_prompt_section``.

    The state it uses (made by ``PluginContext.__init__``): ``_manager``, ``_key``, ``_plugin_dir``; and
    ``_live``, ``_refuse``.
    """

    __slots__ = ()

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
