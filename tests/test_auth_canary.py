"""Canary secrets through the whole gateway: no key leaks, profiles via the trust gate, pools over HTTP.

A unique secret is put in auth.json, an environment variable, a key_cmd and a
pool; a fake OpenAI-compatible server on 127.0.0.1 answers with bodies that
echo the Authorization header and the request URL back. The canary must reach
the server (so the test is real) and appear nowhere else: exception text,
repr and traceback, agent.log, logging/structlog output, results, and the
objects reachable from ``ctx.llm``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
import textwrap
import threading
import traceback
from pathlib import Path

import pytest

from auth import get_store
from plugin_llm import PluginLlm, PluginLlmConfigError, PluginLlmProviderError, PluginLlmTrustError
from tests.conftest import audit_lines, write_config
from tests.leaks import strings_reachable
from tests.servers import FakeServer, Reply

USER = [{"role": "user", "content": "ping"}]


def canary() -> str:
    return f"cnry{secrets.token_hex(16)}"


def write_auth(home: Path, doc: dict) -> None:
    tmp = home / ".auth.json.test-tmp"
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.chmod(tmp, 0o600)
    os.replace(tmp, home / "auth.json")


def header(headers: dict, name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), "")


def bearer(request) -> str:
    return header(request.headers, "Authorization").removeprefix("Bearer ")


def echo(status: int, extra_headers: dict | None = None):
    """A reply that echoes the Authorization header and the URL in an OpenAI error body."""

    def body(_json, headers, path):
        auth = header(headers, "Authorization")
        message = f"Incorrect API key provided: {auth} for url http://127.0.0.1{path}?key={auth.split()[-1]}"
        return status, {"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}}, \
            dict(extra_headers or {})

    return Reply(body=body)


def assert_no_canary(secret: str, *, home: Path, caplog=None, exc: BaseException | None = None, objects=()) -> None:
    texts = []
    if exc is not None:
        texts += [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    log = home / "logs" / "agent.log"
    if log.exists():
        texts.append(log.read_text(encoding="utf-8"))
    if caplog is not None:
        texts.append(caplog.text)
    for obj in objects:
        texts += [repr(obj), str(obj), *strings_reachable(obj)]
    for text in texts:
        assert secret not in text


@pytest.fixture
def fake():
    with FakeServer() as server:
        yield server


@pytest.fixture
def debug_logs(caplog):
    """Capture everything litellm, httpx and the gateway log at DEBUG."""
    caplog.set_level(logging.DEBUG)
    for name in ("LiteLLM", "LiteLLM Router", "httpx", "httpcore", "openai"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def key_script(tmp_path: Path, key: str) -> list[str]:
    script = tmp_path / "print_key.py"
    script.write_text(textwrap.dedent(f"print({key!r})"), encoding="utf-8")
    return [sys.executable, str(script)]


# --------------------------------------------------------------------------- every key source, 401 and 500 echoes


@pytest.mark.parametrize("source", ["auth.json", "env", "key_cmd", "key_env", "pool"])
@pytest.mark.parametrize("status", [401, 500])
def test_echoed_key_never_leaks(hermes_home, tmp_path, fake, debug_logs, monkeypatch, source, status):
    secret = canary()
    provider = "custom"
    if source == "auth.json":
        write_auth(hermes_home, {"providers": {"custom": {"api_key": secret}}})
    elif source == "env":
        provider = "openai"  # an operator-owned proxy for openai, key from OPENAI_API_KEY
        monkeypatch.setenv("OPENAI_API_KEY", secret)
    elif source == "key_cmd":
        write_auth(hermes_home, {"providers": {"custom": {"key_cmd": key_script(tmp_path, secret)}}})
    elif source == "key_env":
        monkeypatch.setenv("GATEWAY_CANARY_KEY", secret)
        write_auth(hermes_home, {"providers": {"custom": {"key_env": "GATEWAY_CANARY_KEY"}}})
    else:
        write_auth(hermes_home, {"providers": {"custom": {"keys": [secret, canary()]}}})
    write_config(hermes_home, f"model:\n  provider: {provider}\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
                              "llm:\n  max_retries: 0\n  timeout: 10\n")
    fake.push(echo(status))
    llm = PluginLlm("canary-plugin")
    with pytest.raises(PluginLlmProviderError) as info:
        llm.complete(USER)
    assert bearer(fake.requests[0]) == secret  # the key really was sent
    assert info.value.status == status
    assert "Incorrect API key provided" in str(info.value)  # the provider's message survives, redacted
    assert_no_canary(secret, home=hermes_home, caplog=debug_logs, exc=info.value, objects=[llm])
    assert audit_lines(hermes_home)[-1]["status"] == "provider_error"


def test_async_echo_never_leaks(hermes_home, fake, debug_logs):
    secret = canary()
    write_auth(hermes_home, {"providers": {"custom": {"api_key": secret}}})
    write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
                              "llm:\n  max_retries: 0\n")
    fake.push(echo(401))
    llm = PluginLlm("canary-plugin")

    async def call():
        with pytest.raises(PluginLlmProviderError) as info:
            await llm.acomplete(USER)
        return info.value

    error = asyncio.run(call())
    assert bearer(fake.requests[0]) == secret
    assert_no_canary(secret, home=hermes_home, caplog=debug_logs, exc=error, objects=[llm])


def test_success_results_and_ctx_reachable_objects_hold_no_key(hermes_home, fake, debug_logs):
    secret = canary()
    write_auth(hermes_home, {"providers": {"custom": {"api_key": secret}}})
    write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n")
    fake.push(Reply(content="fine"), Reply.json('{"a": 1}'))
    llm = PluginLlm("canary-plugin")
    result = llm.complete(USER)
    structured = llm.complete_structured(instructions="x", input=["y"],
                                         json_schema={"type": "object", "properties": {"a": {"type": "integer"}}})
    assert result.text == "fine" and structured.parsed == {"a": 1}
    assert all(bearer(r) == secret for r in fake.requests)
    assert_no_canary(secret, home=hermes_home, caplog=debug_logs, objects=[llm, result, structured])


def test_plugin_context_exposes_no_key(hermes_home, fake):
    """Everything reachable from a real plugin's ctx (ctx.llm included) after a call."""
    from plugin_llm.plugins.manager import PluginManager

    secret = canary()
    write_auth(hermes_home, {"providers": {"custom": {"api_key": secret}}})
    plugin = hermes_home / "plugins" / "canary"
    plugin.mkdir(parents=True)
    (plugin / "plugin.yaml").write_text("name: canary\nversion: 0.1.0\n")
    (plugin / "__init__.py").write_text(textwrap.dedent("""
        CTX = []
        def register(ctx):
            CTX.append(ctx)
            ctx.llm.complete([{"role": "user", "content": "from register"}])
    """))
    write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
                              "plugins:\n  enabled: [canary]\n")
    manager = PluginManager(home=hermes_home)
    manager.discover_plugins()
    assert bearer(fake.requests[0]) == secret
    module = next(m for name, m in sys.modules.items() if name.endswith("canary") and hasattr(m, "CTX"))
    ctx = module.CTX[0]
    assert_no_canary(secret, home=hermes_home, objects=[ctx, ctx.llm, manager.list_plugins()])


