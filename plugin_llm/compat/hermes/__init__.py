"""The Hermes plugin SDK modules, served to plugin code when real Hermes is not installed.

Plugins written for Hermes import a handful of Hermes modules when they load (``from
agent.memory_provider import MemoryProvider``, ``from tools.registry import tool_error``, ...).
This package holds compatible implementations of exactly those (the set hermes-agent 0.19.0's
bundled plugins import): they read and write *this* home, never hand out a credential, and never
install anything. :mod:`.finder` serves them under their Hermes names, only to imports made from
plugin code; real Hermes modules, when importable, win.

Served: :data:`SERVED`. Any other Hermes module fails with one line naming its subsystem
(:data:`SUBSYSTEMS`). ``plugins.<key path>[.<module>]`` resolves to the loaded plugin with that
key, so a bundled plugin copied into the home finds itself.
"""

from __future__ import annotations

__all__ = ["SERVED", "SUBSYSTEMS", "HERMES_TOP_LEVEL", "subsystem_of"]

_HERE = __name__

#: Hermes module name -> the module of this package that implements it.
SERVED: dict[str, str] = {
    name: f"{_HERE}.{name}"
    for name in (
        "agent",
        "agent.context_engine",
        "agent.memory_provider",
        "agent.memory_manager",
        "agent.image_gen_provider",
        "agent.file_safety",
        "agent.message_content",
        "agent.skill_commands",
        "hermes_constants",
        "hermes_state",
        "hermes_cli",
        "hermes_cli.config",
        "hermes_cli.auth",
        "tools",
        "tools.registry",
        "tools.url_safety",
        "tools.interrupt",
        "tools.xai_http",
        "tools.lazy_deps",
        "utils",
    )
}

#: Top-level names of Hermes's own packages (a module under one of these that is not
#: served fails with the subsystem it needs).
HERMES_TOP_LEVEL = frozenset(
    {"agent", "tools", "hermes_cli", "hermes_constants", "utils", "gateway", "providers", "cron",
     "model_tools", "toolsets", "run_agent", "hermes_logging", "hermes_state", "hermes_time",
     "acp_adapter", "tui_gateway", "plugins"}
)

#: Hermes module prefix -> the subsystem it belongs to (longest prefix wins).
SUBSYSTEMS: dict[str, str] = {
    "gateway": "messaging gateway",
    "agent.browser_provider": "browser automation",
    "agent.web_search_provider": "web search",
    "agent.video_gen_provider": "video generation",
    "agent.auxiliary_client": "auxiliary LLM client (use ctx.llm for model calls)",
    "agent.image_routing": "image routing of the agent loop",
    "agent.async_utils": "agent event-loop helpers",
    "agent.redact": "secret redactor of the agent loop",
    "agent": "agent loop",
    "hermes_cli.dashboard_auth": "dashboard auth",
    "hermes_cli.kanban_db": "kanban board",
    "hermes_cli.kanban_diagnostics": "kanban board",
    "hermes_cli.profiles": "profile manager",
    "hermes_cli": "CLI",
    "cron": "cron scheduler",
    "providers": "model providers (model routing is this host's core)",
    "tools.microsoft_graph_auth": "Microsoft Graph integration",
    "tools.microsoft_graph_client": "Microsoft Graph integration",
    "tools.transcription_tools": "speech transcription",
    "tools.website_policy": "website access policy",
    "tools": "built-in tools",
    "model_tools": "built-in tools",
    "toolsets": "built-in tools",
    "run_agent": "agent loop",
    "acp_adapter": "ACP adapter",
    "tui_gateway": "terminal UI",
}


def subsystem_of(name: str) -> str:
    """The Hermes subsystem a module name belongs to ("Hermes" when unknown)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        found = SUBSYSTEMS.get(".".join(parts[:n]))
        if found is not None:
            return found
    return "core"
