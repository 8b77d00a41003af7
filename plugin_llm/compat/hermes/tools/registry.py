"""``tools.registry``: the result helpers tool handlers use.

Tools are registered with ``ctx.register_tool`` (the host's registry); this
module serves the JSON helpers Hermes plugins import.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["tool_error", "tool_result"]


def tool_error(message: Any, **extra: Any) -> str:
    """``{"error": message, **extra}`` as a JSON string."""
    result: dict[str, Any] = {"error": str(message)}
    result.update(extra)
    return json.dumps(result, ensure_ascii=False)


def tool_result(data: Any = None, **kwargs: Any) -> str:
    """``data`` (or the keyword arguments) as a JSON string."""
    return json.dumps(data if data is not None else kwargs, ensure_ascii=False)
