"""Both limit stores, the same cases: atomic admission, settlement, windows, expiry, faults.

The Redis cases run against a real redis-server started on 127.0.0.1
(tests/redis_server.py); they fail when it is not installed.
"""

from __future__ import annotations

import calendar
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from plugin_llm import limits
from plugin_llm.limits import NANO, Denial, PluginLimits, PluginLlmLimitError, Reservation, StoreError, parse_limit_settings
from plugin_llm.limits.local import LocalStore
from plugin_llm.limits.redis_store import RedisStore
from tests.bounded import run_bounded
from tests.redis_server import own_redis_server, redis_server  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[1]
T0 = calendar.timegm((2026, 3, 31, 23, 59, 30))  # 30 s before a day *and* a month boundary
PLUGIN = "my-plugin"


def L(**kw) -> PluginLimits:
    for window in ("day", "month"):
        if f"budget_{window}" in kw:
            kw[f"budget_{window}_nano"] = round(kw.pop(f"budget_{window}") * NANO)
    return PluginLimits(source=f"plugins.entries.{PLUGIN}.limits", **kw)


def R(cost_usd: float = 0.0, tokens: int = 0, ttl: float = 60.0) -> Reservation:
    return Reservation(cost_nano=round(cost_usd * NANO), tokens=tokens, ttl=ttl)


def make_store(kind: str, where: str):
    if kind == "local":
        return LocalStore(where)
    return RedisStore(where, prefix=f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=["local", "redis"])
def store_spec(request, tmp_path):
    """(kind, where): the SQLite path or the Redis URL, so child processes can open the same store."""
    if request.param == "local":
        return "local", str(tmp_path / "limits.sqlite3")
    return "redis", request.getfixturevalue("redis_server").url


@pytest.fixture
def store(store_spec):
    s = make_store(*store_spec)
    yield s
    s.close()


def admit(store, limits_, r, now=T0):
    return store.admit(PLUGIN, r, limits_, now, timeout=5.0)


# ----------------------------------------------------------------- semantics
def test_budget_reserves_worst_case_and_denial_names_plugin_limit_key_and_reset(store):
    day = L(budget_day=1.0)
    held = [admit(store, day, R(0.3)) for _ in range(3)]
    assert all(isinstance(a, limits.Admission) for a in held)
    denial = admit(store, day, R(0.3))
    assert isinstance(denial, Denial)
    assert (denial.plugin_id, denial.limit, denial.config_key) == (PLUGIN, "budget_usd.day", "plugins.entries.my-plugin.limits.budget_usd.day")
    assert denial.resets_at == T0 + 30  # next UTC midnight
    assert (denial.used, denial.in_flight, denial.requested) == (0, round(0.9 * NANO), round(0.3 * NANO))
    message = denial.message
    assert "plugin 'my-plugin'" in message and "budget_usd.day" in message and "2026-04-01T00:00:00.000Z" in message
    assert "= $1.00)" in message and "$0.90 in flight" in message and "up to $0.30" in message
    tiny = admit(store, L(budget_day=0.0000001), R(0.3))  # money is said as limits show says it, never "$0."
    assert "= <$0.000001)" in tiny.message and "$0.)" not in tiny.message
    # settling at the actual (smaller) cost frees the difference
    store.settle(held[0], round(0.05 * NANO), 100, timeout=5)
    assert isinstance(admit(store, day, R(0.3)), limits.Admission)
    c = store.counters(PLUGIN, T0, timeout=5)
    assert (c.day_spent, c.day_reserved, c.in_flight) == (round(0.05 * NANO), round(0.9 * NANO), 3)


def test_release_drops_the_reservation_and_costs_nothing(store):
    cap = L(budget_day=1.0, max_concurrent=1)
    a = admit(store, cap, R(1.0))
    assert isinstance(admit(store, cap, R(0.01)), Denial)
    store.release(a, timeout=5)
    assert isinstance(admit(store, cap, R(1.0)), limits.Admission)
    assert store.counters(PLUGIN, T0, timeout=5).day_spent == 0


def test_a_call_that_alone_exceeds_the_cap_says_waiting_will_not_help(store):
    denial = admit(store, L(budget_day=0.10), R(0.25))
    assert isinstance(denial, Denial) and denial.resets_at is None and "smaller max_tokens" in denial.message
    denial = admit(store, L(requests_per_minute=0), R())
    assert "the limit is 0" in denial.message


