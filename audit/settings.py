"""Operator settings of the audit log (``audit:`` in ``config.yaml``).

``fsync``: ``"never"`` (default) survives a crash of the host process, but the last few seconds
can be lost if the machine loses power; ``"always"`` survives power loss at one disk flush per
record. Signed checkpoints (on when a signing key exists): ``checkpoint_every`` (default 1000),
``checkpoint_seconds`` (default 60), ``signing_key`` (default ``keys/audit-signing.key``, relative
to the home) or ``key_cmd`` (a command printing the private key). Every key and its default:
docs/auditors.md, "Settings".
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["AuditSettings", "FSYNC_POLICIES", "parse_audit_settings"]

FSYNC_POLICIES = ("never", "always")


@dataclass(frozen=True)
class AuditSettings:
    """How the writer behaves. Immutable; swap with ``AuditLog.update_settings``."""

    log_content: bool = False  #: operator opt-in: message content in records
    required: bool = False  #: fail the call closed when the log can't be written
    max_bytes: int = 50 * 1024**2  #: rotate agent.log beyond this size; 0 = never rotate
    backup_count: int = 10  #: keep agent.log.1 .. agent.log.N; 0 = drop the old file on rotation
    fsync: str = "never"  #: "never" | "always" (see module docstring)
    checkpoint_every: int = 1000  #: a signed checkpoint when the head seq is a multiple of this
    checkpoint_seconds: float = 60.0  #: ... and at most this long after an uncovered record
    signing_key: str = ""  #: private key file ("" = keys/audit-signing.key in the home)
    key_cmd: tuple[str, ...] = ()  #: or a command printing the private key

    def __post_init__(self) -> None:
        if not isinstance(self.log_content, bool) or not isinstance(self.required, bool):
            raise ValueError("audit.log_content and audit.required must be true or false")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 0:
            raise ValueError(f"audit.max_bytes must be a whole number of bytes >= 0; got {self.max_bytes!r}")
        if isinstance(self.backup_count, bool) or not isinstance(self.backup_count, int) or self.backup_count < 0:
            raise ValueError(f"audit.backup_count must be a whole number >= 0; got {self.backup_count!r}")
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"audit.fsync must be one of {', '.join(FSYNC_POLICIES)}; got {self.fsync!r}")
        every = self.checkpoint_every
        if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= 10**9:
            raise ValueError(f"audit.checkpoint_every must be a whole number of records >= 1; got {every!r}")
        seconds = self.checkpoint_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or not 0 < seconds <= 86400:
            raise ValueError(f"audit.checkpoint_seconds must be a number of seconds > 0 (at most a day); got {seconds!r}")
        if not isinstance(self.signing_key, str) or "\0" in self.signing_key:
            raise ValueError("audit.signing_key must be a file path")
        if not isinstance(self.key_cmd, tuple) or not all(isinstance(a, str) and a and "\0" not in a for a in self.key_cmd):
            raise ValueError("audit.key_cmd must be a command: a list of arguments or one string")


_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def _parse_size(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError
    return int(match.group(1)) * _UNITS[(match.group(2) or "")[:1].lower()]


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError


def parse_audit_settings(section: Mapping[str, Any] | None) -> tuple[AuditSettings, list[str]]:
    """Settings from the ``audit:`` mapping of config.yaml, plus warnings.

    Never raises for bad values: an invalid value keeps its default (booleans
    count as false: booleans are strict) and yields a warning naming the key; unknown
    keys are warned about with a "did you mean" hint. ``max_bytes`` accepts a
    number or a size such as ``"50MB"`` / ``"10 MiB"``.
    """
    defaults = AuditSettings()
    warnings: list[str] = []
    if section is None:
        return defaults, warnings
    if not isinstance(section, Mapping):
        return defaults, [f"audit: expected a mapping, got {type(section).__name__}; using defaults"]
    known = [f.name for f in fields(AuditSettings)]
    values: dict[str, Any] = {}
    for key, raw in section.items():
        if key not in known:
            hint = difflib.get_close_matches(str(key), known, n=1)
            warnings.append(f"audit.{key}: unknown setting" + (f" (did you mean audit.{hint[0]}?)" if hint else ""))
            continue
        try:
            if key in ("log_content", "required"):
                values[key] = _parse_bool(raw)
            elif key == "max_bytes":
                values[key] = _parse_size(raw)
            elif key in ("backup_count", "checkpoint_every"):
                if isinstance(raw, bool) or not isinstance(raw, int):
                    raise ValueError
                values[key] = raw
            elif key == "checkpoint_seconds":
                if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                    raise ValueError
                values[key] = float(raw)
            elif key == "signing_key":
                if not isinstance(raw, str) or not raw.strip():
                    raise ValueError
                values[key] = raw.strip()
            elif key == "key_cmd":
                if isinstance(raw, str):
                    values[key] = tuple(shlex.split(raw))
                elif isinstance(raw, list) and all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in raw):
                    values[key] = tuple(str(a) for a in raw)
                else:
                    raise ValueError
                if not values[key]:
                    raise ValueError
            else:
                values[key] = str(raw).strip().lower()
            AuditSettings(**{key: values[key]})
        except ValueError:
            values.pop(key, None)
            shown = repr(raw) if len(repr(raw)) <= 60 else repr(raw)[:57] + "..."
            if key == "required":  # a typo here must not make the audit fail open
                values[key] = True
                warnings.append(f"audit.required: {shown} is not true/false; treated as true (fail closed: a call "
                                "fails when its record cannot be written) until it is written as true or false")
            elif key == "log_content":
                values[key] = False
                warnings.append(f"audit.log_content: {shown} is not true/false; treated as false")
            else:
                shown = repr(raw) if len(repr(raw)) <= 60 else repr(raw)[:57] + "..."
                if key == "key_cmd":
                    shown = "(not shown)"  # could hold a secret
                warnings.append(f"audit.{key}: invalid value {shown}; using the default {getattr(defaults, key)!r}")
    return AuditSettings(**values), warnings
