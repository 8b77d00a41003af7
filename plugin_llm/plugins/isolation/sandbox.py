"""How an out-of-process plugin's child is started and confined.

:func:`child_spec` builds everything ``subprocess.Popen`` needs (``spec.argv``, ``env``, ``cwd``,
``preexec_fn``); the host starts the child and calls ``spec.cleanup()`` after it is gone. The child
gets an environment built from an allowlist (:data:`PASSED_ENV`) plus its own ``requires_env``,
never ``HERMES_HOME``, a credential variable or a ``key_env`` of ``auth.json``
(:attr:`ChildSpec.withheld_env`); its own scratch directory (or persistent data directory) as
``HOME``; resource limits (:class:`SandboxLimits`), a new session, no capabilities; and, with a
working ``bwrap``, bubblewrap: a read-only filesystem without the real home, a private ``/proc``,
and no network unless ``share_network=True``. Without bubblewrap the network cannot be taken away
(``share_network=False`` raises :class:`SandboxUnavailable`) and the confinement is ``"process"``
(:attr:`ChildSpec.reason` says why): the child can read any file the same OS user can.

``PR_SET_PDEATHSIG`` fires when the *thread* that called ``Popen`` exits: start children from a
thread that lives as long as they should. Every mount and flag: docs/design.md.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
import re
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from plugin_llm.home_env import read_env_file
from plugin_llm.limits.settings import url_secrets
from plugin_llm.plugin_env import credential_check

try:
    import resource
except ImportError:  # pragma: no cover - Windows: no rlimits (and no preexec_fn in subprocess)
    resource = None  # type: ignore[assignment]

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


# ------------------------------------------------------------------ limits
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


#: Host environment variables a child inherits when set (``LC_*`` too). Nothing here carries a secret.
PASSED_ENV = (
    "PATH", "LANG", "LANGUAGE", "TZ",
    # the interpreter's own settings (PYTHONPATH also gets the plugin_llm package when the host needs it)
    "PYTHONPATH", "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONUTF8",
    "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDEVMODE",
    "PYTHONFAULTHANDLER", "PYTHONUNBUFFERED", "PYTHONOPTIMIZE", "PYTHONINTMAXSTRDIGITS",
    "LD_LIBRARY_PATH",  # an interpreter built with shared libraries outside the system paths needs it to start
    # TLS trust for plugins that call APIs (file paths)
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
)
#: Proxy settings are passed only without credentials in them (``user:pass@`` is withheld).
_PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy")
#: Never passed, whatever ``requires_env`` says: the host's own identity and credentials.
_NEVER_ENV = frozenset({"HERMES_HOME", "PLUGIN_LLM_TOKEN"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


# ------------------------------------------------------------------ environment
def _credential_names(home: Path) -> Callable[[str], bool]:
    """Is a variable one of the host's credentials (:func:`plugin_llm.plugin_env.credential_check`)? Proxies
    are passed by their own rule (without ``user:pass@``), never by ``requires_env``."""
    credential = credential_check(home)
    return lambda name: name in _NEVER_ENV or credential(name)


def _child_env(requires_env: Sequence[str], home: Path, credential_names: Callable[[str], bool],
               scratch: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    host = os.environ
    env: dict[str, str] = {}
    for name in PASSED_ENV:
        if host.get(name):
            env[name] = host[name]
    for name, value in host.items():
        if name.startswith("LC_") and _ENV_NAME.match(name):
            env[name] = value
    for name in _PROXY_ENV:
        value = host.get(name)
        if value and "@" not in value:
            env[name] = value
    env.setdefault("PATH", os.defpath)
    pythonpath = _pythonpath(env.get("PYTHONPATH"))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    user_site = _user_site()
    if user_site is not None:  # the host imports from the user's site-packages: so must the child
        env["PYTHONUSERBASE"] = site.getuserbase()
    # Fewer malloc arenas: per-thread arenas reserve 64 MiB of address space each, which RLIMIT_AS would count.
    env["MALLOC_ARENA_MAX"] = host.get("MALLOC_ARENA_MAX") or "2"

    withheld: list[str] = []
    wanted = [n for n in dict.fromkeys(requires_env) if isinstance(n, str) and _ENV_NAME.match(n)]
    dotenv: dict[str, str] | None = None
    for name in wanted:
        if credential_names(name):
            withheld.append(name)
            if name not in _PROXY_ENV:  # a proxy the allowlist passed (without credentials) stays
                env.pop(name, None)
            continue
        value = host.get(name)
        if not value:  # as the host loads <home>/.env: the process environment wins, the file fills in
            if dotenv is None:
                dotenv = _home_env(home)
            value = dotenv.get(name)
        if value:
            env[name] = value
    env["HOME"] = env["TMPDIR"] = str(scratch)
    return env, tuple(withheld)


def _without_store_secrets(env: dict[str, str], withheld: tuple[str, ...], home: Path) -> tuple[str, ...]:
    """Drop every variable whose value holds the password of ``limits.redis_url`` (the store of the tokens and
    limits: a plugin must never be able to write what authenticates or limits it); their names join ``withheld``."""
    try:
        from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

        found = url_secrets(get_config_source(home).current().limits.redis_url)
    except Exception:  # an unreadable config names no store the host could use
        return withheld
    dropped = [name for name, value in env.items() if any(secret in value for secret in found)]
    for name in dropped:
        del env[name]
    return (*withheld, *dropped)


def _home_env(home: Path) -> dict[str, str]:
    values = read_env_file(home)
    if values:
        from auth import register_secret  # as load_home_env does: .env values are often keys

        for value in values.values():
            register_secret(value)
    return values


def _site_dirs() -> set[str]:
    dirs = set()
    try:
        dirs.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:  # pragma: no cover - old virtualenv's site module
        pass
    return dirs


def _user_site() -> str | None:
    """The user's site-packages when the host imports from it (it follows HOME, which the child does not share)."""
    user_site = site.USER_SITE if site.ENABLE_USER_SITE else None
    if user_site and os.path.isdir(user_site) and user_site in sys.path:
        return user_site
    return None


def _package_roots() -> list[str]:
    """The directories the gateway's packages are imported from (plugin_llm, and auth/audit beside it)."""
    roots = []
    for name in ("plugin_llm", "auth", "audit"):
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if found is not None and found.origin:
            roots.append(os.path.dirname(os.path.dirname(os.path.realpath(found.origin))))
    return list(dict.fromkeys(roots))


def _pythonpath(host_value: str | None) -> str:
    """The host's PYTHONPATH, plus the package roots the host imports through ``sys.path`` (a source checkout).

    A venv and an editable install need nothing here: the interpreter is the
    host's (``sys.executable``), which finds its own site-packages and their
    ``.pth`` import hooks.
    """
    entries = [os.path.abspath(p) for p in (host_value or "").split(os.pathsep) if p]  # the child's cwd differs
    on_path = {os.path.realpath(p or os.getcwd()) for p in sys.path}
    site_dirs = _site_dirs()
    for root in _package_roots():
        if root in on_path and root not in site_dirs and root not in entries:
            entries.append(root)
    return os.pathsep.join(entries)


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


# ------------------------------------------------------------------ in the child, before exec
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
