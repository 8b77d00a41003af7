"""``hermes_constants`` for plugins: where the home is (this host's home)."""

from __future__ import annotations

from pathlib import Path

from ._home import active_home

__all__ = ["get_hermes_home", "display_hermes_home", "get_hermes_dir", "get_default_hermes_root"]


def get_hermes_home() -> Path:
    """The active home (the plugin manager's ``$HERMES_HOME``)."""
    return active_home()


def get_default_hermes_root() -> Path:
    return active_home()


def get_hermes_dir(new_subpath: str, old_name: str | None = None) -> Path:
    """``<home>/<new_subpath>`` (Hermes also looks for a legacy ``old_name``; kept when it exists)."""
    home = active_home()
    if old_name:
        legacy = home / old_name
        if legacy.exists():
            return legacy
    return home / new_subpath


def display_hermes_home() -> str:
    """The home for messages, with ``~`` for the user's home directory."""
    home = active_home()
    try:
        return "~/" + str(home.relative_to(Path.home()))
    except ValueError:
        return str(home)
