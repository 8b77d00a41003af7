"""plugin_llm.limits.settings and pricing: parsing fails closed; prices are worst cases, never free."""

from __future__ import annotations

import time

import pytest
import yaml

from plugin_llm import limits
from plugin_llm.limits import NANO, PluginLlmLimitError, find_price, input_token_bound, parse_limit_settings, worst_case


def parse(text: str):
    data = yaml.safe_load(text) or {}
    return parse_limit_settings(data.get("limits"), data.get("plugins"))


def test_the_issue_example_parses_into_limits():
    settings, issues = parse("""
limits:
  store: redis
  redis_url: redis://127.0.0.1:6379/0
  on_store_error: allow
plugins:
  entries:
    my-plugin:
      limits:
        budget_usd: {day: 1.00, month: 20}
        requests_per_minute: 30
        tokens_per_minute: 40000
        max_concurrent: 4
""")
    assert issues == []
    assert (settings.store, settings.on_store_error) == ("redis", "allow")
    mine = settings.for_plugin("my-plugin")
    assert (mine.budget_day_nano, mine.budget_month_nano) == (1 * NANO, 20 * NANO)
    assert (mine.requests_per_minute, mine.tokens_per_minute, mine.max_concurrent) == (30, 40000, 4)
    assert mine.key("budget_usd.day") == "plugins.entries.my-plugin.limits.budget_usd.day"
    assert settings.for_plugin("other").empty


@pytest.mark.parametrize(
    ("block", "path", "hint"),
    [
        ("{requests_per_minut: 30}", "plugins.entries.p.limits.requests_per_minut", "did you mean 'requests_per_minute'"),
        ("{budget_usd: {dya: 1}}", "plugins.entries.p.limits.budget_usd.dya", "did you mean 'day'"),
        ("{budget_usd: 5}", "plugins.entries.p.limits.budget_usd", "expected a mapping"),
        ("{budget_usd: {day: '$1'}}", "plugins.entries.p.limits.budget_usd.day", "expected a number of US dollars"),
        ("{budget_usd: {day: -1}}", "plugins.entries.p.limits.budget_usd.day", "between 0 and"),
        ("{budget_usd: {day: .inf}}", "plugins.entries.p.limits.budget_usd.day", "expected a number"),
        ("{requests_per_minute: 2.5}", "plugins.entries.p.limits.requests_per_minute", "whole number"),
        ("{max_concurrent: true}", "plugins.entries.p.limits.max_concurrent", "whole number"),
        ("{tokens_per_minute: null}", "plugins.entries.p.limits.tokens_per_minute", "whole number"),
        ("[30]", "plugins.entries.p.limits", "expected a mapping"),
    ],
)
def test_a_malformed_plugin_block_denies_the_plugin_with_one_error(block, path, hint):
    settings, issues = parse(f"plugins:\n  entries:\n    p:\n      limits: {block}\n")
    assert [(i.severity, i.path) for i in issues] == [("error", path)]
    assert hint in str(issues[0])
    with pytest.raises(PluginLlmLimitError) as caught:
        limits.admit(settings, "/nonexistent", "p", messages=[{"role": "user", "content": "hi"}],
                     provider="local", model="local-echo-1", max_tokens=10, deadline=time.monotonic() + 5)
    assert caught.value.limit == "config" and caught.value.config_key == path
    assert "plugin 'p'" in str(caught.value) and hint in str(caught.value)
    # an unrelated plugin is not affected
    assert limits.admit(settings, "/nonexistent", "q", messages=[{"role": "user", "content": "hi"}], provider="local",
                        model="local-echo-1", max_tokens=10, deadline=time.monotonic() + 5) is limits.UNLIMITED


