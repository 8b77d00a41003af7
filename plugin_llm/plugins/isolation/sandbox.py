"""How an out-of-process plugin's child is started and confined.

:func:`child_spec` builds everything ``subprocess.Popen`` needs (``spec.argv``, ``env``, ``cwd``,
``preexec_fn``); the host starts the child and calls ``spec.cleanup()`` after it is gone. The child
gets an environment from an allowlist (:mod:`.sandbox_env`); its own scratch directory (or its
persistent data directory, both kept here) as ``HOME``; resource limits (:mod:`.sandbox_limits`), a
new session, no capabilities (:mod:`.sandbox_preexec`); and, with a working ``bwrap``, bubblewrap
(:mod:`.sandbox_bwrap`): a read-only filesystem without the real home, a private ``/proc``, and no
network unless ``share_network=True``. Without bubblewrap the network cannot be taken away
(``share_network=False`` raises :class:`SandboxUnavailable`) and the confinement is ``"process"``
(:attr:`ChildSpec.reason` says why): the child can read any file the same OS user can.

``PR_SET_PDEATHSIG`` fires when the *thread* that called ``Popen`` exits: start children from a
thread that lives as long as they should. Every mount and flag: docs/design.md.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .sandbox_bwrap import BubblewrapStatus, _bwrap_options, _hidden_paths, _real, bubblewrap_status
from .sandbox_env import PASSED_ENV, _child_env, _credential_names, _without_store_secrets
from .sandbox_limits import DEFAULT_LIMITS, LIMIT_RANGES, SandboxLimits, parse_limits
from .sandbox_preexec import _preexec, harden_host_process

__all__ = [
    "SandboxLimits",
    "DEFAULT_LIMITS",
    "LIMIT_RANGES",
    "parse_limits",
    "ChildSpec",
    "child_spec",
    "BubblewrapStatus",
    "bubblewrap_status",
    "harden_host_process",
    "PASSED_ENV",
    "CONFINEMENT_BUBBLEWRAP",
    "CONFINEMENT_PROCESS",
    "SandboxUnavailable",
    "plugin_data_dir",
    "plugin_data_path",
    "quarantine_plugin_data",
    "DATA_DIR_NAME",
    "REMOVED_DATA_DIR_NAME",
]

_log = logging.getLogger("plugin_llm.plugins")

CONFINEMENT_BUBBLEWRAP = "bubblewrap"
CONFINEMENT_PROCESS = "process"
#: ``<home>/plugin-data/``: one private, persistent directory per isolated plugin (see :func:`plugin_data_dir`)
DATA_DIR_NAME = "plugin-data"
#: ``<home>/plugin-data/.removed/``: data directories of removed plugins, moved aside (never a plugin's: a key's
#: directory name never starts with a dot)
REMOVED_DATA_DIR_NAME = ".removed"


class SandboxUnavailable(RuntimeError):
    """The confinement the configuration asks for cannot be had here (the message says what to change)."""


# ------------------------------------------------------------------ the child
@dataclass
class ChildSpec:
    """What ``subprocess.Popen`` needs to start one plugin's child, and its scratch directory."""

    argv: list[str]
    env: dict[str, str] = field(repr=False)  # holds the plugin's requires_env values: never in a repr
    cwd: str
    preexec_fn: Callable[[], None] | None  # rlimits, new session, umask 077, PR_SET_PDEATHSIG (Linux);
    # under process confinement also no capabilities and PR_SET_NO_NEW_PRIVS (bubblewrap does both itself)
    confinement: str  # CONFINEMENT_BUBBLEWRAP or CONFINEMENT_PROCESS
    scratch: Path  # the child's own TMPDIR and cwd (0700; also HOME without a data_dir), deleted by cleanup()
    reason: str = ""  # why bubblewrap is (not) in effect
    withheld_env: tuple[str, ...] = ()  # requires_env names refused: credential variables of the host
    limits: SandboxLimits = DEFAULT_LIMITS
    data_dir: Path | None = None  # the plugin's persistent HOME and HERMES_HOME (kept by cleanup())
    share_network: bool = True  # as the child has it (child_spec's None resolved)
    _cleaned: bool = field(default=False, repr=False)

    def cleanup(self) -> None:
        """Remove the scratch directory (idempotent; call once the child has exited)."""
        if self._cleaned:
            return
        self._cleaned = True
        _remove_tree(self.scratch)


