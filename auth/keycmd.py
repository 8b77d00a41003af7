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
    non-zero, times out, prints nothing, or prints more than one line. The
    error is raised from a frame that holds none of the command's output and
    chains no exception that does (``subprocess.TimeoutExpired`` carries the
    partial output), so a traceback printed with its locals shows no key.
    """
    name = os.path.basename(argv[0]) if argv else "?"
    label = f"key_cmd of {where} ({name!r})"
    key, problem = _run(argv, label, timeout)  # the process object (it keeps the output) stays in there
    if problem is not None:
        raise PluginLlmConfigError(f"{label}: {problem}")
    return key  # type: ignore[return-value]


def _run(argv: Sequence[str], label: str, timeout: float) -> tuple[str | None, str | None]:
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
    return _collect(proc, timeout)


def _collect(proc: subprocess.Popen, timeout: float) -> tuple[str | None, str | None]:
    """(the key, None) or (None, what went wrong) — never an exception that holds the output."""
    timed_out = False
    try:
        output = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:  # its .output may hold part of the key: not chained to anything
        timed_out = True
        output = b""
    finally:
        if proc.poll() is None:  # timed out or interrupted (e.g. KeyboardInterrupt): do not leave it running
            _kill_group(proc)
    if timed_out:
        with contextlib.suppress(Exception):
            proc.communicate(timeout=1.0)
        return None, f"did not finish within {timeout:g} s and was killed"
    return _key_from(proc.returncode, output)


def _key_from(returncode: int, output: bytes) -> tuple[str | None, str | None]:
    if returncode != 0:
        return None, f"exited with status {returncode}; {_NOT_SHOWN}"
    try:
        key = output.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, f"printed bytes that are not UTF-8; {_NOT_SHOWN}"
    if not key:
        return None, "printed nothing on stdout; it must print the key"
    if any(ch.isspace() or ord(ch) < 32 for ch in key):
        return None, (
            "printed more than one line or a value with spaces; it must print only the key "
            f"(a password manager that prints extra lines needs a small wrapper printing the first line); {_NOT_SHOWN}"
        )
    return key, None
