"""Where an installed plugin comes from: SOURCE as the operator writes it, its name, and git.

:func:`parse_source` classifies ``owner/repo``, a git URL (with ``#subdir``) or a local directory;
:func:`validate_install_name` keeps a name to one directory under ``plugins/`` that discovery sees.
Git always runs with an argument list (no shell), ``--`` before user URLs, no terminal prompts,
only the source's protocol allowed and a timeout that kills its process group.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from plugin_llm.hardened.terminal_text import escape_unsafe, unsafe_characters

DEFAULT_GIT_TIMEOUT = 120.0
_SCHEMES = ("https://", "ssh://", "file://")
_SCP_LIKE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:(?!//)\S+$")  # git@github.com:owner/repo.git
_OWNER_REPO = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")


class InstallError(Exception):
    """An install, update or remove that could not be done; nothing was changed."""


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class InstallSource:
    """Where a plugin comes from. ``kind`` is ``git``, ``dir`` or ``link`` (``--link DIR``)."""

    kind: str
    location: str  # the git URL, or the absolute directory path
    subdir: str | None
    given: str  # SOURCE as the operator typed it

    @property
    def protocol(self) -> str:
        """The git transport (for ``GIT_ALLOW_PROTOCOL``)."""
        if self.location.startswith("https://"):
            return "https"
        if self.location.startswith("file://"):
            return "file"
        return "ssh"

    @property
    def display(self) -> str:
        """The source with any password in the URL masked."""
        text = _mask_url(self.location)
        return f"{text}#{self.subdir}" if self.subdir else text

    def default_name(self) -> str:
        """The name when the manifest has none: subdir leaf, repository or directory name."""
        if self.subdir:
            return PurePosixPath(self.subdir).name
        tail = self.location.rstrip("/").replace(":", "/").rsplit("/", 1)[-1]
        return tail[:-4] if tail.endswith(".git") else tail


def _mask_url(url: str) -> str:
    return re.sub(r"^([a-z+]+://)([^/@:]+):[^/@]*@", r"\1\2:***@", url)


def _check_subdir(subdir: str, given: str) -> str:
    if not subdir.strip():
        raise InstallError(f"{given!r}: empty #subdir; write URL#path/inside/the/repository or drop the '#'")
    if "\\" in subdir or "\0" in subdir:
        raise InstallError(f"{given!r}: #subdir {subdir!r} must use '/' as separator and no backslashes")
    path = PurePosixPath(subdir)
    if path.is_absolute() or re.match(r"^[A-Za-z]:", subdir):
        raise InstallError(f"{given!r}: #subdir {subdir!r} must be relative to the repository root")
    if any(part == ".." for part in path.parts):
        raise InstallError(f"{given!r}: #subdir {subdir!r} must not contain '..'")
    parts = [p for p in path.parts if p not in ("", ".")]
    if not parts:
        raise InstallError(f"{given!r}: #subdir {subdir!r} names the repository root; drop the '#'")
    return "/".join(parts)


def parse_source(source: str, *, cwd: Path | None = None) -> InstallSource:
    """Classify SOURCE; raises :class:`InstallError` with the accepted forms when it is none of them."""
    given = source
    source = source.strip()
    if not source:
        raise InstallError("empty SOURCE")
    if source.startswith("-"):
        raise InstallError(f"{given!r} is not a source (it starts with '-')")
    if any(ch.isspace() for ch in source) and not Path(source).expanduser().exists():
        raise InstallError(f"{given!r}: a source must not contain whitespace")
    base = Path(cwd) if cwd is not None else Path.cwd()

    local = Path(source).expanduser()
    local = local if local.is_absolute() else base / local
    if local.is_dir():  # an existing directory wins, even if its name contains '#'
        return InstallSource("dir", str(local.resolve()), None, given)

    location, subdir = source, None
    if "#" in source:
        location, _, subdir = source.rpartition("#")
        subdir = _check_subdir(subdir, given)
    if location.startswith(_SCHEMES):
        if location.startswith("file://") and len(location) <= len("file://"):
            raise InstallError(f"{given!r}: file:// URL without a path")
        return InstallSource("git", location, subdir, given)
    if location.startswith("http://"):
        raise InstallError(f"{given!r}: plain http:// is not accepted (no integrity); use https://")
    if "://" in location or location.startswith("ext::") or "::" in location:
        raise InstallError(
            f"{given!r}: unsupported URL scheme; use https://, ssh://, git@host:path or file://"
        )
    if _SCP_LIKE.match(location):
        return InstallSource("git", location, subdir, given)
    local = Path(location).expanduser()
    local = local if local.is_absolute() else base / local
    if local.is_dir():
        return InstallSource("dir", str(local.resolve()), subdir, given)
    looks_like_path = location.startswith((".", "/", "~")) or os.sep in location.replace("/", "") or location.count("/") > 1
    if _OWNER_REPO.match(location) and not looks_like_path:
        owner, repo = location.split("/")
        repo = repo[:-4] if repo.endswith(".git") else repo
        if repo in {".", ".."} or not repo:
            raise InstallError(f"{given!r}: {repo!r} is not a repository name")
        return InstallSource("git", f"https://github.com/{owner}/{repo}.git", subdir, given)
    if looks_like_path:
        raise InstallError(f"{given!r}: no such directory {local}")
    raise InstallError(
        f"cannot tell what {given!r} is: expected owner/repo (GitHub), a git URL "
        "(https://, ssh://, git@host:path, file://), URL#subdir, or a local directory"
    )


# --------------------------------------------------------------------------- names


def validate_install_name(name: str, *, what: str = "plugin name") -> str:
    """A name that is safe as one directory under ``plugins/`` and visible to discovery."""
    if not isinstance(name, str) or not name.strip():
        raise InstallError(f"the {what} is empty")
    if name != name.strip():
        raise InstallError(f"the {what} {name!r} has leading or trailing whitespace")
    if name in {".", ".."} or ".." in name:
        raise InstallError(f"the {what} {name!r} must not contain '..'")
    if "/" in name or "\\" in name:
        raise InstallError(f"the {what} {name!r} must not contain '/' or '\\'")
    if PurePosixPath(name).is_absolute() or re.match(r"^[A-Za-z]:", name):
        raise InstallError(f"the {what} {name!r} must not be an absolute path")
    if name.startswith((".", "_")):
        raise InstallError(f"the {what} {name!r} must not start with '.' or '_' (discovery skips such directories)")
    if len(name) > 100:
        raise InstallError(f"the {what} '{escape_unsafe(name, 20)}' is longer than 100 characters")
    if any(ch.isspace() for ch in name) or ":" in name:
        raise InstallError(f"the {what} {name!r} must not contain whitespace, control characters or ':'")
    codes = unsafe_characters(name)
    if codes:
        raise InstallError(
            f"the {what} '{escape_unsafe(name)}' contains control or invisible characters ({', '.join(codes[:5])})"
        )
    return name


def _within(path: Path | str, root: Path | str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# --------------------------------------------------------------------------- git


def _git_env(protocol: str) -> dict[str, str]:
    env = dict(os.environ)
    env["GIT_TERMINAL_PROMPT"] = "0"  # never ask for a username/password
    env["GCM_INTERACTIVE"] = "never"
    env["GIT_ALLOW_PROTOCOL"] = protocol  # only the source's own transport (no ext::, no fd::)
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return env


def _git(args: list[str], *, cwd: Path | None = None, timeout: float, protocol: str = "file", what: str = "") -> str:
    """Run ``git <args>`` (argument list, no shell); stdout, or :class:`InstallError`."""
    cmd = ["git", "-c", "advice.detachedHead=false", *args]
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=_git_env(protocol), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
    except FileNotFoundError:
        raise InstallError("git is not installed (it is needed for git sources; a local directory works without it)") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # git and its helpers (ssh, remote-https)
        proc.communicate()
        raise InstallError(f"git {what or args[0]} timed out after {timeout:g} s (network? use --timeout to allow more)") from None
    if proc.returncode != 0:
        lines = [_mask_url(ln.strip()) for ln in (err or out).splitlines() if ln.strip()]
        detail = "; ".join(lines[-3:]) or f"exit code {proc.returncode}"
        raise InstallError(f"git {what or args[0]} failed: {detail}")
    return out.strip()


def _clone(source: InstallSource, dest: Path, *, ref: str | None, timeout: float) -> None:
    proto = source.protocol
    if ref is None:
        _git(["clone", "--depth", "1", "--quiet", "--", source.location, str(dest)],
             timeout=timeout, protocol=proto, what="clone")
        return
    # A pinned install: fetch just that commit (servers allow a reachable SHA in protocol v2),
    # falling back to a full clone for servers or refs that refuse it.
    dest.mkdir()
    _git(["init", "--quiet", str(dest)], timeout=timeout, what="init")
    try:
        _git(["-C", str(dest), "fetch", "--depth", "1", "--quiet", "--", source.location, ref],
             timeout=timeout, protocol=proto, what="fetch")
        _git(["-C", str(dest), "checkout", "--quiet", "--detach", "FETCH_HEAD", "--"], timeout=timeout, what="checkout")
    except InstallError as shallow_error:
        shutil.rmtree(dest)
        try:
            _git(["clone", "--no-checkout", "--quiet", "--", source.location, str(dest)],
                 timeout=timeout, protocol=proto, what="clone")
            _git(["-C", str(dest), "checkout", "--quiet", "--detach", ref, "--"], timeout=timeout, what="checkout")
        except InstallError as exc:
            raise InstallError(f"cannot check out --ref {ref}: {exc} (shallow fetch: {shallow_error})") from None


def _revision(repo: Path, timeout: float) -> str:
    return _git(["-C", str(repo), "rev-parse", "HEAD"], timeout=timeout, what="rev-parse")


def _local_edits(repo: Path, timeout: float) -> list[str]:
    """Tracked files changed in the clone (untracked files, e.g. __pycache__ or data, don't count)."""
    out = _git(["-C", str(repo), "status", "--porcelain", "--untracked-files=no"], timeout=timeout, what="status")
    return [line.strip() for line in out.splitlines() if line.strip()]
