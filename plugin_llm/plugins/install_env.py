"""The values a plugin's ``requires_env`` names, in ``<home>/.env``: which are secret, set, missing."""

from __future__ import annotations

import os
import re
from pathlib import Path

from plugin_llm.hardened.atomic_write import write_atomic
from plugin_llm.home_env import ENV_FILENAME, read_env_file, read_env_text

from .install_sources import InstallError

_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


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
