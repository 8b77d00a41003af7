"""The CLI's and the service's own operational log lines, as readable console lines or JSON lines.

This is not the audit log (``audit/``: one chained record per call outcome); it is what the processes say
about themselves: warnings, a store that went away, a plugin that failed to load. Lines go through
structlog's processor chain: every value is redacted like the audit log's, control characters are
escaped on a console, and the ``call_id`` / ``trace_id`` bound with :func:`bound` are added.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

from auth import redact
from plugin_llm.hardened.terminal_text import escape_unsafe

__all__ = ["FORMATS", "install", "formatter", "bound"]

#: ``--log-format`` values
FORMATS = ("console", "json")
_MARK = "_plugin_llm_oplog"


def _redact(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    return {key: redact(value) if isinstance(value, str) else value for key, value in event.items()}


def _escape(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    return {key: escape_unsafe(value, 4000) if isinstance(value, str) else value for key, value in event.items()}


def formatter(fmt: str) -> logging.Formatter:
    """A formatter rendering stdlib log records as ``fmt`` (one of :data:`FORMATS`) lines."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    import structlog

    chain = [structlog.contextvars.merge_contextvars, structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
             structlog.processors.TimeStamper(fmt="iso", utc=True), structlog.processors.format_exc_info, _redact]
    if fmt == "json":
        renderer: Any = structlog.processors.JSONRenderer(sort_keys=True)
    else:
        chain.append(_escape)
        renderer = structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=chain, processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer])


def install(fmt: str, level: int = logging.WARNING, *, stream: Any = None) -> logging.Handler:
    """Send the process's log records to ``stream`` (stderr) as ``fmt`` lines, at ``level`` and above.
    Replaces a handler this module installed before; leaves others alone."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False) or getattr(handler, "_plugin_llm_terminal", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream)
    handler.setLevel(level)
    handler.setFormatter(formatter(fmt))
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    return handler


@contextlib.contextmanager
def bound(**values: Any) -> Iterator[None]:
    """Add ``values`` (``call_id``, ``trace_id``, ...) to every line logged in this context."""
    import structlog

    tokens = structlog.contextvars.bind_contextvars(**{k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)