# --------------------------------------------------------------------------- profiles through the trust gate


@pytest.fixture
def profiles(hermes_home, fake):
    default_key, work_key = canary(), canary()
    write_auth(hermes_home, {"providers": {"custom": {"api_key": default_key}},
                             "profiles": {"work": {"custom": {"api_key": work_key}}}})
    write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
                              "plugins:\n  entries:\n    trusted:\n      llm:\n        allow_profile_override: true\n")
    return default_key, work_key


def test_untrusted_plugin_cannot_pick_a_profile(hermes_home, fake, profiles):
    with pytest.raises(PluginLlmTrustError) as info:
        PluginLlm("untrusted").complete(USER, profile="work")
    assert "allow_profile_override" in str(info.value)
    assert fake.requests == []
    assert audit_lines(hermes_home)[-1]["status"] == "denied"


def test_trusted_plugin_gets_the_profile_key(hermes_home, fake, profiles):
    default_key, work_key = profiles
    fake.push(Reply(), Reply())
    result = PluginLlm("trusted").complete(USER, profile="work")
    PluginLlm("trusted").complete(USER)
    assert [bearer(r) for r in fake.requests] == [work_key, default_key]
    assert result.audit["profile"] == "work"
    records = audit_lines(hermes_home)
    assert [r["profile"] for r in records] == ["work", None]
    assert_no_canary(work_key, home=hermes_home, objects=[result])
    assert_no_canary(default_key, home=hermes_home)


def test_unknown_profile_is_an_audited_error_never_the_default_key(hermes_home, fake, profiles):
    with pytest.raises(PluginLlmConfigError) as info:
        PluginLlm("trusted").complete(USER, profile="wrok")
    assert "'wrok'" in str(info.value) and "work" in str(info.value)
    assert fake.requests == []
    record = audit_lines(hermes_home)[-1]
    assert record["profile"] == "wrok" and record["status"] not in ("ok", "denied")
    assert_no_canary(profiles[0], home=hermes_home, exc=info.value)


# --------------------------------------------------------------------------- pools over HTTP


