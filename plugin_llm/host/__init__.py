"""The host runtime: a session/turn loop that drives the plugin manager.

:class:`Session` runs conversation turns against the configured model route
through the gateway (audited as ``host``), offers the registered tools, fires
every hook at its point, dispatches slash commands and drains injected
messages. :class:`ContextCompressor` is the built-in context engine.
"""

from plugin_llm.host.compressor import (
    DEFAULT_BUDGET_TOKENS,
    ContextCompressor,
    estimate_message_tokens,
    estimate_tokens,
)
from plugin_llm.host.session import BUILTIN_COMMAND_HELP, Session, ToolRun, TurnResult, format_plugins

__all__ = [
    "Session",
    "TurnResult",
    "ToolRun",
    "ContextCompressor",
    "DEFAULT_BUDGET_TOKENS",
    "BUILTIN_COMMAND_HELP",
    "estimate_tokens",
    "estimate_message_tokens",
    "format_plugins",
]
