"""Setting up a host process: resolve the home, point ``$HERMES_HOME`` at it, load plugins.

Shared by ``plugin-llm run``, ``chat`` and ``demo``. Plugins find their data
under ``$HERMES_HOME`` (``ctx`` exposes no host paths), so a CLI that works on
another home (``--home``) exports it for the duration of the command and
restores the previous value afterwards (tests call the CLI in-process).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from plugin_llm.plugins import PluginManager

__all__ = ["resolve_home", "home_environment", "load_manager"]


def resolve_home(value: str | os.PathLike[str] | None) -> Path:
    """``--home`` if given, else ``$HERMES_HOME``, else ``~/.hermes``."""
    if value:
        return Path(value).expanduser().resolve()
    from plugin_llm.config import hermes_home  # on first use: it loads PyYAML

    return hermes_home().resolve()


@contextmanager
def home_environment(home: Path) -> Iterator[Path]:
    """Export ``HERMES_HOME=home`` while the block runs, then restore the previous value."""
    previous = os.environ.get("HERMES_HOME")
    os.environ["HERMES_HOME"] = str(home)
    try:
        yield home
    finally:
        if previous is None:
            os.environ.pop("HERMES_HOME", None)
        else:
            os.environ["HERMES_HOME"] = previous


def load_manager(home: Path) -> "PluginManager":
    """A plugin manager for ``home`` with its plugins discovered and loaded."""
    manager = PluginManager(home=home)
    manager.discover_plugins()
    return manager
