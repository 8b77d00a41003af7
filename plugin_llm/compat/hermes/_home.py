"""The home the compat modules act on: the plugin manager's, else ``$HERMES_HOME``."""

from __future__ import annotations

import threading
from pathlib import Path

_lock = threading.Lock()
_active: Path | None = None


def set_active_home(home: Path | str | None) -> None:
    """Called by the plugin manager before it loads plugins (the home they belong to)."""
    global _active
    with _lock:
        _active = Path(home) if home is not None else None


def active_home() -> Path:
    """The home of the calling plugin (several managers may load plugins in one process), else the
    home of the manager that loaded plugins last, else ``$HERMES_HOME``."""
    from .finder import caller_home  # on first use: this shim stays light

    home = caller_home()
    if home is not None:
        return home
    if _active is not None:
        return _active
    from plugin_llm.config import hermes_home  # on first use: it loads PyYAML

    return Path(hermes_home())