def test_every_problem_of_a_block_is_reported_and_the_calls_are_refused_with_the_first():
    settings, issues = parse("plugins:\n  entries:\n    p:\n      limits:\n"
                             "        requests_per_minut: 30\n        budget_usd: {dya: 1, day: -1, month: 2}\n"
                             "        max_concurrent: 0.5\n        tokens_per_minute: 100\n")
    base = "plugins.entries.p.limits."
    assert [i.path for i in issues] == [base + "requests_per_minut", base + "budget_usd.dya", base + "budget_usd.day",
                                        base + "max_concurrent"]
    assert {i.severity for i in issues} == {"error"} and "did you mean 'day'" in str(issues[1])
    with pytest.raises(PluginLlmLimitError) as caught:  # the whole block fails closed, the valid limits too
        limits.admit(settings, "/nonexistent", "p", messages=[{"role": "user", "content": "hi"}],
                     provider="local", model="local-echo-1", max_tokens=10, deadline=time.monotonic() + 5)
    assert caught.value.config_key == base + "requests_per_minut"
    assert "did you mean 'requests_per_minute'" in str(caught.value) and "and 3 more problems" in str(caught.value)
    settings, issues = parse("limits:\n  defaults: {max_concurrent: -1, requests_per_minute: x}\n")
    assert [i.path for i in issues] == ["limits.defaults.max_concurrent", "limits.defaults.requests_per_minute"]
    assert "and 1 more problem in this block" in settings.for_plugin("anyone").error


def test_a_host_section_error_denies_every_limited_plugin_but_not_unlimited_ones():
    settings, issues = parse("limits:\n  stor: redis\nplugins:\n  entries:\n    p: {limits: {max_concurrent: 2}}\n")
    assert [i.path for i in issues] == ["limits.stor"] and "did you mean 'store'" in str(issues[0])
    assert settings.for_plugin("p").error and "limits.stor" in settings.for_plugin("p").error
    assert settings.for_plugin("unlimited").empty
    settings, issues = parse("limits:\n  on_store_error: sometimes\n  defaults: {max_concurrent: 1}\n")
    assert issues[0].path == "limits.on_store_error" and settings.for_plugin("anyone").error


def test_defaults_apply_to_plugins_without_a_block_and_an_empty_block_opts_out():
    settings, issues = parse("""
limits:
  defaults: {requests_per_minute: 10}
plugins:
  entries:
    own: {limits: {requests_per_minute: 99}}
    exempt: {limits: {}}
    bare: {limits: }
    trust_only: {llm: {allow_model_override: true}}
""")
    assert issues == []
    assert settings.for_plugin("own").requests_per_minute == 99
    assert settings.for_plugin("exempt").empty
    assert settings.for_plugin("bare").requests_per_minute == 10  # `limits:` with no value never lifts the defaults
    assert settings.for_plugin("trust_only").requests_per_minute == 10
    assert settings.for_plugin("trust_only").source == "limits.defaults"


def test_redis_url_password_never_shows():
    settings, issues = parse("limits: {store: redis, redis_url: 'redis://:hunter2-canary@10.0.0.5:6380/2'}")
    assert issues == []
    assert "hunter2-canary" not in repr(settings)
    assert settings.redis_url_display == "redis://***@10.0.0.5:6380/2"
    _, issues = parse("limits: {redis_url: 'http://user:hunter2-canary@x'}")
    assert issues and all("hunter2-canary" not in str(i) for i in issues)


@pytest.mark.parametrize("line, path", [
    ("store_timeout: 1.0e+10", "limits.store_timeout"),  # a lock wait the OS refuses: every keeper pass failed
    ("reservation_grace: 1.0e+12", "limits.reservation_grace"),  # resets past the year 9999
    ("redis_url: 'redis://:hunter2-canary@127.0.0.1:99999/0'", "limits.redis_url"),
    ("redis_url: 'redis://127.0.0.1:6379x/0'", "limits.redis_url"),
])
def test_absurd_timeouts_and_bad_redis_ports_are_errors_when_parsed(line, path):
    settings, issues = parse(f"limits:\n  {line}\nplugins:\n  entries:\n    p: {{limits: {{max_concurrent: 2}}}}\n")
    assert [(i.severity, i.path) for i in issues] == [("error", path)]
    assert "hunter2-canary" not in str(issues[0]) and settings.for_plugin("p").error  # fail closed
    assert "at most" in str(issues[0]) or "1 to 65535" in str(issues[0])


def test_a_reset_time_past_the_year_9999_is_still_said():
    assert limits.iso_utc(1e30) == limits.iso_utc(float("nan")) == "9999-12-31T23:59:59.999Z"
    assert limits.iso_utc(0) == "1970-01-01T00:00:00.000Z"


