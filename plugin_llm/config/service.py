"""The ``service:`` section of config.yaml: settings of ``plugin-llm serve``.

Pure: takes the parsed YAML value, returns a frozen value and warnings. ``config.py`` owns reading
the file; this module owns the rules of this section: ``failed_auth`` (``max_failures``,
``window_seconds``, ``block_seconds``: a brake on token guessing per client address; 0
``max_failures`` turns it off), ``header_timeout``, ``write_timeout``, ``max_connections`` and
``max_connections_per_address``. Defaults and meaning: docs/reference/config.md and
docs/service.md.

A request without any token is answered 401 but not counted (no guess was made). A problem here
never turns the brake off: an unknown key or a bad value is a warning and the default is used.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["FailedAuthSettings", "ServiceSettings", "parse_service_settings", "SERVICE_KEYS", "FAILED_AUTH_KEYS"]

SERVICE_KEYS = ("failed_auth", "header_timeout", "write_timeout", "max_connections", "max_connections_per_address")
FAILED_AUTH_KEYS = ("max_failures", "window_seconds", "block_seconds")
#: the longest window or block accepted (a day): a longer one is more likely a unit mistake than a wish
_MAX_SECONDS = 86400.0
_MAX_FAILURES = 1_000_000
#: the longest header or write timeout accepted: a slow client may hold its connection this long
_MAX_IO_SECONDS = 3600.0
_MAX_CONNECTIONS = 1_000_000


@dataclass(frozen=True)
class FailedAuthSettings:
    """``service.failed_auth``: after ``max_failures`` refused tokens from one address within
    ``window_seconds``, that address gets 429 for ``block_seconds`` (0 ``max_failures``: no brake)."""

    max_failures: int = 20
    window_seconds: float = 60.0
    block_seconds: float = 60.0

    @property
    def enabled(self) -> bool:
        return self.max_failures > 0


@dataclass(frozen=True)
class ServiceSettings:
    """The ``service:`` section."""

    failed_auth: FailedAuthSettings = field(default_factory=FailedAuthSettings)
    #: seconds a connection has to send a whole request head (from its start, or from the previous answer)
    header_timeout: float = 5.0
    #: seconds an answer may stay blocked on a client that does not read (its send buffer full)
    write_timeout: float = 30.0
    #: open connections per worker; None: derived from the open-file limit at start
    max_connections: int | None = None
    #: open connections per worker from one client address (a trusted proxy's count in the total only)
    max_connections_per_address: int = 256


def _did_you_mean(key: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, (int, float, bool)) or value is None else repr(str(value)[:40])
    return text[:60]


def _parse_failed_auth(raw: Any, warnings: list[str]) -> FailedAuthSettings:
    default = FailedAuthSettings()
    if raw is None:
        return default
    if not isinstance(raw, Mapping):
        warnings.append(f"service.failed_auth: expected a mapping such as {{max_failures: 20, window_seconds: 60}}, "
                        f"got {type(raw).__name__}; using the defaults (the brake stays on)")
        return default
    values: dict[str, Any] = {}
    for raw_key, value in raw.items():
        key = str(raw_key)[:60]
        if key not in FAILED_AUTH_KEYS:
            warnings.append(f"service.failed_auth.{key}: unknown key, ignored{_did_you_mean(key, FAILED_AUTH_KEYS)}")
            continue
        number_ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if key == "max_failures":
            if not number_ok or value != int(value) or not 0 <= value <= _MAX_FAILURES:
                warnings.append(f"service.failed_auth.max_failures: expected a whole number from 0 (no brake) to "
                                f"{_MAX_FAILURES:,}, got {_short(value)}; using {default.max_failures}")
                continue
            values[key] = int(value)
        else:
            if not number_ok or not 0 < value <= _MAX_SECONDS:
                warnings.append(f"service.failed_auth.{key}: expected seconds, more than 0 and at most "
                                f"{_MAX_SECONDS:g}, got {_short(value)}; using {getattr(default, key):g}")
                continue
            values[key] = float(value)
    return FailedAuthSettings(**values)


def _parse_connection_keys(raw: Mapping[str, Any], warnings: list[str]) -> dict[str, Any]:
    default = ServiceSettings()
    values: dict[str, Any] = {}
    for key in ("header_timeout", "write_timeout"):
        if key not in raw:
            continue
        value = raw[key]
        if not _number_ok(value) or not 0 < value <= _MAX_IO_SECONDS:
            warnings.append(f"service.{key}: expected seconds, more than 0 and at most {_MAX_IO_SECONDS:g}, got "
                            f"{_short(value)}; using {getattr(default, key):g}")
            continue
        values[key] = float(value)
    for key in ("max_connections", "max_connections_per_address"):
        if key not in raw or (key == "max_connections" and raw[key] is None):
            continue
        value = raw[key]
        if not _number_ok(value) or value != int(value) or not 1 <= value <= _MAX_CONNECTIONS:
            fallback = "derived from the open-file limit" if key == "max_connections" else getattr(default, key)
            warnings.append(f"service.{key}: expected a whole number from 1 to {_MAX_CONNECTIONS:,}"
                            f"{' (or null: derived from the open-file limit)' if key == 'max_connections' else ''}, "
                            f"got {_short(value)}; using {fallback}")
            continue
        values[key] = int(value)
    return values


def _number_ok(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_service_settings(raw: Any, warnings: list[str]) -> ServiceSettings:
    """``service:`` -> settings; problems are appended to ``warnings`` (never raises)."""
    if raw is None:
        return ServiceSettings()
    if not isinstance(raw, Mapping):
        warnings.append(f"service: expected a mapping such as {{failed_auth: {{max_failures: 20}}}}, got "
                        f"{type(raw).__name__}; using the defaults")
        return ServiceSettings()
    for raw_key in raw:
        key = str(raw_key)[:60]
        if key not in SERVICE_KEYS:
            warnings.append(f"service.{key}: unknown key, ignored{_did_you_mean(key, SERVICE_KEYS)}")
    return ServiceSettings(failed_auth=_parse_failed_auth(raw.get("failed_auth"), warnings),
                           **_parse_connection_keys(raw, warnings))
