"""The trust gate matrix: every override x every policy shape."""

from __future__ import annotations

import pytest

from plugin_llm.config import parse_config
from plugin_llm.errors import PluginLlmTrustError
from plugin_llm.trust import FLAG_KEYS, LIST_KEYS, Overrides, TrustPolicy, config_path, decide, enforce

PLUGIN = "my-plugin"


def policy_from_yaml(tmp_path, llm_block: str) -> TrustPolicy:
    text = f"plugins:\n  entries:\n    {PLUGIN}:\n      llm:\n" + "".join(f"        {line}\n" for line in llm_block.splitlines())
    return parse_config(tmp_path, text).trust_for(PLUGIN)


VALUES = {"provider": "openrouter", "model": "gpt-4o-mini", "agent_id": "research", "profile": "work"}


@pytest.mark.parametrize("override", sorted(FLAG_KEYS))
def test_missing_entry_denies_every_override(tmp_path, override):
    policy = parse_config(tmp_path, "plugins:\n  entries: {}\n").trust_for(PLUGIN)
    decision = decide(PLUGIN, policy, Overrides(**{override: VALUES[override]}))
    assert not decision.allowed
    assert decision.config_key == f"plugins.entries.{PLUGIN}.llm.{FLAG_KEYS[override]}"
    assert PLUGIN in decision.reason and FLAG_KEYS[override] in decision.reason


@pytest.mark.parametrize("override", sorted(FLAG_KEYS))
@pytest.mark.parametrize("flag_value", ["false", '"false"', "'FALSE'", "no", "1", '"yes"', '"on"', "null", "[true]"])
def test_flag_off_or_not_a_boolean_denies(tmp_path, override, flag_value):
    policy = policy_from_yaml(tmp_path, f"{FLAG_KEYS[override]}: {flag_value}")
    assert not decide(PLUGIN, policy, Overrides(**{override: VALUES[override]})).allowed


def test_non_boolean_flag_is_warned_about(tmp_path):
    config = parse_config(tmp_path, f"plugins:\n  entries:\n    {PLUGIN}:\n      llm:\n        allow_model_override: yes please\n")
    assert not config.trust_for(PLUGIN).allow_model_override
    assert any("expected true or false" in w and "allow_model_override" in w for w in config.warnings)


@pytest.mark.parametrize("override", sorted(FLAG_KEYS))
@pytest.mark.parametrize("flag_value", ["true", '"true"', "' True '"])
def test_flag_on_without_list_allows_any_value(tmp_path, override, flag_value):
    policy = policy_from_yaml(tmp_path, f"{FLAG_KEYS[override]}: {flag_value}")
    assert decide(PLUGIN, policy, Overrides(**{override: VALUES[override]})).allowed


def test_flags_are_independent(tmp_path):
    policy = policy_from_yaml(tmp_path, "allow_model_override: true")
    assert decide(PLUGIN, policy, Overrides(model="gpt-4o")).allowed
    denied = decide(PLUGIN, policy, Overrides(model="gpt-4o", provider="anthropic"))
    assert not denied.allowed and denied.config_key.endswith("allow_provider_override")
    for other in ("agent_id", "profile"):
        assert not decide(PLUGIN, policy, Overrides(**{other: VALUES[other]})).allowed


@pytest.mark.parametrize("override", sorted(LIST_KEYS))
def test_allowlist_matches_case_insensitively_after_trimming(tmp_path, override):
    value = VALUES[override]
    policy = policy_from_yaml(tmp_path, f"{FLAG_KEYS[override]}: true\n{LIST_KEYS[override]}: ['  {value.upper()} ', other]")
    assert decide(PLUGIN, policy, Overrides(**{override: f" {value.title()}"})).allowed
    denied = decide(PLUGIN, policy, Overrides(**{override: "not-listed"}))
    assert not denied.allowed
    assert denied.config_key == f"plugins.entries.{PLUGIN}.llm.{LIST_KEYS[override]}"
    assert "not-listed" in denied.reason


