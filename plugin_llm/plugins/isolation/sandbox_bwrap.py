"""Bubblewrap for isolated plugins: whether it works here, and the mounts of one child.

:func:`bubblewrap_status` finds ``bwrap`` and runs it once with the options every child gets (cached
per binary and user); when that fails, ``reason`` says why and what to check. :func:`_bwrap_options`
builds one child's mounts: a read-only root with the homes, the host's temporary files and the
user's runtime directory hidden, what the child needs bound back read-only, and its scratch and data
directories read-write.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .sandbox_env import _package_roots, _user_site

__all__ = ["BubblewrapStatus", "bubblewrap_status"]


# ------------------------------------------------------------------ bubblewrap detection
@dataclass(frozen=True)
class BubblewrapStatus:
    """Whether bubblewrap confines isolated plugins here; ``reason`` says why (not)."""

    usable: bool
    path: str | None
    reason: str


_STATUS_CACHE: dict[tuple[str | None, int], BubblewrapStatus] = {}
_STATUS_LOCK = threading.Lock()
_TRIAL_TIMEOUT = 10.0

_INSTALL_HINT = "install bubblewrap (e.g. apt-get install bubblewrap, dnf install bubblewrap)"


def bubblewrap_status() -> BubblewrapStatus:
    """``bwrap`` found on PATH and a trial run with the options :func:`child_spec` uses works (cached per binary)."""
    if not sys.platform.startswith("linux"):
        return BubblewrapStatus(False, None, f"bubblewrap is Linux-only (this is {sys.platform})")
    path = shutil.which("bwrap")
    if path is None:
        return BubblewrapStatus(False, None, f"bwrap is not on PATH; {_INSTALL_HINT} to hide the home "
                                              "directory and the host's /proc from isolated plugins")
    key = (os.path.realpath(path), os.geteuid())
    with _STATUS_LOCK:
        cached = _STATUS_CACHE.get(key)
        if cached is None:
            cached = _STATUS_CACHE[key] = _trial(path)
    return cached


def _trial(path: str) -> BubblewrapStatus:
    target = shutil.which("true") or sys.executable
    argv = [path, *_BASE_OPTIONS, "--tmpfs", "/tmp", "--", target]
    if target == sys.executable:
        argv += ["-c", ""]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=_TRIAL_TIMEOUT, env={"PATH": os.environ.get("PATH", os.defpath)})
    except subprocess.TimeoutExpired:
        return BubblewrapStatus(False, path, f"{path}: a trial run did not finish in {_TRIAL_TIMEOUT:g} s")
    except OSError as exc:
        return BubblewrapStatus(False, path, f"{path} cannot be run: {exc.strerror or type(exc).__name__}")
    if done.returncode == 0:
        return BubblewrapStatus(True, path, f"{path} works here (new PID namespace, private /proc, home hidden)")
    message = done.stderr.decode("utf-8", "replace").strip().splitlines()
    first = message[0][:300] if message else f"exit status {done.returncode}"
    return BubblewrapStatus(False, path, f"{path} is installed but a trial run failed: {first}{_why(first)}")


def _why(message: str) -> str:
    text = message.lower()
    if "proc" in text and ("not permitted" in text or "permission denied" in text):
        return ("; mounting a private /proc is refused, as inside a Docker or Podman container whose /proc "
                "is partly masked (run the container with --security-opt systempaths=unconfined, or without "
                "bubblewrap)")
    if "namespace" in text or "operation not permitted" in text or "permission denied" in text:
        return ("; unprivileged user namespaces look disabled here (check sysctl kernel.unprivileged_userns_clone, "
                "user.max_user_namespaces and, on Ubuntu 24.04+, kernel.apparmor_restrict_unprivileged_userns), "
                "or a container runtime forbids them")
    return ""


# Options every confined child gets (the trial run uses them too, so "usable" means these work).
_BASE_OPTIONS = (
    "--ro-bind", "/", "/",
    "--dev", "/dev",
    "--unshare-pid",
    "--proc", "/proc",
    "--unshare-ipc",
    "--die-with-parent",
    "--new-session",
    "--cap-drop", "ALL",  # as root, bwrap would otherwise keep capabilities (CAP_SYS_ADMIN could unmount the tmpfs)
)


# ------------------------------------------------------------------ bubblewrap options
def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def _hidden_paths(hermes_home: Path) -> list[str]:
    """What a bubblewrap child must not see: the homes, the host's temporary files, the user's runtime dir."""
    # /home and /root too: other users' homes are often readable (mode 0755), and whatever is needed from
    # under them (a venv, a checkout) is bound back
    candidates = [str(hermes_home), os.environ.get("HOME") or "", "/home", "/root", tempfile.gettempdir(), "/tmp",
                  "/var/tmp", f"/run/user/{os.getuid()}"]
    try:
        import pwd

        candidates.append(pwd.getpwuid(os.getuid()).pw_dir)
    except (ImportError, KeyError):  # pragma: no cover - no passwd entry
        pass
    out = []
    for path in candidates:
        if path and os.path.isdir(path):
            real = _real(path)
            if real != "/":
                out.append(real)
    return list(dict.fromkeys(out))


def _needed_paths(plugin_dir: Path, env: Mapping[str, str]) -> list[str]:
    """What a bubblewrap child must read: the interpreter, the gateway's packages, the plugin, its import path."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(_real(sys.executable)), *_package_roots(), str(plugin_dir)]
    for variable in ("PYTHONPATH", "LD_LIBRARY_PATH"):
        paths += [p for p in env.get(variable, "").split(os.pathsep) if os.path.isabs(p)]
    user_site = _user_site()
    if user_site:
        paths.append(user_site)
    out = []
    for path in paths:
        if path and os.path.exists(path):
            out.append(_real(path))
    return list(dict.fromkeys(out))


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _bwrap_options(plugin_dir: Path, hermes_home: Path, scratch: Path, env: Mapping[str, str],
                   share_network: bool, data_dir: Path | None = None) -> list[str]:
    """Mount options, applied in order: read-only root, then (shallowest first) hide and bind back.

    A hidden directory becomes an empty tmpfs; a needed path inside one is
    bound back read-only (a needed path elsewhere is visible already). Shallow
    paths come first, so a hidden directory inside a needed one (a home inside
    a source checkout) is hidden again after the bind; every bind also gets a
    tmpfs over each hidden directory inside its source, at that directory's
    place under the bind's destination (a linked checkout that holds the home,
    bound at the link's path, shows no home there either). The scratch
    directory and the plugin's own data directory (inside the hidden home) are
    bound read-write last.
    """
    hidden = _hidden_paths(hermes_home)

    def inside_hidden(path: str) -> bool:
        return any(_under(path, h) and path != h for h in hidden)

    def covered(path: str) -> bool:  # visible through an earlier bind, no hidden directory in between
        return any(_under(path, b) and not any(_under(h, b) and _under(path, h) for h in hidden) for b in bound)

    ops: list[tuple[int, int, str, str]] = [(p.count("/"), 0, p, p) for p in hidden]
    bound: list[str] = []
    for path in sorted(_needed_paths(plugin_dir, env), key=len):
        if inside_hidden(path) and not covered(path):
            bound.append(path)
            ops.append((path.count("/"), 1, path, path))
    # A plugin installed with --link is a symlink in <home>/plugins/: its target is bound above; the link
    # itself vanished with the hidden home, so the target is bound at the link's path too (what the worker imports).
    logical, real = os.path.abspath(plugin_dir), _real(plugin_dir)
    if logical != real and os.path.isdir(real) and inside_hidden(logical):
        ops.append((logical.count("/"), 1, real, logical))
    for _depth, kind, source, dest in list(ops):  # kind 2: after the bind at its depth, before deeper binds
        if kind == 1:
            ops += [(mirror.count("/"), 2, mirror, mirror)
                    for mirror in (dest + h[len(source):] for h in hidden if _under(h, source))]
    options = list(_BASE_OPTIONS)
    if not share_network:
        options.append("--unshare-net")
    for _depth, kind, source, dest in sorted(set(ops)):
        options += ["--ro-bind", source, dest] if kind == 1 else ["--tmpfs", dest]
    if data_dir is not None:
        options += ["--bind", str(data_dir), str(data_dir)]
    options += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch)]
    return options