def child_spec(
    *,
    plugin_key: str,
    plugin_dir: Path,
    requires_env: Sequence[str],
    hermes_home: Path,
    limits: SandboxLimits,
    python_args: Sequence[str],
    use_bubblewrap: bool = True,
    share_network: bool | None = None,
    harden_host: bool = True,
    data_dir: Path | None = None,
) -> ChildSpec:
    """The argv, environment, cwd and pre-exec step of one plugin's child (see the module docstring).

    Creates the scratch directory; the caller owns it and calls :meth:`ChildSpec.cleanup`.
    ``use_bubblewrap=False`` (an operator setting) forces ``"process"`` confinement;
    ``share_network`` True / False: the host's network / none; None: none under bubblewrap, else the host's. With
    ``"process"`` confinement the host is made non-dumpable first
    (:func:`harden_host_process`; ``harden_host=False`` skips it), because the
    child shares the host's ``/proc`` and OS user.

    ``data_dir`` (made with :func:`plugin_data_dir`) becomes the child's ``HOME``
    and ``HERMES_HOME`` and is bound read-write under bubblewrap; without it
    ``HOME`` is the scratch directory and ``HERMES_HOME`` is not set.
    ``share_network=False`` without a usable bubblewrap raises
    :class:`SandboxUnavailable`.
    """
    hermes_home = Path(hermes_home)
    plugin_dir = Path(plugin_dir)
    withheld_names = _credential_names(hermes_home)
    data = Path(_real(data_dir)) if data_dir is not None else None
    scratch = Path(_real(tempfile.mkdtemp(prefix=f"plugin-llm-{_slug(plugin_key)}-")))
    try:
        os.chmod(scratch, 0o700)
        env, withheld = _child_env(requires_env, hermes_home, withheld_names, scratch)
        withheld = _without_store_secrets(env, withheld, hermes_home)
        if data is not None:
            env["HOME"] = env["HERMES_HOME"] = str(data)
        python = [sys.executable, *python_args]
        if not use_bubblewrap:
            confinement, reason, argv = CONFINEMENT_PROCESS, "bubblewrap is turned off by the configuration", python
        else:
            status = bubblewrap_status()
            if status.usable and status.path:
                _refuse_hidden_plugin_dir(plugin_key, plugin_dir, hermes_home)
                confinement, reason = CONFINEMENT_BUBBLEWRAP, status.reason
                share_network = bool(share_network)  # unset: no network, where bubblewrap can take it away
                argv = [status.path, *_bwrap_options(plugin_dir, hermes_home, scratch, env, share_network, data),
                        "--", *python]
            else:
                confinement, reason, argv = CONFINEMENT_PROCESS, status.reason, python
        if share_network is None:  # a plain process: there is no taking the host's network away from it
            share_network = True
        if not share_network and confinement != CONFINEMENT_BUBBLEWRAP:
            raise SandboxUnavailable(
                f"plugin {plugin_key[:200]}: isolation_network: none needs bubblewrap to take the network away, "
                f"and it is not in effect here ({reason}); the plugin is not started. Fix: make bubblewrap usable, "
                f"or set plugins.entries.{plugin_key[:200]}.isolation_network: host to let it use the network")
    except BaseException:
        _remove_tree(scratch)
        raise
    if withheld:
        _log.warning("plugin %s: requires_env %s withheld from its isolated process: the host's credential "
                     "variables are never passed to a plugin", plugin_key[:200], ", ".join(withheld))
    process_only = confinement == CONFINEMENT_PROCESS
    if process_only and harden_host:
        harden_host_process()
    return ChildSpec(argv=argv, env=env, cwd=str(scratch), preexec_fn=_preexec(limits, drop_privileges=process_only),
                     confinement=confinement, scratch=scratch, reason=reason, withheld_env=withheld, limits=limits,
                     data_dir=data, share_network=share_network)


