"""Leases (plugin_llm/limits/leases.py): most calls admitted in memory, the same guarantees.

Both stores, real ones: SQLite in the home and a real redis-server on
127.0.0.1. The cases: threads x processes against one budget never exceed
it and settle exactly; a crashed process's lease expires; idle leases are
given back; near a limit the decisions (and their messages) are those of a
per-call store; a busy plugin needs few store steps.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from plugin_llm import limits
from plugin_llm.limits import NANO, PluginLlmLimitError, parse_limit_settings
from plugin_llm.limits import leases
from plugin_llm.limits.local import LocalStore
from plugin_llm.limits.redis_store import RedisStore
from tests.bounded import run_bounded
from tests.redis_server import own_redis_server, redis_server  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "my-plugin"
MESSAGES = [{"role": "user", "content": "Summarise the release notes in one line."}]


def settings_text(kind: str, url: str | None, prefix: str, block: str, extra: str = "") -> str:
    host = "limits:\n"
    if kind == "redis":
        host += f"  store: redis\n  redis_url: {url}\n  redis_key_prefix: {prefix}\n"
    host += '  prices:\n    "custom/m": {input_per_mtok: 1.0, output_per_mtok: 4.0}\n' + extra
    return host + f"plugins:\n  entries:\n    {PLUGIN}:\n      limits: {block}\n"


def parse(text: str):
    data = yaml.safe_load(text)
    settings, issues = parse_limit_settings(data["limits"], data["plugins"])
    assert [str(i) for i in issues] == []
    return settings


def call(settings, home, **kw):
    args = dict(messages=MESSAGES, provider="custom", model="m", max_tokens=100, deadline=time.monotonic() + 10)
    args.update(kw)
    return limits.admit(settings, home, PLUGIN, **args)


def worst(settings):
    return limits.worst_case(MESSAGES, provider="custom", model="m", max_tokens=100, settings=settings)


def worst_nano(settings, home) -> int:
    return worst(settings).cost_nano


def settle_worst(ticket, settings) -> None:
    """Settle with the actual usage equal to the reservation: the hardest case for a cap."""
    e = worst(settings)
    ticket.settle(input_tokens=e.input_tokens, output_tokens=e.output_tokens)


def plain_store(kind: str, home: Path, url: str | None, prefix: str):
    """A second store object on the same data, with no leases of its own: what another process sees."""
    return LocalStore(home / "limits.sqlite3") if kind == "local" else RedisStore(url, prefix=prefix)


@pytest.fixture(params=["local", "redis"])
def kind(request, tmp_path):
    limits.close_stores()
    url = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    yield request.param, url, f"t{uuid.uuid4().hex[:12]}"
    limits.close_stores()


# ----------------------------------------------------------------- threads x processes, one budget
def _hammer(text: str, home: str, threads: int, tries: int, queue) -> None:
    """One process: ``threads`` threads each making ``tries`` calls of 5 ms; reports admitted calls
    and the (start, end) of each call's provider time."""
    settings = parse(text)
    admitted: list[tuple[float, float]] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(tries):
            try:
                ticket = call(settings, home)
            except PluginLlmLimitError:
                time.sleep(0.002)
                continue
            start = time.time()
            time.sleep(0.005)  # the provider call
            end = time.time()
            settle_worst(ticket, settings)
            with lock:
                admitted.append((start, end))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    queue.put(admitted)  # exiting gives the leases back (atexit)


