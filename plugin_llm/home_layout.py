"""The host's own files in a home, in one place.

The stores take their paths from here, and the Hermes ``agent.file_safety``
shim refuses plugins' access to every entry of :data:`HOST_PATHS`: a store
added to this table is protected with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from audit.logfiles import LOG_NAME
from audit.signing import KEY_DIR
from auth.authfile import AUTH_FILE_NAME

__all__ = ["HostPath", "HOST_PATHS", "CONFIG_FILE", "ENV_FILE", "AUTH_FILE", "SERVICE_DIR", "TOKENS_DB",
           "AUTH_FAILURES_DB", "LIMITS_DB", "LOGS_DIR", "AUDIT_LOG", "KEYS_DIR", "PLUGINS_DIR", "INSTALL_METADATA",
           "host_path", "host_path_of"]

CONFIG_FILE = "config.yaml"
ENV_FILE = ".env"
AUTH_FILE = AUTH_FILE_NAME
SERVICE_DIR = "service"
TOKENS_DB = f"{SERVICE_DIR}/tokens.db"
AUTH_FAILURES_DB = f"{SERVICE_DIR}/auth_failures.db"
LIMITS_DB = "limits.sqlite3"
LOGS_DIR = "logs"
AUDIT_LOG = f"{LOGS_DIR}/{LOG_NAME}"
KEYS_DIR = KEY_DIR
PLUGINS_DIR = "plugins"
INSTALL_METADATA = f"{PLUGINS_DIR}/.install-metadata.json"


@dataclass(frozen=True)
class HostPath:
    """One host-only file or directory of the home (``rel`` with ``/``)."""

    rel: str
    what: str
    is_dir: bool = False
    secret: bool = True  # plugins may not read it either (else: not write it)


HOST_PATHS: tuple[HostPath, ...] = (
    HostPath(AUTH_FILE, "holds this host's provider keys"),
    HostPath(ENV_FILE, "holds this host's environment, keys included"),
    HostPath(KEYS_DIR, "holds the audit log's signing keys", is_dir=True),
    HostPath(SERVICE_DIR, "holds the service's tokens and its failed-token brake", is_dir=True),
    HostPath(LIMITS_DB, "is the limit store (budgets, counters, reservations)"),
    HostPath(CONFIG_FILE, "is the operator's configuration", secret=False),
    HostPath(LOGS_DIR, "holds the audit log and its signed checkpoints", is_dir=True, secret=False),
    HostPath(INSTALL_METADATA, "records what the operator installed", secret=False),
    # Hermes's own credential stores, when the home is shared with Hermes
    HostPath("auth", "holds Hermes's credentials", is_dir=True),
    HostPath("mcp-tokens", "holds MCP servers' tokens", is_dir=True),
    HostPath("auth.lock", "guards Hermes's credential store"),
    HostPath(".anthropic_oauth.json", "holds an OAuth token"),
    HostPath("webhook_subscriptions.json", "holds webhook secrets"),
)


def host_path(home: Path | str, rel: str) -> Path:
    """``<home>/<rel>`` for one of this module's names."""
    return Path(home).joinpath(*rel.split("/"))


def _same_file(name: str, base: str) -> bool:
    """``name`` is ``base`` or one of its companions (``-wal``, ``-shm``, ``-journal``, ``.bak``, ``.lock``,
    ``.<base>.lock``, temporary files)."""
    return name == base or name.startswith((base + ".", base + "-", "." + base))


def host_path_of(home: Path | str, target: Path | str, *, reading: bool) -> HostPath | None:
    """The entry of :data:`HOST_PATHS` that ``target`` is (or is inside, or a companion file of), after
    resolving symlinks; with ``reading`` only the secret entries count. None when it is none of them."""
    real_home = Path(os.path.realpath(os.path.expanduser(str(home))))
    real = Path(os.path.realpath(os.path.expanduser(str(target))))
    try:
        rel = real.relative_to(real_home).parts
    except ValueError:
        return None
    for entry in HOST_PATHS:
        if reading and not entry.secret:
            continue
        parts = tuple(entry.rel.split("/"))
        if len(rel) < len(parts) or rel[:len(parts) - 1] != parts[:-1]:
            continue
        if entry.is_dir and rel[len(parts) - 1] == parts[-1]:
            return entry
        if not entry.is_dir and len(rel) == len(parts) and _same_file(rel[-1], parts[-1]):
            return entry
    return None
