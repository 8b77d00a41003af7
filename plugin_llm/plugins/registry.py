"""What plugins register: immutable entries and the registry that holds them.

Every entry carries the ``plugin_key`` that registered it, so a plugin that
fails (or a forced re-discovery) removes exactly its own registrations.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from plugin_llm.hardened.safe_files import MIB, read_home_text, read_text_inside

#: a skill file larger than this is refused (skills are prompts, not data sets)
MAX_SKILL_BYTES = MIB

__all__ = [
    "BUILTIN_COMMANDS",
    "Disposable",
    "ToolEntry",
    "CommandEntry",
    "CliCommandEntry",
    "SkillEntry",
    "PlatformEntry",
    "ProviderEntry",
    "AuxiliaryTaskEntry",
    "PluginRegistry",
    "normalize_command_name",
    "scan_for_injection",
]

#: Slash commands of the host itself; plugins cannot take these names.
BUILTIN_COMMANDS = frozenset({"help", "exit", "quit", "plugins", "tools", "clear", "reset", "model", "history"})


class Disposable:
    """A registry entry as Hermes's registration handle: ``active`` while it is registered,
    ``dispose()`` removes it (idempotent). The manager binds both when it adds the entry."""

    def _bind_handle(self, release: Callable[[], None], is_active: Callable[[], bool]) -> None:
        object.__setattr__(self, "_handle", (release, is_active))  # frozen dataclasses: not a field

    @property
    def active(self) -> bool:
        handle = self.__dict__.get("_handle")
        return bool(handle is not None and handle[1]())

    def dispose(self) -> None:
        handle = self.__dict__.get("_handle")
        if handle is not None:
            handle[0]()


@dataclass(frozen=True)
class ToolEntry(Disposable):
    """A tool offered to the model. ``schema`` is an OpenAI function schema."""

    name: str
    toolset: str
    schema: Mapping[str, Any]  # {"name", "description", "parameters"}
    handler: Callable[..., Any]
    check_fn: Callable[[], Any] | None = None
    requires_env: tuple[str, ...] = ()
    is_async: bool = False
    description: str = ""
    emoji: str = ""
    plugin_key: str = ""

    def openai_tool(self) -> dict:
        """The tool in OpenAI function-calling form (``tools=[...]`` of a chat request)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description or self.schema.get("description", ""),
                "parameters": self.schema.get("parameters") or {"type": "object", "properties": {}},
            },
        }

    def missing_env(self) -> tuple[str, ...]:
        return tuple(name for name in self.requires_env if not os.environ.get(name))

    def is_available(self) -> bool:
        """Required env vars set and ``check_fn`` (if any) truthy; a raising check counts as False."""
        if self.missing_env():
            return False
        if self.check_fn is None:
            return True
        try:
            return bool(self.check_fn())
        except Exception:
            return False


@dataclass(frozen=True)
class CommandEntry(Disposable):
    """A slash command (``/name args``); ``handler(raw_args) -> str | None``, sync or async."""

    name: str
    handler: Callable[[str], Any]
    description: str = ""
    args_hint: str = ""
    plugin_key: str = ""
    #: how the raw arguments are meant: ``options``, ``text`` or ``mixed`` (None: not said)
    argument_mode: str | None = None


@dataclass(frozen=True)
class CliCommandEntry(Disposable):
    """``plugin-llm <name> ...``: ``setup_fn(parser)``, then ``handler_fn(args)`` (or ``args.func``)."""

    name: str
    help: str
    setup_fn: Callable[[Any], Any]
    handler_fn: Callable[[Any], Any] | None = None
    plugin_key: str = ""
    description: str = ""