@pytest.mark.slow
def test_processes_times_threads_never_exceed_one_budget_and_settle_exactly(kind, tmp_path):
    k, url, prefix = kind
    probe = parse(settings_text(k, url, prefix, "{budget_usd: {day: 1.0}}"))
    price = worst_nano(probe, tmp_path)
    fits = 60
    cap = (fits + 0.5) * price / NANO
    text = settings_text(k, url, prefix, "{budget_usd: {day: %r}, max_concurrent: 6}" % cap)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(text, str(tmp_path), 5, 30, queue)) for _ in range(3)]  # 15 callers
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    intervals = [iv for r in results for iv in r]
    settings = parse(text)
    other = plain_store(k, tmp_path, url, prefix)
    c = other.counters(PLUGIN, time.time(), timeout=5)
    assert c.day_spent == len(intervals) * price  # every admitted call settled exactly once
    assert c.day_spent <= cap * NANO  # zero overspend across processes and threads
    assert (c.in_flight, c.day_reserved) == (0, 0)  # the exiting processes gave their leases back
    # max_concurrent held across processes: never more than 6 provider calls at once
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 6
    # with every lease given back, the rest of the budget is admitted exactly: nothing was refused for good
    more = 0
    while True:
        try:
            ticket = call(settings, tmp_path)
        except PluginLlmLimitError as exc:
            assert exc.limit == "budget_usd.day"
            break
        settle_worst(ticket, settings)
        more += 1
    assert len(intervals) + more == fits
    other.close()