def test_operator_prices_parse_and_a_bad_price_leaves_the_model_unpriced():
    settings, issues = parse("""
limits:
  prices:
    custom/my-model: {input_per_mtok: 0.5, output_per_mtok: 1.5, max_output_tokens: 8192}
    custom/broken: {input_per_mtok: 0.5}
    custom/typo: {input_per_mtk: 1, output_per_mtk: 1}
""")
    assert sorted(i.path for i in issues) == ['limits.prices."custom/broken"', 'limits.prices."custom/typo".input_per_mtk',
                                             'limits.prices."custom/typo".output_per_mtk']  # each typo, not "missing"
    assert find_price("custom", "typo", settings.prices) is None
    price = find_price("custom", "my-model", settings.prices)
    assert price.operator and price.input_nano == pytest.approx(500) and price.max_output_tokens == 8192
    assert find_price("custom", "broken", settings.prices) is None


def test_prices_come_from_litellms_map_at_the_worst_tier_and_custom_models_are_unpriced():
    mini = find_price("openai", "gpt-4o-mini", {})
    assert mini is not None and mini.input_nano == pytest.approx(150) and mini.max_output_tokens == 16384
    gemini = find_price("gemini", "gemini-2.5-pro", {})
    assert gemini is not None and gemini.input_nano == pytest.approx(2500)  # the >200k-token tier, not 1250
    assert find_price("custom", "gpt-4o-mini", {}) is None  # an operator endpoint: the map's price is not its price
    assert find_price("groq", "gpt-4o-mini", {}) is None  # a bare name listed for another provider
    assert find_price("local", "local-echo-1", {}).input_nano == 0


def test_input_bound_is_at_least_one_token_per_byte_and_counts_images_and_tools():
    text = "héllo wörld 你好 🙂" * 50
    bound = input_token_bound([{"role": "user", "content": text}])
    assert bound >= len(text.encode("utf-8"))
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 10**6}}]}]
    assert 1000 <= input_token_bound(image) < 10_000  # a fixed worst case, not the size of the data URL
    tools = [{"type": "function", "function": {"name": "x" * 500}}]
    assert input_token_bound([{"role": "user", "content": "hi"}], [tools]) > input_token_bound([{"role": "user", "content": "hi"}]) + 500


def test_worst_case_output_is_max_tokens_else_the_models_limit_else_the_default():
    settings, _ = parse("limits: {default_max_output_tokens: 777}")
    messages = [{"role": "user", "content": "hi"}]
    assert worst_case(messages, provider="openai", model="gpt-4o-mini", max_tokens=50, settings=settings).output_tokens == 50
    assert worst_case(messages, provider="openai", model="gpt-4o-mini", max_tokens=None, settings=settings).output_tokens == 16384
    unknown = worst_case(messages, provider="custom", model="x", max_tokens=None, settings=settings)
    assert unknown.output_tokens == 777 and unknown.cost_nano is None


@pytest.mark.parametrize("block, output", [
    ("{tokens_per_minute: 1000000}", 16384),  # a token limit reserves the model's output limit, as trust check says
    ("{budget_usd: {day: 5}}", 16384),
    ("{requests_per_minute: 10}", 777),  # no token or money limit: the output bound only sizes the lease
])
def test_a_call_without_max_tokens_reserves_the_models_output_limit_under_a_token_limit(tmp_path, block, output):
    from plugin_llm.limits import check_limits

    settings, _ = parse(f"limits: {{default_max_output_tokens: 777}}\nplugins:\n  entries:\n    p: {{limits: {block}}}\n")
    ticket = limits.admit(settings, tmp_path, "p", messages=[{"role": "user", "content": "hi"}], provider="openai",
                          model="gpt-4o-mini", max_tokens=None, deadline=time.monotonic() + 5)
    fields = ticket.audit_fields()
    assert output < fields["limits.reserved_tokens"] < output + 100
    assert (fields["limits.reserved_usd"] > 0) == ("budget" in block)  # only a budget needs the cost
    ticket.release()
    limits.close_stores()
    if "tokens" in block:  # trust check's warning uses the same bound as admission
        settings, _ = parse("plugins:\n  entries:\n    p: {limits: {tokens_per_minute: 10000}}\n")
        [finding] = [f for f in check_limits(settings, provider="openai", model="gpt-4o-mini") if "tokens_per_minute" in f.path]
        assert "16384 output tokens" in str(finding)


