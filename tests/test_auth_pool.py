"""Key pools: round-robin, cooldowns on 401/402/429, exhaustion, shared state under threads and asyncio."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import threading
from pathlib import Path

import pytest

from auth import CredentialStore, PoolExhaustedError, get_store
from plugin_llm.errors import PluginLlmProviderError


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def write_auth(home: Path, doc) -> None:
    tmp = home / ".auth.json.test-tmp"
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.chmod(tmp, 0o600)
    os.replace(tmp, home / "auth.json")


def make_keys(n: int) -> list[str]:
    return [f"poolkey{i}-{secrets.token_hex(12)}" for i in range(n)]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def pool_store(home: Path, clock: FakeClock, n: int = 3, provider: str = "openrouter", **kw) -> tuple[CredentialStore, list[str]]:
    keys = make_keys(n)
    write_auth(home, {"providers": {provider: {"keys": keys}}})
    return CredentialStore(home, env={}, clock=clock, **kw), keys


def ids(store: CredentialStore, n: int, provider: str = "openrouter") -> list[str]:
    return [store.acquire(provider).key_id for _ in range(n)]


def test_round_robin_over_all_keys(home, clock):
    store, keys = pool_store(home, clock)
    got = [store.acquire("openrouter") for _ in range(6)]
    assert [c.key_id for c in got] == ["openrouter#0", "openrouter#1", "openrouter#2"] * 2
    assert [c.reveal() for c in got[:3]] == keys
    assert {c.source for c in got} == {"pool"}


def test_profile_pools_have_their_own_ids_and_state(home, clock):
    keys = make_keys(2)
    write_auth(home, {"providers": {"openrouter": {"keys": make_keys(2)}},
                      "profiles": {"work": {"openrouter": {"keys": keys}}}})
    store = CredentialStore(home, env={}, clock=clock)
    work = store.acquire("openrouter", "work")
    assert work.key_id == "work:openrouter#0" and work.reveal() == keys[0] and work.profile == "work"
    store.report_failure(work, 429, retry_after=60)
    assert ids(store, 2) == ["openrouter#0", "openrouter#1"]  # the top-level pool is unaffected
    assert store.acquire("openrouter", "work").key_id == "work:openrouter#1"
    assert store.acquire("openrouter", "work").key_id == "work:openrouter#1"


def test_429_with_retry_after_cools_exactly_that_key_for_that_long(home, clock):
    store, _ = pool_store(home, clock)
    first = store.acquire("openrouter")
    second = store.acquire("openrouter")
    store.report_failure(second, 429, retry_after=10)
    assert ids(store, 4) == ["openrouter#2", "openrouter#0", "openrouter#2", "openrouter#0"]
    health = {k["key_id"]: k["health"] for k in store.describe()[0]["keys"]}
    assert health == {"openrouter#0": "healthy", "openrouter#1": "cooling 10s", "openrouter#2": "healthy"}
    assert store.describe()[0]["health"] == "2/3 healthy"
    clock.advance(9.9)
    assert "openrouter#1" not in ids(store, 4)
    clock.advance(0.1)
    assert "openrouter#1" in ids(store, 3)
    assert first.key_id == "openrouter#0"


def test_retry_after_is_capped(home, clock):
    store, _ = pool_store(home, clock, n=2, cooldown_cap=120)
    cred = store.acquire("openrouter")
    store.report_failure(cred, 429, retry_after=86400)
    clock.advance(120)
    assert sorted(set(ids(store, 4))) == ["openrouter#0", "openrouter#1"]


def test_cooldowns_grow_exponentially_and_success_resets_the_streak(home, clock):
    store, _ = pool_store(home, clock, n=2)
    key0 = store.acquire("openrouter")

    def cooling_for() -> float:
        """Seconds until key #0 is handed out again (probing with the fake clock)."""
        waited = 0.0
        while store.acquire("openrouter").key_id != "openrouter#0":
            clock.advance(0.5)
            waited += 0.5
        return waited

    store.report_failure(key0, 429)
    assert cooling_for() == 1.0
    store.report_failure(key0, 429)
    assert cooling_for() == 2.0
    store.report_failure(key0, 429)
    assert cooling_for() == 4.0
    store.report_success(key0)
    store.report_failure(key0, 429)
    assert cooling_for() == 1.0


def test_401_and_402_cool_longer_and_are_capped(home, clock):
    store, _ = pool_store(home, clock, n=2, auth_cooldown_base=30, cooldown_cap=50)
    key0 = store.acquire("openrouter")
    store.report_failure(key0, 401)
    clock.advance(29)
    assert ids(store, 2) == ["openrouter#1", "openrouter#1"]
    clock.advance(1)
    assert "openrouter#0" in ids(store, 2)
    store.report_failure(key0, 402)  # second failure: 60 s, capped at 50
    clock.advance(49)
    assert "openrouter#0" not in ids(store, 2)
    clock.advance(1)
    assert "openrouter#0" in ids(store, 2)


@pytest.mark.parametrize("status", [200, 400, 403, 404, 408, 500, 503])
def test_other_statuses_do_not_cool(home, clock, status):
    store, _ = pool_store(home, clock, n=2)
    store.report_failure(store.acquire("openrouter"), status, retry_after=60)
    assert ids(store, 2) == ["openrouter#1", "openrouter#0"]