def test_requests_per_minute_counts_admissions_and_resets_next_minute(store):
    rpm = L(requests_per_minute=3)
    for _ in range(2):
        store.release(admit(store, rpm, R()), timeout=5)  # released calls were still requests
    held = admit(store, rpm, R(), now=T0 + 1)
    denial = admit(store, rpm, R())
    assert denial.limit == "requests_per_minute" and denial.resets_at == T0 + 30
    assert (denial.used, denial.in_flight) == (2, 1) and "3 requests this minute already" in denial.message
    store.settle(held, 0, 0, timeout=5)
    assert isinstance(admit(store, rpm, R(), now=T0 + 31), limits.Admission)


def test_tokens_per_minute_hold_reserved_tokens_then_the_actual_ones(store):
    tpm = L(tokens_per_minute=1000)
    a = admit(store, tpm, R(tokens=800))
    denial = admit(store, tpm, R(tokens=300))
    assert denial.limit == "tokens_per_minute" and (denial.used, denial.in_flight) == (0, 800)
    store.settle(a, 0, 500, timeout=5)
    assert isinstance(admit(store, tpm, R(tokens=300)), limits.Admission)
    assert admit(store, tpm, R(tokens=300)).limit == "tokens_per_minute"


def test_max_concurrent_counts_calls_in_flight(store):
    conc = L(max_concurrent=2)
    a, b = admit(store, conc, R(ttl=10)), admit(store, conc, R(ttl=20))
    denial = admit(store, conc, R())
    assert denial.limit == "max_concurrent" and denial.in_flight == 2 and denial.resets_at == pytest.approx(T0 + 10)
    store.settle(b, 0, 0, timeout=5)
    assert isinstance(admit(store, conc, R()), limits.Admission)


def test_window_roll_over_keeps_earlier_spend(store):
    caps = L(budget_day=1.0, budget_month=1.5)
    a = admit(store, caps, R(0.9))
    # admitted on March 31, settled after midnight: the spend belongs to March 31 (and March)
    store.settle(a, round(0.9 * NANO), 10, timeout=5)
    april = T0 + 60
    c = store.counters(PLUGIN, april, timeout=5)
    assert (c.day_spent, c.month_spent) == (0, 0)  # new day, new month: fresh windows ...
    march = store.counters(PLUGIN, T0, timeout=5)
    assert (march.day_spent, march.month_spent) == (round(0.9 * NANO),) * 2  # ... and March's spend is still there
    # within one month, a new day keeps the month's spend
    may1, may2 = calendar.timegm((2026, 5, 1, 12, 0, 0)), calendar.timegm((2026, 5, 2, 12, 0, 0))
    store.settle(admit(store, caps, R(0.9), now=may1), round(0.9 * NANO), 0, timeout=5)
    denial = admit(store, caps, R(0.9), now=may2)
    assert denial.limit == "budget_usd.month" and denial.used == round(0.9 * NANO)
    assert denial.resets_at == calendar.timegm((2026, 6, 1, 0, 0, 0))
    assert isinstance(admit(store, caps, R(0.5), now=may2), limits.Admission)


def test_an_unsettled_reservation_stops_counting_after_its_expiry(store):
    caps = L(budget_day=1.0, max_concurrent=1)
    admit(store, caps, R(1.0, ttl=5))  # never settled
    assert isinstance(admit(store, caps, R(0.5), now=T0 + 4), Denial)
    assert isinstance(admit(store, caps, R(0.5), now=T0 + 6), limits.Admission)


def test_snapshot_and_reset(store):
    caps = L(budget_day=2.0, requests_per_minute=10, max_concurrent=5)
    store.settle(admit(store, caps, R(0.5)), round(0.25 * NANO), 40, timeout=5)
    admit(store, caps, R(0.5))
    snap = store.snapshot(PLUGIN, caps, T0, timeout=5).as_dict()
    by_limit = {w["limit"]: w for w in snap["limits"]}
    assert by_limit["budget_usd.day"] == {
        "limit": "budget_usd.day", "config_key": "plugins.entries.my-plugin.limits.budget_usd.day", "cap": 2.0,
        "used": 0.25, "in_flight": 0.5, "unit": "usd", "resets_at": "2026-04-01T00:00:00.000Z",
        "resets_at_unix": 1775001600.0,
    }
    assert (by_limit["requests_per_minute"]["used"], by_limit["requests_per_minute"]["in_flight"]) == (1, 1)
    assert by_limit["max_concurrent"]["in_flight"] == 1  # the minute's counts, settled and reserved, as the limits'
    assert snap["minute"] == {"requests": 1, "requests_reserved": 1, "tokens": 40, "tokens_reserved": R(0.5).tokens}
    forgotten = store.reset(PLUGIN, T0, timeout=5)
    assert (forgotten.minute_requests, forgotten.minute_tokens, forgotten.day_spent) == (1, 40, round(0.25 * NANO))
    c = store.counters(PLUGIN, T0, timeout=5)
    assert (c.day_spent, c.minute_requests, c.in_flight) == (0, 0, 1)  # calls in flight keep their reservation


