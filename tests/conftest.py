"""Shared fixtures: a temporary HERMES_HOME per test, never the real ~/.hermes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# A shell starts a background job (`pytest &`) with SIGINT ignored, and an ignored signal stays ignored in
# every child it execs: the Ctrl-C tests (and the children they interrupt) would never see one. Python's
# own handler here means the children start with the default disposition again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: set once by a library for the whole process (litellm's tokenizer module points tiktoken at its bundled
#: encodings when first imported): removing it after the test that imported it would send tiktoken online
_PROCESS_WIDE = frozenset({"TIKTOKEN_CACHE_DIR"})


@pytest.fixture(autouse=True)
def _environment():
    """The process environment as it was before the test, whatever the test (or the host code it runs:
    loading a home's ``.env``, a shim's ``save_env_value``) set in it: a proxy variable left behind
    would send every later test's HTTP through it."""
    before = dict(os.environ)
    yield
    for name in set(os.environ) - set(before) - _PROCESS_WIDE:
        del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def hermes_home(_environment: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
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


def audit_lines(home: Path) -> list[dict]:
    """The call records (not operational events) of <home>/logs/agent.log, oldest first."""
    import json

    path = home / "logs" / "agent.log"
    if not path.exists():
        return []
    # split on "\n" only: str.splitlines() would also split on U+2028 inside JSON strings
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    return [r for r in records if r.get("event") == "llm.call"]


@pytest.fixture
def custom_route(hermes_home: Path):
    """Point config.yaml at an OpenAI-compatible server: ``custom_route(base_url, **llm_settings)``."""

    def configure(base_url: str, model: str = "gpt-4o", extra: str = "", **llm: object) -> Path:
        text = f"model:\n  provider: custom\n  model: {model}\n  base_url: {base_url}\n"
        if llm:
            text += "llm:\n" + "".join(f"  {k}: {v}\n" for k, v in llm.items())
        return write_config(hermes_home, text + extra)

    return configure


@pytest.fixture(scope="module")
def litellm():
    """litellm itself, loaded as the transport loads it (offline), for tests that compare against it."""
    from plugin_llm.transport._loading import load_litellm  # deferred: most tests never import litellm

    return load_litellm()


@pytest.fixture(scope="module")
def prices():
    """litellm's bundled price map, read as a file as the own path reads it."""
    from plugin_llm.transport._pricemap import PriceMap

    return PriceMap()
