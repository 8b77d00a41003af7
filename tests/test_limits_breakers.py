"""Circuit breakers of model routes: the policy's parsing, the state machine on both limit stores
(SQLite and a real Redis), sharing across processes, and the facade's cache and fail-open rule."""

from __future__ import annotations

import pytest

from plugin_llm.config.breakers import DISABLED, BreakerPolicy, parse_breaker_policy


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
