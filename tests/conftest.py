"""Shared fixtures: a temporary HERMES_HOME per test, never the real ~/.hermes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(autouse=True)
def hermes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own home; HOME is moved too so ~/.hermes is never touched."""
    home = tmp_path / "hermes"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "HERMES_ENABLE_PROJECT_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    return home


def write_config(home: Path, text: str) -> Path:
    """Write config.yaml and make sure its stamp changes even within one mtime tick."""
    path = home / "config.yaml"
    old = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    st = path.stat()
    if st.st_mtime_ns == old:
        os.utime(path, ns=(st.st_atime_ns, old + 1_000_000))
    return path