@dataclass(frozen=True)
class SkillEntry(Disposable):
    """A read-only skill shipped by a plugin, addressed as ``<plugin>:<skill>``.

    It never enters the home's skill index (``<home>/skills/``); it is only
    reachable by its qualified name. ``injection_findings`` lists suspicious
    prompt-injection patterns found when it was registered.
    """

    qualified_name: str
    plugin_key: str
    name: str
    path: Path
    description: str = ""
    injection_findings: tuple[str, ...] = ()
    _siblings: Callable[[], tuple[str, ...]] | None = field(default=None, repr=False, compare=False)
    #: the plugin's directory: the file must still be inside it when read (a link swapped in later is refused)
    root: Path | None = None
    #: the plugin's metadata for the skill (plain data; never read as instructions)
    frontmatter: Mapping[str, Any] | None = field(default=None, compare=False)

    def read(self) -> str:
        """The skill text, followed by the other skills the same plugin registered."""
        if self.root is not None:  # bounded; a FIFO is refused, never opened
            text = read_text_inside(self.path, self.root, who=f"skill {self.qualified_name}", max_bytes=MAX_SKILL_BYTES)
        else:
            text = read_home_text(self.path, max_bytes=MAX_SKILL_BYTES)
        if text is None:
            raise FileNotFoundError(f"skill {self.qualified_name}: {self.path} no longer exists")
        siblings = [s for s in (self._siblings() if self._siblings else ()) if s != self.qualified_name]
        if siblings:
            text = (
                text.rstrip("\n")
                + f"\n\n---\nOther skills from plugin '{self.plugin_key}' (load them by qualified name): "
                + ", ".join(siblings)
                + "\n"
            )
        return text


