"""The model catalog through the gateway: aliases, the trust gate over them, fallbacks in one record."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from plugin_llm import PluginLlm, PluginLlmConfigError, PluginLlmProviderError, PluginLlmTrustError
from plugin_llm import limits
from plugin_llm.config import get_config_source, parse_config
from tests.conftest import audit_lines, write_config
from tests.redis_server import redis_server  # noqa: F401
from tests.servers import FakeServer, Reply

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


@pytest.fixture
def upstreams():
    with FakeServer() as a, FakeServer() as b:
        yield a, b


def catalog(home, a: str, b: str, *, default: str = "{route: first, fallbacks: [second]}", plugins: str = "",
            extra: str = "") -> None:
    write_config(home, (
        "models:\n"
        f"  first: {{provider: custom, model: ma, base_url: {a}}}\n"
        f"  second: {{provider: custom, model: mb, base_url: {b}}}\n"
        f"model: {default}\n"
        "llm: {max_retries: 0, breaker: false}\n"
        f"{extra}"
        f"{plugins}"
    ))


def grant(models: str, **flags: str) -> str:
    more = "".join(f", {k}: {v}" for k, v in flags.items())
    return f"plugins:\n  entries:\n    p:\n      llm: {{allow_model_override: true, allowed_models: {models}{more}}}\n"


# ------------------------------------------------------------------ the catalog in config.yaml
def test_the_catalog_parses_routes_and_the_default_route_by_name(tmp_path):
    config = parse_config(tmp_path, (
        "models:\n"
        "  fast: {provider: openai, model: gpt-4o-mini}\n"
        "  smart: {provider: anthropic, model: claude-sonnet-4-5, profile: team-b, fallbacks: [fast]}\n"
        "  local-llama: {provider: custom, model: llama3, base_url: 'http://10.0.0.5:8000/v1', timeout: 5}\n"
        "model: {route: fast, fallbacks: [local-llama]}\n"
    ))
    assert not config.warnings
    assert config.model.name == "fast" and config.model.provider == "openai" and config.model.fallbacks == ("local-llama",)
    smart = config.models["smart"]
    assert (smart.provider, smart.model, smart.profile, smart.fallbacks) == ("anthropic", "claude-sonnet-4-5", "team-b", ("fast",))
    assert config.models["local-llama"].timeout == 5.0 and config.models["local-llama"].base_url.startswith("http://10.")


def test_catalog_typos_get_a_did_you_mean_and_are_left_out(tmp_path):
    config = parse_config(tmp_path, (
        "models:\n"
        "  fast: {provider: openai, model: gpt-4o-mini, fallback: [smart]}\n"
        "  smart: {provider: anthropic, model: claude-sonnet-4-5, fallbacks: [fsat, smart]}\n"
        "  'bad/name': {provider: openai, model: gpt-4o}\n"
        "model: {route: fast}\n"
    ))
    text = "\n".join(config.warnings)
    assert "models.fast.'fallback': unknown key, ignored (did you mean 'fallbacks'?)" in text
    assert "models.smart.fallbacks: 'fsat' is not a route of models: (did you mean 'fast'?)" in text
    assert "names the route itself" in text
    assert "models.bad/name: a route name is letters" in text
    assert config.models["smart"].fallbacks == () and "bad/name" not in config.models


def test_a_default_route_naming_no_catalog_entry_refuses_calls_with_the_fix(hermes_home):
    write_config(hermes_home, "models:\n  fast: {provider: openai, model: gpt-4o-mini}\nmodel: {route: fsat}\n")
    config = get_config_source(hermes_home).current()
    assert any("did you mean 'fast'?" in w for w in config.warnings)
    with pytest.raises(PluginLlmConfigError) as caught:
        PluginLlm("p").complete(USER)
    assert "model.route 'fsat' is not a route of models: (did you mean 'fast'?)" in str(caught.value)
    [record] = audit_lines(hermes_home)
    assert record["status"] == "error" and "fsat" in record["error.message"]


def test_the_old_model_forms_still_work_and_name_no_route(tmp_path):
    for text in ("model: gpt-4o-mini\n", "model: {provider: openai, model: gpt-4o-mini}\n"):
        config = parse_config(tmp_path, text)
        assert (config.model.provider, config.model.model, config.model.name) == ("openai", "gpt-4o-mini", None)


# ------------------------------------------------------------------ aliases and the trust gate
def test_an_alias_reaches_exactly_its_route_and_the_record_names_it(hermes_home, upstreams):
    a, b = upstreams
    catalog(hermes_home, a.base_url, b.base_url, default="{route: first}", plugins=grant("[second]"))
    result = PluginLlm("p").complete(USER, model="second")
    assert result.text == "ok" and len(b.requests) == 1 and not a.requests
    assert b.requests[0].json["model"] == "mb"
    [record] = audit_lines(hermes_home)
    assert record["route"] == "second" and record["gen_ai.request.model"] == "mb"
    assert "route.attempts" not in record  # a route without fallbacks is one attempt


def test_a_raw_model_override_stays_on_the_default_route_s_endpoint(hermes_home, upstreams):
    a, b = upstreams
    catalog(hermes_home, a.base_url, b.base_url, default="{route: first}", plugins=grant("['*']"))
    PluginLlm("p").complete(USER, model="mb")  # the model name of route "second", not the route
    assert len(a.requests) == 1 and not b.requests and a.requests[0].json["model"] == "mb"
    assert "route" not in audit_lines(hermes_home)[0]


def test_an_alias_not_listed_is_refused_before_anything_is_sent(hermes_home, upstreams):
    a, b = upstreams
    catalog(hermes_home, a.base_url, b.base_url, default="{route: first}", plugins=grant("[first]"))
    with pytest.raises(PluginLlmTrustError) as caught:
        PluginLlm("p").complete(USER, model="second")
    assert "may not use the route 'second'" in str(caught.value)
    assert caught.value.config_key == "plugins.entries.p.llm.allowed_models"
    assert not a.requests and not b.requests
    assert audit_lines(hermes_home)[0]["decision"] == "denied"


def test_any_model_admits_a_route_only_on_the_call_s_provider(hermes_home, upstreams):
    a, b = upstreams
    write_config(hermes_home, (
        "models:\n"
        f"  same: {{provider: custom, model: mb, base_url: {b.base_url}}}\n"
        "  other: {provider: anthropic, model: claude-sonnet-4-5}\n"
        f"model: {{provider: custom, model: ma, base_url: {a.base_url}}}\n"
        "llm: {max_retries: 0}\n" + grant("['*']")
    ))
    llm = PluginLlm("p")
    llm.complete(USER, model="same")
    assert len(b.requests) == 1
    with pytest.raises(PluginLlmTrustError) as caught:
        llm.complete(USER, model="other")
    assert "goes to provider 'anthropic'" in str(caught.value) and "list other in" in str(caught.value)


def test_a_route_naming_its_key_profile_keeps_it_whatever_profile_the_plugin_asks(hermes_home, upstreams):
    a, b = upstreams
    write_config(hermes_home, (
        "models:\n"
        f"  teamb: {{provider: custom, model: mb, base_url: {b.base_url}, profile: team-b}}\n"
        f"model: {{provider: custom, model: ma, base_url: {a.base_url}}}\n"
        "plugins:\n  entries:\n    p:\n      llm: {allow_model_override: true, allowed_models: [teamb], "
        "allow_profile_override: true}\n"
    ))
    from plugin_llm.routing import resolve_route

    config = get_config_source(hermes_home).current()
    assert resolve_route(config, model="teamb", profile="team-a").profile == "team-b"
    assert resolve_route(config, model="ma", profile="team-a").profile == "team-a"


# ------------------------------------------------------------------ fallbacks
@pytest.mark.parametrize("failure", [Reply.error(503, "overloaded"), Reply.error(429, "slow down"),
                                     Reply.error(500, "boom")], ids=["503", "429", "500"])
def test_a_failure_another_provider_can_fix_falls_back_in_one_record(hermes_home, upstreams, failure):
    a, b = upstreams
    a.push(failure)
    catalog(hermes_home, a.base_url, b.base_url)
    result = PluginLlm("p").complete(USER)
    assert result.text == "ok" and len(a.requests) == 1 and len(b.requests) == 1
    [record] = audit_lines(hermes_home)
    assert record["status"] == "ok" and record["route"] == "second" and record["gen_ai.request.model"] == "mb"
    attempts = record["route.attempts"]
    assert [(x["route"], x["outcome"]) for x in attempts] == [("first", f"provider_error:{failure.status}"),
                                                            ("second", "ok")]
    assert all(type(x["latency_ms"]) is float for x in attempts)


def test_an_error_of_the_request_itself_never_falls_back(hermes_home, upstreams):
    a, b = upstreams
    a.push(Reply.error(400, "bad request: context too long"))
    catalog(hermes_home, a.base_url, b.base_url)
    with pytest.raises(PluginLlmProviderError) as caught:
        PluginLlm("p").complete(USER)
    assert caught.value.status == 400 and not b.requests
    [record] = audit_lines(hermes_home)
    assert record["status"] == "provider_error" and record["route"] == "first"
    assert [x["outcome"] for x in record["route.attempts"]] == ["provider_error:400"]


def test_a_connection_error_falls_back(hermes_home, upstreams):
    a, b = upstreams
    dead = a.base_url
    a.stop()  # nothing listens there any more
    catalog(hermes_home, dead, b.base_url)
    assert PluginLlm("p").complete(USER).text == "ok"
    [record] = audit_lines(hermes_home)
    assert record["route"] == "second" and record["route.attempts"][0]["route"] == "first"
    assert record["route.attempts"][0]["outcome"] != "ok"


@pytest.mark.slow
def test_a_hung_route_times_out_within_the_call_s_deadline_and_the_next_route_answers(hermes_home, upstreams):
    a, b = upstreams
    a.push(Reply.hanging())
    write_config(hermes_home, (
        "models:\n"
        f"  first: {{provider: custom, model: ma, base_url: {a.base_url}, timeout: 0.5}}\n"
        f"  second: {{provider: custom, model: mb, base_url: {b.base_url}}}\n"
        "model: {route: first, fallbacks: [second]}\n"
        "llm: {max_retries: 0, breaker: false, timeout: 30}\n"
    ))
    assert PluginLlm("p").complete(USER).text == "ok"
    [record] = audit_lines(hermes_home)
    assert [x["outcome"] for x in record["route.attempts"]] == ["timeout", "ok"]
    assert record["route"] == "second"


def test_every_route_failing_ends_in_the_last_failure_with_every_attempt(hermes_home, upstreams):
    a, b = upstreams
    a.push(Reply.error(503, "down"))
    b.push(Reply.error(502, "also down"))
    catalog(hermes_home, a.base_url, b.base_url)
    with pytest.raises(PluginLlmProviderError) as caught:
        PluginLlm("p").complete(USER)
    assert caught.value.status == 502
    [record] = audit_lines(hermes_home)
    assert record["status"] == "provider_error" and record["route"] == "second"
    assert [x["outcome"] for x in record["route.attempts"]] == ["provider_error:503", "provider_error:502"]


def test_an_alias_s_own_fallbacks_are_its_chain(hermes_home, upstreams):
    a, b = upstreams
    b.push(Reply.error(503, "down"))
    write_config(hermes_home, (
        "models:\n"
        f"  first: {{provider: custom, model: ma, base_url: {a.base_url}}}\n"
        f"  second: {{provider: custom, model: mb, base_url: {b.base_url}, fallbacks: [first]}}\n"
        "model: {route: first}\n"
        "llm: {max_retries: 0, breaker: false}\n" + grant("[second]")
    ))
    assert PluginLlm("p").complete(USER, model="second").text == "ok"
    [record] = audit_lines(hermes_home)
    assert record["route"] == "first" and [x["route"] for x in record["route.attempts"]] == ["second", "first"]


def test_a_stream_falls_back_when_its_route_fails_to_open(hermes_home, upstreams):
    a, b = upstreams
    a.push(Reply.error(503, "down"))
    b.push(Reply(content="streamed reply"))
    catalog(hermes_home, a.base_url, b.base_url)
    with PluginLlm("p").stream(USER) as stream:
        text = "".join(stream)
    assert text == "streamed reply"
    [record] = audit_lines(hermes_home)
    assert record["status"] == "ok" and record["route"] == "second"
    assert [x["outcome"] for x in record["route.attempts"]] == ["provider_error:503", "ok"]


def test_the_async_path_falls_back_too(hermes_home, upstreams):
    a, b = upstreams
    a.push(Reply.error(503, "down"))
    catalog(hermes_home, a.base_url, b.base_url)
    result = asyncio.run(PluginLlm("p").acomplete(USER))
    assert result.text == "ok"
    assert audit_lines(hermes_home)[0]["route"] == "second"


def test_limits_are_charged_at_the_answering_route_s_price(hermes_home, upstreams):
    a, b = upstreams
    a.push(Reply.error(503, "down"))
    prices = ("  store: local\n  prices:\n    custom/ma: {input_per_mtok: 1000.0, output_per_mtok: 1000.0}\n"
              "    custom/mb: {input_per_mtok: 1.0, output_per_mtok: 2.0}\n")
    catalog(hermes_home, a.base_url, b.base_url, extra=f"limits:\n{prices}",
            plugins="plugins:\n  entries:\n    p:\n      limits: {budget_usd: {day: 1.0}}\n")
    result = PluginLlm("p").complete(USER, max_tokens=100)
    assert result.usage.cost_usd == pytest.approx(13e-6)  # 7 * 1 + 3 * 2 micro-dollars: the route that answered
    limits.close_stores()
    snap = limits.snapshot(get_config_source(hermes_home).current().limits, hermes_home, "p").as_dict()
    assert snap["spent_usd"]["day"] == pytest.approx(13e-6) and snap["in_flight"] == 0


# ------------------------------------------------------------------ circuit breakers
BREAKER = "llm: {max_retries: 0, breaker: {failures: 2, window: 60, cooldown: 30}}\n"


def breaker_catalog(home, a: str, b: str) -> None:
    write_config(home, (
        "models:\n"
        f"  first: {{provider: custom, model: ma, base_url: {a}}}\n"
        f"  second: {{provider: custom, model: mb, base_url: {b}}}\n"
        "model: {route: first, fallbacks: [second]}\n" + BREAKER
    ))


def outcomes(home) -> list[list[tuple[str, str]]]:
    return [[(x["route"], x["outcome"]) for x in r.get("route.attempts", ())] for r in audit_lines(home)]


def test_the_breaker_opens_skips_half_opens_and_closes(hermes_home, upstreams, monkeypatch):
    from plugin_llm.call import fallback

    a, b = upstreams
    now = [1_000_000.0]
    monkeypatch.setattr(fallback, "wall_clock", lambda: now[0])
    a.push(Reply.error(503, "down"), Reply.error(503, "down"))
    breaker_catalog(hermes_home, a.base_url, b.base_url)
    llm = PluginLlm("p")
    for _ in range(3):
        assert llm.complete(USER).text == "ok"
    assert len(a.requests) == 2  # the third call skipped the open route: nothing sent to it
    assert outcomes(hermes_home)[2] == [("first", "skipped"), ("second", "ok")]
    now[0] += 31  # the cooldown is over: one probe goes to the route, which has recovered
    llm.complete(USER)
    assert len(a.requests) == 3 and outcomes(hermes_home)[3] == [("first", "ok")]
    llm.complete(USER)  # closed again
    assert len(a.requests) == 4


def test_a_failed_probe_opens_the_breaker_again(hermes_home, upstreams, monkeypatch):
    from plugin_llm.call import fallback

    a, b = upstreams
    now = [2_000_000.0]
    monkeypatch.setattr(fallback, "wall_clock", lambda: now[0])
    a.push(*[Reply.error(503, "down")] * 3)
    breaker_catalog(hermes_home, a.base_url, b.base_url)
    llm = PluginLlm("p")
    llm.complete(USER), llm.complete(USER)
    now[0] += 31
    llm.complete(USER)  # the probe fails: open for another cooldown
    llm.complete(USER)
    assert len(a.requests) == 3
    assert outcomes(hermes_home)[2:] == [[("first", "provider_error:503"), ("second", "ok")],
                                         [("first", "skipped"), ("second", "ok")]]


def test_an_error_of_the_request_itself_does_not_count_against_the_route(hermes_home, upstreams):
    a, b = upstreams
    a.push(*[Reply.error(400, "bad request")] * 3)
    breaker_catalog(hermes_home, a.base_url, b.base_url)
    llm = PluginLlm("p")
    for _ in range(3):
        with pytest.raises(PluginLlmProviderError):
            llm.complete(USER)
    llm.complete(USER)
    assert len(a.requests) == 4 and not b.requests  # never skipped, never fell back


@pytest.mark.slow
def test_the_breaker_is_shared_by_the_processes_of_one_host(hermes_home, upstreams):
    import subprocess
    import sys
    import textwrap

    a, b = upstreams
    a.push(Reply.error(503, "down"), Reply.error(503, "down"))
    breaker_catalog(hermes_home, a.base_url, b.base_url)
    other = textwrap.dedent("""
        from plugin_llm import PluginLlm, limits
        llm = PluginLlm("p")
        for _ in range(2):
            llm.complete([{"role": "user", "content": "hi"}])
        limits.close_stores()
    """)
    subprocess.run([sys.executable, "-c", other], check=True, timeout=120)
    assert len(a.requests) == 2
    PluginLlm("p").complete(USER)  # this process sees the breaker the other one opened
    assert len(a.requests) == 2 and len(b.requests) == 3
    assert outcomes(hermes_home)[-1] == [("first", "skipped"), ("second", "ok")]


# ------------------------------------------------------------------ the service: discovery and metrics
@pytest.mark.slow
def test_models_list_shows_exactly_the_routes_the_token_s_plugin_may_use(hermes_home, upstreams):
    import openai

    from tests.service_server import ServiceServer

    a, b = upstreams
    write_config(hermes_home, (
        "models:\n"
        f"  first: {{provider: custom, model: ma, base_url: {a.base_url}}}\n"
        f"  second: {{provider: custom, model: mb, base_url: {b.base_url}}}\n"
        "  other: {provider: anthropic, model: claude-sonnet-4-5}\n"
        "model: {route: first}\n"
        "plugins:\n  entries:\n"
        "    p:\n      llm: {allow_model_override: true, allowed_models: [second]}\n"
        "    star:\n      llm: {allow_model_override: true, allowed_models: ['*']}\n"
    ))
    with ServiceServer(hermes_home) as service:
        def ids(plugin):
            client = openai.OpenAI(base_url=service.url + "/v1", api_key=service.token(plugin), max_retries=0)
            return [m.id for m in client.models.list().data]

        assert ids("p") == ["default", "first", "second"]
        assert ids("star") == ["default", "first", "second"]  # 'other' goes to another provider
        assert ids("plain") == ["default", "first"]
        client = openai.OpenAI(base_url=service.url + "/v1", api_key=service.token("p"), max_retries=0)
        reply = client.chat.completions.create(model="second", messages=USER)
        assert reply.choices[0].message.content == "ok" and len(b.requests) == 1
        client.chat.completions.create(model="first", messages=USER)  # the default route by its name
        assert len(a.requests) == 1


def test_models_list_leaves_the_auxiliary_slots_out(tmp_path):
    """A task is not a model: a slot's name or inline model sent as ``model`` would be a model override."""
    from plugin_llm.service.discovery import model_ids

    config = parse_config(tmp_path, (
        "models:\n  first: {provider: openai, model: gpt-4o-mini}\n  second: {provider: openai, model: gpt-4o}\n"
        "model: {route: first}\n"
        "auxiliary:\n  vision: second\n  compression: {provider: openai, model: gpt-4.1-nano}\n"
        "plugins:\n  entries:\n    p:\n      llm: {allow_task_override: true}\n"))
    assert config.warnings == () and set(config.auxiliary) == {"vision", "compression"}
    assert [mid for mid, _ in model_ids(config, "p")] == ["default", "first"]


