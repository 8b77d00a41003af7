"""Run a ``key_cmd``: a password-manager style command whose stdout is the key.

The command runs without a shell, with stdin closed and a timeout; on timeout
its whole process group is killed so a lingering child cannot keep it alive.
Errors never include what the command printed: that output may be the secret
(or part of it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Sequence

from plugin_llm.errors import PluginLlmConfigError

__all__ = ["DEFAULT_KEY_CMD_TIMEOUT", "run_key_cmd"]

DEFAULT_KEY_CMD_TIMEOUT = 5.0

_NOT_SHOWN = "its output is not shown because it may contain the key; run the command yourself to see it"


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover
            proc.kill()


def run_key_cmd(argv: Sequence[str], *, where: str, timeout: float = DEFAULT_KEY_CMD_TIMEOUT) -> str:
    """Run ``argv`` and return its stripped stdout; ``where`` names the entry in errors.

    Raises :class:`PluginLlmConfigError` when the command cannot start, exits
    non-zero, times out, prints nothing, or prints more than one line.
    """
    name = os.path.basename(argv[0]) if argv else "?"
    label = f"key_cmd of {where} ({name!r})"
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            shell=False,
            start_new_session=(os.name == "posix"),
            close_fds=True,
        )
    except FileNotFoundError:
        raise PluginLlmConfigError(f"{label}: command not found; check the path or PATH") from None
    except PermissionError:
        raise PluginLlmConfigError(f"{label}: not executable (permission denied)") from None
    except OSError as exc:
        raise PluginLlmConfigError(f"{label}: cannot start: {exc.strerror}") from None
    try:
        out, _err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=1.0)
        raise PluginLlmConfigError(f"{label}: did not finish within {timeout:g} s and was killed") from None
    finally:
        if proc.poll() is None:  # interrupted (e.g. KeyboardInterrupt): do not leave it running
            _kill_group(proc)
    if proc.returncode != 0:
        raise PluginLlmConfigError(f"{label}: exited with status {proc.returncode}; {_NOT_SHOWN}")
    try:
        key = out.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise PluginLlmConfigError(f"{label}: printed bytes that are not UTF-8; {_NOT_SHOWN}") from None
    if not key:
        raise PluginLlmConfigError(f"{label}: printed nothing on stdout; it must print the key")
    if any(ch.isspace() or ord(ch) < 32 for ch in key):
        raise PluginLlmConfigError(
            f"{label}: printed more than one line or a value with spaces; it must print only the key "
            f"(a password manager that prints extra lines needs a small wrapper printing the first line); {_NOT_SHOWN}"
        )
    return key
