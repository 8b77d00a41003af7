"""A CLI call that waits for the provider layer's import says so on a terminal, and only there;
``auth test`` reports the call's own time, not that import."""

from __future__ import annotations

import io
import json
import os
import re
import time
from pathlib import Path

import pytest

from plugin_llm.cli._waiting import LOADING_LINE
from plugin_llm.cli.main import main
from plugin_llm.transport import _loading
from tests.conftest import audit_lines

SLOW_IMPORT_SECONDS = 1.5


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _slow_import(monkeypatch: pytest.MonkeyPatch, *, wait_for: io.StringIO | None = None) -> None:
    """litellm unloaded, and its import slow: it ends once ``wait_for`` shows the notice (hang guard:
    10 s), else after SLOW_IMPORT_SECONDS."""
    real_import = _loading._import

    def slow() -> None:
        if wait_for is not None:
            limit = time.monotonic() + 10.0
            while LOADING_LINE not in wait_for.getvalue() and time.monotonic() < limit:
                time.sleep(0.01)
        else:
            time.sleep(SLOW_IMPORT_SECONDS)
        real_import()

    monkeypatch.setattr(_loading, "_litellm", None)
    monkeypatch.setattr(_loading, "_import", slow)
    # the local model runs in process without litellm: through litellm, as a translated provider's call does
    monkeypatch.setenv("PLUGIN_LLM_OWN_PATH", "0")


@pytest.mark.slow
def test_try_says_on_a_terminal_that_it_loads_the_provider_layer(hermes_home: Path, monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(_loading, "NOTICE_AFTER", 0.0)
    _slow_import(monkeypatch, wait_for=terminal)
    assert main(["try", "--as", "p", "--force", "hi"]) == 0
    assert terminal.getvalue().count(LOADING_LINE) == 1


@pytest.mark.slow
def test_try_prints_nothing_about_loading_when_stderr_is_no_terminal(hermes_home: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(_loading, "NOTICE_AFTER", 0.0)
    _slow_import(monkeypatch)
    assert main(["try", "--as", "p", "--force", "hi"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_try_on_the_gateway_s_own_path_never_loads_the_provider_layer(hermes_home: Path, monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(_loading, "NOTICE_AFTER", 0.0)
    monkeypatch.setattr(_loading, "_litellm", None)
    monkeypatch.setattr(_loading, "_import", lambda: pytest.fail("litellm was loaded for a local call"))
    assert main(["try", "--as", "p", "--force", "hi"]) == 0
    assert LOADING_LINE not in terminal.getvalue()


@pytest.mark.slow
def test_a_refused_try_never_loads_the_provider_layer(hermes_home: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(_loading, "_litellm", None)
    monkeypatch.setattr(_loading, "_import", lambda: pytest.fail("litellm was loaded for a denied call"))
    assert main(["try", "--as", "p", "--force", "--model", "gpt-4o", "hi"]) == 1
    assert "PluginLlmTrustError" in capsys.readouterr().err


@pytest.mark.slow
def test_auth_test_reports_the_calls_time_without_the_import(tmp_path: Path, monkeypatch, capsys) -> None:
    from tests.servers import FakeServer, Reply

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with FakeServer([Reply(content="ok")]) as server:
        (home / "config.yaml").write_text(
            f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {server.base_url}\nllm:\n  max_retries: 0\n")
        (home / "auth.json").write_text(json.dumps({"providers": {"custom": {"api_key": "sk-test-0000"}}}))
        os.chmod(home / "auth.json", 0o600)
        _slow_import(monkeypatch)
        assert main(["auth", "test", "custom", "--home", str(home)]) == 0
    out = capsys.readouterr().out
    reported = re.search(r"answered in ([0-9.]+) s", out)
    assert reported is not None, out
    [record] = audit_lines(home)
    # the number is the call's own (its record's latency), not the import it waited for
    assert reported.group(1) == f"{record['latency_ms'] / 1000.0:.2f}"
    assert float(reported.group(1)) < SLOW_IMPORT_SECONDS


@pytest.mark.slow
def test_chat_says_on_a_terminal_that_its_turn_waits_for_the_provider_layer(hermes_home: Path, monkeypatch,
                                                                           capsys) -> None:
    """chat starts loading litellm in the background; a turn that has to wait for it says so, once."""
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello there\n"))
    monkeypatch.setattr(_loading, "NOTICE_AFTER", 0.0)
    monkeypatch.setattr(_loading, "_background", None)
    _slow_import(monkeypatch, wait_for=terminal)
    assert main(["chat"]) == 0
    assert terminal.getvalue().count(LOADING_LINE) == 1
    assert "hello there" in capsys.readouterr().out  # the local model's echo: the turn was answered


@pytest.mark.parametrize("config, loads", [
    ("model:\n  provider: local\n", False),
    ("", False),
    ("model:\n  provider: deepseek\n  model: deepseek-chat\n", False),
    ("model:\n  provider: custom\n  model: gpt-4o\n  base_url: http://127.0.0.1:9/v1\n", False),
    ("model:\n  provider: anthropic\n  model: claude-sonnet-4-5\n", True),
    ("model:\n  provider: mistral\n  model: mistral-small\n", True),
    ("models:\n  a: {provider: local, model: local-echo-1}\n  b: {provider: groq, model: llama3}\n"
     "model: {route: a, fallbacks: [b]}\n", True),
    ("models:\n  a: {provider: local, model: local-echo-1}\n  b: {provider: groq, model: llama3}\n"
     "model: {route: a}\n", False),
    ("models:\n  a: {provider: local, model: local-echo-1}\n  b: {provider: bedrock, model: x}\n"
     "model: {route: a}\nauxiliary:\n  vision: b\n", True),
], ids=["local", "no-model", "deepseek", "custom", "anthropic", "mistral", "fallback", "unused-route", "auxiliary"])
def test_the_provider_layer_loads_ahead_only_for_routes_that_need_it(hermes_home: Path, monkeypatch, config,
                                                                     loads) -> None:
    """chat and run start litellm's import early only when the default route, its fallbacks or an auxiliary
    task's route needs its translation."""
    from plugin_llm.cli._waiting import preload_provider_layer
    from plugin_llm.transport import _transport

    started: list[bool] = []
    monkeypatch.setattr(_transport, "start_background_load", lambda: started.append(True))
    monkeypatch.delenv("PLUGIN_LLM_OWN_PATH", raising=False)
    (hermes_home / "config.yaml").write_text(config)
    assert preload_provider_layer(hermes_home) is loads
    assert started == ([True] if loads else [])


@pytest.mark.slow
def test_chat_on_a_route_without_litellm_never_loads_it(hermes_home: Path, monkeypatch, capsys) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello there\n"))
    monkeypatch.setattr(_loading, "NOTICE_AFTER", 0.0)
    monkeypatch.setattr(_loading, "_background", None)
    monkeypatch.setattr(_loading, "_litellm", None)
    monkeypatch.setattr(_loading, "_import", lambda: pytest.fail("litellm was loaded for a local chat"))
    assert main(["chat"]) == 0
    assert _loading._background is None and LOADING_LINE not in terminal.getvalue()
    assert "hello there" in capsys.readouterr().out