@pytest.mark.parametrize("override", sorted(LIST_KEYS))
def test_star_allows_anything(tmp_path, override):
    policy = policy_from_yaml(tmp_path, f"{FLAG_KEYS[override]}: true\n{LIST_KEYS[override]}: ['*']")
    assert decide(PLUGIN, policy, Overrides(**{override: "whatever/anything"})).allowed


@pytest.mark.parametrize("override", sorted(LIST_KEYS))
def test_empty_list_allows_nothing(tmp_path, override):
    policy = policy_from_yaml(tmp_path, f"{FLAG_KEYS[override]}: true\n{LIST_KEYS[override]}: []")
    decision = decide(PLUGIN, policy, Overrides(**{override: VALUES[override]}))
    assert not decision.allowed and "nothing is allowed" in decision.reason


@pytest.mark.parametrize("override", sorted(LIST_KEYS))
def test_list_without_flag_grants_nothing(tmp_path, override):
    policy = policy_from_yaml(tmp_path, f"{LIST_KEYS[override]}: ['*']")
    assert not decide(PLUGIN, policy, Overrides(**{override: VALUES[override]})).allowed


def test_allowlist_given_as_string_fails_closed_with_warning(tmp_path):
    config = parse_config(tmp_path, f"plugins:\n  entries:\n    {PLUGIN}:\n      llm:\n        allow_model_override: true\n        allowed_models: gpt-4o\n")
    assert not decide(PLUGIN, config.trust_for(PLUGIN), Overrides(model="gpt-4o")).allowed
    assert any("expected a list" in w for w in config.warnings)


def test_model_allowlist_accepts_provider_qualified_entries():
    policy = TrustPolicy(allow_model_override=True, allowed_models=("openai/gpt-4o-mini",))
    assert decide(PLUGIN, policy, Overrides(model="gpt-4o-mini", active_provider="openai")).allowed
    assert decide(PLUGIN, policy, Overrides(model="openai/gpt-4o-mini", active_provider="openai")).allowed
    assert not decide(PLUGIN, policy, Overrides(model="gpt-4o-mini", active_provider="anthropic")).allowed


def test_the_routes_own_provider_prefix_names_the_same_model_never_another_providers():
    policy = TrustPolicy(allow_model_override=True, allowed_models=("gpt-4o",))
    assert decide(PLUGIN, policy, Overrides(model="openai/gpt-4o", active_provider="openai")).allowed
    assert decide(PLUGIN, policy, Overrides(model=" OpenAI/GPT-4o ", active_provider="openai")).allowed
    assert not decide(PLUGIN, policy, Overrides(model="anthropic/gpt-4o", active_provider="openai")).allowed
    assert not decide(PLUGIN, policy, Overrides(model="openai/gpt-4o", active_provider="custom")).allowed
    assert not decide(PLUGIN, policy, Overrides(model="openai/gpt-4o")).allowed  # no route: no prefix to drop


def test_unknown_key_never_grants_and_hints(tmp_path):
    config = parse_config(tmp_path, f"plugins:\n  entries:\n    {PLUGIN}:\n      llm:\n        allow_modle_override: true\n")
    assert not decide(PLUGIN, config.trust_for(PLUGIN), Overrides(model="x")).allowed
    assert any("allow_modle_override" in w and "did you mean 'allow_model_override'" in w for w in config.warnings)


def test_no_overrides_is_always_allowed():
    assert decide(PLUGIN, TrustPolicy(), Overrides()).allowed


def test_enforce_raises_permission_error_naming_plugin_and_key():
    with pytest.raises(PluginLlmTrustError) as info:
        enforce("image_gen/openai", TrustPolicy(), Overrides(model="dall-e-3"))
    assert isinstance(info.value, PermissionError)
    assert info.value.config_key == 'plugins.entries."image_gen/openai".llm.allow_model_override'
    assert "image_gen/openai" in str(info.value)


def test_config_path_quotes_nested_keys():
    assert config_path("plain-id_1", "allowed_models") == "plugins.entries.plain-id_1.llm.allowed_models"
    assert config_path("memory/honcho", "x") == 'plugins.entries."memory/honcho".llm.x'
