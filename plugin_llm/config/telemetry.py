"""The ``telemetry:`` section of config.yaml: live OpenTelemetry traces and metrics (off unless set).

Pure: takes the parsed YAML value, returns a frozen value and warnings. ``otlp_endpoint`` (the
collector's base URL; unset: telemetry off), ``protocol`` (``http/protobuf`` or ``grpc``),
``headers_from_env`` (OTLP header name -> the environment variable holding its value: the value is
read when telemetry starts, never stored here or logged), ``service_name`` and ``sample_ratio``.
A problem here is a warning; a bad endpoint turns telemetry off (it is observability, not a gate).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

# the section checks speak as the service section's do: one did-you-mean, one bounded value shown
from plugin_llm.config.service import _did_you_mean, _short

__all__ = ["TelemetrySettings", "parse_telemetry_settings", "TELEMETRY_KEYS", "PROTOCOLS"]

TELEMETRY_KEYS = ("otlp_endpoint", "protocol", "headers_from_env", "service_name", "sample_ratio")
PROTOCOLS = ("http/protobuf", "grpc")
_MAX_URL = 2048
_MAX_NAME = 200
_MAX_HEADERS = 32
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class TelemetrySettings:
    """The ``telemetry:`` section; ``enabled`` when ``otlp_endpoint`` is set."""

    otlp_endpoint: str | None = None
    protocol: str = "http/protobuf"
    #: (OTLP header name, environment variable name) pairs
    headers_from_env: tuple[tuple[str, str], ...] = ()
    service_name: str = "plugin-llm"
    sample_ratio: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.otlp_endpoint is not None


def _endpoint(value: Any, warnings: list[str]) -> str | None:
    problem = None
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_URL:
        problem = f"expected a URL such as http://127.0.0.1:4318, got {type(value).__name__}"
    else:
        try:
            parts = urlsplit(value.strip())
            port = parts.port
        except ValueError:
            parts, port = None, None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            problem = "expected an http:// or https:// URL such as http://127.0.0.1:4318"
        elif parts.username is not None or parts.password is not None:
            # never echo it: the userinfo is a credential
            problem = "a user or password in the URL is refused (send credentials with headers_from_env)"
        elif port == 0:
            problem = "port 0 is not a collector's port"
    if problem is not None:
        warnings.append(f"telemetry.otlp_endpoint: {problem}; telemetry is off")
        return None
    return value.strip().rstrip("/")


def _headers(value: Any, warnings: list[str]) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        warnings.append("telemetry.headers_from_env: expected a mapping of header name to environment variable, "
                        f"such as {{x-api-key: OTLP_API_KEY}}, got {type(value).__name__}; no headers are sent")
        return ()
    out: list[tuple[str, str]] = []
    for raw_name, env in list(value.items())[:_MAX_HEADERS + 1]:
        name = str(raw_name)[:100]
        if len(out) >= _MAX_HEADERS:
            warnings.append(f"telemetry.headers_from_env: more than {_MAX_HEADERS} headers; the rest are ignored")
            break
        if not _HEADER_NAME.fullmatch(name):
            warnings.append(f"telemetry.headers_from_env.{name[:40]}: not an HTTP header name; ignored")
        elif not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
            warnings.append(f"telemetry.headers_from_env.{name}: expected the NAME of an environment variable "
                            f"(letters, digits, _), got {_short(env)}; ignored")
        else:
            out.append((name.lower(), env))
    return tuple(out)


def parse_telemetry_settings(raw: Any, warnings: list[str]) -> TelemetrySettings:
    """``telemetry:`` -> settings; problems are appended to ``warnings`` (never raises)."""
    if raw is None:
        return TelemetrySettings()
    if not isinstance(raw, Mapping):
        warnings.append(f"telemetry: expected a mapping such as {{otlp_endpoint: http://127.0.0.1:4318}}, got "
                        f"{type(raw).__name__}; telemetry is off")
        return TelemetrySettings()
    default = TelemetrySettings()
    for raw_key in raw:
        key = str(raw_key)[:60]
        if key not in TELEMETRY_KEYS:
            warnings.append(f"telemetry.{key}: unknown key, ignored{_did_you_mean(key, TELEMETRY_KEYS)}")
    values: dict[str, Any] = {}
    if raw.get("otlp_endpoint") is not None:
        values["otlp_endpoint"] = _endpoint(raw["otlp_endpoint"], warnings)
    protocol = raw.get("protocol")
    if protocol is not None:
        if protocol in PROTOCOLS:
            values["protocol"] = protocol
        else:
            warnings.append(f"telemetry.protocol: expected one of {', '.join(PROTOCOLS)}, got {_short(protocol)}; "
                            f"using {default.protocol}")
    values["headers_from_env"] = _headers(raw.get("headers_from_env"), warnings)
    name = raw.get("service_name")
    if name is not None:
        if isinstance(name, str) and name.strip() and len(name) <= _MAX_NAME and name.isprintable():
            values["service_name"] = name.strip()
        else:
            warnings.append(f"telemetry.service_name: expected a short name such as plugin-llm, got {_short(name)}; "
                            f"using {default.service_name}")
    ratio = raw.get("sample_ratio")
    if ratio is not None:
        if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and math.isfinite(ratio) and 0 <= ratio <= 1:
            values["sample_ratio"] = float(ratio)
        else:
            warnings.append(f"telemetry.sample_ratio: expected a number from 0 to 1 (the share of traces kept), got "
                            f"{_short(ratio)}; using {default.sample_ratio:g}")
    return TelemetrySettings(**values)
