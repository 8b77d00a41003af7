"""Limits through the gateway: admission before the provider call, settlement after, one audit record."""

from __future__ import annotations

import asyncio
import threading

import pytest

from plugin_llm import PluginLlm, PluginLlmQuotaError, PluginLlmSchemaError
from plugin_llm import limits
from plugin_llm.config import get_config_source
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply

USER = [{"role": "user", "content": "hi"}]
#: the fake server reports 7 prompt + 3 completion tokens; at these prices one call costs
#: 7 * 1 + 3 * 2 = 13 micro-dollars, and reserves (input bound + max_tokens) far more
PRICES = "  prices:\n    custom/m: {input_per_mtok: 1.0, output_per_mtok: 2.0}\n"


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


def configure(home, base_url: str, block: str, host: str = PRICES) -> None:
    write_config(home, (
        f"model:\n  provider: custom\n  model: m\n  base_url: {base_url}\n"
        f"limits:\n  store: local\n{host}"
        f"plugins:\n  entries:\n    capped:\n      limits:\n{block}"
    ))


def snapshot(home, plugin: str = "capped") -> dict:
    config = get_config_source(home).current()
    return limits.snapshot(config.limits, home, plugin).as_dict()


def test_requests_per_minute_refuses_before_the_provider_and_audits_the_deciding_limit(hermes_home):
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        requests_per_minute: 2\n")
        llm = PluginLlm("capped")
        llm.complete(USER)
        llm.complete(USER)
        with pytest.raises(PluginLlmQuotaError) as caught:
            llm.complete(USER)
        assert len(server.requests) == 2  # the third never reached the provider
        other = PluginLlm("free").complete(USER)  # other plugins are not limited
    message = str(caught.value)
    assert "capped" in message and "requests_per_minute" in message
    assert caught.value.config_key == "plugins.entries.capped.limits.requests_per_minute"
    assert caught.value.resets_at is not None
    lines = audit_lines(hermes_home)
    assert [line["status"] for line in lines] == ["ok", "ok", "quota", "ok"]
    denied = lines[2]
    assert denied["decision"] == "denied" and denied["limits.limit"] == "requests_per_minute"
    assert denied["decision_key"] == "plugins.entries.capped.limits.requests_per_minute"
    assert denied["limits.resets_at"] and denied["attempts"] == 0 and denied["error.type"] == "PluginLlmLimitError"
    assert lines[0]["limits.reserved_tokens"] > 0 and "limits.reserved_usd" in lines[0]
    assert "limits.reserved_usd" not in lines[3] and other.text


