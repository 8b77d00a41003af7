"""plugin_llm.limits.admit / Ticket: the one way in the gateway uses, on both stores."""

from __future__ import annotations

import asyncio
import math
import time
import uuid

import pytest
import yaml

from plugin_llm import PluginLlmQuotaError, limits
from plugin_llm.limits import NANO, PluginLlmLimitError, parse_limit_settings
from plugin_llm.types import PluginLlmUsage
from tests.bounded import run_bounded
from tests.redis_server import redis_server  # noqa: F401  (fixture)

PLUGIN = "my-plugin"
MESSAGES = [{"role": "user", "content": "Summarise the release notes in one line."}]


def settings_for(kind: str, redis_url: str | None, block: str, extra: str = ""):
    host = "limits:\n"
    if kind == "redis":
        host += f"  store: redis\n  redis_url: {redis_url}\n  redis_key_prefix: t{uuid.uuid4().hex[:12]}\n"
    host += '  prices:\n    "custom/m": {input_per_mtok: 1.0, output_per_mtok: 4.0}\n' + extra
    data = yaml.safe_load(host + f"plugins:\n  entries:\n    {PLUGIN}:\n      limits: {block}\n")
    settings, issues = parse_limit_settings(data["limits"], data["plugins"])
    assert [str(i) for i in issues] == []
    return settings


@pytest.fixture(params=["local", "redis"])
def kind(request):
    limits.close_stores()
    yield request.param, (request.getfixturevalue("redis_server").url if request.param == "redis" else None)
    limits.close_stores()


def call(settings, home, **kw):
    args = dict(messages=MESSAGES, provider="custom", model="m", max_tokens=100, deadline=time.monotonic() + 10)
    args.update(kw)
    return limits.admit(settings, home, PLUGIN, **args)


def test_a_plugin_without_limits_never_touches_a_store(tmp_path):
    settings, _ = parse_limit_settings(None, None)
    ticket = call(settings, tmp_path)
    assert ticket is limits.UNLIMITED and not ticket.metered and ticket.audit_fields() == {}
    ticket.settle(PluginLlmUsage(1, 1, 2, cost_usd=1.0))
    assert not (tmp_path / "limits.sqlite3").exists()


def test_settle_counts_once_and_uses_the_operator_price(kind, tmp_path):
    settings = settings_for(*kind, "{budget_usd: {day: 1.0}}")
    ticket = call(settings, tmp_path)
    fields = ticket.audit_fields()
    assert fields["limits.reserved_tokens"] == ticket.estimate.tokens and fields["limits.reserved_usd"] > 0
    usage = PluginLlmUsage(input_tokens=1000, output_tokens=500, total_tokens=1500, cost_usd=123.0)
    ticket.settle(usage)
    ticket.settle(usage)  # a second settle (or a release) of the same ticket does nothing
    ticket.release()
    snap = limits.snapshot(settings, tmp_path, PLUGIN)
    # operator price wins over the provider-reported cost: 1000 * $1/M + 500 * $4/M
    assert snap.counters.day_spent == round(0.003 * NANO) and snap.counters.in_flight == 0


