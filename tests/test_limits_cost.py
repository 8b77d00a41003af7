"""What a limited call costs the caller's books: the operator's price applied exactly (result,
audit record, budget), tickets settled exactly once however many threads race, and the in-memory
(lease) path reporting and settling like the store path. Guards for the cheaper code paths of
the limits' cost targets (``_operator_priced``/``_with_field``, ``Ticket``, ``LeasedTicket``)."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import pytest

from plugin_llm import PluginLlm, limits
from plugin_llm.config import get_config_source
from plugin_llm.limits import NANO, leases
from plugin_llm.limits.local import LocalStore
from plugin_llm.llm import _with_field
from plugin_llm.transport import TransportResponse
from plugin_llm.types import PluginLlmUsage
from tests.bounded import run_bounded
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply

USER = [{"role": "user", "content": "hi"}]
IN_PRICE, OUT_PRICE = 0.15, 0.6  # US dollars per million tokens
USAGE = {"prompt_tokens": 1234, "completion_tokens": 567, "total_tokens": 1801}
#: what the operator's price makes of USAGE: the same arithmetic as the budget's
EXPECTED_NANO = math.ceil(1234 * (IN_PRICE * NANO / 1e6) + 567 * (OUT_PRICE * NANO / 1e6))


@pytest.fixture(autouse=True)
def _fresh_stores():
    limits.close_stores()
    yield
    limits.close_stores()


def configure(home, base_url: str, block: str = "        budget_usd: {day: 10, month: 50}\n") -> None:
    write_config(home, (
        f"model:\n  provider: custom\n  model: m\n  base_url: {base_url}\n"
        "limits:\n  store: local\n"
        f"  prices:\n    custom/m: {{input_per_mtok: {IN_PRICE}, output_per_mtok: {OUT_PRICE}}}\n"
        f"plugins:\n  entries:\n    capped:\n      limits:\n{block}"
    ))


def spent_nano(home, plugin: str = "capped") -> int:
    config = get_config_source(home).current()
    limits.close_stores()  # hands leased and queued usage to the store
    return round(limits.snapshot(config.limits, home, plugin).as_dict()["spent_usd"]["day"] * NANO)


def test_the_operator_price_is_the_cost_of_the_result_the_record_and_the_budget_exactly(hermes_home):
    reply = Reply(content="priced", usage=USAGE, finish_reason="stop")
    with FakeServer(default=reply) as server:
        configure(hermes_home, server.base_url)
        capped = PluginLlm("capped").complete(USER, max_tokens=900)
        free = PluginLlm("free").complete(USER, max_tokens=900)  # no limits: the operator's price all the same
        streamed = PluginLlm("capped").stream(USER, max_tokens=900)
        text = "".join(streamed)
    for result in (capped, free, streamed.result):
        assert result.usage.cost_usd == EXPECTED_NANO / NANO
        assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.total_tokens) == (1234, 567, 1801)
    assert capped.text == "priced" == text and capped.model == "fake-model-2024-01-01"
    records = [line for line in audit_lines(hermes_home) if line.get("status") == "ok"]
    assert [r["cost_usd"] for r in records] == [EXPECTED_NANO / NANO] * 3
    assert spent_nano(hermes_home) == 2 * EXPECTED_NANO  # the two calls of the limited plugin, to the nano-dollar


def test_a_provider_reported_cost_gives_way_to_the_operator_price(hermes_home):
    def body(request, headers, path):
        return 200, {"id": "c1", "object": "chat.completion", "model": "m", "usage": {**USAGE, "cost": 0.5},
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": "ok"}}]}

    with FakeServer(default=Reply(body=body)) as server:
        configure(hermes_home, server.base_url)
        result = PluginLlm("capped").complete(USER, max_tokens=900)
    assert result.usage.cost_usd == EXPECTED_NANO / NANO
    assert spent_nano(hermes_home) == EXPECTED_NANO


def test_with_field_is_dataclasses_replace_for_the_response_and_usage_types():
    usage = PluginLlmUsage(input_tokens=3, output_tokens=4, total_tokens=7, cache_read_tokens=1, cost_usd=None,
                           estimated=True)
    response = TransportResponse(text="t", message={"role": "assistant", "content": "t"}, model="m", usage=usage,
                                 attempts=2, provider_seconds=0.25, finish_reason="length", anomalies=("a",))
    priced = _with_field(usage, "cost_usd", 1.5e-6)
    assert priced == dataclasses.replace(usage, cost_usd=1.5e-6) and usage.cost_usd is None
    copied = _with_field(response, "usage", priced)
    assert copied == dataclasses.replace(response, usage=priced) and response.usage is usage
    assert type(copied) is TransportResponse and hash(priced) == hash(dataclasses.replace(usage, cost_usd=1.5e-6))
    with pytest.raises(dataclasses.FrozenInstanceError):
        copied.usage = usage  # still frozen

    @dataclasses.dataclass(frozen=True)
    class Checked(PluginLlmUsage):  # anything else goes through replace (its __post_init__ runs)
        def __post_init__(self) -> None:
            if self.cost_usd is not None and self.cost_usd < 0:
                raise ValueError("negative cost")

    with pytest.raises(ValueError, match="negative cost"):
        _with_field(Checked(), "cost_usd", -1.0)


def _settings(home, block: str):
    write_config(home, (
        "limits:\n  store: local\n"
        f"  prices:\n    custom/m: {{input_per_mtok: {IN_PRICE}, output_per_mtok: {OUT_PRICE}}}\n"
        f"plugins:\n  entries:\n    capped:\n      limits:\n{block}"
    ))
    return get_config_source(home).current().limits


def _admit(settings, home):
    return limits.admit(settings, home, "capped", messages=USER, provider="custom", model="m", max_tokens=100,
                        deadline=time.monotonic() + 10)


@pytest.mark.parametrize("leased", [True, False], ids=["lease", "per-call"])
def test_a_ticket_settled_by_many_threads_at_once_counts_once(hermes_home, monkeypatch, leased):
    monkeypatch.setattr(leases, "ENABLED", leased)
    settings = _settings(hermes_home, "        budget_usd: {day: 10}\n        max_concurrent: 2\n")
    for _ in range(40):  # a busy plugin: with leases, the later tickets come from memory
        _admit(settings, hermes_home).settle(input_tokens=10, output_tokens=10)
    ticket = _admit(settings, hermes_home)
    assert isinstance(ticket, leases.LeasedTicket) is leased
    gate = threading.Barrier(16)

    def settle() -> None:
        gate.wait()
        ticket.settle(input_tokens=1000, output_tokens=1000)
        ticket.release()

    def race() -> None:
        pool = [threading.Thread(target=settle) for _ in range(16)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    run_bounded(race, 20)
    per_call = math.ceil(10 * (IN_PRICE * NANO / 1e6) + 10 * (OUT_PRICE * NANO / 1e6))
    once = math.ceil(1000 * (IN_PRICE * NANO / 1e6) + 1000 * (OUT_PRICE * NANO / 1e6))
    snap_nano = spent_nano(hermes_home)
    assert snap_nano == 40 * per_call + once
    config = get_config_source(hermes_home).current()
    assert limits.snapshot(config.limits, hermes_home, "capped").as_dict()["in_flight"] == 0  # max_concurrent freed


def test_a_call_admitted_in_memory_reports_and_settles_like_one_the_store_admitted(hermes_home, monkeypatch):
    steps = []
    real = LocalStore.lease
    monkeypatch.setattr(LocalStore, "lease", lambda self, *a, **kw: steps.append(1) or real(self, *a, **kw))
    settings = _settings(hermes_home, "        budget_usd: {day: 10}\n        tokens_per_minute: 10000000\n")
    tickets = [_admit(settings, hermes_home) for _ in range(40)]
    assert all(isinstance(t, leases.LeasedTicket) for t in tickets)
    assert len(steps) < 20  # most of them were admitted in memory
    for ticket in (tickets[0], tickets[-1]):  # a store step's and an in-memory admission's
        fields = ticket.audit_fields()
        assert fields == {"limits.reserved_usd": ticket.estimate.cost_nano / NANO,
                          "limits.reserved_tokens": ticket.estimate.tokens,
                          "limits.reserved_input_tokens": ticket.estimate.input_tokens,
                          "limits.input_count": "bound"}  # (a custom model: no tokenizer)
    for ticket in tickets:
        ticket.settle(input_tokens=5, output_tokens=5)
    per_call = math.ceil(5 * (IN_PRICE * NANO / 1e6) + 5 * (OUT_PRICE * NANO / 1e6))
    old_book = tickets[-1].lease.book
    assert spent_nano(hermes_home) == 40 * per_call  # spent_nano closed the stores, and their lease books
    assert old_book.closed
    again = _admit(settings, hermes_home)  # a new store and book, not the closed one remembered from before
    assert again.lease.book is not old_book and not again.lease.book.closed
    again.settle(input_tokens=5, output_tokens=5)
    assert spent_nano(hermes_home) == 41 * per_call


def test_a_busy_plugins_calls_are_admitted_in_the_flow_and_only_store_steps_reach_the_shell(hermes_home, monkeypatch):
    with FakeServer() as server:
        configure(hermes_home, server.base_url)
        shell_admissions = []
        real = limits.admit
        monkeypatch.setattr(limits, "admit", lambda *a, **kw: shell_admissions.append(1) or real(*a, **kw))
        llm = PluginLlm("capped")
        results = [llm.complete(USER, max_tokens=50) for _ in range(30)]
    assert 0 < len(shell_admissions) < 15  # the first calls needed the store; the busy rest were admitted in memory
    records = [line for line in audit_lines(hermes_home) if line.get("status") == "ok"]
    assert len(records) == 30 and all(r["limits.reserved_tokens"] > 50 for r in records)
    assert spent_nano(hermes_home) == round(sum(r.usage.cost_usd for r in results) * NANO)


def test_admit_in_memory_never_waits_for_the_store_and_refuses_what_needs_no_store(hermes_home):
    settings = _settings(hermes_home, "        budget_usd: {day: 10}\n")
    args = (USER, "custom", "m", 100, time.monotonic() + 10, ())
    assert limits.admit_in_memory(settings, hermes_home, "other", *args) is limits.UNLIMITED
    assert limits.admit_in_memory(settings, hermes_home, "capped", *args) is None  # no lease yet: the store decides
    with pytest.raises(limits.PluginLlmLimitError) as refused:
        limits.admit_in_memory(settings, hermes_home, "capped", USER, "custom", "unpriced", 100, time.monotonic() + 10)
    assert refused.value.denial.limit == "price" and 'limits.prices."custom/unpriced"' in str(refused.value)


def test_the_gateways_transport_applies_the_operator_price_and_another_transport_gets_it_applied(hermes_home):
    """``TransportRequest.cost`` is the operator's price: the litellm transport reports it
    (``priced``); a transport that ignores it is priced by the gateway, to the same number."""
    seen = []

    class Own:  # a host's own transport: answers the provider's cost, knows nothing of prices
        def complete(self, request):
            seen.append(request)
            usage = PluginLlmUsage(input_tokens=1234, output_tokens=567, total_tokens=1801, cost_usd=0.5)
            return TransportResponse(text="own", message={"role": "assistant", "content": "own"}, model="m",
                                     usage=usage, attempts=1, provider_seconds=0.001)

    reply = Reply(content="priced", usage=USAGE, finish_reason="stop")
    with FakeServer(default=reply) as server:
        configure(hermes_home, server.base_url)
        own = PluginLlm("capped", transport=Own()).complete(USER, max_tokens=900)
        from plugin_llm.transport import LitellmTransport

        ours = LitellmTransport().complete(seen[0])
    assert seen[0].cost is not None and seen[0].cost(None, None, 1234, 567) == EXPECTED_NANO / NANO
    assert ours.priced and ours.usage.cost_usd == EXPECTED_NANO / NANO
    assert own.usage.cost_usd == EXPECTED_NANO / NANO
    assert spent_nano(hermes_home) == EXPECTED_NANO
    write_config(hermes_home, "model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:9/v1\n")
    PluginLlm("capped", transport=Own()).complete(USER)
    assert seen[-1].cost is None  # no limits.prices: the transport's own price map decides


def test_an_operator_price_for_the_embedded_local_model_is_its_cost(hermes_home):
    write_config(hermes_home, (
        "model:\n  provider: local\n  model: local-echo-1\n"
        "limits:\n  prices:\n    local/local-echo-1: {input_per_mtok: 1.0, output_per_mtok: 2.0}\n"))
    result = PluginLlm("p").complete(USER)
    usage = result.usage
    expected = math.ceil(usage.input_tokens * (1.0 * NANO / 1e6) + usage.output_tokens * (2.0 * NANO / 1e6))
    assert usage.input_tokens > 0 and usage.cost_usd == expected / NANO
    write_config(hermes_home, "model:\n  provider: local\n  model: local-echo-1\n")
    assert PluginLlm("p").complete(USER).usage.cost_usd == 0.0  # no price set: the local model is free


def test_the_plan_of_a_call_follows_its_max_tokens_and_a_reloaded_config(hermes_home):
    settings = _settings(hermes_home, "        tokens_per_minute: 10000000\n")
    tokens = [limits.admit(settings, hermes_home, "capped", messages=USER, provider="custom", model="m",
                           max_tokens=n, deadline=time.monotonic() + 10).estimate.output_tokens
              for n in (100, 200, 100, True, 0, None)]
    assert tokens[:3] == [100, 200, 100]
    assert tokens[3:] == [settings.default_max_output_tokens] * 3  # not a token count: the default bound
    # the six calls above are still in flight
    raised = _settings(hermes_home, "        tokens_per_minute: 10000000\n        max_concurrent: 7\n")
    assert raised is not settings
    limits.admit(raised, hermes_home, "capped", messages=USER, provider="custom", model="m", max_tokens=100,
                 deadline=time.monotonic() + 10)
    with pytest.raises(limits.PluginLlmLimitError) as refused:  # the new config's cap, not the old plan's limits
        limits.admit(raised, hermes_home, "capped", messages=USER, provider="custom", model="m", max_tokens=100,
                     deadline=time.monotonic() + 10)
    assert refused.value.denial.limit == "max_concurrent"
