"""Circuit breakers of model routes: the policy's parsing, the state machine on both limit stores
(SQLite and a real Redis), sharing across processes, and the facade's cache and fail-open rule."""

from __future__ import annotations

import calendar
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from plugin_llm.config.breakers import DISABLED, BreakerPolicy, parse_breaker_policy
from plugin_llm.limits import StoreError
from plugin_llm.limits.local import LocalStore
from plugin_llm.limits.redis_store import RedisStore
from plugin_llm.limits.store import BreakerState
from tests.redis_server import redis_server  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[1]
T0 = float(calendar.timegm((2026, 3, 31, 12, 0, 0)))
ROUTE = "fast-model"
POLICY = BreakerPolicy(failures=3, window=60.0, cooldown=30.0)
PROBE = 10.0  # seconds a probe's lease lasts


# ----------------------------------------------------------------- the policy
def parse(raw, where="llm.breaker"):
    warnings: list[str] = []
    return parse_breaker_policy(raw, where, warnings), warnings


def test_no_breaker_setting_is_the_default_policy_and_false_turns_it_off():
    assert parse(None) == (BreakerPolicy(5, 60.0, 30.0), [])
    assert parse(True) == (BreakerPolicy(), [])
    assert parse(False) == (DISABLED, []) and DISABLED.failures == 0 and not DISABLED.enabled
    assert parse({"enabled": False}) == (DISABLED, [])
    assert parse({"enabled": "false"}) == (DISABLED, [])
    assert parse({"failures": 3, "window": 10, "cooldown": 2.5}) == (BreakerPolicy(3, 10.0, 2.5), [])
    assert parse({"failures": 1000, "window": 86400, "cooldown": 1}) == (BreakerPolicy(1000, 86400.0, 1.0), [])


def test_an_unknown_key_is_a_warning_with_a_did_you_mean_and_the_rest_applies():
    policy, warnings = parse({"failure": 3, "cooldown": 5, "zzz": 1}, "models.fast.breaker")
    assert policy == BreakerPolicy(cooldown=5.0)
    assert warnings[0] == "models.fast.breaker.failure: unknown key, ignored (did you mean 'failures'?)"
    assert warnings[1].startswith("models.fast.breaker.zzz: unknown key, ignored (known: enabled, failures")
    assert len(warnings) == 2


@pytest.mark.parametrize("key, value, default", [
    ("failures", 0, 5), ("failures", 1001, 5), ("failures", 2.5, 5), ("failures", True, 5), ("failures", "5", 5),
    ("window", 0.5, 60.0), ("window", 86401, 60.0), ("window", float("nan"), 60.0), ("window", "60s", 60.0),
    ("cooldown", -1, 30.0), ("cooldown", float("inf"), 30.0), ("cooldown", False, 30.0), ("cooldown", [1], 30.0),
])
def test_a_bad_value_is_a_warning_naming_its_key_and_keeps_the_default(key, value, default):
    policy, warnings = parse({key: value})
    assert getattr(policy, key) == default and policy.enabled
    assert len(warnings) == 1 and warnings[0].startswith(f"llm.breaker.{key}: expected ")
    assert f"using {default:g}" in warnings[0]


def test_failures_zero_says_how_to_turn_the_breaker_off():
    _, warnings = parse({"failures": 0}, "models.fast.breaker")
    assert "write models.fast.breaker: false" in warnings[0]


def test_a_value_that_is_not_a_mapping_or_a_bool_keeps_the_breaker_on():
    for raw in ("off", 5, ["failures"]):
        policy, warnings = parse(raw)
        assert policy == BreakerPolicy()
        assert len(warnings) == 1 and warnings[0].startswith("llm.breaker: expected a mapping")
    policy, warnings = parse({"enabled": "maybe"})
    assert policy == BreakerPolicy() and warnings == ["llm.breaker.enabled: expected true or false, got 'maybe'; "
                                                      "the breaker stays on"]