@pytest.mark.parametrize("bad", ["-5000", "1.5"])
def test_a_plugin_count_that_is_not_one_is_that_plugins_error_and_its_reset_deletes_nothing(store, store_spec, bad,
                                                                                           tmp_path):
    from plugin_llm.limits import views
    from plugin_llm.limits.store import StoreDataError, buckets_at

    caps = L(budget_day=2.0)
    for plugin in (PLUGIN, "other"):
        store.settle(store.admit(plugin, R(0.5), caps, T0, timeout=5), round(0.25 * NANO), 40, timeout=5)
    b = buckets_at(T0)
    if isinstance(store, LocalStore):
        db = sqlite3.connect(store.path)
        db.execute(f"UPDATE spend SET nano = {bad} WHERE plugin = ? AND bucket = 'day:' || ?", (PLUGIN, b.day))
        db.commit()
        db.close()
    else:
        import redis as redis_py

        client = redis_py.Redis.from_url(store_spec[1])
        client.set(store._keys(PLUGIN, b.minute, b.day, b.month)[3], bad)
        client.close()
    with pytest.raises(StoreDataError, match="0 or more"):
        store.counters(PLUGIN, T0, timeout=5)
    with pytest.raises(StoreDataError, match="0 or more"):
        store.reset(PLUGIN, T0, timeout=5)  # checked before anything is deleted
    assert store.counters("other", T0, timeout=5).day_spent == round(0.25 * NANO)  # the other plugin reads fine
    settings, _ = parse_limit_settings({"store": "local"}, {"entries": {p: {"limits": {"budget_usd": {"day": 2.0}}}
                                                                        for p in (PLUGIN, "other", "zed")}})
    rows = {r.plugin_id: r for r in views.show(settings, tmp_path, [PLUGIN, "other", "zed"], now=T0, store=store)}
    assert "0 or more" in rows[PLUGIN].error and rows["other"].error is None and rows["zed"].error is None
    if isinstance(store, LocalStore):
        db = sqlite3.connect(store.path)
        assert db.execute("SELECT COUNT(*) FROM spend WHERE plugin = ?", (PLUGIN,)).fetchone()[0] >= 2  # kept
        db.close()


def test_plugins_are_counted_separately_and_large_budgets_stay_exact(store):
    big = PluginLimits(budget_month_nano=900_000 * NANO, source="x")
    a = store.admit("other", R(123_456.789123456), big, T0, timeout=5)
    store.settle(a, 123_456_789_123_456, 0, timeout=5)
    assert store.counters("other", T0, timeout=5).month_spent == 123_456_789_123_456
    assert store.counters(PLUGIN, T0, timeout=5).month_spent == 0


# ----------------------------------------------------------------- concurrency
PRICE = round(0.01 * NANO)
CAP_CALLS = 10


def _hammer(kind: str, where: str, threads: int, calls: int, queue, later: bool = False) -> None:
    """One process: ``threads`` threads each trying ``calls`` slow calls (20 ms between admit and settle)."""
    store = make_store(kind, where) if kind == "local" else RedisStore(where, prefix=os.environ["LIMITS_TEST_PREFIX"])
    caps = L(budget_day=(CAP_CALLS + 0.5) * PRICE / NANO)
    admitted = []

    def worker():
        for _ in range(calls):
            result = store.admit(PLUGIN, Reservation(PRICE, 50, 30.0), caps, time.time(), timeout=10)
            if isinstance(result, limits.Admission):
                time.sleep(0.02)  # the provider call
                if later:  # queued: applied with the next admission's transaction / round trip
                    store.settle_later(result, PRICE, 50)
                else:
                    store.settle(result, PRICE, 50, timeout=10)  # actual cost = worst case: the hardest case
                admitted.append(1)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    store.flush(timeout=10)
    queue.put(len(admitted))


