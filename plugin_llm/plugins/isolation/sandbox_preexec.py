"""What runs in an isolated plugin's child between fork and exec, and the host's own hardening.

:func:`_preexec` is computed in the host, so the child only makes system calls: a new session,
umask 077, ``PR_SET_PDEATHSIG``, the resource limits and, under process confinement, no
capabilities and ``PR_SET_NO_NEW_PRIVS``. :func:`harden_host_process` makes the host non-dumpable.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from .sandbox_limits import SandboxLimits

try:
    import resource
except ImportError:  # pragma: no cover - Windows: no rlimits (and no preexec_fn in subprocess)
    resource = None  # type: ignore[assignment]

__all__ = ["harden_host_process"]


def _clamped(limit: int, wanted: int) -> tuple[int, int]:
    """(soft, hard) for ``limit``: ``wanted``, but never above the host's hard limit (which cannot be raised)."""
    _soft, hard = resource.getrlimit(limit)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    return wanted, wanted


def _preexec(limits: SandboxLimits, *, drop_privileges: bool) -> Callable[[], None] | None:
    """The step run in the child between fork and exec: computed here, so the child only makes system calls.

    ``drop_privileges`` (process confinement; bubblewrap does the same itself):
    ``PR_SET_NO_NEW_PRIVS`` (no setuid binary gives the plugin more rights) and,
    when the host runs as root, an empty capability bounding set and no ambient
    capabilities, so the exec'd child has no capabilities at all (no
    ``CAP_SYS_PTRACE`` to read the host's ``/proc/<pid>/environ`` or memory, no
    ``CAP_DAC_OVERRIDE`` to read other users' files).
    """
    if resource is None:  # pragma: no cover - Windows
        return None
    settings = [
        (resource.RLIMIT_AS, _clamped(resource.RLIMIT_AS, limits.memory_mb * 1024 * 1024)),
        (resource.RLIMIT_NOFILE, _clamped(resource.RLIMIT_NOFILE, limits.open_files)),
        (resource.RLIMIT_CORE, (0, 0)),  # no core files of a plugin's memory in its scratch directory
    ]
    cpu_soft, cpu_hard = _clamped(resource.RLIMIT_CPU, limits.cpu_seconds)
    if cpu_hard == limits.cpu_seconds:  # SIGXCPU at the limit, SIGKILL a little later if it is ignored
        cpu_hard = cpu_soft + 5
        _soft, host_hard = resource.getrlimit(resource.RLIMIT_CPU)
        if host_hard != resource.RLIM_INFINITY:
            cpu_hard = min(cpu_hard, host_hard)
    settings.append((resource.RLIMIT_CPU, (cpu_soft, cpu_hard)))
    prctl = _prctl()
    parent = os.getpid()
    drop_caps = _bounding_capabilities() if drop_privileges and os.geteuid() == 0 else ()

    def preexec() -> None:
        os.setsid()
        os.umask(0o077)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL when the host (its thread that forked) goes away
            if os.getppid() != parent:  # the host died before prctl: nobody would kill us
                os._exit(1)
            if drop_privileges:
                for cap in drop_caps:
                    if prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:  # never run a plugin as root with capabilities
                        os.write(2, b"plugin-llm sandbox: cannot drop the child's capabilities (the host has no "
                                    b"CAP_SETPCAP); not starting the plugin\n")
                        os._exit(126)
                prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
                if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                    os.write(2, b"plugin-llm sandbox: PR_SET_NO_NEW_PRIVS failed; not starting the plugin\n")
                    os._exit(126)
        for which, values in settings:
            resource.setrlimit(which, values)

    return preexec


_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_PRCTL: list[Callable[..., int] | None] = []


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up in the host once (ctypes must not load libraries after fork)."""
    if not sys.platform.startswith("linux"):
        return None
    if not _PRCTL:
        try:
            import ctypes

            function = ctypes.CDLL(None, use_errno=True).prctl
            function.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
            function.restype = ctypes.c_int
            _PRCTL.append(function)
        except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
            _PRCTL.append(None)
    return _PRCTL[0]


def _bounding_capabilities() -> tuple[int, ...]:
    """The capabilities in this process's bounding set (what a root child would get back at exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapBnd:"):
                mask = int(line.split()[1], 16)
                return tuple(cap for cap in range(mask.bit_length()) if mask >> cap & 1)
    except (OSError, ValueError):  # pragma: no cover - no /proc: drop every capability Linux 6 knows
        pass
    return tuple(range(41))


def harden_host_process() -> bool:
    """Make the host non-dumpable (Linux ``PR_SET_DUMPABLE 0``), as ssh-agent and gpg-agent do; True when in effect.

    A process of the same OS user (a plugin's child under process confinement)
    can then read neither ``/proc/<host pid>/environ`` (the environment the host
    started with: provider keys) nor ``/proc/<host pid>/mem``, nor ptrace the
    host. The cost: no core dumps of the host, and debuggers or ``py-spy``
    attach to it only as root. Idempotent; does nothing elsewhere than Linux.
    """
    prctl = _prctl()
    if prctl is None:
        return False
    return prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