def test_a_huge_hostile_key_or_value_is_shown_bounded():
    _, warnings = parse({"x" * 10_000: 1, "window": "y" * 10_000})
    assert all(len(w) < 300 for w in warnings) and len(warnings) == 2


# ----------------------------------------------------------------- both stores
def open_store(kind: str, where: str, prefix: str = ""):
    return LocalStore(where) if kind == "local" else RedisStore(where, prefix=prefix)


@pytest.fixture(params=["local", pytest.param("redis", marks=pytest.mark.slow)])
def store_spec(request, tmp_path):
    """(kind, where, prefix): what a child process needs to open the same store."""
    if request.param == "local":
        return "local", str(tmp_path / "limits.sqlite3"), ""
    return "redis", request.getfixturevalue("redis_server").url, f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(store_spec):
    s = open_store(*store_spec)
    yield s
    s.close()


def acquire(store, now, route=ROUTE, policy=POLICY, probe_for=PROBE):
    return store.breaker_acquire(route, policy, now, timeout=5.0, probe_for=probe_for)


def fail(store, now, route=ROUTE, policy=POLICY):
    return store.breaker_report(route, False, policy, now, timeout=5.0)


def succeed(store, now, route=ROUTE, policy=POLICY):
    return store.breaker_report(route, True, policy, now, timeout=5.0)


def test_consecutive_failures_within_the_window_open_the_breaker(store):
    assert acquire(store, T0) == "closed"
    assert [fail(store, T0 + i) for i in range(3)] == ["closed", "closed", "open"]
    assert acquire(store, T0 + 3) == "open"
    assert store.breaker_states(T0 + 3, timeout=5) == {
        ROUTE: BreakerState(ROUTE, "open", 3, opened_at=T0 + 2, retry_at=T0 + 2 + 30)}
    assert acquire(store, T0 + 3, route="other-model") == "closed"  # routes are separate


def test_a_streak_older_than_the_window_starts_again(store):
    assert fail(store, T0) == "closed"
    assert fail(store, T0 + 30) == "closed"
    assert fail(store, T0 + 61) == "closed"  # the streak began at T0, more than 60 s ago: this is its 1st
    assert store.breaker_states(T0 + 61, timeout=5)[ROUTE].failures == 1
    assert fail(store, T0 + 62) == "closed"
    assert fail(store, T0 + 63) == "open"  # three within 60 s of T0 + 61


def test_a_success_resets_the_streak(store):
    fail(store, T0)
    fail(store, T0 + 1)
    assert succeed(store, T0 + 2) == "closed"
    assert store.breaker_states(T0 + 2, timeout=5) == {}
    assert [fail(store, T0 + 3 + i) for i in range(3)] == ["closed", "closed", "open"]


def open_it(store, at=T0):
    for _ in range(POLICY.failures):
        state = fail(store, at)
    assert state == "open"


def test_an_open_breaker_refuses_until_its_cooldown_then_lets_exactly_one_probe_through(store):
    open_it(store)
    assert acquire(store, T0 + 29.9) == "open"
    assert acquire(store, T0 + 30) == "probe"
    assert [acquire(store, T0 + 30 + i) for i in range(3)] == ["open"] * 3  # the probe is out
    state = store.breaker_states(T0 + 31, timeout=5)[ROUTE]
    assert (state.state, state.retry_at) == ("half_open", T0 + 30 + PROBE)