@pytest.mark.slow
@pytest.mark.parametrize("later", [False, True], ids=["settle", "settle_later"])
def test_processes_times_threads_never_exceed_the_budget(store_spec, monkeypatch, later):
    kind, where = store_spec
    prefix = f"t{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("LIMITS_TEST_PREFIX", prefix)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(kind, where, 8, 3, queue, later)) for _ in range(4)]  # 32 callers, 96 tries
    for p in procs:
        p.start()
    counts = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    check = LocalStore(where) if kind == "local" else RedisStore(where, prefix=prefix)
    spent = check.counters(PLUGIN, time.time(), timeout=5).day_spent
    assert sum(counts) * PRICE == spent
    assert spent <= (CAP_CALLS + 0.5) * PRICE  # zero overspend ...
    assert sum(counts) == CAP_CALLS  # ... and the budget was used, not refused early


# ----------------------------------------------------------------- crashes and faults
_HOLDER = """
import sys, time
from plugin_llm.limits import PluginLimits, Reservation, NANO
from plugin_llm.limits.local import LocalStore
from plugin_llm.limits.redis_store import RedisStore
kind, where, prefix = sys.argv[1:4]
store = LocalStore(where) if kind == "local" else RedisStore(where, prefix=prefix)
caps = PluginLimits(budget_day_nano=NANO, max_concurrent=1, source="plugins.entries.my-plugin.limits")
print(type(store.admit("my-plugin", Reservation(NANO, 10, 3.0), caps, time.time(), timeout=5)).__name__, flush=True)
time.sleep(600)
"""


def test_a_killed_process_reservation_expires(store_spec):
    kind, where = store_spec
    prefix = f"t{uuid.uuid4().hex[:12]}"
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, kind, where, prefix], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert child.stdout.readline().strip() == "Admission"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    store = LocalStore(where) if kind == "local" else RedisStore(where, prefix=prefix)
    caps = PluginLimits(budget_day_nano=NANO, max_concurrent=1, source="plugins.entries.my-plugin.limits")
    now = time.time()
    held = store.admit(PLUGIN, R(0.5), caps, now, timeout=5)
    assert isinstance(held, Denial) and held.limit == "max_concurrent"  # the dead process's call still counts ...
    later = store.admit(PLUGIN, R(0.5), caps, now + 4, timeout=5)
    assert isinstance(later, limits.Admission)  # ... until its deadline plus grace (3 s here) passed


def _settings(text: str):
    import yaml

    data = yaml.safe_load(text)
    settings, issues = parse_limit_settings(data.get("limits"), data.get("plugins"))
    assert [i for i in issues if i.severity == "error"] == []
    return settings


@pytest.fixture
def fresh_stores():
    limits.close_stores()
    yield
    limits.close_stores()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["deny", "allow"])
@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_redis_down_or_hung_follows_on_store_error_within_the_deadline(own_redis_server, tmp_path, policy, fault, fresh_stores):
    settings = _settings(f"""
limits: {{store: redis, redis_url: "{own_redis_server.url}", on_store_error: {policy}}}
plugins: {{entries: {{{PLUGIN}: {{limits: {{requests_per_minute: 100}}}}}}}}
""")
    call = dict(messages=[{"role": "user", "content": "hi"}], provider="local", model="local-echo-1", max_tokens=5)
    ticket = limits.admit(settings, tmp_path, PLUGIN, deadline=time.monotonic() + 5, **call)
    assert ticket.metered
    ticket.settle(cost_usd=0.0, input_tokens=1, output_tokens=1)
    own_redis_server.kill() if fault == "kill" else own_redis_server.pause()
    admit = lambda: limits.admit(settings, tmp_path, PLUGIN, deadline=time.monotonic() + 0.4, **call)  # noqa: E731
    if policy == "deny":
        with pytest.raises(PluginLlmLimitError) as caught:
            run_bounded(admit, 20)  # bounded by the 0.4 s deadline, not by a TCP timeout
        assert caught.value.limit == "store" and caught.value.config_key == "limits.on_store_error"
        assert "Redis limits store (redis://127.0.0.1:" in str(caught.value) and "fail closed" in str(caught.value)
    else:
        ticket = run_bounded(admit, 20)
        assert not ticket.metered and "Redis" in ticket.audit_fields()["limits.store_error"]
        ticket.settle(cost_usd=0.1)  # unmetered: nothing to settle, nothing raised