# ----------------------------------------------------------------- crash, idle return
_CRASHER = """
import sys, time, yaml
from plugin_llm import limits
from plugin_llm.limits import parse_limit_settings
text, home = sys.argv[1], sys.argv[2]
data = yaml.safe_load(text)
settings, _ = parse_limit_settings(data["limits"], data["plugins"])
args = dict(messages=[{"role": "user", "content": "Summarise the release notes in one line."}],
            provider="custom", model="m", max_tokens=100)
for _ in range(40):  # busy: the lease grows beyond the calls in flight
    limits.admit(settings, home, "my-plugin", deadline=time.monotonic() + 2, **args).settle(input_tokens=1, output_tokens=1)
limits.admit(settings, home, "my-plugin", deadline=time.monotonic() + 2, **args)  # in flight when the process dies
print(time.time(), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_lease_held_by_a_crashed_process_expires(kind, tmp_path):
    k, url, prefix = kind
    text = settings_text(k, url, prefix, "{budget_usd: {day: 1000}, max_concurrent: 100}", extra="  reservation_grace: 1\n")
    child = subprocess.Popen([sys.executable, "-c", _CRASHER, text, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             cwd=REPO)
    try:
        last_admission = float(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    settings = parse(text)
    price = worst_nano(settings, tmp_path)
    other = plain_store(k, tmp_path, url, prefix)
    c = other.counters(PLUGIN, time.time(), timeout=5)
    assert c.in_flight >= 1 and c.day_reserved > price  # the dead process's lease: its call and spare headroom
    # ... counting only until the deadline of its last call (2 s) plus the grace (1 s), as a call's reservation
    assert c.earliest_expiry is not None and c.earliest_expiry <= last_admission + 2 + 1 + 0.5

    def wait_expired():
        while other.counters(PLUGIN, time.time(), timeout=5).day_reserved:
            time.sleep(0.1)

    run_bounded(wait_expired, 20)
    c = other.counters(PLUGIN, time.time(), timeout=5)
    assert (c.in_flight, c.day_reserved) == (0, 0) and c.day_spent <= 40 * 5000  # what it settled in time stays
    other.close()


@pytest.mark.slow
def test_idle_leases_are_given_back_and_the_settled_usage_is_exact(kind, tmp_path):
    k, url, prefix = kind
    settings = parse(settings_text(k, url, prefix, "{budget_usd: {day: 1000}, requests_per_minute: 100000}"))
    price = worst_nano(settings, tmp_path)
    start = time.time()
    for _ in range(50):
        call(settings, tmp_path).settle(input_tokens=100, output_tokens=50)  # actual: 100 * 1 + 50 * 4 nano-$/token
    minutes = {int(start // 60), int(time.time() // 60)}  # (requests count in their minute: read each one's)
    actual = 100 * 1000 + 50 * 4000
    other = plain_store(k, tmp_path, url, prefix)
    busy = other.counters(PLUGIN, time.time(), timeout=5)
    assert busy.day_reserved >= price  # this process holds a lease: headroom beyond its calls (none in flight)

    def wait_returned():
        while True:
            c = other.counters(PLUGIN, time.time(), timeout=5)
            if c.day_reserved == 0 and c.minute_requests_reserved == 0:
                return c
            time.sleep(0.05)

    c = run_bounded(wait_returned, 20)
    requests = sum(other.counters(PLUGIN, minute * 60.0 + 30.0, timeout=5).minute_requests for minute in minutes)
    assert (c.day_spent, requests, c.in_flight) == (50 * actual, 50, 0)
    other.close()


# ----------------------------------------------------------------- near the limit, exact
def test_near_the_limit_decisions_and_messages_are_those_of_a_per_call_store(kind, tmp_path):
    k, url, prefix = kind
    probe = parse(settings_text(k, url, prefix, "{budget_usd: {day: 1.0}}"))
    price = worst_nano(probe, tmp_path)
    fits = 25
    settings = parse(settings_text(k, url, prefix, "{budget_usd: {day: %r}}" % ((fits + 0.5) * price / NANO)))
    admitted = 0
    with pytest.raises(PluginLlmLimitError) as caught:
        while True:  # one busy process: the lease grows, then shrinks to per-call reservations near the cap
            settle_worst(call(settings, tmp_path), settings)
            admitted += 1
    assert admitted == fits
    got = caught.value.denial
    assert (got.limit, got.used, got.in_flight, got.requested) == ("budget_usd.day", fits * price, 0, price)
    other = plain_store(k, tmp_path, url, prefix)
    reference = other.admit(PLUGIN, limits.Reservation(price, 0, 30.0),
                            settings.for_plugin(PLUGIN), time.time(), timeout=5)
    assert isinstance(reference, limits.Denial) and reference.limit == "budget_usd.day"
    assert str(caught.value) == reference.message  # the message a per-call store gives, unchanged
    other.close()


def test_max_concurrent_near_the_limit_is_exact_per_call(kind, tmp_path):
    k, url, prefix = kind
    settings = parse(settings_text(k, url, prefix, "{max_concurrent: 3}"))
    for _ in range(20):  # busy
        call(settings, tmp_path).release()
    held = [call(settings, tmp_path) for _ in range(3)]
    with pytest.raises(PluginLlmLimitError) as caught:
        call(settings, tmp_path)
    assert caught.value.limit == "max_concurrent" and "3 calls in flight already" in str(caught.value)
    held.pop().release()
    held.append(call(settings, tmp_path))  # the freed slot is admitted at once
    for ticket in held:
        ticket.release()


# ----------------------------------------------------------------- cost: few store steps
def busy_book(kind, home, block: str, calls: int):
    """The lease book of a plugin with limits ``block`` after ``calls`` calls one after another."""
    k, url, prefix = kind
    settings = parse(settings_text(k, url, prefix, block))
    for _ in range(calls):
        call(settings, home).settle(input_tokens=10, output_tokens=10)
    return limits.store_for(settings, home).lease_books()[PLUGIN]


def test_a_leases_room_is_what_it_holds_less_its_calls_in_flight_and_their_usage_at_every_point(kind, tmp_path):
    """Admissions and settlements in memory change ``room`` by the numbers that store steps work it
    out from afresh: whatever mix of calls, releases, expired calls and steps, it never drifts."""
    import random

    from plugin_llm.limits import leases

    k, url, prefix = kind
    settings = parse(settings_text(k, url, prefix, "{max_concurrent: 50, requests_per_minute: 100000, "
                                                   "tokens_per_minute: 100000000, budget_usd: {day: 1000}}"))
    rng = random.Random(7)
    book = None
    open_tickets = []

    def check() -> None:
        with book.lock:
            lease = book.current
            r, h = lease.in_flight(), lease.held
            assert lease.room == [h[0] - r[0], h[1] - r[1] - lease.u_req, h[2] - r[2] - lease.u_tok,
                                  h[3] - r[3] - lease.u_nano]

    for i in range(400):
        action = rng.random()
        if not open_tickets or (action < 0.5 and len(open_tickets) < 30):
            open_tickets.append(call(settings, tmp_path))
        elif action < 0.8:
            open_tickets.pop(rng.randrange(len(open_tickets))).settle(
                input_tokens=rng.randrange(0, 30), output_tokens=rng.randrange(0, 100))
        elif action < 0.9:
            open_tickets.pop(rng.randrange(len(open_tickets))).release()
        else:
            ticket = open_tickets[rng.randrange(len(open_tickets))]
            if type(ticket) is leases.LeasedTicket:
                ticket.expires_at = 0.0  # it expires: the next step stops counting it (its usage counts)
            with book.io:
                book._step(book.current, give_back=False, timeout=5.0)
        if book is None:
            book = limits.store_for(settings, tmp_path).lease_books()[PLUGIN]
        if book.current is not None:
            check()
    assert sum(type(t) is leases.LeasedTicket for t in open_tickets) > 5  # most were admitted in memory
    for ticket in open_tickets:
        ticket.release()
    check()


def test_a_lease_holds_concurrency_slots_for_the_calls_in_flight_not_for_the_calls_per_interval(kind, tmp_path):
    """A plugin making one call at a time under a high max_concurrent holds a few slots, and stays
    far from the limit (its renewals are not exact steps that hold up admissions)."""
    book = busy_book(kind, tmp_path, "{max_concurrent: 1000, budget_usd: {day: 1000}}", 200)
    lease = book.current
    assert book.n > 8 and lease.held[0] <= 3 and not lease.near


def test_the_keeper_makes_a_store_step_only_when_one_is_due(kind, tmp_path):
    from plugin_llm.limits import leases

    book = busy_book(kind, tmp_path, "{budget_usd: {day: 1000}, requests_per_minute: 100000000}", 100)
    lease = book.current
    assert not lease.near and book.n
    assert book.max_interval == min(leases.MAX_RENEW_INTERVAL, book.slack / 2)
    with book.io:  # the keeper skips this book meanwhile: nothing made up here reaches the store
        book._step(lease, give_back=False, timeout=5.0)  # topped up to its slice just now
        assert not lease.near
        saved = lease.stepped, lease.room[1]
        assert not book._due(lease)  # far from every limit, stepped just now, room left: nothing to do
        lease.stepped -= book.max_interval
        assert book._due(lease)  # settled usage goes to the store at least every max_interval
        lease.stepped = time.monotonic()
        lease.room[1] = book.n // 2 - 1  # less than half the slice of requests left
        assert book._due(lease)
        lease.room[1] = saved[1]
        lease.near = True
        assert book._due(lease)  # near a limit: every keeper pass is an exact step
        assert book.next_pass(lease.stepped) == 0.0  # ... and the keeper looks on every pass (whenever asked)
        lease.near = False
        lease.stepped = saved[0]


def test_the_keeper_sleeps_until_a_step_is_due_and_the_admission_at_half_the_slice_wakes_it(kind, tmp_path,
                                                                                           monkeypatch):
    from plugin_llm.limits import leases

    woken = []

    class Recorder(type(leases._WAKE)):
        def set(self) -> None:
            woken.append(1)
            super().set()

    monkeypatch.setattr(leases, "_WAKE", Recorder())
    k, url, prefix = kind
    settings = parse(settings_text(k, url, prefix, "{budget_usd: {day: 1000}, requests_per_minute: 100000000}"))
    for _ in range(100):
        call(settings, tmp_path).settle(input_tokens=10, output_tokens=10)
    book = limits.store_for(settings, tmp_path).lease_books()[PLUGIN]
    with book.io:  # the keeper skips this book meanwhile
        lease = book.current
        book._step(lease, give_back=False, timeout=5.0)
        assert lease.alarm == book.n // 2 > 1 and lease.admitted == 0
        woken.clear()  # (the 100 calls woke it on their way)
        lease.last_used = now = lease.stepped  # (next_pass is worked out for a given instant: this one)
        assert book.next_pass(now) == pytest.approx(leases.IDLE_RETURN)  # nothing admitted since: only idle
        tickets = [call(settings, tmp_path)]
        assert book.next_pass(now) == pytest.approx(book.max_interval)  # usage to hand over: due by time
        tickets += [call(settings, tmp_path) for _ in range(lease.alarm - 2)]
        assert woken == [] and lease.admitted == lease.alarm - 1
        tickets.append(call(settings, tmp_path))  # half the slice: the keeper is woken, and looks on every pass
        assert woken == [1] and book.next_pass(now) == 0.0
        assert all(type(t) is leases.LeasedTicket for t in tickets)
        for t in tickets:
            t.release()


def test_a_busy_plugin_needs_few_store_steps_and_async_calls_no_worker_thread(kind, tmp_path, monkeypatch):
    k, url, prefix = kind
    settings = parse(settings_text(k, url, prefix, "{budget_usd: {day: 1000}, tokens_per_minute: 100000000}"))
    store = limits.store_for(settings, tmp_path)
    steps = []
    real = store.lease
    monkeypatch.setattr(store, "lease", lambda *a, **kw: steps.append(1) or real(*a, **kw))
    for _ in range(300):
        call(settings, tmp_path).settle(input_tokens=10, output_tokens=10)
    assert len(steps) < 100  # the per-call design made 300

    hops = []
    to_thread = asyncio.to_thread
    monkeypatch.setattr(asyncio, "to_thread", lambda *a, **kw: hops.append(1) or to_thread(*a, **kw))

    async def main() -> None:
        for _ in range(50):
            ticket = await limits.aadmit(settings, tmp_path, PLUGIN, messages=MESSAGES, provider="custom", model="m",
                                         max_tokens=100, deadline=time.monotonic() + 10)
            await ticket.asettle(input_tokens=10, output_tokens=10)

    asyncio.run(main())
    assert len(hops) < 25  # admitted on the event loop, in memory (a store step still goes to a thread)
    spent = limits.snapshot(settings, tmp_path, PLUGIN).counters
    assert spent.day_spent == 350 * (10 * 1000 + 10 * 4000) and spent.day_reserved == 0


def test_a_new_minute_starts_a_new_lease_and_keeps_each_minutes_counts(kind, tmp_path):
    k, url, prefix = kind
    settings = parse(settings_text(k, url, prefix, "{requests_per_minute: 1000, budget_usd: {day: 1000}}"))
    t0 = (time.time() // 86400) * 86400 + 3600  # 01:00 UTC today: both minutes in one day
    for i in range(30):
        call(settings, tmp_path, now=t0 + i * 0.01).settle(input_tokens=1, output_tokens=1)
    for i in range(20):
        call(settings, tmp_path, now=t0 + 60 + i * 0.01).settle(input_tokens=1, output_tokens=1)
    store = limits.store_for(settings, tmp_path)
    first = store.counters(PLUGIN, t0, timeout=5)
    second = store.counters(PLUGIN, t0 + 60, timeout=5)
    assert (first.minute_requests, second.minute_requests) == (30, 20)
    assert second.day_spent == 50 * (1000 + 4000) and second.day_reserved == 0


def test_a_forked_child_does_not_use_its_parents_lease(tmp_path):
    limits.close_stores()
    settings = parse(settings_text("local", None, "", "{budget_usd: {day: 1000}}"))
    for _ in range(30):
        call(settings, tmp_path).settle(input_tokens=1, output_tokens=1)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            from plugin_llm.limits import store_for

            books = store_for(settings, tmp_path).__dict__.get("_lease_books", {})
            book = books.get(PLUGIN)
            if book is None or book.current is None:
                call(settings, tmp_path).settle(input_tokens=1, output_tokens=1)
                limits.close_stores()  # gives the child's own lease back, with its usage
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    c = limits.snapshot(settings, tmp_path, PLUGIN).counters
    assert c.day_spent == 31 * 5000 and c.day_reserved == 0
    limits.close_stores()


@pytest.mark.slow
def test_a_forked_child_runs_its_own_keeper_and_its_usage_reaches_the_store(tmp_path):
    """The child inherits the parent's books (forgotten) but not its keeper thread: without one,
    a busy child's settled usage stayed in memory, and was lost at its os._exit."""
    import sqlite3

    limits.close_stores()
    settings = parse(settings_text("local", None, "", "{budget_usd: {day: 1000}}"))
    for _ in range(30):  # the parent's book and plan exist before the fork
        call(settings, tmp_path).settle(input_tokens=1, output_tokens=1)
    limits.store_for(settings, tmp_path).return_leases(None, timeout=5)  # the book stays
    spent = lambda: sqlite3.connect(tmp_path / "limits.sqlite3").execute(  # noqa: E731 - read, no give-back
        "SELECT COALESCE(SUM(nano), 0) FROM spend WHERE bucket LIKE 'day:%'").fetchone()[0]
    before = spent()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            for _ in range(60):  # busy: admitted in memory under the child's lease
                call(settings, tmp_path).settle(input_tokens=1, output_tokens=1)
            for _ in range(100):  # the keeper hands the usage over within a pass or two
                if spent() == before + 60 * 5000:
                    code = 0
                    break
                time.sleep(0.05)
        finally:
            os._exit(code)  # no atexit handler: only the keeper can have handed the usage over
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert spent() == before + 60 * 5000