def pool_route(hermes_home: Path, fake: FakeServer, keys: list[str], **llm) -> None:
    write_auth(hermes_home, {"providers": {"custom": {"keys": keys}}})
    settings = {"max_retries": 3, "timeout": 10, **llm}
    write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
                              "llm:\n" + "".join(f"  {k}: {v}\n" for k, v in settings.items()))


def test_429_rotates_to_the_next_key_within_the_call(hermes_home, fake):
    keys = [canary(), canary(), canary()]
    pool_route(hermes_home, fake, keys)
    fake.push(echo(429, {"Retry-After": "120"}), Reply(content="second key worked"))
    result = PluginLlm("p").complete(USER)
    assert result.text == "second key worked"
    assert [bearer(r) for r in fake.requests] == keys[:2]
    # keys[0] cools for the Retry-After: the next calls use keys[1] and keys[2] only
    fake.push(Reply(), Reply(), Reply())
    for _ in range(3):
        PluginLlm("other-plugin").complete(USER)  # another PluginLlm: the pool state is shared
    assert [bearer(r) for r in fake.requests[2:]] == [keys[2], keys[1], keys[2]]
    health = {k["key_id"]: k["health"] for k in get_store(hermes_home).describe()[0]["keys"]}
    assert health["custom#0"].startswith("cooling") and health["custom#1"] == "healthy"
    for key in keys:
        assert_no_canary(key, home=hermes_home, objects=[result])


def test_all_keys_cooling_is_reported_as_such(hermes_home, fake):
    keys = [canary(), canary()]
    pool_route(hermes_home, fake, keys, timeout=3)
    fake.push(echo(429, {"Retry-After": "600"}), echo(429, {"Retry-After": "600"}))
    with pytest.raises(PluginLlmProviderError) as info:
        PluginLlm("p").complete(USER)
    assert len(fake.requests) == 2
    assert "all 2 keys" in str(info.value) and "cooling down" in str(info.value)
    assert_no_canary(keys[0], home=hermes_home, exc=info.value)
    assert_no_canary(keys[1], home=hermes_home, exc=info.value)


def _bad_key_server(bad: str) -> FakeServer:
    """Answers 429 (Retry-After: 1000) to requests with ``bad``, 200 to every other key."""

    def body(_json, headers, _path):
        if header(headers, "Authorization") == f"Bearer {bad}":
            return 429, {"error": {"message": "rate limited", "type": "rate_limit_error"}}, {"Retry-After": "1000"}
        return 200, {"id": "x", "object": "chat.completion", "created": 1, "model": "gpt-4o",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    return FakeServer(default=Reply(body=body))


class _Watch:
    """Wraps the shared store's acquire/report_failure to check the pool invariant under load.

    A key whose 429 was reported (report_failure returned) before an acquire()
    started must never be handed out by that acquire().
    """

    def __init__(self, store) -> None:
        self.cooled: set[str] = set()
        self.violations: list[str] = []
        self.lock = threading.Lock()
        acquire, report = store.acquire, store.report_failure

        def watched_acquire(provider, profile=None):
            with self.lock:
                before = set(self.cooled)
            cred = acquire(provider, profile)
            if cred.key_id in before:
                self.violations.append(cred.key_id)
            return cred

        def watched_report(cred, status, retry_after=None):
            report(cred, status, retry_after)
            if status == 429:
                with self.lock:
                    self.cooled.add(cred.key_id)

        store.acquire, store.report_failure = watched_acquire, watched_report


def test_concurrent_threads_never_use_a_cooling_key(hermes_home):
    keys = [canary() for _ in range(4)]
    with _bad_key_server(keys[1]) as server:
        pool_route(hermes_home, server, keys)
        watch = _Watch(get_store(hermes_home))
        errors: list[BaseException] = []

        def worker() -> None:
            llm = PluginLlm("pool-user")
            for _ in range(5):
                try:
                    llm.complete(USER)
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and not watch.violations
        assert watch.cooled == {"custom#1"}
        sent = [bearer(r) for r in server.requests]
        assert len(sent) - sent.count(keys[1]) == 40  # every call succeeded on a healthy key


@pytest.mark.slow
def test_concurrent_asyncio_tasks_never_use_a_cooling_key(hermes_home):
    keys = [canary() for _ in range(4)]
    with _bad_key_server(keys[2]) as server:
        pool_route(hermes_home, server, keys)
        watch = _Watch(get_store(hermes_home))
        llm = PluginLlm("pool-user")

        async def main():
            return await asyncio.gather(*(llm.acomplete(USER) for _ in range(50)), return_exceptions=True)

        results = asyncio.run(main())
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert not watch.violations and watch.cooled == {"custom#2"}