def test_concurrent_acquirers_get_one_probe_between_them(store_spec):
    kind, where, prefix = store_spec
    stores = [open_store(kind, where, prefix) for _ in range(8)]  # (each its own connection)
    try:
        open_it(stores[0])
        barrier = threading.Barrier(len(stores))
        answers: list[str] = []

        def race(s):
            barrier.wait()
            answers.append(acquire(s, T0 + 40))

        threads = [threading.Thread(target=race, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(answers) == ["open"] * 7 + ["probe"]
    finally:
        for s in stores:
            s.close()


def test_a_probe_that_succeeds_closes_the_breaker(store):
    open_it(store)
    assert acquire(store, T0 + 30) == "probe"
    assert succeed(store, T0 + 31) == "closed"
    assert acquire(store, T0 + 31) == "closed"
    assert store.breaker_states(T0 + 31, timeout=5) == {}
    assert fail(store, T0 + 32) == "closed"  # a new streak, from 1


def test_a_probe_that_fails_opens_the_breaker_again_from_then(store):
    open_it(store)
    assert acquire(store, T0 + 30) == "probe"
    assert fail(store, T0 + 35) == "open"
    assert store.breaker_states(T0 + 35, timeout=5)[ROUTE] == BreakerState(ROUTE, "open", 4, T0 + 35, T0 + 65)
    assert acquire(store, T0 + 64) == "open"
    assert acquire(store, T0 + 65) == "probe"


def test_a_probe_whose_lease_ends_without_a_report_goes_to_the_next_caller(store):
    open_it(store)
    assert acquire(store, T0 + 30) == "probe"  # ... and its caller dies
    assert acquire(store, T0 + 30 + PROBE - 0.1) == "open"
    assert acquire(store, T0 + 30 + PROBE) == "probe"
    assert acquire(store, T0 + 30 + PROBE + 1) == "open"
    store.breaker_reset(ROUTE, timeout=5)
    open_it(store)
    assert acquire(store, T0 + 30, probe_for=1e12) == "probe"  # a lease lasts a day at most
    assert store.breaker_states(T0 + 30, timeout=5)[ROUTE].retry_at == T0 + 30 + 86400


def test_failures_of_calls_still_in_flight_keep_an_open_breaker_as_it_is(store):
    open_it(store)
    assert fail(store, T0 + 10) == "open"
    state = store.breaker_states(T0 + 10, timeout=5)[ROUTE]
    assert (state.failures, state.opened_at, state.retry_at) == (4, T0, T0 + 30)  # the cooldown is not pushed back


def test_a_policy_with_no_failures_is_always_closed_and_touches_no_store(tmp_path):
    path = tmp_path / "limits.sqlite3"
    store = LocalStore(path)
    for _ in range(5):
        assert fail(store, T0, policy=DISABLED) == "closed"
    assert acquire(store, T0, policy=DISABLED) == "closed"
    assert not path.exists()
    assert succeed(store, T0) == "closed" and acquire(store, T0) == "closed"
    assert store.breaker_states(T0, timeout=5) == {} and not path.exists()  # reads and successes create nothing
    fail(store, T0)
    assert path.exists()


def test_reset_closes_one_route_or_every_route(store):
    open_it(store)
    open_it(store, T0)
    for route in ("b", "c"):
        for _ in range(3):
            fail(store, T0, route=route)
    store.breaker_reset(ROUTE, timeout=5)
    assert acquire(store, T0 + 1) == "closed"
    assert sorted(store.breaker_states(T0 + 1, timeout=5)) == ["b", "c"]
    store.breaker_reset(None, timeout=5)
    assert store.breaker_states(T0 + 1, timeout=5) == {}
    assert acquire(store, T0 + 1, route="b") == "closed"


def test_the_routes_kept_are_bounded_and_closed_ones_go_first(store, monkeypatch):
    import plugin_llm.limits.local as local
    import plugin_llm.limits.redis_store as redis_store

    monkeypatch.setattr(local, "MAX_BREAKER_ROUTES", 3)
    monkeypatch.setattr(redis_store, "MAX_BREAKER_ROUTES", 3)
    open_it(store)  # open, the oldest
    fail(store, T0 + 1, route="b")  # closed
    fail(store, T0 + 2, route="c")  # closed
    fail(store, T0 + 3, route="d")  # a 4th route: the oldest closed one (b) goes
    assert sorted(store.breaker_states(T0 + 3, timeout=5)) == ["c", "d", ROUTE]
    for route in ("c", "d"):
        for _ in range(2):
            fail(store, T0 + 4, route=route)
    fail(store, T0 + 5, route="e")  # all open: the oldest goes
    assert sorted(store.breaker_states(T0 + 5, timeout=5)) == ["c", "d", "e"]


@pytest.mark.parametrize("route", ["", "x" * 129, "line\nbreak", 5, None])
def test_a_route_that_is_not_a_short_printable_name_is_refused(store, route):
    with pytest.raises(ValueError, match="printable name of 1 to 128"):
        acquire(store, T0, route=route)
    with pytest.raises(ValueError):
        fail(store, T0, route=route)


def test_a_long_odd_route_name_is_kept_as_it_is(store):
    route = "openai/gpt-4o {eu} : ünïcode " + "x" * 99
    assert len(route) == 128
    open_it_route = [fail(store, T0, route=route) for _ in range(3)]
    assert open_it_route[-1] == "open" and list(store.breaker_states(T0, timeout=5)) == [route]


def corrupt(store_spec, store, value_local, value_redis):
    kind, where, _ = store_spec
    fail(store, T0)
    if kind == "local":
        with sqlite3.connect(where) as db:
            db.execute(f"UPDATE breakers SET {value_local}")
    else:
        import redis

        redis.Redis.from_url(where).hset(store._breakers_key(), ROUTE, value_redis)


@pytest.mark.parametrize("local, remote", [
    ("state = 'wide-open'", "wide-open 3 1 1 1 1"),
    ("state = 'open', retry_at = NULL", "open 3 1 1 - 1"),
    ("failures = -2", "closed -2 1 - - 1"),
], ids=["state", "retry_at", "failures"])
def test_an_edited_row_counts_as_closed_and_the_next_failure_starts_over(store_spec, store, local, remote):
    corrupt(store_spec, store, local, remote)
    assert acquire(store, T0 + 1) == "closed"
    assert store.breaker_states(T0 + 1, timeout=5) == {}
    assert fail(store, T0 + 2) == "closed"
    assert store.breaker_states(T0 + 2, timeout=5)[ROUTE].failures == 1


_CHILD = """
import sys
from plugin_llm.config.breakers import BreakerPolicy
from plugin_llm.limits.local import LocalStore
from plugin_llm.limits.redis_store import RedisStore
kind, where, prefix, now = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
store = LocalStore(where) if kind == "local" else RedisStore(where, prefix=prefix)
policy = BreakerPolicy(failures=3, window=60, cooldown=30)
print([store.breaker_report("fast-model", False, policy, now + i, timeout=5) for i in range(3)], flush=True)
"""


@pytest.mark.slow
def test_another_process_opens_the_breaker_this_one_sees(store_spec, store):
    kind, where, prefix = store_spec
    assert acquire(store, T0) == "closed"
    child = subprocess.run([sys.executable, "-c", _CHILD, kind, where, prefix, repr(T0)], capture_output=True,
                           text=True, cwd=REPO, timeout=60)
    assert child.stdout.strip() == "['closed', 'closed', 'open']", child.stderr
    assert acquire(store, T0 + 3) == "open"
    assert acquire(store, T0 + 32) == "probe"


def test_a_version_4_database_gets_the_breakers_and_keeps_its_counts(tmp_path):
    path = tmp_path / "limits.sqlite3"
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript("""
        CREATE TABLE spend (plugin TEXT NOT NULL, bucket TEXT NOT NULL, nano INTEGER NOT NULL DEFAULT 0,
            requests INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (plugin, bucket)) WITHOUT ROWID;
        INSERT INTO spend VALUES ('my-plugin', 'day:2026-03-31', 700000000, 0, 0);
        CREATE TABLE reservations (plugin TEXT NOT NULL, id TEXT NOT NULL, expires REAL NOT NULL,
            nano INTEGER NOT NULL, tokens INTEGER NOT NULL, minute TEXT NOT NULL, day TEXT NOT NULL,
            month TEXT NOT NULL, slots INTEGER NOT NULL DEFAULT 1, requests INTEGER NOT NULL DEFAULT 1,
            PRIMARY KEY (plugin, id)) WITHOUT ROWID;
        PRAGMA user_version = 4;
    """)
    old.close()
    store = LocalStore(path)
    open_it(store)
    assert acquire(store, T0 + 1) == "open"
    assert store.counters("my-plugin", T0, timeout=5).day_spent == 700_000_000
    store.close()


# ----------------------------------------------------------------- the facade
@pytest.fixture
def facade(tmp_path):
    """The facade on a fresh local store in a home with no limits configured."""
    from plugin_llm import limits
    from plugin_llm.limits import breakers

    limits.close_stores()
    breakers._forget_views()
    breakers._failing = False
    yield breakers, limits.LimitSettings(), tmp_path
    limits.close_stores()
    breakers._forget_views()
    breakers._failing = False


def count_calls(monkeypatch, store, name):
    calls = []
    real = getattr(store, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, name, spy)
    return calls


def test_the_facade_uses_the_default_local_store_when_no_limits_are_configured(facade):
    breakers, settings, home = facade
    for i in range(3):
        assert breakers.acquire(settings, home, ROUTE, POLICY, T0 + i, PROBE) == "closed"
        breakers.report(settings, home, ROUTE, False, POLICY, T0 + i)
    assert breakers.acquire(settings, home, ROUTE, POLICY, T0 + 3, PROBE) == "open"
    assert (home / "limits.sqlite3").exists()
    assert breakers.states(settings, home, T0 + 3)[ROUTE].as_dict() == {
        "route": ROUTE, "state": "open", "failures": 3, "opened_at": "2026-03-31T12:00:02.000Z",
        "retry_at": "2026-03-31T12:00:32.000Z", "retry_at_unix": T0 + 32}
    assert LocalStore(home / "limits.sqlite3").breaker_acquire(ROUTE, POLICY, T0 + 3, timeout=5, probe_for=1) == "open"
    assert breakers.acquire(settings, home, ROUTE, POLICY, T0 + 33, PROBE) == "probe"
    breakers.report(settings, home, ROUTE, True, POLICY, T0 + 34)
    assert breakers.acquire(settings, home, ROUTE, POLICY, T0 + 34, PROBE) == "closed"
    assert breakers.states(settings, home, T0 + 34) == {}


def test_a_closed_route_is_answered_from_memory_for_a_quarter_second(facade, monkeypatch):
    from plugin_llm import limits

    breakers, settings, home = facade
    store = limits.store_for(settings, home)
    asked = count_calls(monkeypatch, store, "breaker_acquire")
    answers = [breakers.acquire(settings, home, ROUTE, POLICY, T0 + i * 0.01, PROBE) for i in range(20)]
    assert answers == ["closed"] * 20 and len(asked) == 1
    # another process opens it: this one may say closed from memory until its view is 0.25 s old, not longer
    other = LocalStore(home / "limits.sqlite3")
    for _ in range(3):
        fail(other, T0 + 0.1)
    assert breakers.acquire(settings, home, ROUTE, POLICY, T0 + 0.2, PROBE) == "closed"
    assert breakers.acquire(settings, home, ROUTE, POLICY, T0 + 0.25, PROBE) == "open"
    assert len(asked) == 2
    assert [breakers.acquire(settings, home, ROUTE, POLICY, T0 + 0.26, PROBE) for _ in range(2)] == ["open"] * 2
    assert len(asked) == 4  # an open route is asked every time
    other.close()


def test_the_cache_never_hides_a_breaker_this_process_opened(facade):
    breakers, settings, home = facade
    one = BreakerPolicy(failures=1, window=60, cooldown=30)
    assert breakers.acquire(settings, home, ROUTE, one, T0, PROBE) == "closed"
    breakers.report(settings, home, ROUTE, False, one, T0 + 0.01)
    assert breakers.acquire(settings, home, ROUTE, one, T0 + 0.02, PROBE) == "open"


def test_failures_always_reach_the_store_and_repeated_successes_do_not(facade, monkeypatch):
    from plugin_llm import limits

    breakers, settings, home = facade
    told = count_calls(monkeypatch, limits.store_for(settings, home), "breaker_report")
    breakers.report(settings, home, ROUTE, False, POLICY, T0)
    breakers.report(settings, home, ROUTE, False, POLICY, T0 + 0.01)
    assert len(told) == 2
    for i in range(10):
        breakers.report(settings, home, ROUTE, True, POLICY, T0 + 0.02 + i * 0.01)
    assert len(told) == 3  # the first success reset the streak in the store; the next ones changed nothing
    assert breakers.states(settings, home, T0 + 1) == {}
    breakers.report(settings, home, ROUTE, True, POLICY, T0 + 0.5)  # a stale view: told again
    assert len(told) == 4


def test_a_disabled_policy_never_touches_the_store(facade, monkeypatch):
    from plugin_llm.limits import breakers as module

    breakers, settings, home = facade

    def no_store(*args):
        raise AssertionError("the store was opened")

    monkeypatch.setattr(module, "store_for", no_store)
    for _ in range(10):
        breakers.report(settings, home, ROUTE, False, DISABLED, T0)
        assert breakers.acquire(settings, home, ROUTE, DISABLED, T0, PROBE) == "closed"
    assert not (home / "limits.sqlite3").exists()


def test_a_store_that_fails_opens_the_breakers_with_one_warning(facade, caplog):
    from plugin_llm import limits
    from tests.redis_server import _free_port

    breakers, _, home = facade
    settings = limits.LimitSettings(store="redis", redis_url=f"redis://:hunter2secret@127.0.0.1:{_free_port()}/0",
                                    store_timeout=1.0)
    with caplog.at_level("WARNING", logger="plugin_llm.limits"):
        for i in range(3):
            breakers.report(settings, home, ROUTE, False, POLICY, T0 + i)
            assert breakers.acquire(settings, home, ROUTE, POLICY, T0 + i, PROBE) == "closed"
    warnings = [r for r in caplog.records if "circuit breakers are off" in r.getMessage()]
    assert len(warnings) == 1 and "Redis limits store" in warnings[0].getMessage()
    assert "hunter2secret" not in caplog.text


def test_a_store_defect_fails_open_too_and_recovery_is_logged(facade, caplog, monkeypatch):
    from plugin_llm import limits

    breakers, settings, home = facade
    store = limits.store_for(settings, home)

    def broken(*args, **kwargs):
        raise KeyError("bug")

    monkeypatch.setattr(store, "breaker_acquire", broken)
    with caplog.at_level("WARNING", logger="plugin_llm.limits"):
        assert breakers.acquire(settings, home, ROUTE, POLICY, T0, PROBE) == "closed"
        assert "failed unexpectedly (KeyError)" in caplog.text
        monkeypatch.undo()
        assert breakers.acquire(settings, home, ROUTE, POLICY, T0 + 1, PROBE) == "closed"
    assert "answers again" in caplog.text


def test_an_operator_reset_closes_the_route_for_this_process_at_once(facade):
    breakers, settings, home = facade
    for i in range(3):
        breakers.report(settings, home, ROUTE, False, POLICY, T0)
    breakers.report(settings, home, "b", False, POLICY, T0)
    assert breakers.acquire(settings, home, ROUTE, POLICY, T0, PROBE) == "open"
    breakers.reset(settings, home, ROUTE)
    assert breakers.acquire(settings, home, ROUTE, POLICY, T0, PROBE) == "closed"
    assert list(breakers.states(settings, home, T0)) == ["b"]
    breakers.reset(settings, home, None)
    assert breakers.states(settings, home, T0) == {}


def test_a_read_of_a_failing_store_raises_for_the_operator(facade):
    from plugin_llm import limits
    from tests.redis_server import _free_port

    breakers, _, home = facade
    settings = limits.LimitSettings(store="redis", redis_url=f"redis://127.0.0.1:{_free_port()}/0", store_timeout=1.0)
    with pytest.raises(StoreError):
        breakers.states(settings, home, T0)
    with pytest.raises(StoreError):
        breakers.reset(settings, home, None)