def test_a_redis_killed_under_a_busy_lease_follows_on_store_error_within_the_deadline(tmp_path, caplog):
    from tests.redis_server import RedisServer, _free_port

    server = RedisServer(_free_port(), tmp_path)
    server.start()
    limits.close_stores()
    try:
        settings = parse(settings_text("redis", server.url, "t" + uuid.uuid4().hex[:12],
                                       "{budget_usd: {day: 1000}, requests_per_minute: 100000}"))
        for _ in range(50):  # busy: a lease with spare headroom
            call(settings, tmp_path).settle(input_tokens=1, output_tokens=1)
        server.kill()

        def until_refused() -> tuple[int, PluginLlmLimitError]:
            covered = 0
            while True:  # the lease's spare, which Redis still counted, then the store is needed
                try:
                    ticket = call(settings, tmp_path, deadline=time.monotonic() + 0.4)
                except PluginLlmLimitError as exc:
                    return covered, exc
                ticket.settle(input_tokens=1, output_tokens=1)
                covered += 1

        covered, refused = run_bounded(until_refused, 20)  # each store step bounded by the 0.4 s deadline
        assert refused.limit == "store" and refused.config_key == "limits.on_store_error"
        assert covered <= 1024  # never more than one slice
        assert "Connection refused.;" not in str(refused) and "plugin-llm limits show" in str(refused)
        caplog.clear()
        leases._give_back_at_exit()  # what the atexit handler does, the store down: one line, no traceback
        [record] = [r for r in caplog.records if "not given back at exit" in r.getMessage()]
        assert record.levelname == "WARNING" and record.exc_info is None
    finally:
        limits.close_stores()
        server.kill()


