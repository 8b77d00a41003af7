"""``$HERMES_HOME/.env``: environment variables kept with the home (Hermes convention).

``plugin-llm plugins install`` saves the ``requires_env`` values an operator
types there (mode 0600). The host loads the file once per home and process,
before plugins or credentials need it, without overriding variables that are
already set; every value is registered with the secret redactor.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from plugin_llm.home_layout import ENV_FILE
from plugin_llm.hardened.safe_files import MIB, UnsafeFileError, read_home_text

__all__ = ["ENV_FILENAME", "ENV_MAX_BYTES", "read_env_text", "read_env_file", "load_home_env"]

ENV_FILENAME = ENV_FILE
#: a .env larger than this is refused unread
ENV_MAX_BYTES = 1 * MIB

_log = logging.getLogger("plugin_llm.config")

_LOADED: set[Path] = set()
_LOCK = threading.Lock()


def read_env_text(home: Path) -> str | None:
    """The text of ``<home>/.env`` (None when there is none).

    Read without blocking and bounded (:func:`plugin_llm.hardened.safe_files.read_home_text`):
    a FIFO, a directory or a device there raises
    :class:`~plugin_llm.hardened.safe_files.UnsafeFileError` naming the file.
    """
    return read_home_text(Path(home) / ENV_FILENAME, max_bytes=ENV_MAX_BYTES)


def read_env_file(home: Path) -> dict[str, str]:
    """``<home>/.env`` as a mapping (``NAME=value`` lines; quotes stripped; comments ignored).

    A file that cannot be used is logged (once per call, naming the file and
    the fix) and counts as empty: a broken ``.env`` never stops the host.
    """
    try:
        text = read_env_text(home)
    except UnsafeFileError as exc:
        _log.warning("%s; its variables are not loaded", exc)
        return {}
    if text is None:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.removeprefix("export ").partition("=")
        name, value = name.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            quote, value = value[0], value[1:-1]
            if quote == '"':
                value = value.replace('\\"', '"').replace("\\\\", "\\")
        out[name] = value
    return out


def load_home_env(home: Path) -> dict[str, str]:
    """Apply ``<home>/.env`` to ``os.environ`` once per home (never overriding); returns what was set."""
    key = Path(home).expanduser().resolve()
    with _LOCK:
        if key in _LOADED:
            return {}
        _LOADED.add(key)
    values = read_env_file(key)
    if not values:
        return {}
    from auth import register_secret  # values are often keys: keep them out of every log line

    applied = {}
    for name, value in values.items():
        register_secret(value)
        if name and not os.environ.get(name):
            os.environ[name] = value
            applied[name] = value
    return applied
