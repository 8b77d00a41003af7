"""A model route's circuit breaker policy (``llm.breaker`` and a route's own ``breaker:``).

Pure: takes the parsed YAML value, returns a frozen policy and appends warnings. ``failures``
consecutive failures within ``window`` seconds open the breaker; after ``cooldown`` seconds it
lets one probe call through. ``false`` or ``{enabled: false}`` turns it off (``failures`` 0).
A problem here never turns the breaker off: an unknown key or a bad value is a warning and the
default is kept. How the state is kept and shared: docs/limits.md, "Circuit breakers".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

# the section checks speak as the service section's do: one did-you-mean, one bounded value shown
from plugin_llm.config.service import _did_you_mean, _short

__all__ = ["BreakerPolicy", "DISABLED", "BREAKER_KEYS", "parse_breaker_policy"]

BREAKER_KEYS = ("enabled", "failures", "window", "cooldown")
#: bounds of the values accepted (beyond them, more likely a unit mistake than a wish)
MAX_FAILURES = 1000
MIN_SECONDS = 1.0
MAX_SECONDS = 86400.0


@dataclass(frozen=True)
class BreakerPolicy:
    """When a route's breaker opens and for how long; ``failures`` 0: no breaker."""

    failures: int = 5
    window: float = 60.0
    cooldown: float = 30.0

    @property
    def enabled(self) -> bool:
        return self.failures > 0


DISABLED = BreakerPolicy(failures=0)


def _seconds(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and MIN_SECONDS <= value <= MAX_SECONDS)


def parse_breaker_policy(raw: Any, where: str, warnings: list[str]) -> BreakerPolicy:
    """``raw`` (the YAML value at ``where``, e.g. ``llm.breaker``) -> a policy; never raises."""
    default = BreakerPolicy()
    if raw is None or raw is True:
        return default
    if raw is False:
        return DISABLED
    if not isinstance(raw, Mapping):
        warnings.append(f"{where}: expected a mapping such as {{failures: 5, window: 60, cooldown: 30}} or false, "
                        f"got {_short(raw)}; using the defaults (the breaker stays on)")
        return default
    for raw_key in raw:
        key = str(raw_key)[:60]
        if key not in BREAKER_KEYS:
            warnings.append(f"{where}.{key}: unknown key, ignored{_did_you_mean(key, BREAKER_KEYS)}")
    values: dict[str, Any] = {}
    failures = raw.get("failures")
    if failures is not None:
        if isinstance(failures, int) and not isinstance(failures, bool) and 1 <= failures <= MAX_FAILURES:
            values["failures"] = failures
        else:
            hint = f" (to turn the breaker off, write {where}: false)" if type(failures) is int and failures == 0 else ""
            warnings.append(f"{where}.failures: expected a whole number of failures from 1 to {MAX_FAILURES}, got "
                            f"{_short(failures)}; using {default.failures}{hint}")
    for key, meaning in (("window", "within which the failures count"), ("cooldown", "the breaker stays open")):
        value = raw.get(key)
        if value is None:
            continue
        if _seconds(value):
            values[key] = float(value)
        else:
            warnings.append(f"{where}.{key}: expected the seconds {meaning}, from {MIN_SECONDS:g} to "
                            f"{MAX_SECONDS:g} (a day), got {_short(value)}; using {getattr(default, key):g}")
    enabled = raw.get("enabled", True)
    if isinstance(enabled, str) and enabled.strip().lower() in ("true", "false"):
        enabled = enabled.strip().lower() == "true"
    if enabled is False:
        return DISABLED
    if enabled is not True:
        warnings.append(f"{where}.enabled: expected true or false, got {_short(enabled)}; the breaker stays on")
    return BreakerPolicy(**values)