def test_a_lease_no_store_step_ever_granted_is_dropped_at_exit_without_a_store_call(tmp_path, caplog):
    from tests.redis_server import _free_port

    limits.close_stores()
    settings = parse(settings_text("redis", f"redis://127.0.0.1:{_free_port()}/0", "t" + uuid.uuid4().hex[:12],
                                   "{requests_per_minute: 100}", "  store_timeout: 0.5\n"))
    with pytest.raises(PluginLlmLimitError) as refused:  # nothing listens there: refused (deny)
        call(settings, tmp_path)
    assert refused.value.limit == "store"
    [book] = limits.store_for(settings, tmp_path).lease_books().values()
    caplog.clear()
    leases._give_back_at_exit()
    assert book.current is None and not caplog.records  # nothing held, nothing said
    limits.close_stores()


def test_a_burst_of_calls_waiting_for_a_cold_plugins_store_step_is_covered_by_one_slice(kind, tmp_path, monkeypatch):
    k, url, prefix = kind
    settings = parse(settings_text(k, url, prefix, "{budget_usd: {day: 1000}, requests_per_minute: 100000000}"))
    call(settings, tmp_path).settle(input_tokens=10, output_tokens=10)  # quiet so far: an exact step
    store = limits.store_for(settings, tmp_path)
    book = store.lease_books()[PLUGIN]
    steps = []  # the burst's own store steps (not the keeper's)
    real = store.lease

    def counted(*a, **kw):
        if not threading.current_thread().name.startswith("plugin-llm-limits"):
            steps.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(store, "lease", counted)
    tickets, errors = [], []

    def one() -> None:
        try:
            tickets.append(call(settings, tmp_path))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def burst() -> None:
        with book.io:  # a store step in progress: the burst queues behind it
            pool = [threading.Thread(target=one) for _ in range(20)]
            for t in pool:
                t.start()
            while book.waiting < 20:
                time.sleep(0.001)
        for t in pool:
            t.join()

    run_bounded(burst, 30)
    assert errors == [] and len(tickets) == 20
    assert len(steps) <= 2  # the first waiter's step holds a slice for all of them (doubling needed ~6)
    for ticket in tickets:
        ticket.settle(input_tokens=10, output_tokens=10)
    assert limits.snapshot(settings, tmp_path, PLUGIN).counters.day_spent == 21 * (10 * 1000 + 10 * 4000)


