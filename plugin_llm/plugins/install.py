"""Installing, updating and removing directory plugins.

``install``: SOURCE is ``owner/repo`` (a GitHub https URL), a git URL (``https://``, ``ssh://``,
``git@host:path``, ``file://``), any of those with ``#subdir``, or a local directory (``path`` or
``path#subdir``). Everything happens in a hidden staging directory inside ``plugins/``; only a
validated tree is moved into place with ``os.rename`` (the previous install, with ``--force``,
moved aside and restored if anything fails), and ``plugins/.install-metadata.json`` updated.
Whatever fails, nothing half-installed is left behind.

Git always runs with an argument list (no shell), ``--`` before user URLs, no terminal prompts,
only the source's protocol allowed and a timeout that kills its process group. Layout of git
installs and ``update``: docs/design.md. This module prints nothing and never asks anything: the
CLI does that.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator

from plugin_llm.hardened.atomic_write import write_atomic
from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.hardened.terminal_text import escape_unsafe, unsafe_characters
from plugin_llm.home_env import ENV_FILENAME, read_env_file, read_env_text
from plugin_llm.hardened.safe_files import MIB, describe_file_type, read_home_text
from plugin_llm.hardened.safe_json import loads_bounded

from .discovery import SOURCE_USER, scan_directory
from .isolation.sandbox import plugin_data_path, quarantine_plugin_data
from .manifest import MANIFEST_ALIAS_BUDGET, MANIFEST_MAX_BYTES, ManifestError, PluginManifest, find_manifest, load_manifest

__all__ = [
    "InstallError",
    "InstallSource",
    "StagedPlugin",
    "InstalledPlugin",
    "UpdateResult",
    "RemoveResult",
    "DEFAULT_GIT_TIMEOUT",
    "METADATA_FILENAME",
    "parse_source",
    "validate_install_name",
    "stage_plugin",
    "stage_link",
    "commit_staged",
    "check_target",
    "discard_staged",
    "install_plugin",
    "update_plugin",
    "remove_plugin",
    "read_metadata",
    "installed_plugins",
    "resolve_installed",
    "copy_example_files",
    "is_secret_name",
    "read_env_file",
    "write_env_values",
    "missing_env",
]

DEFAULT_GIT_TIMEOUT = 120.0
METADATA_FILENAME = ".install-metadata.json"
#: the install record is refused beyond this size (one entry is a few hundred bytes)
METADATA_MAX_BYTES = 4 * MIB
REPOS_DIRNAME = ".repos"
STAGING_PREFIX = ".install-"
_SCHEMES = ("https://", "ssh://", "file://")
_SCP_LIKE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:(?!//)\S+$")  # git@github.com:owner/repo.git
_OWNER_REPO = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_HEX = re.compile(r"^[0-9a-fA-F]{4,64}$")
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
_COPY_IGNORE = (".git", "__pycache__")


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


def _target_for(plugins_dir: Path, key: str) -> Path:
    """``plugins/<key>``, refusing anything that would land outside ``plugins/``."""
    parts = key.split("/")
    for part in parts:
        validate_install_name(part, what="category" if len(parts) > 1 and part == parts[0] else "plugin name")
    target = plugins_dir.joinpath(*parts)
    parent = target.parent
    if len(parts) > 1 and find_manifest(parent) is not None:
        raise InstallError(f"{parent} is a plugin, not a category directory; choose another --category")
    if parent.is_symlink() or (parent.exists() and not _within(parent, plugins_dir)):
        raise InstallError(f"{parent} resolves outside {plugins_dir}; refusing to install there")
    if not _within(parent, plugins_dir) and parent.exists():  # pragma: no cover - covered above
        raise InstallError(f"{target} resolves outside {plugins_dir}")
    return target


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


# --------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class InstalledPlugin:
    """One entry of ``plugins/.install-metadata.json``."""

    key: str
    source: str  # as given (password masked)
    kind: str  # git | dir | link (``--link``: a symlink to the author's directory)
    location: str  # git URL (masked) or directory path
    subdir: str | None
    ref: str | None  # --ref given at install: pinned, never updated
    revision: str | None  # the commit installed (git), None for directories
    installed_at: str
    updated_at: str | None = None
    repo: str | None = None  # clone location relative to plugins/ when it is not the plugin dir
    created_files: tuple[str, ...] = ()
    tree_sha256: str | None = None  # directory installs: content hash at install (local-edit check)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "key"}
        data["created_files"] = list(self.created_files)
        return data

    @classmethod
    def from_json(cls, key: str, data: dict[str, Any]) -> "InstalledPlugin":
        known = {f for f in cls.__dataclass_fields__ if f != "key"}
        values = {k: v for k, v in data.items() if k in known}
        values["created_files"] = tuple(values.get("created_files") or ())
        values.setdefault("source", "")
        values.setdefault("kind", "dir")
        values.setdefault("location", values["source"])
        values.setdefault("subdir", None)
        values.setdefault("ref", None)
        values.setdefault("revision", None)
        values.setdefault("installed_at", "")
        return cls(key=key, **values)


def _metadata_path(plugins_dir: Path) -> Path:
    return plugins_dir / METADATA_FILENAME


def read_metadata(plugins_dir: Path) -> dict[str, InstalledPlugin]:
    """Installed plugins by key (empty when the file does not exist)."""
    path = _metadata_path(plugins_dir)
    try:  # bounded and never blocking (a FIFO is refused); nesting checked before json recurses
        text = read_home_text(path, max_bytes=METADATA_MAX_BYTES)
        if text is None:
            return {}
        raw = loads_bounded(text)
    except PluginLlmConfigError as exc:  # the message names the file and what it is
        raise InstallError(f"{exc}; or move it aside to start a fresh record") from None
    except ValueError as exc:
        raise InstallError(f"{path} is unreadable ({exc}); move it aside to start a fresh record") from None
    plugins = raw.get("plugins") if isinstance(raw, dict) else None
    if not isinstance(plugins, dict):
        raise InstallError(f"{path} has no 'plugins' mapping; move it aside to start a fresh record")
    return {k: InstalledPlugin.from_json(k, v) for k, v in plugins.items() if isinstance(v, dict)}


def _write_metadata(plugins_dir: Path, entries: dict[str, InstalledPlugin]) -> None:
    data = {"version": 1, "plugins": {k: entries[k].to_json() for k in sorted(entries)}}
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    write_atomic(_metadata_path(plugins_dir), text.encode("utf-8"))


@contextlib.contextmanager
def _plugins_lock(plugins_dir: Path) -> Iterator[None]:
    """One install/update/remove at a time per plugins directory."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(plugins_dir / ".install.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _now() -> str:
    # microseconds: installs within one second still order (registry.load_order: the first installed
    # keeps a clashing name); a record written with whole seconds sorts before ones of that second
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


