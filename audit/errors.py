"""Errors raised by the audit package.

They derive from plain ``Exception``/``FileNotFoundError`` so that ``audit``
does not depend on the gateway; the core wraps :class:`AuditWriteError` into
its own ``PluginLlmError`` when a call must fail closed.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["AuditWriteError", "AuditLogNotFoundError"]


class AuditWriteError(Exception):
    """The audit log could not be written and ``audit.required`` is true.

    ``path`` is the log file, ``reason`` a short description of the OS error
    (never record content, never a credential).
    """

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(
            f"audit log {self.path} cannot be written ({reason}); audit.required is true, so the call "
            f"is refused. Fix: make {self.path.parent} writable and free disk space, or set "
            f"audit.required: false in config.yaml to log best-effort."
        )


class AuditLogNotFoundError(FileNotFoundError):
    """There is no audit log at the given place (nothing logged yet, or a wrong home)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        super().__init__(
            f"no audit log at {self.path}: nothing has been recorded in this home yet, "
            f"or --home/HERMES_HOME points somewhere else"
        )