@pytest.mark.slow
def test_metrics_show_each_route_s_breaker_state(hermes_home, upstreams):
    import httpx

    from tests.service_server import ServiceServer

    a, b = upstreams
    a.push(Reply.error(503, "down"), Reply.error(503, "down"))
    breaker_catalog(hermes_home, a.base_url, b.base_url)
    with ServiceServer(hermes_home) as service:
        client_headers = service.auth(service.token("p"))
        for _ in range(2):
            response = httpx.post(service.url + "/v1/plugin-llm/complete", headers=client_headers,
                                  json={"messages": USER}, timeout=60)
            assert response.status_code == 200
        text = httpx.get(service.url + "/metrics", timeout=30).text
    assert 'plugin_llm_route_breaker_state{route="first",state="open"} 1.0' in text
    assert 'plugin_llm_route_breaker_state{route="second",state="closed"} 1.0' in text
    assert 'plugin_llm_route_breaker_state{route="first",state="closed"} 0.0' in text


# ------------------------------------------------------------------ what operators see: trust explain, check, doctor
CATALOG = (
    "models:\n"
    "  fast: {provider: openai, model: gpt-4o-mini}\n"
    "  smart: {provider: anthropic, model: claude-sonnet-4-5, profile: team-b, fallbacks: [fast]}\n"
    "  local-llama: {provider: custom, model: llama3, base_url: 'http://127.0.0.1:9/v1'}\n"
    "model: {route: fast, fallbacks: [local-llama]}\n"
    "plugins:\n  entries:\n    notes:\n      llm: {allow_model_override: true, allowed_models: [smart]}\n"
)


