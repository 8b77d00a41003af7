"""The fast path: key pools and Retry-After on both paths, pooled clients, doctor, background load."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_llm import PluginLlm, PluginLlmProviderError
from tests.conftest import audit_lines, write_config
from tests.paths import transport_path  # noqa: F401  (every test on both paths)
from tests.servers import FakeServer, Reply

ROOT = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "ping"}]


def bearer(request) -> str:
    return next(v for k, v in request.headers.items() if k.lower() == "authorization").split()[-1]


def pooled(home: Path, base_url: str, keys: list[str], retries: int = 2) -> None:
    auth = home / "auth.json"
    auth.write_text(json.dumps({"providers": {"custom": {"keys": keys}}}), encoding="utf-8")
    os.chmod(auth, 0o600)
    write_config(home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {base_url}\n"
                       f"llm:\n  max_retries: {retries}\n  timeout: 20\n")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_pooled_key_refused_with_429_cools_and_the_retry_takes_the_next(hermes_home, mode):
    keys = ["poolkey-a-0123456789abcdef", "poolkey-b-0123456789abcdef"]
    with FakeServer([Reply.error(429, "slow down", headers={"Retry-After": "30"})]) as fake:
        pooled(hermes_home, fake.base_url, keys)
        llm = PluginLlm("p")
        first = llm.complete(USER) if mode == "sync" else asyncio.run(llm.acomplete(USER))
        second = llm.complete(USER) if mode == "sync" else asyncio.run(llm.acomplete(USER))
        sent = [bearer(r) for r in fake.requests]
    assert first.text == second.text == "ok"
    # no wait for the 30 s Retry-After: the retry went straight to the other key, which also serves the next
    # call while the first one cools down
    assert sent[0] != sent[1] and sent[2] == sent[1] and set(sent) == set(keys)
    assert [line["attempts"] for line in audit_lines(hermes_home)] == [2, 1]


@pytest.mark.slow
def test_retry_after_is_honoured_for_a_single_key(hermes_home, monkeypatch):
    import time
    import types

    from plugin_llm.transport import _transport

    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the real wait, recorded: what the transport asked for, not a clock
        slept.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(_transport, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic,
                                                                  perf_counter=time.perf_counter))
    with FakeServer([Reply.error(429, "slow down", headers={"Retry-After": "1"})]) as fake:
        write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
                                  "llm:\n  max_retries: 1\n")
        assert PluginLlm("p").complete(USER).text == "ok"
    assert len(fake.requests) == 2 and slept == [pytest.approx(1.0)]  # the retry waited for the Retry-After


def test_retry_after_beyond_the_deadline_fails_at_once(hermes_home):
    with FakeServer([Reply.error(429, "slow down", headers={"Retry-After": "20"})]) as fake:
        write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
                                  "llm:\n  max_retries: 2\n")
        with pytest.raises(PluginLlmProviderError) as info:
            PluginLlm("p").complete(USER, timeout=3)
    assert info.value.status == 429 and info.value.retry_after == 20.0 and len(fake.requests) == 1


def test_async_session_is_closed_when_its_loop_ends(hermes_home, transport_path):
    from plugin_llm.transport import _fastpath

    with FakeServer() as fake:
        write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n")

        async def two_calls():
            llm = PluginLlm("p")
            await asyncio.gather(llm.acomplete(USER), llm.acomplete(USER))
            entry = _fastpath._sessions.get(asyncio.get_running_loop())
            return entry[0] if entry else None

        session = asyncio.run(two_calls())
    if transport_path == "fast":
        assert session is not None and session.closed  # closed by the loop's shutdown, no "Unclosed" warning
    else:
        assert session is None


def test_one_async_session_per_loop_is_reused(hermes_home, transport_path):
    from plugin_llm.transport import _fastpath

    with FakeServer() as fake:
        write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n")

        async def calls():
            llm = PluginLlm("p")
            seen = set()
            for _ in range(3):
                await llm.acomplete(USER)
                entry = _fastpath._sessions.get(asyncio.get_running_loop())
                seen.add(id(entry[0]) if entry else None)
            return seen

        seen = asyncio.run(calls())
    assert len(seen) == 1


# --------------------------------------------------------------------------- doctor


@pytest.mark.parametrize("transport_path", ["fast"], indirect=True)
@pytest.mark.parametrize("config, expected", [
    ("model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:9/v1\n", "OK fast path: yes: OpenAI-compatible"),
    ("model:\n  provider: local\n", "OK fast path: no: the embedded local model"),
    ("model:\n  provider: bedrock\n  model: anthropic.claude-3\n", "OK fast path: no: provider bedrock is not"),
])
def test_doctor_says_whether_the_route_takes_the_fast_path(hermes_home, config, expected):
    from plugin_llm.cli.doctor_cmd import run_checks

    write_config(hermes_home, config)
    lines = [f"{c.status} {c.check}: {c.message}" for c in run_checks(hermes_home)]
    assert any(line.startswith(expected) for line in lines), lines


@pytest.mark.parametrize("transport_path", ["fast"], indirect=True)
@pytest.mark.parametrize("config, expected", [
    ("model:\n  provider: deepseek\n  model: deepseek-chat\n", "not loaded: the gateway sends these calls itself"),
    ("model:\n  provider: local\n", "not loaded"),
    ("model:\n  provider: bedrock\n  model: anthropic.claude-3\n", "litellm loads for calls on bedrock/anthropic"),
    ("models:\n  a: {provider: local, model: local-echo-1}\n  b: {provider: groq, model: llama3}\n"
     "model: {route: a, fallbacks: [b]}\n", "litellm loads for calls on b "),
])
def test_doctor_says_whether_the_route_loads_litellm(hermes_home, monkeypatch, config, expected):
    from plugin_llm.cli.doctor_cmd import run_checks

    monkeypatch.delenv("PLUGIN_LLM_OWN_PATH", raising=False)
    write_config(hermes_home, config)
    [check] = [c for c in run_checks(hermes_home) if c.check == "provider layer"]
    assert check.status == "OK" and check.message.startswith(expected), check.message


@pytest.mark.parametrize("transport_path", ["fast"], indirect=True)
def test_doctor_warns_when_litellm_is_outside_the_tested_range(hermes_home, monkeypatch):
    from plugin_llm.cli.doctor_cmd import run_checks
    from plugin_llm.transport import _fastpath

    monkeypatch.setattr(_fastpath, "_VERSION", ["2.0.1"])
    write_config(hermes_home, "model:\n  provider: openai\n  model: gpt-4o\n")
    [check] = [c for c in run_checks(hermes_home) if c.check == "fast path"]
    assert check.status == "WARN" and "litellm 2.0.1 is outside the range" in check.message
    assert "pip install 'litellm>=" in check.fix


@pytest.mark.parametrize("transport_path", ["fallback"], indirect=True)
def test_doctor_names_the_switch(hermes_home):
    from plugin_llm.cli.doctor_cmd import run_checks

    write_config(hermes_home, "model:\n  provider: openai\n  model: gpt-4o\n")
    [check] = [c for c in run_checks(hermes_home) if c.check == "fast path"]
    assert check.status == "OK" and "PLUGIN_LLM_FAST_PATH=0" in check.message


# --------------------------------------------------------------------------- loading litellm


def python(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("transport_path", ["fast"], indirect=True)
def test_background_load_imports_litellm_off_the_main_thread_once_and_freezes_it(hermes_home):
    code = (
        "import gc, sys, threading\n"
        "import plugin_llm.transport as t\n"
        "from plugin_llm.transport import _loading\n"
        "assert 'litellm' not in sys.modules\n"
        "t.start_background_load(); t.start_background_load()\n"
        "loader = _loading._background\n"
        "assert loader is not None and loader is not threading.current_thread()\n"
        "first = t.LitellmTransport(); first.ready()  # waits for the background import, does not repeat it\n"
        "loader.join(60)\n"
        "print('litellm' in sys.modules, _loading.loaded_litellm() is sys.modules['litellm'],"
        " _loading.GC_FREEZE, gc.get_freeze_count() > 10000)\n"
    )
    assert python(code) == "True True True True"  # litellm's objects are out of the collector's generations


@pytest.mark.parametrize("transport_path", ["fast"], indirect=True)
@pytest.mark.parametrize("route, loads", [("  provider: anthropic\n  model: claude-sonnet-4-5\n", True),
                                          ("  provider: local\n", False),
                                          ("  provider: deepseek\n  model: deepseek-chat\n", False)],
                         ids=["anthropic", "local", "deepseek"])
def test_an_attached_session_starts_loading_litellm_when_its_route_needs_it(hermes_home, route, loads):
    write_config(hermes_home, "model:\n" + route)
    code = (
        "import sys\n"
        "from plugin_llm.host import Session\n"
        "from plugin_llm.host.bootstrap import load_manager\n"
        "from plugin_llm.transport import _loading\n"
        f"manager = load_manager({str(hermes_home)!r})\n"
        "session = Session(manager)\n"
        "print(_loading._background is None, end=' ')\n"
        "session.attach()\n"
        "print(_loading._background is not None)\n"
        "session.close()\n"
    )
    assert python(code) == f"True {loads}"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_http_proxy_from_the_environment_is_used(hermes_home, monkeypatch, mode):
    from plugin_llm.transport import _fastpath

    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    with FakeServer() as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.port}")
        _fastpath.reset_clients()  # proxies are looked up once per endpoint
        write_config(hermes_home, "model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:9/v1\n")
        try:
            llm = PluginLlm("p")
            result = llm.complete(USER) if mode == "sync" else asyncio.run(llm.acomplete(USER))
        finally:
            _fastpath.reset_clients()
        [request] = proxy.requests
    assert result.text == "ok"
    assert request.path == "http://127.0.0.1:9/v1/chat/completions"  # the absolute form a proxy is sent


@pytest.mark.slow
@pytest.mark.parametrize("transport_path", ["fast", "fallback"], indirect=True)
def test_an_interrupted_call_leaves_the_pool_usable(hermes_home, transport_path):
    """Ctrl-C (KeyboardInterrupt) while a sync call waits for the provider: the next call still gets through."""
    import signal
    import threading

    with FakeServer(default=Reply(content="next answer")) as fake:
        write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
                                  "llm:\n  max_retries: 0\n")
        llm = PluginLlm("p")
        llm.complete(USER)  # warm: the pool holds a connection
        fake.push(Reply(content="too late", delay=30))
        main = threading.main_thread().ident
        timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))  # a real Ctrl-C: EINTR
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            llm.complete(USER, timeout=20)
        timer.join()
        assert llm.complete(USER, timeout=5).text == "next answer"
