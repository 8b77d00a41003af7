"""The one format of times in the CLI's ``--json`` outputs (and of the audit log's ``ts``).

ISO 8601 in UTC with milliseconds and ``Z`` (``2026-03-01T09:30:00.250Z``): fixed
width, so it sorts as text. Where scripts need a number, the output has the same
instant as Unix seconds beside it, under the name with ``_unix`` (``expires_unix``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

__all__ = ["utc_iso", "utc_iso_text", "with_unix"]

_FIRST, _LAST = 0.0, 253402300799.9995  # 1970-01-01T00:00:00.000Z .. 9999-12-31T23:59:59.999Z


def utc_iso(ts: float | None) -> str | None:
    """Unix seconds as ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (None stays None; clamped to 1970..9999, NaN as the end)."""
    if ts is None:
        return None
    ts = min(max(float(ts), _FIRST), _LAST) if ts == ts else _LAST
    whole = int(ts)
    millis = min(999, int((ts - whole) * 1000))
    return datetime.fromtimestamp(whole, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis:03d}Z"


def utc_iso_text(value: Any) -> Any:
    """An ISO 8601 time written in another form (``+00:00``, microseconds, an offset) in the one form;
    anything else (None, a text that is not a time) unchanged."""
    if not isinstance(value, str) or not value:
        return value
    try:
        moment = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        return value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def with_unix(name: str, ts: float | None) -> dict[str, Any]:
    """``{name: <ISO>, name_unix: <seconds>}`` for an output that scripts read."""
    return {name: utc_iso(ts), f"{name}_unix": ts}
