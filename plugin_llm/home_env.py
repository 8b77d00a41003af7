"""``$HERMES_HOME/.env``: environment variables kept with the home (Hermes convention).

``plugin-llm plugins install`` saves the ``requires_env`` values an operator
types there (mode 0600). The host loads the file once per home and process,
before plugins or credentials need it, without overriding variables that are
already set; every value is registered with the secret redactor.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["ENV_FILENAME", "read_env_file", "load_home_env"]

ENV_FILENAME = ".env"

_LOADED: set[Path] = set()
_LOCK = threading.Lock()


def read_env_file(home: Path) -> dict[str, str]:
    """``<home>/.env`` as a mapping (``NAME=value`` lines; quotes stripped; comments ignored)."""
    try:
        text = (Path(home) / ENV_FILENAME).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
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
