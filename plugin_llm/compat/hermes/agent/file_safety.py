"""``agent.file_safety``: the read/write deny-list providers consult before touching a local file.

Reads of the home's secrets (``auth.json``, ``.env``, ``auth/``, ``mcp-tokens/``,
the audit signing keys) and of project ``.env`` files are refused; writes into
the home's credential and audit files too. As in Hermes this is defence in
depth, not a sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .._home import active_home

__all__ = ["get_read_block_error", "raise_if_read_blocked", "is_write_denied", "get_write_denied_error"]

_HOME_SECRETS = ("auth.json", "auth.lock", ".env", ".anthropic_oauth.json", "webhook_subscriptions.json")
_HOME_SECRET_DIRS = ("auth", "mcp-tokens", "keys")
_ENV_FILES = frozenset({".env", ".env.local", ".env.development", ".env.production", ".env.test",
                        ".env.staging", ".envrc"})


def _resolved(path: str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def get_read_block_error(path: str) -> Optional[str]:
    """An error message when ``path`` is a secret this host keeps (None when the read is fine)."""
    target = _resolved(path)
    home = _resolved(str(active_home()))
    if target.name in _ENV_FILES:
        return f"Access denied: {path} is an environment file that may hold credentials"
    if _under(target, home):
        rel = target.relative_to(home)
        if str(rel) in _HOME_SECRETS or (rel.parts and rel.parts[0] in _HOME_SECRET_DIRS):
            return f"Access denied: {path} holds this host's credentials"
        if rel.parts[:2] == ("skills", ".hub"):
            return f"Access denied: {path} is an internal cache file"
    return None


def raise_if_read_blocked(path: str) -> None:
    """Raise ``ValueError`` when :func:`get_read_block_error` blocks ``path``."""
    blocked = get_read_block_error(path)
    if blocked:
        raise ValueError(blocked)


def get_write_denied_error(path: str, *, verb: str = "Write") -> Optional[str]:
    target = _resolved(path)
    home = _resolved(str(active_home()))
    if _under(target, home):
        rel = target.relative_to(home)
        if str(rel) in _HOME_SECRETS or str(rel) == "config.yaml" or (rel.parts and rel.parts[0] in
                                                                       _HOME_SECRET_DIRS + ("logs",)):
            return f"{verb} denied: {path} is a protected file of this host"
    return None


def is_write_denied(path: str) -> bool:
    return get_write_denied_error(path) is not None
