"""Per-plugin service tokens: create/list/revoke/expiry, only digests stored, the CLI."""

from __future__ import annotations

import json
import re
import shutil
import stat

import pytest

from plugin_llm.cli.main import main
from plugin_llm.service.tokens import CACHE_SECONDS, TokenError, TokenStore, digest, parse_duration, \
    token_key_path, tokens_path
from tests.conftest import write_config

_ISO_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_create_prints_a_plg_token_of_32_random_bytes_and_stores_only_its_digest(hermes_home):
    store = TokenStore(hermes_home)
    info, token = store.create("my-plugin")
    store.close()
    assert token.startswith("plg_") and len(token) >= 4 + 43  # 32 bytes, urlsafe base64 without padding
    path = tokens_path(hermes_home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = b"".join(p.read_bytes() for p in path.parent.iterdir())  # the database and its WAL
    assert token.encode() not in raw and token[4:].encode() not in raw
    assert digest(token).encode() in raw
    assert info.id.startswith("tok_") and info.plugin == "my-plugin" and info.expires is None
    other = TokenStore(hermes_home).create("my-plugin")[1]
    assert other != token


def test_verify_active_unknown_expired_and_revoked(hermes_home):
    now = [1_000_000.0]
    store = TokenStore(hermes_home, clock=lambda: now[0])
    live, live_token = store.create("a")
    short, short_token = store.create("b", expires_in=60)
    gone, gone_token = store.create("c")
    assert store.verify(live_token) == (live, "ok")
    assert store.verify(short_token)[1] == "ok"
    store.revoke(gone.id)
    assert store.verify(gone_token)[1] == "revoked"
    now[0] += 61
    assert store.verify(short_token)[1] == "expired"  # even while the positive answer is still cached
    assert store.verify("plg_" + "A" * 43) == (None, "unknown")
    assert store.verify("not-a-token") == (None, "unknown")
    assert store.verify("plg_" + "A" * 5000) == (None, "unknown")
    statuses = {row.id: row.status(now[0]) for row in store.list()}
    assert statuses == {live.id: "active", short.id: "expired", gone.id: "revoked"}


def test_revocation_reaches_another_store_on_the_same_file_within_the_cache_time(hermes_home):
    mono = [0.0]
    server = TokenStore(hermes_home, monotonic=lambda: mono[0])  # a worker that has seen the token
    operator = TokenStore(hermes_home)
    info, token = operator.create("p")
    assert server.verify(token)[1] == "ok"
    operator.revoke(info.id)
    mono[0] += CACHE_SECONDS  # the cached answer has expired: the file is read again
    assert server.verify(token)[1] == "revoked"
    assert CACHE_SECONDS <= 1.0


@pytest.mark.parametrize("text, seconds", [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("3600s", 3600),
                                           ("2w", 14 * 86400), ("7", 7 * 86400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0d", "-1d", "soon", "1y", "1.5d"])
def test_bad_durations_say_what_is_accepted(text):
    with pytest.raises(TokenError, match="30d, 12h, 90m or 2w"):
        parse_duration(text)


def test_bad_plugin_keys_and_ids_are_refused(hermes_home):
    store = TokenStore(hermes_home)
    for bad in ("", "  ", "two words", "x\x1b[31m"):
        with pytest.raises(TokenError, match="plugin key"):
            store.create(bad)
    with pytest.raises(TokenError, match="tok_0123456789ab"):
        store.revoke("nonsense")
    with pytest.raises(TokenError, match="no token tok_0123456789ab"):
        store.revoke("tok_0123456789ab")


def test_cli_create_list_revoke(hermes_home, capsys):
    write_config(hermes_home, "plugins:\n  enabled: [my-plugin, other]\n")  # tokens are for plugins it knows
    assert main(["tokens", "create", "my-plugin", "--expires", "30d", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    token = created["token"]
    assert token.startswith("plg_") and created["plugin"] == "my-plugin" and created["status"] == "active"
    assert created["expires_unix"] - created["created_unix"] == pytest.approx(30 * 86400)  # 30 days after its creation
    assert _ISO_Z.fullmatch(created["created"]) and _ISO_Z.fullmatch(created["expires"]) and created["revoked"] is None
    assert main(["tokens", "create", "other"]) == 0
    out = capsys.readouterr()
    plain_token = out.out.strip()
    assert plain_token.startswith("plg_") and "shown once" in out.err
    assert main(["tokens", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["plugin"] for row in listed] == ["my-plugin", "other"]
    assert main(["tokens", "list"]) == 0
    table = capsys.readouterr().out
    assert created["id"] in table and token not in table and plain_token not in table
    assert main(["tokens", "revoke", created["id"]]) == 0
    assert "revoked" in capsys.readouterr().out
    assert TokenStore(hermes_home).verify(token)[1] == "revoked"
    log = (hermes_home / "logs" / "agent.log").read_text()
    events = [json.loads(line) for line in log.splitlines()]
    assert [e["event"] for e in events if e["event"].startswith("service.")] == [
        "service.token_created", "service.token_created", "service.token_revoked"]
    assert token not in log and plain_token not in log


def test_cli_mistakes_are_one_line_errors(hermes_home, capsys):
    assert main(["tokens", "create", "p", "--expires", "forever"]) == 2
    assert main(["tokens", "revoke", "tok_0123456789ab"]) == 2
    err = capsys.readouterr().err
    assert "30d" in err and "no token tok_0123456789ab" in err and "Traceback" not in err
    assert main(["tokens", "list"]) == 0 and "No tokens" in capsys.readouterr().out


def test_a_replaced_token_file_is_reopened(hermes_home, tmp_path):
    """Replicas on other machines get the file by copy: a running service reads the new copy."""
    import sqlite3

    mono = [0.0]
    server = TokenStore(hermes_home, monotonic=lambda: mono[0])
    info, token = server.create("p")
    assert server.verify(token)[1] == "ok"
    primary = tmp_path / "primary"  # the operator's machine (with the same token key): revoked there, copied here
    tokens_path(primary).parent.mkdir(parents=True)
    shutil.copy2(token_key_path(hermes_home), token_key_path(primary))
    shutil.copy2(tokens_path(hermes_home), tokens_path(primary))
    elsewhere = TokenStore(primary)
    elsewhere.revoke(info.id)
    elsewhere.close()
    copy = tmp_path / "copy.db"
    source = sqlite3.connect(tokens_path(primary))
    target = sqlite3.connect(copy)
    source.backup(target)
    source.close()
    target.close()
    copy.replace(tokens_path(hermes_home))
    mono[0] += CACHE_SECONDS
    assert server.verify(token)[1] == "revoked"


# --------------------------------------------------------------------------- single-flight lookups
class _HeldLookups:
    """Counts a store's record lookups; each waits (on its worker thread) until ``release`` is set."""

    def __init__(self, store: TokenStore) -> None:
        import threading

        self.count = 0
        self.release = threading.Event()
        real = store._row

        def row(wanted: str):
            self.count += 1
            assert self.release.wait(30), "the test never released the lookup"
            return real(wanted)

        store._row = row


async def _until(condition, turns: int = 10_000) -> None:
    import asyncio

    for _ in range(turns):  # bounded: a broken condition fails the test instead of hanging it
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def test_concurrent_lookups_of_one_token_from_one_address_ask_the_store_once(hermes_home):
    import asyncio

    store = TokenStore(hermes_home)
    info, token = store.create("p")
    held = _HeldLookups(store)

    async def run():
        first = [asyncio.create_task(store.aauthenticate(token, "10.0.0.1", None)) for _ in range(16)]
        other = asyncio.create_task(store.aauthenticate(token, "10.0.0.2", None))  # another address: its own
        await _until(lambda: held.count == 2)
        await asyncio.sleep(0)
        assert len(store._flights) == 2
        held.release.set()
        return await asyncio.gather(*first), await other

    answers, other = asyncio.run(run())
    assert held.count == 2  # one lookup per (token, address), not one per request
    assert answers == [(info, "ok", None)] * 16 and other == (info, "ok", None)
    assert store._flights == {}
    assert store.cached(token) == info  # the answer is cached for the next requests
    store.close()


def test_a_waiter_that_is_cancelled_leaves_the_lookup_to_the_others_and_a_failure_reaches_all(hermes_home):
    import asyncio

    store = TokenStore(hermes_home)
    info, token = store.create("p")
    held = _HeldLookups(store)

    async def run():
        tasks = [asyncio.create_task(store.aauthenticate(token, "10.0.0.1", None)) for _ in range(4)]
        await _until(lambda: held.count == 1)
        tasks[0].cancel()  # its client went away: the others still get the answer
        await asyncio.sleep(0)
        held.release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    first, *rest = asyncio.run(run())
    assert isinstance(first, asyncio.CancelledError) and rest == [(info, "ok", None)] * 3

    def broken(wanted: str):
        raise TokenError("the token file is damaged")

    store._cache.clear()
    store._row = broken

    async def failing():
        return await asyncio.gather(*(store.aauthenticate(token, "10.0.0.1", None) for _ in range(3)),
                                    return_exceptions=True)

    assert [str(e) for e in asyncio.run(failing())] == ["the token file is damaged"] * 3
    store.close()


@pytest.mark.slow
def test_the_service_asks_the_store_once_for_the_concurrent_requests_of_a_token(hermes_home):
    import asyncio

    import httpx

    from plugin_llm.service.app import create_app
    from plugin_llm.types import PluginLlmCompleteResult, PluginLlmUsage

    class Stub:
        async def acomplete(self, messages, **kwargs):
            return PluginLlmCompleteResult(text="ok", provider="custom", model="m", agent_id=None,
                                           usage=PluginLlmUsage(), audit={"plugin_id": "p", "call_id": "c" * 32})

    app = create_app(hermes_home, llm_factory=lambda plugin: Stub(), warm=False)
    tokens = app.state.service.tokens
    token = tokens.create("p")[1]
    held = _HeldLookups(tokens)
    asked = []
    cached = tokens.cached
    tokens.cached = lambda presented: asked.append(1) or cached(presented)

    async def run():
        transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            calls = [asyncio.create_task(client.post("/v1/plugin-llm/complete", json={"messages": "hi"},
                                                     headers={"Authorization": f"Bearer {token}"}))
                     for _ in range(12)]
            await _until(lambda: len(asked) == 12)  # every request has missed the cache and waits on the lookup
            held.release.set()
            return await asyncio.gather(*calls)

    answers = asyncio.run(run())
    assert [a.status_code for a in answers] == [200] * 12
    assert held.count == 1