# --------------------------------------------------------------------------- validation


def _check_special_files(root: Path) -> None:
    """Reject FIFOs, sockets and devices anywhere in a plugin tree: copying or hashing
    one would block or read forever. A plugin is regular files, directories and symlinks."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for entry in dirnames + filenames:
            path = os.path.join(dirpath, entry)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                rel = os.path.relpath(path, root)
                raise InstallError(
                    f"{rel} in {root} is {describe_file_type(mode)}: a plugin may contain only regular files, "
                    "directories and symlinks; remove it"
                )


def _check_symlinks(root: Path) -> None:
    """Reject absolute symlinks and symlinks that resolve outside ``root``."""
    real_root = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if ".git" in dirnames and Path(dirpath) == root:
            dirnames.remove(".git")
        for entry in dirnames + filenames:
            path = os.path.join(dirpath, entry)
            if not os.path.islink(path):
                continue
            target = os.readlink(path)
            rel = os.path.relpath(path, root)
            if os.path.isabs(target):
                raise InstallError(f"symlink {rel} -> {target} is absolute; a plugin may only link inside itself")
            if not _within(os.path.join(dirpath, target), real_root):
                raise InstallError(f"symlink {rel} -> {target} points outside the plugin directory")


def _validate_tree(root: Path, where: str) -> PluginManifest:
    if not root.is_dir():
        raise InstallError(f"{where}: not a directory")
    manifest_path = find_manifest(root)
    if manifest_path is None:
        nested = sorted(
            str(p.parent.relative_to(root)) for p in list(root.glob("*/plugin.y*ml")) + list(root.glob("*/*/plugin.y*ml"))
            if ".git" not in p.parts
        )
        hint = f"; it contains plugins at: {', '.join(nested[:8])} (install one with SOURCE#<path>)" if nested else ""
        raise InstallError(f"{where}: no plugin.yaml, so it is not a plugin{hint}")
    try:
        manifest = load_manifest(manifest_path)
    except ManifestError as exc:
        raise InstallError(f"invalid manifest: {exc}") from None
    if not (root / "__init__.py").is_file():
        raise InstallError(f"{where}: no __init__.py (a plugin needs one defining register(ctx))")
    _check_symlinks(root)
    _check_special_files(root)
    return manifest


def copy_example_files(root: Path) -> list[str]:
    """``x.example`` -> ``x`` wherever ``x`` does not exist yet; returns the created paths (relative)."""
    created = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in _COPY_IGNORE]
        for filename in sorted(filenames):
            if not filename.endswith(".example") or filename == ".example":
                continue
            src = Path(dirpath) / filename
            dst = src.with_name(filename[: -len(".example")])
            if src.is_symlink() or dst.exists() or dst.is_symlink():
                continue
            shutil.copy2(src, dst)
            created.append(dst.relative_to(root).as_posix())
    return created


def _tree_hash(root: Path, skip: tuple[str, ...] = ()) -> str:
    """SHA-256 over the relative paths and contents of a plugin directory."""
    digest = hashlib.sha256()
    skip_set = set(skip)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _COPY_IGNORE)
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            rel = path.relative_to(root).as_posix()
            if rel in skip_set or filename.endswith(".pyc"):
                continue
            digest.update(rel.encode() + b"\0")
            if path.is_symlink():
                digest.update(b"L" + os.readlink(path).encode())
            elif path.is_file():  # never open a FIFO or a device (it would block or never end)
                digest.update(hashlib.sha256(path.read_bytes()).digest())
            else:
                digest.update(b"S")
    return digest.hexdigest()


# --------------------------------------------------------------------------- staging


@dataclass
class StagedPlugin:
    """A validated plugin in ``plugins/.install-*/``, ready to be moved into place."""

    staging: Path
    tree: Path  # what moves: the clone, or the copied directory
    root: Path  # the plugin directory inside ``tree``
    manifest: PluginManifest
    key: str
    source: InstallSource
    ref: str | None
    revision: str | None
    created_files: list[str] = field(default_factory=list)
    plugins_dir: Path = Path()
    #: where :func:`commit_staged` moved a data directory left under this key (a new plugin starts empty)
    data_moved_to: Path | None = None

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def target(self) -> Path:
        return self.plugins_dir.joinpath(*self.key.split("/"))

    @property
    def uses_repo_dir(self) -> bool:
        return self.source.kind == "git" and self.source.subdir is not None


def _copy_dir(src: Path, dst: Path) -> None:
    _check_special_files(src)
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(*_COPY_IGNORE, "*.pyc"))


def stage_plugin(
    plugins_dir: Path,
    source: InstallSource,
    *,
    ref: str | None = None,
    category: str | None = None,
    timeout: float = DEFAULT_GIT_TIMEOUT,
) -> StagedPlugin:
    """Fetch and validate SOURCE into a staging directory; :class:`InstallError` on any problem
    (the staging directory is removed then)."""
    if ref is not None:
        if source.kind != "git":
            raise InstallError("--ref only applies to git sources")
        if not _REF.match(ref) or ".." in ref:
            raise InstallError(f"--ref {ref!r} is not a commit SHA or ref name")
    if category is not None:
        validate_install_name(category, what="category")
    plugins_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=plugins_dir))
    try:
        revision = None
        if source.kind == "git":
            tree = staging / "repo"
            _clone(source, tree, ref=ref, timeout=timeout)
            revision = _revision(tree, timeout)
            if ref is not None and _HEX.match(ref) and not revision.lower().startswith(ref.lower()):
                raise InstallError(f"--ref {ref} resolved to {revision}, which is not that commit")
            root = tree / source.subdir if source.subdir else tree
            if source.subdir and not _within(root, tree):
                raise InstallError(f"#subdir {source.subdir!r} resolves outside the repository (a symlink?)")
        else:
            origin = Path(source.location)
            origin_root = origin / source.subdir if source.subdir else origin
            if not origin_root.is_dir():
                raise InstallError(f"{origin_root}: no such directory")
            if source.subdir and not _within(origin_root, origin):
                raise InstallError(f"#subdir {source.subdir!r} resolves outside {origin} (a symlink?)")
            tree = root = staging / "plugin"
            _copy_dir(origin_root, tree)
        where = source.display
        manifest = _validate_tree(root, where)
        explicit_name = _manifest_has_name(root)
        if explicit_name and unsafe_characters(manifest.name):
            raise InstallError(
                f"{where}: {find_manifest(root).name}: the 'name' field '{escape_unsafe(manifest.name, 100)}' contains "
                f"control or invisible characters ({', '.join(unsafe_characters(manifest.name)[:5])}); "
                "a plugin name must be printable text: fix name: in the manifest"
            )
        name = manifest.name if explicit_name else source.default_name()
        validate_install_name(name)
        if not explicit_name and name != manifest.name:
            # Discovery names an unnamed plugin after its directory: that is ``name`` once installed.
            manifest = replace(manifest, name=name, key=name)
        key = f"{category}/{name}" if category else name
        created = copy_example_files(root)
        return StagedPlugin(staging, tree, root, manifest, key, source, ref, revision, created, plugins_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _manifest_has_name(root: Path) -> bool:
    import yaml

    from plugin_llm.hardened.safe_yaml import load_yaml  # on first use: it loads PyYAML

    path = find_manifest(root)
    try:
        text = read_home_text(path, max_bytes=MANIFEST_MAX_BYTES) if path else None
        data = load_yaml(text, alias_budget=MANIFEST_ALIAS_BUDGET) if text else None
    except (PluginLlmConfigError, yaml.YAMLError):  # pragma: no cover - validated just before
        return False
    return isinstance(data, dict) and data.get("name") is not None


def discard_staged(staged: StagedPlugin) -> None:
    shutil.rmtree(staged.staging, ignore_errors=True)


def stage_link(plugins_dir: Path, directory: str | Path, *, category: str | None = None) -> StagedPlugin:
    """``plugins install --link DIR``: validate the plugin in DIR for a link install (development).

    Nothing is copied: :func:`commit_staged` places a symlink ``plugins/<key> -> DIR`` and records
    ``kind: link``, so the author's edits apply on the next load (``update`` is a no-op and
    ``remove`` deletes only the link, never DIR). No ``*.example`` file is created in DIR.
    """
    if category is not None:
        validate_install_name(category, what="category")
    origin = Path(directory).expanduser()
    if not origin.is_dir():
        raise InstallError(f"--link {escape_unsafe(str(directory), 200)}: no such directory")
    root = Path(os.path.realpath(origin))
    if _within(root, plugins_dir):
        raise InstallError(f"--link {root}: the directory is already inside {plugins_dir}")
    manifest = _validate_tree(root, str(root))
    name = manifest.name if _manifest_has_name(root) else root.name
    validate_install_name(name)
    if name != manifest.name:
        manifest = replace(manifest, name=name, key=name)
    key = f"{category}/{name}" if category else name
    plugins_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=plugins_dir))
    source = InstallSource("link", str(root), None, str(directory))
    return StagedPlugin(staging, root, root, manifest, key, source, None, None, [], plugins_dir)


def _entry_from_staged(staged: StagedPlugin, installed_at: str | None = None) -> InstalledPlugin:
    source = staged.source
    return InstalledPlugin(
        key=staged.key,
        source=_mask_url(source.given.strip()),
        kind=source.kind,
        location=_mask_url(source.location),
        subdir=source.subdir,
        ref=staged.ref,
        revision=staged.revision,
        installed_at=installed_at or _now(),
        updated_at=_now() if installed_at else None,
        repo=f"{REPOS_DIRNAME}/{staged.key}" if staged.uses_repo_dir else None,
        created_files=tuple(staged.created_files),
        tree_sha256=_tree_hash(staged.root, tuple(staged.created_files)) if source.kind == "dir" else None,
    )


def _existing_paths(plugins_dir: Path, key: str, entry: InstalledPlugin | None) -> list[Path]:
    """What an install of ``key`` occupies: the plugin path, and its clone when separate."""
    paths = [plugins_dir.joinpath(*key.split("/"))]
    if entry is not None and entry.repo:
        repo = plugins_dir / entry.repo
        if _within(repo, plugins_dir / REPOS_DIRNAME):
            paths.append(repo)
    return paths


def _occupied(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _plugin_dirs_in(directory: Path, plugins_dir: Path) -> list[str]:
    """The plugins directly inside ``directory`` (what makes it a category), relative to plugins/."""
    try:
        children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    return [os.path.relpath(p, plugins_dir) for p in children if find_manifest(p) is not None]


def _discovered_key(plugins_dir: Path, path: Path) -> str | None:
    """The key discovery gives the plugin in ``path`` (None when it finds none there)."""
    for cand in scan_directory(plugins_dir, SOURCE_USER):
        if cand.path is not None and cand.path == path:
            return cand.key
    return None


def _occupant_problem(plugins_dir: Path, key: str, path: Path, entry: InstalledPlugin | None) -> str | None:
    """Why ``path`` — where plugin ``key`` lives — is not that plugin's directory (None when it is).

    Install, update and remove only ever delete or replace the one directory of one
    plugin: never a category directory, a file, a directory without a manifest that
    plugin-llm did not install, or a directory holding another plugin. Symlinks are
    the callers' business (unlinked, never followed).
    """
    shown = escape_unsafe(str(path), 300)
    if not path.is_dir():
        return f"{shown} already exists and is a file, not a plugin directory"
    if find_manifest(path) is None:
        nested = _plugin_dirs_in(path, plugins_dir)
        if nested:
            listed = ", ".join(escape_unsafe(n, 100) for n in nested[:5]) + (f" (+{len(nested) - 5} more)" if len(nested) > 5 else "")
            return f"{shown} is a category directory (it holds {listed}), not a plugin"
        if entry is not None:  # a recorded install whose manifest went missing: still that install
            return None
        return f"{shown} already exists and is not a plugin directory (no plugin.yaml); move it away by hand"
    holder = _discovered_key(plugins_dir, path)
    if holder is not None and holder != key:
        return (
            f"{shown} holds the plugin '{escape_unsafe(holder, 100)}' (its manifest name:), "
            f"not '{escape_unsafe(key, 100)}'"
        )
    return None


def _check_replace(plugins_dir: Path, key: str, entry: InstalledPlugin | None, force: bool) -> tuple[Path, list[Path]]:
    """The install target of ``key`` and the paths an install would replace; InstallError
    when it must not replace them (never a category or a non-plugin, even with force)."""
    target = _target_for(plugins_dir, key)
    old_paths = [p for p in _existing_paths(plugins_dir, key, entry) if _occupied(p)]
    if target.is_symlink() and (entry is None or not (entry.repo or entry.kind == "link")):
        raise InstallError(
            f"{target} is a symlink not made by plugin-llm (it resolves to {os.path.realpath(target)}); "
            "remove it by hand first"
        )
    if _occupied(target) and not target.is_symlink():
        problem = _occupant_problem(plugins_dir, key, target, entry)
        if problem is not None:
            raise InstallError(f"{problem}; refusing to replace it, even with --force (choose another name or --category)")
    if old_paths and not force:
        raise InstallError(f"{target} already exists; use --force to replace it (or `plugins update {key}`)")
    return target, old_paths


def check_target(staged: StagedPlugin, *, force: bool = False) -> None:
    """Raise :class:`InstallError` if committing ``staged`` would be refused because of what
    is at its target (so the CLI can say so before asking anything). Nothing is changed."""
    entries = read_metadata(staged.plugins_dir)
    _check_replace(staged.plugins_dir, staged.key, entries.get(staged.key), force)


def commit_staged(
    staged: StagedPlugin,
    *,
    force: bool = False,
    installed_at: str | None = None,
    _metadata_writer: Callable[..., None] | None = None,
) -> InstalledPlugin:
    """Move a staged plugin into place and record it; all or nothing.

    Without ``force`` an existing plugin directory is never touched. With it,
    the old install is moved aside, and put back if any later step fails.
    """
    plugins_dir = staged.plugins_dir
    write_metadata = _metadata_writer or _write_metadata
    with _plugins_lock(plugins_dir):
        entries = read_metadata(plugins_dir)
        target, old_paths = _check_replace(plugins_dir, staged.key, entries.get(staged.key), force)
        entry = _entry_from_staged(staged, installed_at=installed_at)  # hashes the tree before it moves
        aside = staged.staging / "previous"
        aside.mkdir()
        moved: list[tuple[Path, Path]] = []
        placed: list[Path] = []
        data_aside: Path | None = None
        try:
            # whatever is in plugin-data/<key>/ was an earlier plugin's (memory, stored tokens): never inherited
            data_aside = quarantine_plugin_data(plugins_dir.parent, staged.key)
            for i, path in enumerate(old_paths):
                dest = aside / str(i)
                os.rename(path, dest)
                moved.append((dest, path))
            target.parent.mkdir(parents=True, exist_ok=True)
            if staged.source.kind == "link":  # --link: the author's directory itself, never copied
                os.symlink(staged.root, target)
            elif staged.uses_repo_dir:
                repo = plugins_dir / REPOS_DIRNAME / staged.key
                repo.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staged.tree, repo)
                placed.append(repo)
                link_target = os.path.relpath(repo / staged.source.subdir, target.parent)
                tmp_link = target.parent / f".{target.name}.link-{os.getpid()}"
                os.symlink(link_target, tmp_link)
                os.replace(tmp_link, target)
            else:
                os.rename(staged.tree, target)
            placed.append(target)
            entries[staged.key] = entry
            write_metadata(plugins_dir, entries)
        except BaseException:
            for path in reversed(placed):  # undo: remove what was placed, put the old install back
                if path.is_symlink() or path.is_file():
                    with contextlib.suppress(OSError):
                        path.unlink()
                else:
                    shutil.rmtree(path, ignore_errors=True)
            for dest, path in reversed(moved):
                with contextlib.suppress(OSError):
                    os.rename(dest, path)
            if data_aside is not None:
                with contextlib.suppress(OSError):
                    os.rename(data_aside, plugin_data_path(plugins_dir.parent, staged.key))
            _prune_empty(plugins_dir, staged.key)  # directories this attempt created
            raise
        finally:
            shutil.rmtree(staged.staging, ignore_errors=True)
        staged.data_moved_to = data_aside
        return entry


def install_plugin(
    home: Path,
    source: str | InstallSource,
    *,
    force: bool = False,
    ref: str | None = None,
    category: str | None = None,
    timeout: float = DEFAULT_GIT_TIMEOUT,
) -> InstalledPlugin:
    """Stage and commit in one go (no prompts): what the CLI does minus the questions."""
    plugins_dir = Path(home) / "plugins"
    src = parse_source(source) if isinstance(source, str) else source
    staged = stage_plugin(plugins_dir, src, ref=ref, category=category, timeout=timeout)
    try:
        return commit_staged(staged, force=force)
    finally:
        discard_staged(staged)


# --------------------------------------------------------------------------- lookup


def installed_plugins(plugins_dir: Path) -> dict[str, tuple[str, Path | None]]:
    """Plugins present in ``plugins/`` or recorded in the metadata: key -> (name, path)."""
    found: dict[str, tuple[str, Path | None]] = {}
    for cand in scan_directory(plugins_dir, SOURCE_USER):
        found[cand.key] = (cand.name, cand.path)
    for key in read_metadata(plugins_dir):
        found.setdefault(key, (key.rsplit("/", 1)[-1], None))
    return found


def resolve_name(name: str, plugins: dict[str, str], *, what: str = "plugin", where: str = "") -> str:
    """A key from a key, a manifest name or a unique bare leaf; :class:`InstallError` otherwise.

    ``plugins`` maps key -> manifest name.
    """
    name = name.strip()
    if name in plugins:
        return name
    matches = sorted(k for k, n in plugins.items() if n == name or k.rsplit("/", 1)[-1] == name)
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise InstallError(f"{name!r} is ambiguous: it matches {', '.join(matches)}; use the full key")
    import difflib

    names = list(dict.fromkeys([*plugins, *sorted(set(plugins.values()))]))  # a key that is also a name: once
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    if not plugins:
        known = " (none found)"
    elif len(plugins) <= 20:
        known = f" (known: {', '.join(sorted(plugins))})"
    else:
        known = f" ({len(plugins)} known; see `plugin-llm plugins list`)"
    raise InstallError(f"no {what} {name!r}{where}{hint}{known}")


def resolve_installed(plugins_dir: Path, name: str) -> str:
    found = installed_plugins(plugins_dir)
    return resolve_name(name, {k: v[0] for k, v in found.items()}, what="installed plugin", where=f" in {plugins_dir}")


# --------------------------------------------------------------------------- update


@dataclass(frozen=True)
class UpdateResult:
    key: str
    old_revision: str | None
    new_revision: str | None
    changed: bool
    created_files: tuple[str, ...] = ()


def _local_edits(repo: Path, timeout: float) -> list[str]:
    """Tracked files changed in the clone (untracked files, e.g. __pycache__ or data, don't count)."""
    out = _git(["-C", str(repo), "status", "--porcelain", "--untracked-files=no"], timeout=timeout, what="status")
    return [line.strip() for line in out.splitlines() if line.strip()]


def update_plugin(home: Path, name: str, *, timeout: float = DEFAULT_GIT_TIMEOUT) -> UpdateResult:
    """``git pull --ff-only`` a git install (refusing pinned installs and local edits), or
    re-copy a directory install from its recorded path (refusing local edits)."""
    plugins_dir = Path(home) / "plugins"
    key = resolve_installed(plugins_dir, name)
    entries = read_metadata(plugins_dir)
    entry = entries.get(key)
    if entry is None:
        raise InstallError(
            f"{key} was not installed with `plugin-llm plugins install` (no record in {_metadata_path(plugins_dir)}); "
            "update it by hand, or reinstall it with `plugins install SOURCE --force`"
        )
    if entry.kind == "link":  # --link: edits in the linked directory apply on the next load
        return UpdateResult(key, None, None, False, ())
    if entry.kind == "dir":
        return _update_dir(home, plugins_dir, entry, timeout)
    if entry.ref:
        raise InstallError(
            f"{key} is pinned to {entry.ref} (installed with --ref); reinstall to move it: "
            f"`plugin-llm plugins install {entry.source} --ref NEW --force` (or without --ref to follow the branch)"
        )
    plugin_path = plugins_dir.joinpath(*key.split("/"))
    repo = plugins_dir / entry.repo if entry.repo else plugin_path
    if not (repo / ".git").exists():
        raise InstallError(f"{repo} is not a git checkout any more; reinstall with `plugins install {entry.source} --force`")
    with _plugins_lock(plugins_dir):
        edits = _local_edits(repo, timeout)
        if edits:
            shown = ", ".join(edits[:5]) + (f" (+{len(edits) - 5} more)" if len(edits) > 5 else "")
            raise InstallError(
                f"{key} has local edits ({shown}); update refused so they are not lost. "
                f"Inspect them with `git -C {repo} status`, then discard or commit them, "
                f"or reinstall with `plugins install {entry.source} --force`"
            )
        old = _revision(repo, timeout)
        protocol = InstallSource("git", entry.location, entry.subdir, entry.source).protocol
        _git(["-C", str(repo), "pull", "--ff-only", "--quiet"], timeout=timeout, protocol=protocol, what="pull --ff-only")
        new = _revision(repo, timeout)
        created: list[str] = []
        if new != old:
            root = repo / entry.subdir if entry.subdir else repo
            try:
                manifest = _validate_tree(root, key)
                leaf = key.rsplit("/", 1)[-1]
                if manifest.name != leaf and _manifest_has_name(root):
                    raise InstallError(f"the new version renames the plugin to {manifest.name!r}; reinstall it instead")
            except InstallError as exc:
                _git(["-C", str(repo), "reset", "--hard", "--quiet", old], timeout=timeout, what="reset")
                raise InstallError(f"update of {key} rolled back to {old[:12]}: {exc}") from None
            created = copy_example_files(root)
        entries = read_metadata(plugins_dir)
        entries[key] = replace(
            entry, revision=new, updated_at=_now() if new != old else entry.updated_at,
            created_files=tuple(dict.fromkeys([*entry.created_files, *created])),
        )
        _write_metadata(plugins_dir, entries)
    return UpdateResult(key, old, new, new != old, tuple(created))


def _update_dir(home: Path, plugins_dir: Path, entry: InstalledPlugin, timeout: float) -> UpdateResult:
    key = entry.key
    plugin_path = plugins_dir.joinpath(*key.split("/"))
    if entry.tree_sha256 and plugin_path.is_dir():
        if _tree_hash(plugin_path, entry.created_files) != entry.tree_sha256:
            raise InstallError(
                f"{key} has local edits (its files differ from what was installed); update refused so they are "
                f"not lost. Reinstall with `plugins install {entry.source} --force` to overwrite them"
            )
    source = InstallSource("dir", entry.location, entry.subdir, entry.source)
    if not Path(entry.location).is_dir():
        raise InstallError(f"{key} was installed from {entry.location}, which no longer exists")
    category = key.split("/")[0] if "/" in key else None
    staged = stage_plugin(plugins_dir, source, category=category, timeout=timeout)
    try:
        if staged.key != key:
            raise InstallError(f"{entry.location} now holds plugin {staged.key!r}, not {key!r}; reinstall it instead")
        old_hash = entry.tree_sha256 or ""
        # keep the operator's copies of *.example files
        for rel in entry.created_files:
            src = plugin_path / rel
            dst = staged.root / rel
            if src.is_file() and not src.is_symlink():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        staged.created_files = list(dict.fromkeys([*entry.created_files, *staged.created_files]))
        new_entry = _entry_from_staged(staged, installed_at=entry.installed_at)
        if new_entry.tree_sha256 == old_hash:
            return UpdateResult(key, old_hash, old_hash, False)
        committed = commit_staged(staged, force=True, installed_at=entry.installed_at)
        return UpdateResult(key, old_hash, committed.tree_sha256, True)
    finally:
        discard_staged(staged)


# --------------------------------------------------------------------------- remove


@dataclass(frozen=True)
class RemoveResult:
    key: str
    removed_paths: tuple[str, ...]
    had_metadata: bool
    data_moved_to: str | None = None  # where its plugin-data/<key>/ went (None: it had none, or keep_data)


def remove_plugin(home: Path, name: str, *, force: bool = False, timeout: float = DEFAULT_GIT_TIMEOUT,
                  keep_data: bool = False) -> RemoveResult:
    """Delete a user plugin's directory (and its clone) and its metadata entry, together.

    A git install with local edits is refused unless ``force``. A symlink that
    plugin-llm did not create is unlinked, never followed. Its private data
    (``plugin-data/<key>/``) is moved aside to ``plugin-data/.removed/`` unless
    ``keep_data``.
    """
    plugins_dir = Path(home) / "plugins"
    key = resolve_installed(plugins_dir, name)
    with _plugins_lock(plugins_dir):
        entries = read_metadata(plugins_dir)
        entry = entries.get(key)
        target = plugins_dir.joinpath(*key.split("/"))
        if _occupied(target) and not target.is_symlink():
            problem = _occupant_problem(plugins_dir, key, target, entry)
            if problem is not None:
                raise InstallError(f"{problem}; refusing to delete it (nothing was removed)")
        elif not _occupied(target) and entry is None:
            raise InstallError(
                f"{escape_unsafe(key, 100)} is not in {target} (a plugin placed by hand in a directory named "
                "otherwise); delete its directory by hand (see `plugin-llm plugins info`)"
            )
        paths = [p for p in _existing_paths(plugins_dir, key, entry) if _occupied(p)]
        for path in paths:
            if not path.is_symlink() and not _within(path, plugins_dir):  # pragma: no cover - defensive
                raise InstallError(f"{path} resolves outside {plugins_dir}; refusing to delete it")
        if entry is not None and entry.kind == "git" and not force:
            repo = plugins_dir / entry.repo if entry.repo else plugins_dir.joinpath(*key.split("/"))
            if (repo / ".git").exists():
                edits = _local_edits(repo, timeout)
                if edits:
                    raise InstallError(
                        f"{key} has local edits ({', '.join(edits[:5])}); use --force to remove it anyway"
                    )
        trash = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX + "remove-", dir=plugins_dir))
        moved: list[tuple[Path, Path]] = []
        data_aside: Path | None = None
        try:
            if not keep_data:
                data_aside = quarantine_plugin_data(Path(home), key)
            for i, path in enumerate(paths):
                dest = trash / str(i)
                os.rename(path, dest)  # a symlink is moved as a link: its target is untouched
                moved.append((dest, path))
            if entry is not None:
                del entries[key]
                _write_metadata(plugins_dir, entries)
        except BaseException:
            for dest, path in reversed(moved):
                with contextlib.suppress(OSError):
                    os.rename(dest, path)
            if data_aside is not None:
                with contextlib.suppress(OSError):
                    os.rename(data_aside, plugin_data_path(Path(home), key))
            shutil.rmtree(trash, ignore_errors=True)
            raise
        _rmtree_no_follow(trash)
        _prune_empty(plugins_dir, key)
    return RemoveResult(key, tuple(str(p) for p in paths), entry is not None,
                        str(data_aside) if data_aside is not None else None)