def test_a_budget_on_an_unpriced_model_is_refused_with_the_key_to_set(tmp_path):
    settings, _ = parse("plugins:\n  entries:\n    p: {limits: {budget_usd: {day: 5}}}\n")
    with pytest.raises(PluginLlmLimitError) as caught:
        limits.admit(settings, tmp_path, "p", messages=[{"role": "user", "content": "hi"}], provider="custom",
                     model="my-model", max_tokens=10, deadline=time.monotonic() + 5)
    assert caught.value.limit == "price"
    assert caught.value.config_key == 'limits.prices."custom/my-model"'
    assert "no known price" in str(caught.value) and "input_per_mtok" in str(caught.value)
    assert not (tmp_path / "limits.sqlite3").exists()  # refused before the store


def test_importing_the_package_loads_neither_litellm_nor_redis():
    import subprocess
    import sys

    code = "import sys, plugin_llm.limits; print('litellm' in sys.modules, 'redis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_check_limits_reports_refusing_and_fail_open_configurations():
    settings, _ = parse("""
limits: {on_store_error: allow}
plugins:
  entries:
    a: {limits: {tokens_per_minute: 1000, max_concurrent: 0}}
    b: {limits: {budget_usd: {month: 3}}}
    c: {limits: {budget_usd: {day: 1}}}
""")
    found = {(f.severity, f.path, f.plugin_id) for f in limits.check_limits(
        settings, provider="openai", model="gpt-4o-mini", plugin_models={"b": ["custom/mystery-1", "gpt-4o"]})}
    assert found == {
        ("warning", "limits.on_store_error", None),
        ("warning", "plugins.entries.a.limits.max_concurrent", "a"),
        ("warning", "plugins.entries.a.limits.tokens_per_minute", "a"),  # 16384 output tokens > 1000
        ("error", 'limits.prices."custom/mystery-1"', "b"),
    }
    assert limits.check_limits(parse("")[0], provider="custom", model="m") == []


def test_input_bound_counts_every_part_of_a_message_besides_role_and_content():
    plain = input_token_bound([{"role": "assistant", "content": "ok"}])
    named = input_token_bound([{"role": "assistant", "name": "n" * 300}])  # no content: the name still counts
    assert named >= plain + 300 - len("ok")
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "a" * 400}}]
    assert input_token_bound([{"role": "assistant", "content": "ok", "tool_calls": calls}]) >= plain + 400
    assert input_token_bound([{"content": "ok"}]) == plain  # a message without a role costs no more


class _Message(dict):
    pass


def test_input_bound_of_a_mapping_that_is_not_a_dict_is_that_of_the_same_dict():
    from types import MappingProxyType

    message = {"role": "user", "content": "héllo", "name": "n"}
    assert input_token_bound([MappingProxyType(message)]) == input_token_bound([message]) \
        == input_token_bound([_Message(message)])


@pytest.mark.parametrize("url", [
    "redis://:CANARY/SECRET@127.0.0.1:6398/0",  # urlsplit ends the host at the '/': SECRET@... was shown as the path
    "redis://user:CANARY%2FSECRET@127.0.0.1:6398/0",
    "rediss://:CANARY@SECRET@127.0.0.1:6398/0#x",
    "redis://127.0.0.1:6398/0?password=CANARYSECRET",
])
def test_no_part_of_a_redis_password_is_ever_shown(url):
    from plugin_llm.limits.settings import redact_url

    shown = redact_url(url)
    assert "CANARY" not in shown and "SECRET" not in shown and "127.0.0.1:6398" in shown
    settings, issues = parse(f"limits: {{store: redis, redis_url: '{url}'}}")
    assert "CANARY" not in repr(settings) + " ".join(map(str, issues)) and "SECRET" not in settings.redis_url_display
    if "/SECRET" in url:  # not a URL redis-py can use: an error that says how to write it
        assert "percent-encode" in str(issues[0])