@pytest.mark.parametrize("block", ["{budget_usd: {day: 1000}, requests_per_minute: 100000000}",
                                   "{budget_usd: {day: 1000}, max_concurrent: 1000}"], ids=["rates", "slots"])
def test_async_calls_of_a_cold_plugin_wait_for_one_store_step_not_a_thread_each(kind, tmp_path, monkeypatch, block):
    k, url, prefix = kind
    settings = parse(settings_text(k, url, prefix, block))
    hops = []
    to_thread = asyncio.to_thread
    monkeypatch.setattr(asyncio, "to_thread", lambda *a, **kw: hops.append(1) or to_thread(*a, **kw))

    async def main() -> None:
        tickets = await asyncio.gather(*(
            limits.aadmit(settings, tmp_path, PLUGIN, messages=MESSAGES, provider="custom", model="m", max_tokens=100,
                          deadline=time.monotonic() + 10) for _ in range(30)))
        for ticket in tickets:
            await ticket.asettle(input_tokens=10, output_tokens=10)

    run_bounded(lambda: asyncio.run(main()), 30)
    assert len(hops) < 10  # the calls wait on the loop for a store step in progress (a thread hop each before: 30)
    assert limits.snapshot(settings, tmp_path, PLUGIN).counters.day_spent == 30 * (10 * 1000 + 10 * 4000)


