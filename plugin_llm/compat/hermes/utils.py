"""``utils`` helpers Hermes plugins import: environment parsing and atomic JSON writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Union

__all__ = ["is_truthy_value", "env_var_enabled", "env_int", "env_float", "env_bool", "atomic_replace",
           "atomic_json_write"]

_TRUTHY = frozenset({"1", "true", "yes", "on", "y", "t"})


def is_truthy_value(value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if not text:
        return default
    return text in _TRUTHY


def env_var_enabled(name: str, default: str = "") -> bool:
    return is_truthy_value(os.getenv(name, default), default=False)


def env_int(key: str, default: int = 0) -> int:
    raw = os.getenv(key, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


def env_float(key: str, default: float = 0.0) -> float:
    raw = os.getenv(key, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


def env_bool(key: str, default: bool = False) -> bool:
    return is_truthy_value(os.getenv(key, ""), default=default)


def atomic_replace(tmp_path: Union[str, Path], target: Union[str, Path]) -> str:
    """Move ``tmp_path`` onto ``target`` atomically (onto a symlink's target, keeping the link)."""
    target = Path(target)
    real = Path(os.path.realpath(target)) if target.is_symlink() else target
    os.replace(tmp_path, real)
    return str(real)


def atomic_json_write(path: Union[str, Path], data: Any, *, indent: int | None = 2, **dump_kwargs: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file in the same directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=indent, ensure_ascii=False, **dump_kwargs)
            fh.flush()
            os.fsync(fh.fileno())
        atomic_replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
