"""What one line of input to a host :class:`~plugin_llm.host.session.Session` produced:
:class:`TurnResult`, with a :class:`ToolRun` per tool call the model made."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolRun:
    """One tool call the model made during a turn and what it returned."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    result: str

    @property
    def blocked(self) -> bool:
        """True when a ``pre_tool_call`` guard stopped the call (the handler never ran)."""
        try:
            error = json.loads(self.result).get("error")
        except (ValueError, AttributeError):
            return False
        return isinstance(error, str) and ("blocked by plugin policy" in error or "(fail-closed)" in error)


@dataclass(frozen=True)
class TurnResult:
    """What one line of input produced.

    ``kind``: ``reply`` (a conversation turn), ``command`` (a slash command ran),
    ``unknown_command``, ``command_error`` (the handler raised) or ``exit``.
    ``stop_reason`` for replies: ``done`` or ``tool_limit``.
    ``injected``: messages that arrived while the turn ran and joined it.
    """

    kind: str
    text: str | None
    stop_reason: str = "done"
    tool_runs: tuple[ToolRun, ...] = ()
    model_requests: int = 0
    injected: tuple[str, ...] = ()
    usage: Any = None
    provider: str | None = None
    model: str | None = None
    command: str | None = None
    #: for ``command_error``: the plugin's own frames of the failure (file:line), "" when none
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.kind in ("reply", "command", "exit")