def plugin_data_dir(hermes_home: Path, plugin_key: str) -> Path:
    """``<home>/plugin-data/<key>/``: the isolated plugin's persistent private directory, created (0700).

    The key is percent-encoded into one path component (``image_gen/openai`` is
    ``image_gen%2Fopenai``), so no key maps into another plugin's directory.
    Raises :class:`SandboxUnavailable` when the directory (or ``plugin-data``) is
    a symlink or not a directory owned by this user: bound read-write into a
    child, it must never lead anywhere else.
    """
    target = plugin_data_path(hermes_home, plugin_key)
    parent = target.parent
    for path in (parent, target):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise SandboxUnavailable(f"cannot create {path} (the data directory of isolated plugins): "
                                     f"{exc.strerror or type(exc).__name__}; fix: make {path.parent} writable") from None
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise SandboxUnavailable(f"{path} must be a directory owned by this user (it is bound read-write into "
                                     "an isolated plugin's process), and it is a symlink or something else; fix: "
                                     "move it away and let plugin-llm create it")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(path, 0o700)
    return target


def plugin_data_path(hermes_home: Path, plugin_key: str) -> Path:
    """Where :func:`plugin_data_dir` keeps ``plugin_key``'s data (nothing is created or checked)."""
    from urllib.parse import quote

    name = quote(plugin_key, safe="")
    if name.startswith("."):  # "." / ".." / a hidden name: never the parent, never confusable
        name = "%2E" + name[1:]
    return Path(hermes_home) / DATA_DIR_NAME / name[:240]


def quarantine_plugin_data(hermes_home: Path, plugin_key: str) -> Path | None:
    """Move ``plugin_key``'s data directory aside to ``plugin-data/.removed/<name>-<UTC time>``; its new path,
    or None when it had none. No plugin is ever given a directory under ``.removed`` (a symlink there is
    moved as a link, never followed). Raises OSError when it cannot be moved."""
    source = plugin_data_path(hermes_home, plugin_key)
    if not os.path.lexists(source):
        return None
    removed = source.parent / REMOVED_DATA_DIR_NAME
    try:
        os.mkdir(removed, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(removed)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{removed} is not a directory: move it away")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        dest = removed / f"{source.name[:200]}-{stamp}{'' if n == 0 else f'-{n}'}"
        if not os.path.lexists(dest):
            os.rename(source, dest)
            return dest
    raise OSError(f"{removed} has too many copies of {source.name}: empty it")


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", key)[:40].strip("-.") or "plugin"


def _refuse_hidden_plugin_dir(plugin_key: str, plugin_dir: Path, hermes_home: Path) -> None:
    """A plugin whose directory is a home (``--link ~/.hermes``, ``--link ~``) cannot be isolated: the
    directory it needs is the one it must never see. (A checkout that merely holds the home is fine: the
    home inside it is hidden.)"""
    real = _real(plugin_dir)
    if real in _hidden_paths(hermes_home):
        raise SandboxUnavailable(
            f"plugin {plugin_key[:200]}: its directory {plugin_dir} is {real}, a directory isolated plugins must "
            "never see (a home, or the host's temporary files); the plugin is not started. Fix: move the plugin "
            "into a directory of its own and install it from there")


# ------------------------------------------------------------------ cleanup
def _remove_tree(path: Path) -> None:
    """``rm -rf path``, also when the child left directories without write or search permission."""

    def retry(function: Callable[..., object], target: str, _exc: object) -> None:
        try:
            parent = os.path.dirname(target)
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, stat.S_IRWXU)
            function(target)
        except OSError:
            pass

    if not os.path.lexists(path):
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)
    if os.path.lexists(path):  # a second pass after permissions were repaired
        shutil.rmtree(path, ignore_errors=True)
