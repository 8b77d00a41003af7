"""Resource limits of an isolated plugin's child (``isolation_limits``, host-wide or per plugin).

:class:`SandboxLimits` is what the child gets (address space, CPU seconds, open files; applied
between fork and exec by :mod:`.sandbox_preexec`), :data:`DEFAULT_LIMITS` why these numbers, and
:func:`parse_limits` reads a config mapping with a clear error for anything else.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SandboxLimits", "DEFAULT_LIMITS", "LIMIT_RANGES", "parse_limits"]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits applied inside the child (``setrlimit`` between fork and exec)."""

    memory_mb: int  # RLIMIT_AS: address space, in MiB
    cpu_seconds: int  # RLIMIT_CPU: CPU time over the child's whole life; the host restarts it when it hits it
    open_files: int  # RLIMIT_NOFILE


#: Why these numbers:
#: * 1024 MiB of address space: RLIMIT_AS counts *virtual* memory. A Python
#:   3.11 child that imported the plugin manager and runs four threads uses
#:   ~23 MiB resident but ~165 MiB of address space (each thread reserves an
#:   8 MiB stack; with glibc's default of one 64 MiB malloc arena per thread it
#:   would be ~390 MiB, hence MALLOC_ARENA_MAX=2 in the child's environment).
#:   1 GiB leaves a wide margin for a plugin's own libraries, threads and data,
#:   and still stops a runaway allocation long before the machine suffers.
#: * 600 CPU seconds: hook and tool calls take milliseconds of CPU, so ten
#:   minutes is thousands of calls; a busy loop that escaped the per-call
#:   time limits is stopped within ten minutes, and the host restarts the child.
#: * 512 open files: sockets and files a plugin keeps open; the usual soft
#:   default is 1024, a leak is caught at half of it.
DEFAULT_LIMITS = SandboxLimits(memory_mb=1024, cpu_seconds=600, open_files=512)

#: Accepted range of each limit (inclusive). Below the minimum a Python child cannot start.
LIMIT_RANGES: Mapping[str, tuple[int, int]] = {
    "memory_mb": (128, 1 << 22),  # 128 MiB .. 4 TiB
    "cpu_seconds": (1, 1 << 31),
    "open_files": (16, 1 << 20),
}

_LIMIT_MEANING = {
    "memory_mb": "address space of the child in MiB",
    "cpu_seconds": "CPU seconds over the child's life",
    "open_files": "open file descriptors",
}


def parse_limits(raw: object, where: str) -> SandboxLimits:
    """Limits from a config mapping ``{memory_mb, cpu_seconds, open_files}`` (any subset; None = all defaults).

    Raises ValueError naming ``where``, the key and the fix for anything else.
    """
    if raw is None:
        return DEFAULT_LIMITS
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping of {', '.join(LIMIT_RANGES)}, got {_type_name(raw)}; "
                         f"fix: write it as e.g. {where.rsplit('.', 1)[-1]}: {{memory_mb: {DEFAULT_LIMITS.memory_mb}}}")
    values = {name: getattr(DEFAULT_LIMITS, name) for name in LIMIT_RANGES}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise ValueError(f"{where}: keys must be limit names ({', '.join(LIMIT_RANGES)}), got a {_type_name(key)}")
        if key not in LIMIT_RANGES:
            close = difflib.get_close_matches(key, list(LIMIT_RANGES), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}.{_shown(key)}: unknown limit{hint}; the limits are {', '.join(LIMIT_RANGES)}")
        low, high = LIMIT_RANGES[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}.{key}: expected a whole number ({_LIMIT_MEANING[key]}, {low}..{high}), "
                             f"got {_type_name(value)}; fix: e.g. {key}: {getattr(DEFAULT_LIMITS, key)}")
        if not low <= value <= high:
            raise ValueError(f"{where}.{key}: {value if abs(value) < 10**12 else 'a huge number'} is out of range "
                             f"({_LIMIT_MEANING[key]}: {low}..{high}); fix: e.g. {key}: {getattr(DEFAULT_LIMITS, key)}")
        values[key] = value
    return SandboxLimits(**values)


def _type_name(value: object) -> str:
    return type(value).__name__[:60]


def _shown(key: str) -> str:
    return key if len(key) <= 60 and key.isprintable() else repr(key[:60]) + "..."