def test_settlement_replaces_the_reservation_with_the_actual_cost(hermes_home):
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        budget_usd: {day: 1.0, month: 5}\n")
        result = PluginLlm("capped").complete(USER, max_tokens=1000)
    assert result.usage.cost_usd == pytest.approx(13e-6)
    limits.close_stores()  # flushes queued settlements
    snap = snapshot(hermes_home)
    assert snap["in_flight"] == 0
    assert snap["spent_usd"]["day"] == pytest.approx(13e-6) and snap["reserved_usd"]["day"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("calls", [1, 40], ids=["per call", "under a lease"])
def test_a_reply_without_usage_is_charged_its_reservation_never_free(hermes_home, calls):
    """The transport reads a reply with no ``usage`` as 0 tokens at $0.0: unknown, so the
    call is charged its worst case, and a budget still stops a provider that never reports usage."""
    no_usage = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
    with FakeServer(default=Reply(body=no_usage)) as server:
        configure(hermes_home, server.base_url, "        budget_usd: {day: 1.0}\n")
        llm = PluginLlm("capped")
        admitted = 0
        with pytest.raises(PluginLlmQuotaError):
            for _ in range(calls + 400):  # each call reserves (and is charged) about $0.0042
                llm.complete(USER, max_tokens=2000)
                admitted += 1
                if admitted == calls:
                    limits.close_stores()
                    snap = snapshot(hermes_home)
                    reserved = sum(r["limits.reserved_usd"] for r in audit_lines(hermes_home))
                    assert snap["in_flight"] == 0 and snap["spent_usd"]["day"] == pytest.approx(reserved)
    assert admitted < 1.0 / 0.004


def test_a_failed_call_releases_its_reservation(hermes_home):
    with FakeServer(default=Reply.error(400, "bad request")) as server:
        configure(hermes_home, server.base_url, "        budget_usd: {day: 1.0}\n        max_concurrent: 1\n")
        llm = PluginLlm("capped")
        for _ in range(3):  # with max_concurrent 1, a leaked reservation would refuse the next call
            with pytest.raises(Exception) as caught:
                llm.complete(USER)
            assert not isinstance(caught.value, PluginLlmQuotaError)
    limits.close_stores()
    snap = snapshot(hermes_home)
    assert snap["in_flight"] == 0 and snap["spent_usd"]["day"] == 0
    assert [line["status"] for line in audit_lines(hermes_home)] == ["provider_error"] * 3


def test_a_budget_on_an_unpriced_model_is_refused_never_free(hermes_home):
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        budget_usd: {day: 1.0}\n", host="")
        with pytest.raises(PluginLlmQuotaError, match=r'limits\.prices\."custom/m"'):
            PluginLlm("capped").complete(USER)
        assert server.requests == []
    [line] = audit_lines(hermes_home)
    assert line["status"] == "quota" and line["limits.limit"] == "price"


def test_a_budget_smaller_than_one_worst_case_refuses_and_says_waiting_does_not_help(hermes_home):
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        budget_usd: {day: 0.000001}\n")
        with pytest.raises(PluginLlmQuotaError, match="budget_usd.day") as caught:
            PluginLlm("capped").complete(USER, max_tokens=1000)
        assert server.requests == []
    assert caught.value.config_key.startswith("plugins.entries.capped.limits.budget_usd")


def test_a_raised_cap_applies_to_the_next_call(hermes_home):
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        requests_per_minute: 1\n")
        llm = PluginLlm("capped")
        llm.complete(USER)
        with pytest.raises(PluginLlmQuotaError):
            llm.complete(USER)
        configure(hermes_home, server.base_url, "        requests_per_minute: 5\n")
        llm.complete(USER)
        assert len(server.requests) == 2


def test_malformed_limits_fail_closed_for_that_plugin_only(hermes_home):
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        requests_per_minut: 5\n")
        with pytest.raises(PluginLlmQuotaError, match="requests_per_minut"):
            PluginLlm("capped").complete(USER)
        assert PluginLlm("free").complete(USER).text
        assert len(server.requests) == 1
    assert any("did you mean 'requests_per_minute'" in w for w in get_config_source(hermes_home).current().warnings)


def test_async_calls_are_admitted_and_refused_the_same_way(hermes_home):
    async def run(llm: PluginLlm) -> list[str]:
        outcomes = []
        for _ in range(3):
            try:
                await llm.acomplete(USER)
                outcomes.append("ok")
            except PluginLlmQuotaError:
                outcomes.append("quota")
        return outcomes

    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        requests_per_minute: 2\n")
        assert asyncio.run(run(PluginLlm("capped"))) == ["ok", "ok", "quota"]
        assert len(server.requests) == 2
    assert [(line["mode"], line["status"]) for line in audit_lines(hermes_home)] == [
        ("async", "ok"), ("async", "ok"), ("async", "quota")]


def test_threads_hammering_one_budget_never_overspend_it(hermes_home):
    """Each call's worst case (64 output tokens: 128 micro-dollars + input) is reserved before it is sent,
    so however the threads interleave against a slow server, what is spent stays within the cap."""
    cap = 0.0005
    with FakeServer(default=Reply(delay=0.02)) as server:
        configure(hermes_home, server.base_url, f"        budget_usd: {{day: {cap}}}\n")
        llm = PluginLlm("capped")
        outcomes: list[str] = []
        lock = threading.Lock()

        def worker() -> None:
            for _ in range(6):
                try:
                    llm.complete(USER, max_tokens=64)
                    outcome = "ok"
                except PluginLlmQuotaError:
                    outcome = "quota"
                with lock:
                    outcomes.append(outcome)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    lines = audit_lines(hermes_home)
    assert len(lines) == len(outcomes) == 48  # every outcome audited exactly once
    assert "quota" in outcomes and "ok" in outcomes
    spent = sum(line["cost_usd"] for line in lines if line["status"] == "ok")
    assert spent <= cap
    assert sum(1 for line in lines if line["status"] == "ok") == len(server.requests)


def _charged(home) -> tuple[int, float]:
    """Tokens and dollars charged, looked at in the minute of the last call (a run that crosses a
    minute's end would otherwise read the next, empty minute's tokens)."""
    from datetime import datetime

    limits.close_stores()
    last = datetime.fromisoformat(audit_lines(home)[-1]["ts"].replace("Z", "+00:00")).timestamp()
    config = get_config_source(home).current()
    snap = limits.snapshot(config.limits, home, "capped", now=last).as_dict()
    assert snap["in_flight"] == 0
    return snap["minute"]["tokens"], snap["spent_usd"]["day"]


def _reserved(home) -> tuple[int, float]:
    lines = audit_lines(home)
    return sum(r["limits.reserved_tokens"] for r in lines), sum(r["limits.reserved_usd"] for r in lines)


def test_a_stream_abandoned_after_the_provider_answered_is_charged_its_reservation(hermes_home):
    """The provider bills what it generated; how much is unknown once the consumer stops reading
    (before the usage chunk): charged the worst case, so breaking out early is never free."""
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        tokens_per_minute: 100000\n        budget_usd: {day: 1.0}\n")
        llm = PluginLlm("capped")
        for _ in range(3):
            with llm.stream(USER, max_tokens=50) as stream:
                for _delta in stream:
                    break
    assert [r["status"] for r in audit_lines(hermes_home)] == ["abandoned"] * 3
    tokens, usd = _reserved(hermes_home)
    assert _charged(hermes_home) == (tokens, pytest.approx(usd)) and tokens > 0


def test_a_stream_without_reported_usage_is_charged_its_reservation_not_an_estimate(hermes_home):
    with FakeServer(default=Reply(usage=None)) as server:
        configure(hermes_home, server.base_url, "        budget_usd: {day: 1.0}\n")
        with PluginLlm("capped").stream(USER, max_tokens=1000) as stream:
            text = "".join(stream)
        result = stream.result
    assert text == "ok" and result.usage.estimated  # what the result says: litellm's estimate from the text
    tokens, usd = _reserved(hermes_home)
    assert tokens > 1000 and _charged(hermes_home) == (tokens, pytest.approx(usd))


@pytest.mark.slow
def test_a_request_that_timed_out_is_charged_its_reservation(hermes_home):
    from plugin_llm import PluginLlmTimeoutError

    with FakeServer(default=Reply(delay=1.0)) as server:  # the provider may bill what it went on to generate
        configure(hermes_home, server.base_url, "        budget_usd: {day: 1.0}\n")
        with pytest.raises(PluginLlmTimeoutError):
            PluginLlm("capped").complete(USER, max_tokens=100, timeout=0.3)
    tokens, usd = _reserved(hermes_home)
    assert _charged(hermes_home) == (tokens, pytest.approx(usd)) and tokens > 100


def test_a_stream_the_provider_cuts_short_is_charged_its_reservation(hermes_home):
    from tests.stream_server import Stream, StreamServer

    with StreamServer(default=Stream(pieces=["x" * 40] * 5, cut_after=3)) as server:
        configure(hermes_home, server.base_url, "        tokens_per_minute: 100000\n")
        delivered = []
        with pytest.raises(Exception) as caught:
            for delta in PluginLlm("capped").stream(USER, max_tokens=500):
                delivered.append(delta)
    assert delivered and not isinstance(caught.value, PluginLlmQuotaError)
    tokens, _ = _reserved(hermes_home)
    assert _charged(hermes_home)[0] == tokens > 500


@pytest.mark.slow
def test_an_async_stream_cancelled_while_it_waits_for_the_store_is_recorded_as_abandoned(hermes_home):
    from tests.test_limits_admission import _hold_the_local_store

    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        max_concurrent: 1\n")
        llm = PluginLlm("capped")
        llm.complete(USER)  # the store exists
        limits.close_stores()  # no lease: the next call makes a store step
        held = _hold_the_local_store(hermes_home)

        async def main():
            async def consume():
                async with llm.astream(USER, max_tokens=20) as stream:
                    async for _delta in stream:
                        pass

            task = asyncio.create_task(consume())
            for _ in range(20):  # until it waits for the store step (on a worker thread)
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            held.close()  # the step's thread ends (its ticket is released)

        try:
            asyncio.run(main())
        finally:
            held.close()
        assert len(server.requests) == 1
    last = audit_lines(hermes_home)[-1]
    assert (last["status"], last["error.type"], last.get("stream")) == ("abandoned", None, True)


@pytest.mark.slow
def test_a_structured_repair_after_a_reload_is_admitted_under_the_new_limits(hermes_home):
    """A repair is a request of its own: a cap lowered while the first request was out applies to it."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        requests_per_minute: 100\n")
        llm = PluginLlm("capped")
        for _ in range(3):
            llm.complete(USER)
        server.push(Reply(content='{"n": "not a number"}', delay=0.6), Reply(content='{"n": 1}'))
        outcome: dict = {}

        def structured() -> None:
            try:
                outcome["parsed"] = llm.complete_structured(instructions="give n", input=[{"type": "text", "text": "n: x"}],
                                                            json_schema=schema).parsed
            except PluginLlmSchemaError as exc:  # no repair could be sent: the reply it paid for is the outcome
                outcome["schema_error"] = (exc.text, str(exc))

        worker = threading.Thread(target=structured)
        worker.start()
        for _ in range(100):  # until the first request is out
            if len(server.requests) == 4:
                break
            threading.Event().wait(0.01)
        configure(hermes_home, server.base_url, "        requests_per_minute: 4\n")  # 4 used already
        worker.join(10)
        assert len(server.requests) == 4  # the repair never reached the provider
    text, message = outcome["schema_error"]
    assert text == '{"n": "not a number"}' and "after 0 repair attempt(s)" in message
    assert "no further repair was sent" in message and "requests_per_minute" in message
    last = audit_lines(hermes_home)[-1]  # one record: the schema mismatch, with the limit that stopped the repair
    assert (last["status"], last["repairs"], last["validation"], last["attempts"]) == ("schema_error", 0, "failed", 1)
    assert last["limits.repair_refused"] == "requests_per_minute" and last["gen_ai.usage.output_tokens"] > 0
    assert last["limits.repair_refused_key"].endswith("requests_per_minute")
    assert last.get("decision") != "denied"  # a paid call, not a denial: audit stats counts it as an error


_STREAMER = '''
def register(ctx):
    def bad(raw=""):
        stream = ctx.llm.stream([{"role": "user", "content": "one two three four five six"}], max_tokens=64)
        for _delta in stream:
            raise RuntimeError("plugin bug mid-stream")
    def probe(raw):
        ctx.llm.complete([{"role": "user", "content": "hi"}], max_tokens=8)
        return "admitted"
    ctx.register_command("bad", bad)
    ctx.register_command("probe", probe)
    ctx.register_tool("bad_tool", {"name": "bad_tool", "parameters": {"type": "object", "properties": {}}},
                      lambda args: bad())
    ctx.register_hook("on_session_start", lambda **kw: bad())
'''


def test_a_stream_a_plugin_abandons_by_raising_gives_its_slot_back_at_once(hermes_home):
    """The host keeps (a hook's outcome) or re-raises (a command's) the plugin's error; its frames held
    the stream, whose slot and reservation then waited for the cyclic garbage collector."""
    import gc

    from plugin_llm.plugins import PluginManager
    from tests.plugin_fixtures import write_plugin

    write_plugin(hermes_home / "plugins", "streamer", _STREAMER)
    write_config(hermes_home, "model: {provider: local, model: local-echo-1}\nlimits: {store: local}\n"
                              "plugins:\n  enabled: [streamer]\n  entries:\n    streamer: {limits: {max_concurrent: 1}}\n")
    manager = PluginManager(hermes_home)
    manager.discover_plugins()
    gc.disable()  # what is freed must be freed by reference counting alone
    try:
        for how in ("command", "tool", "hook"):
            if how == "command":
                with pytest.raises(RuntimeError, match="mid-stream"):
                    manager.run_command("bad", "")
            elif how == "tool":
                assert "mid-stream" in manager.dispatch_tool("bad_tool", {})
            else:
                manager.invoke_hook("on_session_start", session_id="s", model="m", platform="cli")
            assert manager.run_command("probe", "") == "admitted", how  # the slot is free again
    finally:
        gc.enable()
        manager.shutdown()
    statuses = [r["status"] for r in audit_lines(hermes_home)]
    assert statuses == ["abandoned", "ok"] * 3, statuses


# --- a limit that counts output sends the output bound it reserved -----------------------------------

#: the provider answers at its own length unless the request bounds it: 100k tokens = $2.00 here
LONG = 100_000
EXPENSIVE = "  prices:\n    custom/m: {input_per_mtok: 1.0, output_per_mtok: 20.0}\n"


def _own_length(request_json, headers, path):
    bound = request_json.get("max_tokens") or request_json.get("max_completion_tokens")
    completion = min(bound, LONG) if isinstance(bound, int) else LONG
    return 200, {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
                 "usage": {"prompt_tokens": 7, "completion_tokens": completion, "total_tokens": 7 + completion}}


def _sent_bound(request) -> object:
    body = request.json or {}
    return body.get("max_tokens", body.get("max_completion_tokens"))


@pytest.fixture(params=["fast", "fallback"])
def path(request, monkeypatch):
    from plugin_llm.transport import _fastpath

    if request.param == "fallback":
        monkeypatch.setenv(_fastpath.FAST_PATH_ENV, "0")
    return request.param


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_budget_sends_the_output_bound_it_reserved_so_the_charge_stays_within_it(hermes_home, path, mode):
    """On a $1.00 day, a call without max_tokens reserved ~$0.08 and the provider answered 100k tokens
    ($2.00): the bound reserved is now sent, so the provider stops there and the charge stays within it."""
    with FakeServer(default=Reply(body=_own_length)) as server:
        configure(hermes_home, server.base_url, "        budget_usd: {day: 1.0}\n", EXPENSIVE)
        llm = PluginLlm("capped")
        result = llm.complete(USER) if mode == "sync" else asyncio.run(llm.acomplete(USER))
        assert _sent_bound(server.requests[-1]) == 4096  # limits.default_max_output_tokens: custom/m has no limit
    record = audit_lines(hermes_home)[-1]
    assert record["limits.max_tokens_sent"] == 4096
    assert result.usage.output_tokens == 4096
    assert 0 < result.usage.cost_usd <= record["limits.reserved_usd"] < 1.0
    limits.close_stores()
    assert snapshot(hermes_home)["spent_usd"]["day"] <= record["limits.reserved_usd"]


def test_the_bound_sent_is_the_bound_reserved(hermes_home, path):
    """The model's output limit (from the price map) when it has one; a plugin's own smaller max_tokens as
    it is; a larger one lowered to what was reserved; a token limit alone relies on the bound too."""
    host = "  prices:\n    custom/m: {input_per_mtok: 1.0, output_per_mtok: 20.0, max_output_tokens: 1000}\n"
    with FakeServer(default=Reply(body=_own_length)) as server:
        configure(hermes_home, server.base_url, "        budget_usd: {day: 1.0}\n", host)
        llm = PluginLlm("capped")
        llm.complete(USER)
        llm.complete(USER, max_tokens=200)
        configure(hermes_home, server.base_url, "        tokens_per_minute: 1000000\n", host)
        llm.complete(USER)
        sent = [_sent_bound(r) for r in server.requests]
    assert sent == [1000, 200, 1000]
    records = audit_lines(hermes_home)
    assert [r.get("limits.max_tokens_sent") for r in records] == [1000, None, 1000]
    assert all(r["gen_ai.usage.output_tokens"] <= s for r, s in zip(records, sent))


def test_no_bound_is_added_when_no_limit_counts_output(hermes_home, path):
    """An unlimited plugin, or one limited in requests or concurrency only, is sent as it asked."""
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        requests_per_minute: 100\n        max_concurrent: 2\n")
        PluginLlm("capped").complete(USER)
        PluginLlm("free").complete(USER)
        PluginLlm("free").complete(USER, max_tokens=77)
        assert [_sent_bound(r) for r in server.requests] == [None, None, 77]
    assert all("limits.max_tokens_sent" not in r for r in audit_lines(hermes_home))


def test_streams_and_structured_repairs_send_the_bound_too(hermes_home, path):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with FakeServer() as server:
        configure(hermes_home, server.base_url, "        budget_usd: {day: 1.0}\n", EXPENSIVE)
        llm = PluginLlm("capped")
        with llm.stream(USER) as stream:
            assert "".join(stream) == "ok"

        async def astream() -> str:
            async with llm.astream(USER) as chunks:
                return "".join([delta async for delta in chunks])

        assert asyncio.run(astream()) == "ok"
        server.push(Reply(content='{"n": "not a number"}'), Reply(content='{"n": 1}'))
        parsed = llm.complete_structured(instructions="give n", input=[{"type": "text", "text": "n: 1"}],
                                         json_schema=schema).parsed
        assert parsed == {"n": 1}
        assert [_sent_bound(r) for r in server.requests] == [4096] * 4  # two streams, a request and its repair
    records = audit_lines(hermes_home)
    assert [r["limits.max_tokens_sent"] for r in records] == [4096] * 3 and records[-1]["repairs"] == 1


def test_the_bound_goes_by_the_providers_own_name(hermes_home, path):
    """OpenAI's reasoning models take max_completion_tokens (litellm maps max_tokens per provider)."""
    with FakeServer(default=Reply(body=_own_length)) as server:
        write_config(hermes_home, (
            f"model:\n  provider: custom\n  model: o3-mini\n  base_url: {server.base_url}\n"
            "limits:\n  store: local\n  prices:\n    custom/o3-mini: {input_per_mtok: 1.0, output_per_mtok: 20.0}\n"
            "plugins:\n  entries:\n    capped:\n      limits:\n        budget_usd: {day: 1.0}\n"
        ))
        result = PluginLlm("capped").complete(USER)
        body = server.requests[-1].json
    assert body.get("max_completion_tokens") == 4096 and "max_tokens" not in body
    assert result.usage.output_tokens == 4096