def test_a_denial_is_a_quota_error_with_the_audit_fields(kind, tmp_path):
    settings = settings_for(*kind, "{requests_per_minute: 1}")
    now = time.time()  # the instant both calls are admitted at: the window is its minute
    call(settings, tmp_path, now=now).release()
    with pytest.raises(PluginLlmQuotaError) as caught:
        call(settings, tmp_path, now=now)
    error = caught.value
    assert isinstance(error, PluginLlmLimitError)
    assert (error.plugin_id, error.limit, error.config_key) == (PLUGIN, "requests_per_minute",
                                                               "plugins.entries.my-plugin.limits.requests_per_minute")
    assert error.resets_at == (now // 60 + 1) * 60  # the end of that minute
    fields = error.denial.audit_fields()
    assert fields["decision"] == "denied" and fields["limits.limit"] == "requests_per_minute"
    assert fields["decision_key"] == error.config_key and fields["limits.resets_at"].endswith(":00.000Z")
    assert fields["decision_reason"] == str(error)


def test_a_raised_cap_applies_to_the_next_call(kind, tmp_path):
    low = settings_for(*kind, "{max_concurrent: 1}")
    held = call(low, tmp_path)
    with pytest.raises(PluginLlmLimitError):
        call(low, tmp_path)
    # what config.py's hot reload hands over on the next call: same store, new limits
    high = settings_for(*kind, "{max_concurrent: 2}")
    if kind[0] == "redis":
        high = type(high)(**{**vars(high), "redis_key_prefix": low.redis_key_prefix})
    call(high, tmp_path).release()
    held.release()


def test_the_reservation_expires_at_the_deadline_plus_the_grace(kind, tmp_path):
    settings = settings_for(*kind, "{max_concurrent: 1}", extra="  reservation_grace: 7\n")
    now = time.time()
    call(settings, tmp_path, deadline=time.monotonic() + 3, now=now)  # never settled
    with pytest.raises(PluginLlmLimitError) as caught:
        call(settings, tmp_path, now=now + 9)
    assert caught.value.resets_at == pytest.approx(now + 10, abs=0.5)
    call(settings, tmp_path, now=now + 10.5).release()


def test_async_tasks_hammering_one_budget_never_overspend(kind, tmp_path):
    settings = settings_for(*kind, "{budget_usd: {day: 1.0}}")
    probe = call(settings, tmp_path)
    probe.release()
    worst = probe.estimate
    worst_usd = worst.cost_nano / NANO
    fits = 10
    settings = settings_for(*kind, "{budget_usd: {day: %r}}" % ((fits + 0.5) * worst_usd))
    admitted = []

    async def task() -> None:
        for _ in range(3):
            try:
                ticket = await asyncio.to_thread(call, settings, tmp_path)
            except PluginLlmLimitError as exc:
                assert exc.limit == "budget_usd.day"
                continue
            await asyncio.sleep(0.02)  # the provider call
            # the actual usage is the worst case: the hardest case for the cap
            ticket.settle(input_tokens=worst.input_tokens, output_tokens=worst.output_tokens)
            admitted.append(1)

    async def main() -> None:
        await asyncio.gather(*(task() for _ in range(24)))

    asyncio.run(main())
    spent = limits.snapshot(settings, tmp_path, PLUGIN).counters.day_spent
    assert len(admitted) == fits and spent == fits * worst.cost_nano
    assert spent <= (fits + 0.5) * worst.cost_nano


@pytest.mark.slow
def test_aadmit_waits_for_a_hung_redis_off_the_event_loop(tmp_path):
    from tests.redis_server import RedisServer, _free_port

    server = RedisServer(_free_port(), tmp_path)
    server.start()
    limits.close_stores()
    try:
        settings = settings_for("redis", server.url, "{max_concurrent: 5}")
        server.pause()
        ticks: list[bool] = []  # per tick of another task: was the admission still waiting?

        async def main() -> PluginLlmLimitError:
            admission = asyncio.ensure_future(limits.aadmit(
                settings, tmp_path, PLUGIN, messages=MESSAGES, provider="custom", model="m", max_tokens=10,
                deadline=time.monotonic() + 0.4))

            async def ticker() -> None:
                while True:
                    await asyncio.sleep(0.01)
                    ticks.append(admission.done())

            tick = asyncio.create_task(ticker())
            try:
                await admission
            except PluginLlmLimitError as exc:
                return exc
            finally:
                tick.cancel()
            raise AssertionError("admitted by a hung Redis")

        error = run_bounded(lambda: asyncio.run(main()), 20)  # the 0.4 s deadline ends it, not a TCP timeout
        assert error.limit == "store"
        assert False in ticks  # another task ran while the store call waited: the loop was not blocked
    finally:
        limits.close_stores()
        server.resume()
        server.kill()


def test_a_success_without_any_usage_is_charged_its_reservation(kind, tmp_path):
    settings = settings_for(*kind, "{budget_usd: {day: 1.0}, tokens_per_minute: 100000}")
    ticket = call(settings, tmp_path)
    ticket.settle(PluginLlmUsage())  # no tokens, no cost: unknown is never free
    c = limits.snapshot(settings, tmp_path, PLUGIN).counters
    assert (c.day_spent, c.minute_tokens) == (ticket.estimate.cost_nano, ticket.estimate.tokens)


@pytest.mark.parametrize("leased", [True, False], ids=["lease", "per call"])
def test_settling_garbage_numbers_never_raises_and_charges_the_worst_case(kind, tmp_path, monkeypatch, leased):
    from plugin_llm.limits import leases

    monkeypatch.setattr(leases, "ENABLED", leased)
    settings = settings_for(*kind, "{budget_usd: {day: 1.0}, tokens_per_minute: 100000}")
    ticket = call(settings, tmp_path)
    assert isinstance(ticket, leases.LeasedTicket) is leased
    ticket.settle(input_tokens="many", output_tokens=float("nan"), cost_usd="free")  # a host's own transport
    limits.close_stores()
    c = limits.snapshot(settings, tmp_path, PLUGIN).counters
    assert (c.day_spent, c.minute_tokens) == (ticket.estimate.cost_nano, ticket.estimate.tokens)


@pytest.mark.parametrize("on_store_error", ["deny", "allow"])
def test_a_store_defect_refuses_the_call_even_when_store_errors_allow_it(tmp_path, caplog, on_store_error):
    """``allow`` is for a store that is down or slow; a defect must never admit a call unmetered."""
    class Broken(limits.LimitStore):
        def admit(self, *a, **k):
            raise KeyError("bug")

        settle = counters = reset = admit
        breaker_acquire = breaker_report = breaker_states = breaker_reset = admit

    settings = settings_for("local", None, "{max_concurrent: 1}", extra=f"  on_store_error: {on_store_error}\n")
    with pytest.raises(PluginLlmLimitError) as caught:
        call(settings, tmp_path, store=Broken())
    assert caught.value.limit == "store" and "KeyError" in str(caught.value)
    assert "whatever limits.on_store_error says" in str(caught.value)
    assert "failed unexpectedly" in caplog.text


@pytest.mark.parametrize("on_store_error", ["deny", "allow"])
def test_a_huge_max_tokens_is_refused_by_the_limit_not_by_an_overflow(kind, tmp_path, on_store_error):
    """A max_tokens the gateway accepts (< 2**63) reserves at most MAX_CALL_TOKENS tokens and
    MAX_CALL_NANO nano-dollars: still over every cap an operator can set, and no 64-bit overflow
    in a store (which read as a store failure: unmetered under ``allow``)."""
    extra = f"  on_store_error: {on_store_error}\n"
    budget = settings_for(*kind, "{budget_usd: {day: 1.0}}", extra)
    with pytest.raises(PluginLlmLimitError) as caught:
        call(budget, tmp_path, max_tokens=2**62)
    assert (caught.value.limit, caught.value.resets_at) == ("budget_usd.day", None)  # alone over the cap
    rpm = settings_for(*kind, "{requests_per_minute: 2}", extra)  # no budget: only the token count is huge
    tickets = [call(rpm, tmp_path, max_tokens=2**63 - 1) for _ in range(2)]
    assert all(t.metered and t.store_error is None for t in tickets)
    assert tickets[0].estimate.tokens <= 2 * limits.MAX_CALL_TOKENS
    with pytest.raises(PluginLlmLimitError) as caught:
        call(rpm, tmp_path, max_tokens=2**63 - 1)
    assert caught.value.limit == "requests_per_minute"


def test_usage_counters_saturate_instead_of_overflowing(kind, tmp_path):
    """A provider may report any cost (the transport accepts up to $1e9 a call): settled usage is
    clamped per call (MAX_CALL_NANO) and the stores' counters saturate at MAX_TOTAL, far from a
    64-bit overflow (a store failure on every later step: the plugin unmetered under ``allow``)."""
    settings = settings_for(*kind, "{requests_per_minute: 1000000}", "  on_store_error: allow\n")
    calls = limits.MAX_TOTAL // limits.MAX_CALL_NANO + 50
    for _ in range(calls):
        ticket = call(settings, tmp_path)
        assert ticket.metered
        ticket.settle(cost_usd=9e8, input_tokens=2**62, output_tokens=7)
    limits.close_stores()
    c = limits.snapshot(settings, tmp_path, PLUGIN).counters
    assert c.day_spent == c.month_spent == limits.MAX_TOTAL
    assert (c.minute_requests, c.minute_tokens) == (calls, calls * (limits.MAX_CALL_TOKENS + 7))
    assert call(settings, tmp_path).metered  # still metered


def test_views_show_each_plugin_with_usage_or_the_store_error(kind, tmp_path):
    from plugin_llm.limits import views

    settings = settings_for(*kind, "{budget_usd: {day: 2.0, month: 30}, max_concurrent: 4}")
    call(settings, tmp_path).settle(PluginLlmUsage(input_tokens=100_000, output_tokens=50_000, total_tokens=150_000))
    held = call(settings, tmp_path)
    rows = views.show(settings, tmp_path, [PLUGIN, "no-limits", PLUGIN])
    assert [r.plugin_id for r in rows] == [PLUGIN, "no-limits"]
    mine, other = rows
    assert views.describe(mine.limits) == "budget $2.00/day, $30.00/month; 4 in flight"
    assert views.describe(other.limits) == "no limits" and other.snapshot is None
    text = "\n".join(views.format_rows(rows))
    assert "budget_usd.day" in text and "$0.30 used" in text and "1 in flight" in text and "resets " in text
    summary = views.budget_summary(mine)
    assert summary["day"]["spent_usd"] == pytest.approx(0.3) and summary["day"]["budget_usd"] == 2.0
    assert summary["month"]["resets_at"].endswith("T00:00:00.000Z")
    forgotten = limits.reset(settings, tmp_path, PLUGIN)  # what the store deleted, read in the same step
    assert (forgotten.minute_requests, forgotten.minute_tokens) == (1, 150_000)
    assert forgotten.day_spent == forgotten.month_spent == mine.snapshot.counters.day_spent > 0
    event = views.reset_event(views.reset_target(PLUGIN, settings, tmp_path), forgotten, 1)
    assert event["plugin_id"] == PLUGIN and event["store"] == settings.store
    assert event["forgotten.spent_usd.day"] == pytest.approx(0.3) and event["kept.in_flight"] == 1
    assert ("redis_key_prefix" in event) == (settings.store == "redis") != ("store_path" in event)
    assert limits.reset(settings, tmp_path, PLUGIN) == limits.Counters()  # nothing left to forget
    held.release()
    assert mine.as_dict()["usage"]["spent_usd"]["day"] == pytest.approx(0.3)


def test_views_show_a_broken_store_per_plugin(tmp_path):
    from plugin_llm.limits import views

    (tmp_path / "limits.sqlite3").write_bytes(b"not a database" * 64)
    limits.close_stores()
    settings = settings_for("local", None, "{max_concurrent: 1}")
    (row,) = views.show(settings, tmp_path, [PLUGIN])
    assert row.snapshot is None and "not a database" in row.error
    assert "usage unknown" in "\n".join(views.format_rows([row]))
    limits.close_stores()


def _hold_the_local_store(home, seconds: float | None = None):
    """Another process's writer holding the local store's lock (released after ``seconds``)."""
    import sqlite3
    import threading

    other = sqlite3.connect(home / "limits.sqlite3", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    if seconds is not None:
        threading.Timer(seconds, lambda: (other.execute("COMMIT"), other.close())).start()
    return other


@pytest.mark.slow
def test_an_async_call_cancelled_during_its_store_step_leaks_no_reservation(tmp_path):
    settings = settings_for("local", None, "{max_concurrent: 1}")
    call(settings, tmp_path).release()  # the database exists
    limits.close_stores()  # no lease left: the next call makes a store step
    _hold_the_local_store(tmp_path, 0.5)  # the step waits for the lock, then admits

    async def main():
        with pytest.raises(asyncio.TimeoutError):  # the caller gives up while the step runs
            await asyncio.wait_for(limits.aadmit(settings, tmp_path, PLUGIN, messages=MESSAGES, provider="custom",
                                                 model="m", max_tokens=10, deadline=time.monotonic() + 20), 0.1)
        for _ in range(200):  # until the step's thread is done (its ticket released on the loop)
            await asyncio.sleep(0.05)
            if limits.snapshot(settings, tmp_path, PLUGIN).counters.in_flight == 0:
                break
        ticket = await limits.aadmit(settings, tmp_path, PLUGIN, messages=MESSAGES, provider="custom", model="m",
                                     max_tokens=10, deadline=time.monotonic() + 20)
        ticket.release()  # max_concurrent 1: admitted, so nothing was left in flight

    run_bounded(lambda: asyncio.run(main()), 30)


@pytest.mark.slow
def test_async_calls_waiting_for_a_hung_store_wait_store_timeout_all_told(tmp_path, monkeypatch):
    """A call that waits for another call's store step, then makes its own, gets only what is left
    of ``limits.store_timeout``: refused within it, as the README says, not after k times it. Every
    store step of an async call is bounded by the end of its whole wait, and a step whose wait is
    over gets no time at all."""
    from plugin_llm.limits import admission, leases, plans

    settings = settings_for("local", None, "{requests_per_minute: 1000}", "  store_timeout: 0.3\n")
    call(settings, tmp_path).release()
    limits.close_stores()
    held = _hold_the_local_store(tmp_path)  # hung for the whole test
    bounds: list[float] = []
    steps: list[float] = []
    admit_store, book_admit = admission._admit_store, leases.LeaseBook.admit

    def recording_store(*args):
        bounds.append(args[-1])  # wait_until: the end of the call's whole wait
        return admit_store(*args)

    def recording_step(self, *args, timeout, **kw):
        steps.append(timeout)
        return book_admit(self, *args, timeout=timeout, **kw)

    monkeypatch.setattr(admission, "_admit_store", recording_store)
    monkeypatch.setattr(leases.LeaseBook, "admit", recording_step)

    async def one():
        with pytest.raises(PluginLlmLimitError) as caught:
            await limits.aadmit(settings, tmp_path, PLUGIN, messages=MESSAGES, provider="custom", model="m",
                                max_tokens=10, deadline=time.monotonic() + 20)
        return caught.value.limit

    async def main():
        return await asyncio.gather(*(one() for _ in range(4)))

    try:
        assert run_bounded(lambda: asyncio.run(main()), 30) == ["store"] * 4
        assert len(bounds) == 4 and all(math.isfinite(b) for b in bounds)  # each step is bounded
        steps.clear()
        plan = plans.plan_for(settings, tmp_path, PLUGIN, "custom", "m", 10)
        with pytest.raises(PluginLlmLimitError) as caught:  # a step whose wait is over: no time left
            admit_store(plan, 10, None, time.monotonic() + 20, time.time(), None, None, time.monotonic() - 1)
    finally:
        held.close()
    assert caught.value.limit == "store" and steps == [0.0]


# --- requests that call no model (ctx.call_mcp) -----------------------------------------------


def _request(settings, home):
    return limits.admit_request(settings, home, PLUGIN, deadline=time.monotonic() + 10)


def test_a_request_counts_under_requests_per_minute_with_the_model_calls(kind, tmp_path):
    settings = settings_for(*kind, "{requests_per_minute: 2}")
    call(settings, tmp_path).settle(PluginLlmUsage(10, 10, 20))
    _request(settings, tmp_path).release()
    with pytest.raises(PluginLlmQuotaError) as refused:
        _request(settings, tmp_path)
    assert refused.value.limit == "requests_per_minute"
    assert refused.value.config_key == f"plugins.entries.{PLUGIN}.limits.requests_per_minute"


def test_a_request_holds_a_max_concurrent_slot_until_released(kind, tmp_path):
    settings = settings_for(*kind, "{max_concurrent: 1}")
    held = _request(settings, tmp_path)
    with pytest.raises(PluginLlmQuotaError) as refused:
        _request(settings, tmp_path)
    assert refused.value.limit == "max_concurrent"
    held.release()
    _request(settings, tmp_path).release()


def test_a_budget_or_token_limit_alone_does_not_meter_a_request(tmp_path):
    settings = settings_for("local", None, "{budget_usd: {day: 0.000001}, tokens_per_minute: 1}")
    for _ in range(3):
        ticket = _request(settings, tmp_path)
        assert ticket is limits.UNLIMITED
    counted = settings_for("local", None, "{requests_per_minute: 5}")
    assert _request(counted, tmp_path).metered