def test_trust_explain_shows_the_route_and_its_chain(hermes_home, capsys):
    from plugin_llm.cli.main import main

    write_config(hermes_home, CATALOG)
    assert main(["trust", "explain", "notes", "--model", "smart"]) == 0
    out = capsys.readouterr().out
    assert "route: smart: anthropic / claude-sonnet-4-5" in out and "profile team-b" in out
    assert "then, on a failure another provider can fix: fast: openai / gpt-4o-mini" in out
    assert main(["trust", "explain", "notes", "--model", "local-llama"]) == 1
    out = capsys.readouterr().out
    assert "may not use the route 'local-llama'" in out and "plugin-llm trust grant notes model local-llama" in out
    assert main(["trust", "explain", "notes", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["route"]["name"] == "fast" and [f["name"] for f in doc["route"]["fallbacks"]] == ["local-llama"]


def test_trust_explain_and_doctor_show_an_open_breaker(hermes_home, capsys):
    from plugin_llm.cli.main import main
    from plugin_llm.limits import breakers

    write_config(hermes_home, CATALOG + "llm: {breaker: {failures: 1, cooldown: 600}}\n")
    config = get_config_source(hermes_home).current()
    breakers.report(config.limits, hermes_home, "local-llama", False, config.llm.breaker, time.time())
    limits.close_stores()
    assert main(["trust", "explain", "notes"]) == 0
    assert "local-llama: custom / llama3, http://127.0.0.1:9/v1 [breaker open, 1 failure(s)" in capsys.readouterr().out
    main(["doctor", "--json"])
    checks = json.loads(capsys.readouterr().out)["checks"]
    by_name = {c["check"]: c for c in checks}
    assert by_name["route"]["status"] == "OK" and by_name["route"]["message"].startswith("fast: openai / gpt-4o-mini")
    assert by_name["fallback"]["message"].startswith("then local-llama: custom / llama3")
    assert by_name["breakers"]["status"] == "WARN" and "local-llama open after 1 failure(s)" in by_name["breakers"]["message"]


def test_trust_check_takes_a_route_name_in_allowed_models_for_what_it_is(hermes_home, capsys):
    from plugin_llm.cli.main import main

    write_config(hermes_home, CATALOG)
    main(["trust", "check"])
    assert "litellm does not know the model 'smart'" not in capsys.readouterr().out


@pytest.mark.slow
def test_the_breaker_is_shared_through_redis_by_the_gateways_of_several_hosts(hermes_home, upstreams, redis_server,
                                                                           tmp_path):
    """Two homes (two hosts) with one Redis store: a route one host's calls opened is skipped by the other's."""
    a, b = upstreams
    a.push(Reply.error(503, "down"), Reply.error(503, "down"))
    other_home = tmp_path / "other-host"
    other_home.mkdir()
    for home in (hermes_home, other_home):
        write_config(home, (
            "models:\n"
            f"  first: {{provider: custom, model: ma, base_url: {a.base_url}}}\n"
            f"  second: {{provider: custom, model: mb, base_url: {b.base_url}}}\n"
            "model: {route: first, fallbacks: [second]}\n" + BREAKER +
            f"limits: {{store: redis, redis_url: '{redis_server.url}'}}\n"
        ))
    import os
    import subprocess
    import sys

    other = ("from plugin_llm import PluginLlm, limits\nllm = PluginLlm('p')\n"
             "for _ in range(2):\n    llm.complete([{'role': 'user', 'content': 'hi'}])\nlimits.close_stores()\n")
    subprocess.run([sys.executable, "-c", other], check=True, timeout=120,
                   env={**os.environ, "HERMES_HOME": str(other_home)})
    assert len(a.requests) == 2 and not (hermes_home / "limits.sqlite3").exists()
    PluginLlm("p").complete(USER)
    assert len(a.requests) == 2 and len(b.requests) == 3
    assert outcomes(hermes_home)[-1] == [("first", "skipped"), ("second", "ok")]