@pytest.mark.parametrize("text", [
    "limits: {store: 'redis://:CANARYSECRET@10.0.0.5:6379/0'}",  # the URL put under the wrong key
    "limits: {redis_key_prefix: 'redis://u:CANARYSECRET@10.0.0.5:6379/0'}",
    "limits: {on_store_error: 'rediss://:CANARYSECRET@10.0.0.5/0?x=1'}",
    "limits: {store: ':CANARYSECRET@10.0.0.5'}",
    "limits: {defaults: {max_concurrent: 'redis://:CANARYSECRET@10.0.0.5:6379/0'}}",
])
def test_a_redis_url_misplaced_under_another_key_does_not_show_its_password(text):
    settings, issues = parse(text + "\nplugins: {entries: {p: {limits: {max_concurrent: 2}}}}\n")
    assert issues and "10.0.0.5" in str(issues[0])  # the value is still recognisable
    with pytest.raises(PluginLlmLimitError) as caught:
        limits.admit(settings, "/nonexistent", "p" if "defaults" not in text else "anyone",
                     messages=[{"role": "user", "content": "hi"}], provider="local", model="local-echo-1",
                     max_tokens=10, deadline=time.monotonic() + 5)
    shown = " ".join(map(str, issues)) + repr(settings) + str(caught.value) + repr(caught.value.denial)
    assert "CANARY" not in shown and "SECRET" not in shown


@pytest.mark.parametrize("text, plugin", [
    # a flow mapping without the space after a colon: YAML reads the URL into the key
    ("plugins: {entries: {p: {limits: {budget_usd: {day: 1}, max_concurrent:redis://:CANARYSECRET@10.0.0.5}}}}", "p"),
    ("limits: {store: redis, redis_url:redis://:CANARYSECRET@10.0.0.5:1}\nplugins: {entries: {p: {limits: "
     "{max_concurrent: 2}}}}", "p"),
    ("limits: {defaults: {'u:CANARYSECRET@10.0.0.5': 1}}", "anyone"),
])
def test_a_redis_url_read_into_a_key_does_not_show_its_password(text, plugin):
    settings, issues = parse(text)
    assert issues and "10.0.0.5" in str(issues[0])
    with pytest.raises(PluginLlmLimitError) as caught:
        limits.admit(settings, "/nonexistent", plugin, messages=[{"role": "user", "content": "hi"}],
                     provider="local", model="local-echo-1", max_tokens=10, deadline=time.monotonic() + 5)
    shown = " ".join(map(str, issues)) + repr(settings) + str(caught.value) + repr(caught.value.denial)
    assert "CANARY" not in shown and "SECRET" not in shown


def test_a_redis_url_option_redis_py_does_not_take_is_a_store_error_not_a_traceback():
    from plugin_llm.limits.redis_store import RedisStore
    from plugin_llm.limits.store import StoreError

    with pytest.raises(StoreError, match="limits.redis_url .* is not usable") as caught:
        RedisStore("redis://:CANARY-pw@127.0.0.1:1/0?timeout=2", prefix="p")
    assert "CANARY" not in str(caught.value)


def test_hostile_keys_cannot_forge_lines_and_odd_keys_are_errors():
    """A key with a newline (or a control, a bidi character) is JSON-escaped in every path, so no
    config key can forge a line of CLI output; a key YAML reads as a number or a bool is an error."""
    data = {"limits": {"prices": {"m\nOK    audit verify: chain intact": {"input_per_mtok": 1, "output_per_mtok": 1,
                                                                           "bogus": 1}},
                       "stor\u202e\x1b[2J": "local"},
            "plugins": {"entries": {"p\nplugin-llm: error: forged": {"limits": {"requests_per_minut\n": 5}},
                                    7: {"limits": {"requests_per_minute": 1}}}}}
    settings, issues = parse_limit_settings(data["limits"], data["plugins"])
    text = "\n".join(str(i) for i in issues) + repr(settings)
    assert len(text.splitlines()) == len(issues)  # one line each: the newlines in the keys are escaped
    assert "\x1b" not in text and "\u202e" not in text
    [odd] = [i for i in issues if i.path == "plugins.entries.7"]
    assert odd.severity == "error" and "quote the key" in odd.fix
    settings, issues = parse("plugins:\n  entries:\n    007: {limits: {requests_per_minute: 1}}\n")
    assert [i.path for i in issues] == ["plugins.entries.7"] and settings.for_plugin("7").requests_per_minute == 1
