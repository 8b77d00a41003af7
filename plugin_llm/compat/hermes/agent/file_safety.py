"""``agent.file_safety``: the read/write deny-list providers consult before touching a local file.

The home's host-only files are :data:`plugin_llm.home_layout.HOST_PATHS`
(credentials, ``.env``, the service's token store, the limit store, the audit
signing keys, the audit log and its checkpoints, ``config.yaml`` ...): the
secret ones may be neither read nor written, the others not written; the
configured audit signing key too, wherever it is, and project ``.env`` files
are not read. Symlinks are resolved and hard links recognised. As in Hermes
this is defence in depth, not a sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .._home import active_home

__all__ = ["get_read_block_error", "raise_if_read_blocked", "is_write_denied", "get_write_denied_error"]

_ENV_FILES = frozenset({".env", ".env.local", ".env.development", ".env.production", ".env.test",
                        ".env.staging", ".envrc"})
_MAX_DIR_ENTRIES = 64  # files of a host-only directory compared by inode (hard links)


def _resolved(path: str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _signing_key_files(home: Path) -> list[Path]:
    """The configured audit signing key (``audit.signing_key``, possibly outside the home) and its .pub."""
    try:
        from audit.signing import key_file, pub_file  # on first use: this shim stays light
        from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

        key = key_file(home, get_config_source(home).current().audit.signing_key or None)
    except Exception:
        return []
    return [key, pub_file(key)]


def _host_inodes(home: Path) -> set[tuple[int, int]]:
    """(device, inode) of the existing host-only files, so a hard link to one is recognised."""
    from plugin_llm.home_layout import HOST_PATHS, host_path  # on first use: this shim stays light

    out: set[tuple[int, int]] = set()
    paths = [host_path(home, e.rel) for e in HOST_PATHS] + _signing_key_files(home)
    for path in paths:
        try:
            if path.is_dir() and not path.is_symlink():
                with os.scandir(path) as entries:
                    for i, entry in enumerate(entries):
                        if i >= _MAX_DIR_ENTRIES:
                            break
                        st = entry.stat(follow_symlinks=False)
                        out.add((st.st_dev, st.st_ino))
            else:
                st = path.stat()
                out.add((st.st_dev, st.st_ino))
        except OSError:
            continue
    return out


def _protected(path: str, *, reading: bool) -> Optional[str]:
    """What makes ``path`` a host-only file (None when it is not one)."""
    from plugin_llm.home_layout import host_path_of  # on first use: this shim stays light

    home = Path(active_home())
    entry = host_path_of(home, path, reading=reading)
    if entry is not None:
        return entry.what
    target = _resolved(path)
    keys = [_resolved(str(p)) for p in _signing_key_files(home)]
    if target in keys[:1] or (not reading and target in keys):
        return "is the audit log's signing key"
    try:
        st = os.stat(target)
    except OSError:
        return None
    if st.st_nlink > 1 and (st.st_dev, st.st_ino) in _host_inodes(home):
        return "is a hard link to a file of this host"
    return None


def get_read_block_error(path: str) -> Optional[str]:
    """An error message when ``path`` is a secret this host keeps (None when the read is fine)."""
    target = _resolved(path)
    if target.name in _ENV_FILES:
        return f"Access denied: {path} is an environment file that may hold credentials"
    why = _protected(path, reading=True)
    if why is not None:
        return f"Access denied: {path} {why}"
    home = _resolved(str(active_home()))
    try:
        if target.relative_to(home).parts[:2] == ("skills", ".hub"):
            return f"Access denied: {path} is an internal cache file"
    except ValueError:
        pass
    return None


def raise_if_read_blocked(path: str) -> None:
    """Raise ``ValueError`` when :func:`get_read_block_error` blocks ``path``."""
    blocked = get_read_block_error(path)
    if blocked:
        raise ValueError(blocked)


def get_write_denied_error(path: str, *, verb: str = "Write") -> Optional[str]:
    why = _protected(path, reading=False)
    if why is not None:
        return f"{verb} denied: {path} is a protected file of this host: it {why}"
    return None


def is_write_denied(path: str) -> bool:
    return get_write_denied_error(path) is not None