def _rmtree_no_follow(path: Path) -> None:
    def onerror(func, p, exc_info):  # read-only files in .git/objects
        with contextlib.suppress(OSError):
            os.chmod(p, stat.S_IWRITE | stat.S_IREAD)
            func(p)

    shutil.rmtree(path, onerror=onerror)


def _prune_empty(plugins_dir: Path, key: str) -> None:
    """Remove an emptied category directory, .repos/<category> and .repos itself."""
    candidates = [plugins_dir / REPOS_DIRNAME]
    if "/" in key:
        category = key.split("/")[0]
        candidates = [plugins_dir / category, plugins_dir / REPOS_DIRNAME / category, *candidates]
    for directory in candidates:
        with contextlib.suppress(OSError):
            directory.rmdir()


# --------------------------------------------------------------------------- env


def is_secret_name(name: str) -> bool:
    """Variables whose value is a secret: prompted without echo, never printed."""
    upper = name.upper()
    return any(marker in upper for marker in _SECRET_MARKERS)


def _env_path(home: Path) -> Path:
    return Path(home) / ENV_FILENAME


def _env_line(name: str, value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./:@+-]*", value):
        return f"{name}={value}"
    return f'{name}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_env_values(home: Path, values: dict[str, str]) -> Path:
    """Set ``values`` in ``<home>/.env`` (mode 0600, atomic; other lines kept)."""
    for name, value in values.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise InstallError(f"{name!r} is not an environment variable name")
        if "\n" in value or "\r" in value or "\0" in value:
            raise InstallError(f"the value for {name} contains a line break; not saved")
    path = _env_path(home)
    lines = (read_env_text(home) or "").splitlines()  # a FIFO or a device there: an error, not a hang
    pending = dict(values)
    out = []
    for line in lines:
        name = line.strip().removeprefix("export ").partition("=")[0].strip()
        if "=" in line and name in pending:
            out.append(_env_line(name, pending.pop(name)))
        else:
            out.append(line)
    out.extend(_env_line(n, v) for n, v in pending.items())
    write_atomic(path, ("\n".join(out) + "\n").encode("utf-8"))
    return path


def missing_env(home: Path, names: tuple[str, ...] | list[str]) -> list[str]:
    """The required variables set neither in the environment nor in ``<home>/.env``."""
    saved = read_env_file(home)
    return [n for n in names if not os.environ.get(n) and not saved.get(n)]
