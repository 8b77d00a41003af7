"""The host's audit log: one writer per home, secrets redacted, config reloads recorded.

Everything in the host that writes to ``<home>/logs/agent.log`` (the call
pipeline, the plugin manager, config reload events) goes through
:func:`host_audit_log`, so every line passes the same credential redactor.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

from audit import config_reload_fields
from auth.redaction import redact_field
from plugin_llm.config import ConfigSource, HostConfig

__all__ = ["host_audit_log", "write_event", "write_spare_event", "watch_config"]


def host_audit_log(home: Path, settings: Any = None):
    """The process-wide :class:`audit.AuditLog` of ``home`` with the secret redactor attached.

    The redactor is :func:`auth.redaction.redact_field`: ``redact`` that remembers the short
    values it found clean (a record's plugin id, provider, model, reasons recur call after call).
    """
    from audit import get_audit_log  # on first use: import plugin_llm.llm stays light

    return get_audit_log(Path(home) / "logs" / "agent.log", settings, redact=redact_field)


def write_event(home: Path, event: str, **fields: Any) -> None:
    """An operational event; never raises (an audit problem must not break the host)."""
    try:
        host_audit_log(home).write_event(event, **fields)
    except Exception:  # pragma: no cover - write_event itself reports failures
        pass


def write_spare_event(home: Path, event: str, *, force: bool = False, **fields: Any) -> bool:
    """An event that never rotates the log (:meth:`audit.AuditLog.write_spare_event`); False when its
    file's spare room is used up (nothing written). Never raises."""
    try:
        return host_audit_log(home).write_spare_event(event, force=force, **fields)
    except Exception:  # pragma: no cover - write_spare_event itself reports failures
        return True


def _policy(config: HostConfig) -> dict[str, dict[str, Any]]:
    return {plugin_id: vars(policy) for plugin_id, policy in config.trust.items()}


def _on_reload(old: HostConfig | None, new: HostConfig) -> None:
    fields = config_reload_fields(_policy(old) if old is not None else None, _policy(new))
    fields["config_path"] = str(new.path)
    if new.error:
        fields["config_error"] = new.error
    event = "config_error" if new.error else ("config_loaded" if old is None else "config_reloaded")
    sink = host_audit_log(new.home, new.audit)
    sink.write_event(event, **fields)
    _telemetry(sink, new)


def _telemetry(sink: Any, config: HostConfig) -> None:
    """Export the home's call records as its ``telemetry:`` says (the SDK is imported only when it is on)."""
    from plugin_llm import telemetry  # on first use: import plugin_llm.llm stays light

    telemetry.configure(sink, config.telemetry)


_WATCHED: "weakref.WeakSet[ConfigSource]" = weakref.WeakSet()
_WATCH_LOCK = threading.Lock()


def watch_config(source: ConfigSource) -> None:
    """Record every (re)load of ``source`` in its home's audit log (once per source)."""
    with _WATCH_LOCK:
        if source in _WATCHED:
            return
        _WATCHED.add(source)
    source.on_reload(_on_reload)
    config = source.loaded()  # loaded before this listener (the service reads it first): apply telemetry now
    if config is not None:
        _telemetry(host_audit_log(config.home, config.audit), config)