@dataclass(frozen=True)
class PlatformEntry(Disposable):
    """A messaging platform adapter (``ctx.register_platform``)."""

    name: str
    label: str
    adapter_factory: Callable[..., Any]
    check_fn: Callable[[], Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    plugin_key: str = ""


@dataclass(frozen=True)
class ProviderEntry(Disposable):
    """A registered provider object (memory provider, image generator, context engine)."""

    name: str
    provider: Any
    plugin_key: str = ""


@dataclass(frozen=True)
class AuxiliaryTaskEntry(Disposable):
    """An auxiliary task (``ctx.register_auxiliary_task``): ``ctx.llm(..., task=<name>)`` of the plugin that
    registered it runs on ``auxiliary.<name>`` of config.yaml. ``defaults`` is kept for listings only:
    the operator's slot routes the task."""

    name: str
    display_name: str
    description: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    plugin_key: str = ""

    @property
    def key(self) -> str:
        return self.name


def normalize_command_name(name: Any) -> str:
    """``"/MyCmd "`` -> ``"mycmd"``; raises ValueError for names that cannot be commands."""
    if not isinstance(name, str):
        raise TypeError(f"command name must be a string, got {type(name).__name__}")
    normalized = name.strip().lstrip("/").strip().lower()
    if not normalized or any(ch.isspace() for ch in normalized) or "/" in normalized:
        raise ValueError(f"invalid command name {name!r}: use one word, e.g. 'tldr' or '/tldr'")
    return normalized


# --- prompt-injection scan of plugin skills -----------------------------------------

_INJECTION_RULES: tuple[tuple[str, str], ...] = (
    ("asks to ignore previous instructions",
     r"\bignore\s+(?:all\s+|any\s+)?(?:the\s+|your\s+)?(?:previous|prior|above|earlier)\s+(?:instructions|prompts?|rules)"),
    ("asks to disregard the system prompt",
     r"\bdisregard\s+(?:all\s+|any\s+)?(?:the\s+|your\s+)?(?:system\s+prompt|previous\s+instructions|instructions|rules)"),
    ("tries to redefine the assistant ('you are now')", r"\byou\s+are\s+now\b"),
    ("mentions exfiltration", r"\bexfiltrat\w*"),
    ("pipes a download into a shell", r"\b(?:curl|wget)\b[^\n|]*\|\s*(?:sudo\s+)?(?:ba|z|da)?sh\b"),
    ("asks to reveal secrets or the system prompt",
     r"\b(?:reveal|print|show|leak)\s+(?:your\s+|the\s+)?(?:system\s+prompt|api[\s_-]?keys?|secrets?|credentials)"),
    ("asks to hide actions from the user", r"\b(?:do\s+not|don't)\s+(?:tell|inform|show)\s+the\s+user\b"),
)
# Zero-width, bidi-override and Unicode tag characters hide text from a human reviewer.
_HIDDEN_CHARS = "[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\U000e0000-\U000e007f]"
_compiled: tuple[tuple[tuple[str, re.Pattern[str]], ...], re.Pattern[str]] | None = None


def _patterns() -> tuple[tuple[tuple[str, re.Pattern[str]], ...], re.Pattern[str]]:
    """Compiled on first use: most processes never register a skill."""
    global _compiled
    if _compiled is None:
        rules = tuple((label, re.compile(pattern, re.IGNORECASE)) for label, pattern in _INJECTION_RULES)
        _compiled = (rules, re.compile(_HIDDEN_CHARS))
    return _compiled


def scan_for_injection(text: str) -> tuple[str, ...]:
    """Findings as ``"line N: <what>"`` strings (empty when nothing suspicious)."""
    rules, hidden_chars = _patterns()
    findings: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for label, pattern in rules:
            if pattern.search(line):
                findings.append(f"line {lineno}: {label}")
        hidden = hidden_chars.findall(line if lineno > 1 else line.lstrip("\ufeff"))
        if hidden:
            codes = ", ".join(sorted({f"U+{ord(ch):04X}" for ch in hidden}))
            findings.append(f"line {lineno}: hidden unicode characters ({codes})")
    return tuple(findings)


def load_order(candidates: list[Any], home: Path) -> list[Any]:
    """The order plugins load in, which decides name clashes: **the first plugin to register a
    name keeps it** (a later one's registration is refused and listed as a warning). Plugins
    placed by hand, project plugins and entry points come first (in discovery order), then the
    ones ``plugins install`` installed, oldest install first, so installing a plugin never takes a
    name from one already there. ``candidates`` are :class:`~.discovery.PluginCandidate`."""
    try:
        from .install import read_metadata  # on first use: the isolated child starts light

        installed = {key: entry.installed_at or "" for key, entry in read_metadata(Path(home) / "plugins").items()}
    except Exception:  # an unreadable record: discovery order
        installed = {}
    ranked = sorted(enumerate(candidates), key=lambda item: (
        (1, installed[item[1].key], item[0]) if item[1].key in installed else (0, "", item[0])))
    return [c for _, c in ranked]


class PluginRegistry:
    """Everything registered by loaded plugins, keyed by name; hooks live in ``HookRunner``."""

    def __init__(self) -> None:
        self.tools: dict[str, ToolEntry] = {}
        self.commands: dict[str, CommandEntry] = {}
        self.cli_commands: dict[str, CliCommandEntry] = {}
        self.skills: dict[str, SkillEntry] = {}
        self.platforms: dict[str, PlatformEntry] = {}
        self.image_gen_providers: dict[str, ProviderEntry] = {}
        self.memory_providers: dict[str, ProviderEntry] = {}
        self.context_engines: list[ProviderEntry] = []
        self.auxiliary_tasks: dict[str, AuxiliaryTaskEntry] = {}

    def _tables(self) -> tuple[dict[str, Any], ...]:
        return (self.tools, self.commands, self.cli_commands, self.skills, self.platforms,
                self.image_gen_providers, self.memory_providers, self.auxiliary_tasks)

    def remove_plugin(self, plugin_key: str) -> None:
        for table in self._tables():
            for name in [n for n, e in table.items() if e.plugin_key == plugin_key]:
                del table[name]
        self.context_engines[:] = [e for e in self.context_engines if e.plugin_key != plugin_key]

    def clear(self) -> None:
        for table in self._tables():
            table.clear()
        self.context_engines.clear()

    def owned_by(self, plugin_key: str) -> dict[str, list[str]]:
        """Names registered by one plugin, per kind (for listings)."""
        return {
            "tools": [n for n, e in self.tools.items() if e.plugin_key == plugin_key],
            "commands": [n for n, e in self.commands.items() if e.plugin_key == plugin_key],
            "cli_commands": [n for n, e in self.cli_commands.items() if e.plugin_key == plugin_key],
            "skills": [n for n, e in self.skills.items() if e.plugin_key == plugin_key],
            "platforms": [n for n, e in self.platforms.items() if e.plugin_key == plugin_key],
            "image_gen_providers": [n for n, e in self.image_gen_providers.items() if e.plugin_key == plugin_key],
            "memory_providers": [n for n, e in self.memory_providers.items() if e.plugin_key == plugin_key],
            "context_engines": [e.name for e in self.context_engines if e.plugin_key == plugin_key],
            "auxiliary_tasks": [n for n, e in self.auxiliary_tasks.items() if e.plugin_key == plugin_key],
        }

    def skill_names_of(self, plugin_key: str) -> tuple[str, ...]:
        return tuple(n for n, e in self.skills.items() if e.plugin_key == plugin_key)