def test_async_tasks_hammering_one_budget_through_aadmit_never_overspend(kind, tmp_path):
    k, url, prefix = kind
    per_call = worst_nano(parse(settings_text(k, url, prefix, "{budget_usd: {day: 1000}}")), tmp_path)
    fits = 12
    settings = parse(settings_text(k, url, prefix, "{budget_usd: {day: %r}}" % ((fits + 0.5) * per_call / NANO)))
    admitted, refused = [], []

    async def task() -> None:
        for _ in range(3):
            try:
                ticket = await limits.aadmit(settings, tmp_path, PLUGIN, messages=MESSAGES, provider="custom",
                                             model="m", max_tokens=100, deadline=time.monotonic() + 10)
            except PluginLlmLimitError as exc:
                refused.append(exc.limit)
                continue
            await asyncio.sleep(0.005)  # the provider call
            settle_worst(ticket, settings)
            admitted.append(1)

    async def main() -> None:
        await asyncio.gather(*(task() for _ in range(24)))

    run_bounded(lambda: asyncio.run(main()), 60)
    assert len(admitted) == fits and set(refused) == {"budget_usd.day"}
    assert limits.snapshot(settings, tmp_path, PLUGIN).counters.day_spent == fits * per_call


@pytest.mark.slow
def test_a_lease_step_that_times_out_after_redis_ran_it_counts_the_usage_once(own_redis_server, tmp_path):
    """A hung Redis runs a step after the client gave up on it (SIGSTOP, then SIGCONT: the request
    waited in the socket). The step is sent again, with the same usage: Redis keeps what the lease
    settled in all (in its row, then in a tombstone once the row is gone) and adds only what it lacks."""
    from plugin_llm.limits.store import StoreError

    for _ in range(3):  # a run that crosses a minute's edge sees the minute's counts start again: run it anew
        minute = int(time.time() // 60)
        limits.close_stores()
        settings = parse(settings_text("redis", own_redis_server.url, "t" + uuid.uuid4().hex[:12],
                                       "{budget_usd: {day: 10}}", "  store_timeout: 0.3\n"))
        ticket = call(settings, tmp_path)
        [book] = limits.store_for(settings, tmp_path).lease_books().values()
        own_redis_server.pause()
        try:
            ticket.settle(input_tokens=1000, output_tokens=500)  # 1000 * 1000 + 500 * 4000 nano-dollars
            for _ in range(2):  # (the keeper may try too, meanwhile: each try is one more copy in Redis's socket)
                with pytest.raises(StoreError):
                    book.give_back(0.3)
        finally:
            own_redis_server.resume()
        limits.close_stores()  # gives the lease back: the step is sent once more
        c = limits.snapshot(settings, tmp_path, PLUGIN).counters
        if int(time.time() // 60) == minute:
            break
    assert (c.day_spent, c.minute_requests, c.minute_tokens) == (3_000_000, 1, 1500)
    assert (c.in_flight, c.day_reserved) == (0, 0)
    limits.close_stores()


def test_a_lease_whose_row_another_process_purged_counts_its_usage_once(kind, tmp_path):
    """Another process's step purges a lease row that expired (a frozen process, a small grace): the
    lease's next step must add only what it had not handed over yet (Redis keeps the lease's counted
    total in a key of its own, which outlives the row)."""
    kind, url, prefix = kind
    settings = parse(settings_text(kind, url, prefix, "{budget_usd: {day: 1000}}"))
    for _ in range(40):
        call(settings, tmp_path).settle(input_tokens=1000, output_tokens=0)  # 1000 * 1000 nano each
    pending = call(settings, tmp_path)  # in flight: the lease's row stays
    [book] = limits.store_for(settings, tmp_path).lease_books().values()
    book.give_back(5)  # the 40 calls handed over; the row holds the call in flight
    other = plain_store(kind, tmp_path, url, prefix)
    later = time.time() + 3600  # when the row has expired: the other process's admission purges it
    other.settle(other.admit(PLUGIN, limits.Reservation(0, 0, 30.0), settings.for_plugin(PLUGIN), later, timeout=5),
                 0, 0, timeout=5)
    pending.settle(input_tokens=1000, output_tokens=0)
    book.give_back(5)
    c = other.counters(PLUGIN, time.time(), timeout=5)
    assert c.day_spent == 41 * 1000 * 1000
    other.close()


def test_a_reloaded_grace_and_store_timeout_reach_the_lease_book(tmp_path):
    """In-memory admissions may outlast the lease row by a slack of at most a quarter of the grace:
    a reload that lowers the grace must lower the slack of the book that already exists."""
    limits.close_stores()
    before = parse(settings_text("local", None, "", "{requests_per_minute: 1000}"))
    for _ in range(5):
        call(before, tmp_path).settle(input_tokens=1, output_tokens=1)
    [book] = limits.store_for(before, tmp_path).lease_books().values()
    assert (book.slack, book.timeout) == (2.0, 2.0)
    after = parse(settings_text("local", None, "", "{requests_per_minute: 1000}",
                                "  reservation_grace: 0.5\n  store_timeout: 0.7\n"))
    for _ in range(5):  # the first call after the reload makes a store step (the limits are new objects)
        call(after, tmp_path, deadline=time.monotonic() + 0.2).settle(input_tokens=1, output_tokens=1)
    assert limits.store_for(after, tmp_path).lease_books()[PLUGIN] is book
    assert (book.slack, book.timeout) == (0.125, 0.7)
    lease = book.current
    assert lease.admit_until in (float("-inf"), lease.expires + 0.125)
    limits.close_stores()