@pytest.mark.slow
def test_local_store_locked_by_another_process_follows_on_store_error_within_the_deadline(tmp_path, fresh_stores):
    settings = _settings(f"plugins: {{entries: {{{PLUGIN}: {{limits: {{max_concurrent: 3}}}}}}}}")
    call = dict(messages=[{"role": "user", "content": "hi"}], provider="local", model="local-echo-1", max_tokens=5)
    limits.admit(settings, tmp_path, PLUGIN, deadline=time.monotonic() + 5, **call).release()
    other = sqlite3.connect(tmp_path / "limits.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock and never lets go
    try:
        with pytest.raises(PluginLlmLimitError) as caught:
            run_bounded(lambda: limits.admit(settings, tmp_path, PLUGIN, deadline=time.monotonic() + 0.3, **call), 20)
        assert caught.value.limit == "store" and "locked" in str(caught.value)
    finally:
        other.execute("ROLLBACK")
        other.close()
    ticket = limits.admit(settings, tmp_path, PLUGIN, deadline=time.monotonic() + 5, **call)
    assert ticket.metered


def test_an_unreachable_redis_url_is_a_store_error_with_no_password(fresh_stores, tmp_path):
    store = RedisStore("redis://:hunter2-canary@127.0.0.1:1/0", timeout=0.5)
    with pytest.raises(StoreError) as caught:
        store.admit(PLUGIN, R(), L(max_concurrent=1), T0, timeout=0.5)
    assert "hunter2-canary" not in str(caught.value) and "redis://***@127.0.0.1:1/0" in str(caught.value)


def test_a_hot_reloaded_cap_applies_to_the_next_admission(store):
    store.settle(admit(store, L(budget_day=1.0), R(1.0)), NANO, 0, timeout=5)
    assert isinstance(admit(store, L(budget_day=1.0), R(0.5)), Denial)
    assert isinstance(admit(store, L(budget_day=2.0), R(0.5)), limits.Admission)  # limits are passed per call


def test_odd_plugin_ids_get_keys_of_their_own(store):
    one = L(max_concurrent=1)
    ids = ["a", "a}:res", "we{ird}\nid", "名前/插件"]
    for plugin_id in ids:
        assert isinstance(store.admit(plugin_id, R(), one, T0, timeout=5), limits.Admission)
    for plugin_id in ids:
        assert isinstance(store.admit(plugin_id, R(), one, T0, timeout=5), Denial)
        assert store.counters(plugin_id, T0, timeout=5).in_flight == 1


def test_a_restarted_redis_is_used_again_and_gets_the_script_back(own_redis_server):
    store = RedisStore(own_redis_server.url, prefix="restart")
    assert isinstance(store.admit(PLUGIN, R(), L(max_concurrent=5), T0, timeout=5), limits.Admission)
    own_redis_server.kill()
    with pytest.raises(StoreError):
        store.admit(PLUGIN, R(), L(max_concurrent=5), T0, timeout=1)
    own_redis_server.start()  # same port, empty, no cached scripts: EVALSHA gets NOSCRIPT, EVAL follows
    assert isinstance(store.admit(PLUGIN, R(), L(max_concurrent=5), T0, timeout=5), limits.Admission)
    assert store.counters(PLUGIN, T0, timeout=5).in_flight == 1


def test_a_corrupt_local_database_is_a_store_error(tmp_path):
    path = tmp_path / "limits.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError) as caught:
        LocalStore(path).admit(PLUGIN, R(), L(max_concurrent=1), T0, timeout=1)
    assert str(path) in str(caught.value) and "not a database" in str(caught.value)


def test_the_local_store_works_in_a_forked_child(tmp_path):
    store = LocalStore(tmp_path / "limits.sqlite3")
    one = L(max_concurrent=2)
    assert isinstance(store.admit(PLUGIN, R(), one, T0, timeout=5), limits.Admission)
    pid = os.fork()
    if pid == 0:  # child: the inherited connection is set aside, a new one is opened
        ok = isinstance(store.admit(PLUGIN, R(), one, T0, timeout=5), limits.Admission)
        ok = ok and isinstance(store.admit(PLUGIN, R(), one, T0, timeout=5), Denial)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.counters(PLUGIN, T0, timeout=5).in_flight == 2  # the parent sees the child's reservation


class _Model:
    """The reference semantics in plain Python: store.decide() over dicts (what both stores must match)."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[int, int, limits.Admission]] = {}
        self.spend: dict[str, int] = {}

    def counters(self, now: float):
        from plugin_llm.limits.store import Counters, buckets_at

        b = buckets_at(now)
        live = [(c, t, a) for c, t, a in self.held.values() if a.expires_at > now]
        return Counters(
            in_flight=len(live), earliest_expiry=min((a.expires_at for *_, a in live), default=None),
            minute_requests=self.spend.get("r" + b.minute, 0), minute_tokens=self.spend.get("t" + b.minute, 0),
            minute_requests_reserved=sum(1 for *_, a in live if a.buckets.minute == b.minute),
            minute_tokens_reserved=sum(t for _, t, a in live if a.buckets.minute == b.minute),
            day_spent=self.spend.get("d" + b.day, 0), day_reserved=sum(c for c, _, a in live if a.buckets.day == b.day),
            month_spent=self.spend.get("m" + b.month, 0),
            month_reserved=sum(c for c, _, a in live if a.buckets.month == b.month),
        )

    def settle(self, a: limits.Admission, cost: int, tokens: int) -> None:
        self.held.pop(a.reservation_id, None)
        b = a.buckets
        for key, value in (("d" + b.day, cost), ("m" + b.month, cost), ("r" + b.minute, 1), ("t" + b.minute, tokens)):
            self.spend[key] = self.spend.get(key, 0) + value


def test_both_stores_decide_exactly_like_the_reference_rule(store):
    import random

    from plugin_llm.limits.store import buckets_at, decide

    rng = random.Random(11)
    # limits are passed per call (a hot reload changes them between calls): mix single limits and all of them
    configs = [L(max_concurrent=3), L(requests_per_minute=4), L(tokens_per_minute=1500), L(budget_day=1.0),
               L(budget_month=3.0),
               L(max_concurrent=5, requests_per_minute=6, tokens_per_minute=2000, budget_day=1.5, budget_month=4.0)]
    model, now, open_ = _Model(), float(T0 - 86400 - 4 * 3600), []  # March 30, 20:00 UTC
    outcomes: dict[str, int] = {}
    for _ in range(500):
        now += rng.choice((0.0, 0.0, 0.5, 3.0, 11.0, 45.0)) if rng.random() > 0.01 else 6 * 3600.0
        if open_ and rng.random() < 0.45:
            a = open_.pop(rng.randrange(len(open_)))
            cost, tokens = (rng.randint(0, a.cost_nano), rng.randint(0, a.tokens)) if rng.random() < 0.8 else (0, 0)
            store.settle(a, cost, tokens, timeout=5)
            model.settle(a, cost, tokens)
            continue
        r = R(rng.choice((0.0, 0.05, 0.2, 0.45)), rng.choice((0, 150, 600)), ttl=rng.choice((2.0, 20.0, 300.0, 40000.0)))
        caps = rng.choice(configs)
        got = store.admit(PLUGIN, r, caps, now, timeout=5)
        expected = decide(PLUGIN, caps, model.counters(now), r, buckets_at(now))
        assert (type(got).__name__, getattr(got, "limit", None)) == (
            ("Admission", None) if expected is None else ("Denial", expected.limit))
        if expected is None:
            model.held[got.reservation_id] = (r.cost_nano, r.tokens, got)
            open_.append(got)
        else:
            assert (got.used, got.in_flight, got.resets_at) == (expected.used, expected.in_flight, expected.resets_at)
        outcome = getattr(got, "limit", "admitted")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        assert store.counters(PLUGIN, now, timeout=5) == model.counters(now)
    assert set(outcomes) == {"admitted", *limits.LIMIT_NAMES}, outcomes  # every limit decided at least once


def test_a_call_in_flight_over_midnight_holds_its_own_day_and_the_month(store):
    yesterday = T0 - 86400 + 20  # March 30, 23:59:50
    admit(store, L(budget_day=1.0), R(0.8, ttl=100), now=yesterday)  # still in flight after midnight
    after_midnight = yesterday + 20
    assert admit(store, L(budget_day=1.0, budget_month=1.5), R(0.9), now=after_midnight).limit == "budget_usd.month"
    assert isinstance(admit(store, L(budget_day=1.0, budget_month=2.0), R(0.9), now=after_midnight), limits.Admission)


def _redis_clients(port: int) -> int:
    import socket as socket_module

    with socket_module.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"CLIENT LIST\r\n")
        head = b""
        while b"\r\n" not in head:
            head += s.recv(65536)
        size = int(head.split(b"\r\n", 1)[0][1:])
        data = head.split(b"\r\n", 1)[1]
        while len(data) < size:
            data += s.recv(65536)
    return sum(1 for line in data.decode().splitlines() if "addr=" in line)


def test_redis_connections_are_reused_across_short_lived_threads(redis_server):
    store = RedisStore(redis_server.url, prefix=f"t{uuid.uuid4().hex[:12]}")
    before = _redis_clients(redis_server.port)
    for _ in range(40):  # a host that makes each call on a fresh thread
        t = threading.Thread(target=lambda: store.release(store.admit(PLUGIN, R(), L(max_concurrent=5), T0, timeout=5), timeout=5))
        t.start()
        t.join()
    assert _redis_clients(redis_server.port) - before <= 1  # one connection, reused; not one per thread
    store.close()


# ----------------------------------------------------------------- settlements off the caller's path
def test_a_queued_settlement_rides_along_with_the_next_admission(store):
    one = L(max_concurrent=1, budget_day=1.0)
    for _ in range(20):  # sequential calls never see their own previous call still in flight
        a = admit(store, one, R(0.04))
        assert isinstance(a, limits.Admission)
        store.settle_later(a, round(0.01 * NANO), 5)
    c = store.counters(PLUGIN, T0, timeout=5)
    assert (c.in_flight, c.day_spent, c.minute_requests, c.minute_tokens) == (0, round(0.2 * NANO), 20, 100)


def test_a_queued_settlement_reaches_other_processes_without_another_admission(store_spec):
    kind, where = store_spec
    prefix = f"t{uuid.uuid4().hex[:12]}"
    here = LocalStore(where) if kind == "local" else RedisStore(where, prefix=prefix)
    there = LocalStore(where) if kind == "local" else RedisStore(where, prefix=prefix)  # another process's view
    a = here.admit(PLUGIN, R(0.3), L(max_concurrent=1), T0, timeout=5)
    here.settle_later(a, round(0.1 * NANO), 7)
    deadline = time.monotonic() + 5
    while there.counters(PLUGIN, T0, timeout=5).in_flight and time.monotonic() < deadline:
        time.sleep(0.005)  # the background flush applies it within milliseconds
    assert there.counters(PLUGIN, T0, timeout=5).day_spent == round(0.1 * NANO)


_SETTLE_AND_EXIT = """
import sys, time
from plugin_llm.limits import PluginLimits, Reservation, NANO
from plugin_llm.limits.local import LocalStore
from plugin_llm.limits.redis_store import RedisStore
kind, where, prefix, now = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
store = LocalStore(where) if kind == "local" else RedisStore(where, prefix=prefix)
a = store.admit("my-plugin", Reservation(NANO, 10, 60.0), PluginLimits(max_concurrent=1), now, timeout=5)
store.settle_later(a, NANO // 4, 10)
"""  # and exits at once: the settlement is applied at exit


def test_queued_settlements_are_applied_when_the_process_exits(store_spec):
    kind, where = store_spec
    prefix = f"t{uuid.uuid4().hex[:12]}"
    subprocess.run([sys.executable, "-c", _SETTLE_AND_EXIT, kind, where, prefix, repr(T0)], cwd=REPO, check=True, timeout=60)
    store = LocalStore(where) if kind == "local" else RedisStore(where, prefix=prefix)
    c = store.counters(PLUGIN, T0, timeout=5)
    assert (c.in_flight, c.day_spent) == (0, NANO // 4)


def test_settlements_of_a_failed_local_admission_are_applied_later_exactly_once(tmp_path):
    store = LocalStore(tmp_path / "limits.sqlite3")
    a = store.admit(PLUGIN, R(0.5), L(max_concurrent=3), T0, timeout=5)
    other = sqlite3.connect(tmp_path / "limits.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the database is locked: the next admission (and the flusher) fail
    store.settle_later(a, round(0.2 * NANO), 3)
    with pytest.raises(StoreError):
        store.admit(PLUGIN, R(0.5), L(max_concurrent=3), T0, timeout=0.1)
    other.execute("ROLLBACK")
    other.close()
    c = store.counters(PLUGIN, T0, timeout=5)
    assert (c.in_flight, c.day_spent, c.minute_requests) == (0, round(0.2 * NANO), 1)


def test_settlements_riding_with_a_refused_admission_are_still_applied_once(store):
    caps = L(max_concurrent=1, budget_day=1.0)
    a = admit(store, caps, R(0.5))
    store.settle_later(a, round(0.3 * NANO), 9)
    assert admit(store, caps, R(0.9)).limit == "budget_usd.day"  # 0.3 settled + 0.9 > 1.0: refused, after settling
    c = store.counters(PLUGIN, T0, timeout=5)
    assert (c.in_flight, c.day_spent, c.minute_requests, c.minute_tokens) == (0, round(0.3 * NANO), 1, 9)


def test_a_version_1_database_is_upgraded_in_place(tmp_path):
    path = tmp_path / "limits.sqlite3"
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript("""
        CREATE TABLE spend (plugin TEXT NOT NULL, bucket TEXT NOT NULL, nano INTEGER NOT NULL DEFAULT 0,
            requests INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (plugin, bucket)) WITHOUT ROWID;
        INSERT INTO spend VALUES ('my-plugin', 'day:2026-03-31', 700000000, 0, 0);
        CREATE TABLE admit (plugin TEXT, id TEXT);
        CREATE TRIGGER admit_request BEFORE INSERT ON admit BEGIN SELECT RAISE(IGNORE); END;
        PRAGMA user_version = 1;
    """)
    old.close()
    store = LocalStore(path)
    assert admit(store, L(budget_day=1.0), R(0.5)).limit == "budget_usd.day"  # the spend survived the upgrade
    assert isinstance(admit(store, L(budget_day=1.0), R(0.2)), limits.Admission)


def test_a_server_that_is_not_redis_or_a_tampered_file_is_a_store_error_not_a_traceback(tmp_path):
    """Replies of the wrong shape (a proxy, another server on the port) and counts that are not
    whole numbers (a hand-edited SQLite file) are store errors: refused or allowed as configured,
    shown by limits show as the store not answering."""
    import socket
    import sqlite3
    import threading

    from plugin_llm.limits.store import StoreError

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def answer() -> None:  # every command answered "+OK"
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while conn.recv(65536):
                    conn.sendall(b"+OK\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        store = RedisStore(f"redis://127.0.0.1:{server.getsockname()[1]}/0", prefix="p")
        with pytest.raises(StoreError, match="is limits.redis_url a Redis server"):
            store.counters("p", time.time(), timeout=2)
        for reply in (b"OK", 5, [1], [b"x", b"y"]):  # a Redis whose scripts answer something else
            store._with_queued = store._script = lambda *a, reply=reply, **k: reply
            with pytest.raises(StoreError, match="not a limits reply"):
                store.counters("p", time.time(), timeout=2)
            if reply != [1]:  # (an admission's own reply: admitted)
                with pytest.raises(StoreError, match="not a limits reply"):
                    store.admit("p", R(0.1), L(budget_day=1.0), time.time(), timeout=2)
    finally:
        server.close()
    local = LocalStore(tmp_path / "limits.sqlite3")
    local.settle(admit(local, L(budget_day=1.0), R(0.1)), 1000, 10, timeout=2)
    db = sqlite3.connect(tmp_path / "limits.sqlite3")
    for value in ("'abc'", "-5000000000"):  # a negative count would add headroom and show as "$-5.00 used"
        db.execute(f"UPDATE spend SET nano = {value}")
        db.commit()
        with pytest.raises(StoreError, match="not a whole number of 0 or more"):
            local.counters(PLUGIN, T0, timeout=2)
        with pytest.raises(StoreError, match="not a whole number of 0 or more"):
            local.reset(PLUGIN, T0, timeout=2)
    db.close()


@pytest.mark.slow
def test_a_settlement_whose_reply_never_came_is_sent_again_and_counted_once(own_redis_server, monkeypatch):
    """Sent, then no reply (a hung Redis, a connection reset): applied or not, nobody knows. It is
    sent again as a retry, which Redis applies only while the reservation is still there."""
    import redis as redis_py

    from plugin_llm.limits.store import StoreError

    store = RedisStore(own_redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}", timeout=0.3)
    day = L(budget_day=10.0)
    ran = admit(store, day, R(0.1))
    own_redis_server.pause()  # the first attempt waits in the socket, and runs once Redis is back
    try:
        store.settle_later(ran, 1_000_000, 10)
        with pytest.raises(StoreError):
            store.flush(timeout=0.3)
    finally:
        own_redis_server.resume()
    lost = admit(store, day, R(0.1))
    real = store._send_and_read
    calls = []

    def reset_once(conn, commands, **kw):  # sent, then the connection reset: this one never ran
        if not calls:
            calls.append(1)
            raise redis_py.exceptions.ConnectionError("Connection reset by peer")
        return real(conn, commands, **kw)

    monkeypatch.setattr(store, "_send_and_read", reset_once)
    store.settle_later(lost, 2_000_000, 20)
    for _ in range(3):
        try:
            store.flush(timeout=5)
        except StoreError:
            pass
    c = store.counters(PLUGIN, T0, timeout=5)
    assert (c.day_spent, c.minute_tokens, c.in_flight) == (3_000_000, 30, 0)
    store.close()