def test_single_keys_are_never_cooled(home, clock):
    write_auth(home, {"providers": {"openai": {"api_key": "k" * 24}}})
    store = CredentialStore(home, env={"GROQ_API_KEY": "g" * 24}, clock=clock)
    for provider in ("openai", "groq"):
        cred = store.acquire(provider)
        store.report_failure(cred, 429, retry_after=60)
        assert store.acquire(provider) is cred  # nothing to rotate to: the transport's retry policy waits


def test_all_keys_cooling_is_a_retryable_error_saying_so(home, clock):
    store, keys = pool_store(home, clock)
    for i, cred in enumerate([store.acquire("openrouter") for _ in range(3)]):
        store.report_failure(cred, 429, retry_after=5 + i)
    with pytest.raises(PoolExhaustedError) as info:
        store.acquire("openrouter")
    err = info.value
    assert isinstance(err, PluginLlmProviderError) and err.retryable and err.provider == "openrouter"
    assert err.retry_after == pytest.approx(5.0) and err.keys == 3
    msg = str(err)
    assert "all 3 keys" in msg and "cooling down" in msg and "providers.openrouter.keys" in msg
    assert not any(k in msg or k in repr(err) for k in keys)
    clock.advance(5)
    assert store.acquire("openrouter").key_id == "openrouter#0"


def test_pool_health_survives_an_unrelated_edit_of_auth_json(home, clock):
    keys = make_keys(3)
    write_auth(home, {"providers": {"openrouter": {"keys": keys}}})
    store = CredentialStore(home, env={}, clock=clock)
    cred1 = [store.acquire("openrouter") for _ in range(2)][1]
    store.report_failure(cred1, 429, retry_after=100)
    # keys[0] removed, one added: the cooling key is now #0 and still cooling
    new_keys = keys[1:] + make_keys(1)
    write_auth(home, {"providers": {"openrouter": {"keys": new_keys}, "openai": {"api_key": "x" * 20}}})
    got = [store.acquire("openrouter") for _ in range(4)]
    assert keys[1] not in {c.reveal() for c in got}
    store.report_failure(cred1, 429, retry_after=100)  # a stale credential still maps to its key
    clock.advance(100)
    assert keys[1] in {store.acquire("openrouter").reveal() for _ in range(3)}


def test_report_on_a_key_removed_from_the_file_is_ignored(home, clock):
    keys = make_keys(2)
    write_auth(home, {"providers": {"openrouter": {"keys": keys}}})
    store = CredentialStore(home, env={}, clock=clock)
    gone = store.acquire("openrouter")
    write_auth(home, {"providers": {"openrouter": {"keys": make_keys(2)}}})
    store.acquire("openrouter")
    store.report_failure(gone, 429, retry_after=100)
    assert len(set(ids(store, 2))) == 2


def test_pool_state_is_shared_through_get_store(home):
    keys = make_keys(2)
    write_auth(home, {"providers": {"openrouter": {"keys": keys}}})
    a, b = get_store(home), get_store(str(home))
    first = a.acquire("openrouter")
    assert b.acquire("openrouter").key_id != first.key_id
    b.report_failure(first, 429, retry_after=300)
    assert {a.acquire("openrouter").key_id for _ in range(3)} == {"openrouter#1"}


# --------------------------------------------------------------------------- concurrency

N_KEYS = 8
NEVER_COOLED = {"openrouter#0", "openrouter#7"}  # so the pool is never exhausted


def test_threads_never_get_a_cooling_key(home, clock):
    """8 threads acquire and report concurrently; with a frozen clock a cooled key stays cooled.

    A key whose cooldown was reported (report_failure returned) before an
    acquire() began must never be returned by it.
    """
    store, _ = pool_store(home, clock, n=N_KEYS)
    cooled: set[str] = set()
    cooled_lock = threading.Lock()
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def worker(seed: int) -> None:
        barrier.wait()
        for i in range(400):
            with cooled_lock:
                before = set(cooled)
            cred = store.acquire("openrouter")
            if cred.key_id in before:
                errors.append(f"got cooling {cred.key_id}")
            if (i + seed) % 5 == 0 and cred.key_id not in NEVER_COOLED:
                store.report_failure(cred, 429, retry_after=1e6)
                with cooled_lock:
                    cooled.add(cred.key_id)
            else:
                store.report_success(cred)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cooled == {f"openrouter#{i}" for i in range(1, 7)}
    assert {store.acquire("openrouter").key_id for _ in range(10)} == NEVER_COOLED


def test_asyncio_tasks_never_get_a_cooling_key(home, clock):
    store, _ = pool_store(home, clock, n=N_KEYS)
    cooled: set[str] = set()
    errors: list[str] = []

    async def task(seed: int) -> None:
        for i in range(40):
            before = set(cooled)
            cred = await store.aacquire("openrouter")
            if cred.key_id in before:
                errors.append(f"got cooling {cred.key_id}")
            await asyncio.sleep(0)  # the "request": other tasks run in between
            if (i + seed) % 3 == 0 and cred.key_id not in NEVER_COOLED:
                store.report_failure(cred, 429, retry_after=1e6)
                cooled.add(cred.key_id)
            else:
                store.report_success(cred)

    async def main() -> None:
        await asyncio.gather(*(task(s) for s in range(50)))

    asyncio.run(main())
    assert not errors
    assert cooled == {f"openrouter#{i}" for i in range(1, 7)}


def test_threads_share_round_robin_fairly(home, clock):
    store, _ = pool_store(home, clock, n=4)
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(250):
            key_id = store.acquire("openrouter").key_id
            with lock:
                counts[key_id] = counts.get(key_id, 0) + 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == {f"openrouter#{i}": 500 for i in range(4)}
