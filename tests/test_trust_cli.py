"""``plugin-llm trust show|check|explain|grant|revoke`` through the real CLI entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from plugin_llm.cli.main import main
from plugin_llm.trust_report import read_config, yaml_snippet
from tests.conftest import write_config
from tests.plugin_fixtures import write_plugin

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(hermes_home: Path) -> Path:
    """Two installed plugins: ``tldr`` and the nested ``image_gen/openai``."""
    root = hermes_home / "plugins"
    write_plugin(root, "tldr")
    write_plugin(root, "image_gen/openai")
    return hermes_home


def config(home: Path, text: str) -> Path:
    return write_config(home, textwrap.dedent(text).lstrip("\n"))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_json(capsys) -> tuple[int, list[dict]]:
    code, out, _ = run(capsys, "trust", "check", "--json")
    doc = json.loads(out)
    assert doc["ok"] is (code == 0)
    return code, doc["findings"]


def only(findings: list[dict], path: str) -> dict:
    matching = [f for f in findings if f["path"] == path]
    assert len(matching) == 1, (path, findings)
    return matching[0]


# ------------------------------------------------------------------ trust check: one test per finding
def test_check_clean_config_exits_zero(home, capsys):
    config(home, """
        plugins:
          enabled: [tldr, image_gen/openai]
          entries:
            tldr:
              llm:
                allow_model_override: true
                allowed_models: [openai/gpt-4o-mini, local-echo-1]
    """)
    code, out, err = run(capsys, "trust", "check")
    assert code == 0
    assert "plugins section OK: 1 entry, 2 plugins installed" in out
    assert err == ""


def test_check_unknown_key_under_plugins(home, capsys):
    config(home, """
        plugins:
          enabld: [tldr]
    """)
    code, findings = check_json(capsys)
    assert code == 1
    f = only(findings, "plugins.enabld")
    assert f["severity"] == "error" and f["line"] == 2
    assert "did you mean 'enabled'" in f["problem"] and f["fix"] == "rename it to enabled"


def test_check_unknown_key_under_entry(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              lmm: {allow_model_override: true}
    """)
    code, findings = check_json(capsys)
    assert code == 1
    f = only(findings, "plugins.entries.tldr.lmm")
    assert f["severity"] == "error" and "did you mean 'llm'" in f["problem"]


def test_check_unknown_key_under_llm_with_did_you_mean(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allow_modle_override: true
    """)
    code, out, err = run(capsys, "trust", "check")
    assert code == 1
    assert "error    plugins.entries.tldr.llm.allow_modle_override (config.yaml line 5)" in out
    assert "unknown key 'allow_modle_override', ignored (did you mean 'allow_model_override'?)" in out
    assert "fix: rename it to allow_model_override" in out
    assert "1 error, 0 warnings" in out
    assert "trust check failed" in err


def test_check_non_boolean_flag(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allow_model_override: "sure"
                allow_provider_override: 1
                allow_agent_id_override: "true"
    """)
    code, findings = check_json(capsys)
    assert code == 1
    f = only(findings, "plugins.entries.tldr.llm.allow_model_override")
    assert f["severity"] == "error" and "expected true or false" in f["problem"] and "counts as false" in f["problem"]
    assert only(findings, "plugins.entries.tldr.llm.allow_provider_override")["severity"] == "error"
    # the strings "true"/"false" are understood: booleans are strict, not truthy
    assert not [f for f in findings if f["path"].endswith("allow_agent_id_override")]


def test_check_allowlist_given_as_string(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allow_provider_override: true
                allowed_providers: openrouter, anthropic
    """)
    code, findings = check_json(capsys)
    assert code == 1
    f = only(findings, "plugins.entries.tldr.llm.allowed_providers")
    assert f["severity"] == "error" and "given as a string" in f["problem"] and "nothing is allowed" in f["problem"]
    assert f["fix"] == "allowed_providers: [openrouter, anthropic]"
    assert f["line"] == 6


def test_check_allowlist_not_a_list(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allowed_models: {gpt-4o: yes}
    """)
    code, findings = check_json(capsys)
    assert code == 1
    f = only(findings, "plugins.entries.tldr.llm.allowed_models")
    assert f["severity"] == "error" and "expected a list, got a mapping" in f["problem"]


def test_check_entry_for_a_plugin_that_is_not_installed(home, capsys):
    config(home, """
        plugins:
          entries:
            openai:             # the bare leaf of image_gen/openai: a mistake
              llm: {allow_model_override: true}
            future-plugin:      # nothing like it installed: pre-configured
              llm: {allow_model_override: true}
    """)
    code, findings = check_json(capsys)
    assert code == 1
    typo = only(findings, "plugins.entries.openai")
    assert typo["severity"] == "error" and "did you mean 'image_gen/openai'" in typo["problem"]
    assert typo["fix"] == 'rename the entry to "image_gen/openai" (a plugin\'s trust identity is its key)'
    future = only(findings, "plugins.entries.future-plugin")
    assert future["severity"] == "warning" and "no installed plugin has the key 'future-plugin'" in future["problem"]


def test_check_pre_configured_entry_alone_is_only_a_warning(home, capsys):
    config(home, """
        plugins:
          entries:
            future-plugin:
              llm: {allow_model_override: true}
    """)
    code, findings = check_json(capsys)
    assert code == 0 and [f["severity"] for f in findings] == ["warning"]


def test_check_star_allowlist_is_a_warning(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allow_provider_override: true
                allowed_providers: ["*"]
    """)
    code, findings = check_json(capsys)
    assert code == 0
    f = only(findings, "plugins.entries.tldr.llm.allowed_providers[0]")
    assert f["severity"] == "warning" and "'*' allows any provider" in f["problem"]


def test_check_model_unknown_to_litellm_is_a_warning(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allow_model_override: true
                allowed_models: [gpt-4o-mini, openai/gpt-4o-mini, anthropic/claude-haiku-4-5, gpt-4o-minni, local-echo-1, custom/my-model]
    """)
    code, findings = check_json(capsys)
    assert code == 0
    assert [f["path"] for f in findings] == ["plugins.entries.tldr.llm.allowed_models[3]"]
    f = findings[0]
    assert f["severity"] == "warning" and "litellm does not know the model 'gpt-4o-minni'" in f["problem"]
    assert "did you mean 'gpt-4o-mini'" in f["problem"]


def test_check_enabled_and_disabled_names_matching_no_plugin(home, capsys):
    config(home, """
        plugins:
          enabled: [tldr, openai, tldrr]
          disabled: [ghost]
    """)
    code, findings = check_json(capsys)
    assert code == 0  # openai is the bare name of image_gen/openai: fine
    assert {f["path"] for f in findings} == {"plugins.enabled[2]", "plugins.disabled[0]"}
    assert all(f["severity"] == "warning" for f in findings)
    assert "did you mean 'tldr'" in only(findings, "plugins.enabled[2]")["problem"]


def test_check_enabled_or_disabled_not_a_list(home, capsys):
    config(home, """
        plugins:
          enabled: tldr, image_gen/openai
          disabled: {ghost: true}
    """)
    code, findings = check_json(capsys)
    assert code == 1
    enabled = only(findings, "plugins.enabled")
    assert enabled["severity"] == "error" and enabled["fix"] == "write it as a list: enabled: [tldr, image_gen/openai]"
    assert only(findings, "plugins.disabled")["severity"] == "error"


def test_check_null_and_empty_allowlists_are_warnings(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allow_model_override: true
                allowed_models:
                allow_provider_override: true
                allowed_providers: []
    """)
    code, findings = check_json(capsys)
    assert code == 0
    assert "no allowlist: any value is allowed" in only(findings, "plugins.entries.tldr.llm.allowed_models")["problem"]
    assert "nothing is allowed" in only(findings, "plugins.entries.tldr.llm.allowed_providers")["problem"]


def test_check_unparsable_config_names_file_line_and_column(home, capsys):
    path = config(home, """
        plugins:
          entries:
            tldr:
              llm: [unclosed
    """)
    code, out, err = run(capsys, "trust", "check")
    assert code == 2  # a configuration error (EXIT_CODES), not a finding
    assert f"does not parse: {path}:5:1:" in out
    assert "every plugin override is refused" in out


def test_check_nested_key_paths_are_quoted(home, capsys):
    config(home, """
        plugins:
          entries:
            image_gen/openai:
              llm:
                allowed_models: gpt-4o
    """)
    code, findings = check_json(capsys)
    assert code == 1
    assert findings[0]["path"] == 'plugins.entries."image_gen/openai".llm.allowed_models'


def test_check_without_config_is_fine(home, capsys):
    code, out, _ = run(capsys, "trust", "check")
    assert code == 0 and "nothing to check" in out


# ------------------------------------------------------------------ trust show
SHOW_CONFIG = """
    # operator's notes
    model:
      provider: openai
      model: gpt-4o-mini
    plugins:
      entries:
        image_gen/openai:
          llm:
            allow_model_override: true
            allowed_models: [gpt-4o, gpt-4o-mini]
            allow_provider_override: maybe
"""


def test_show_prints_every_key_with_its_provenance(home, capsys):
    config(home, SHOW_CONFIG)
    code, out, err = run(capsys, "trust", "show")
    assert code == 0
    block = out.split("image_gen/openai  (installed, entry at config.yaml line 7)", 1)[1].split("\n\n")[0]
    rows = {line.split()[0]: line for line in block.splitlines() if line.startswith("    ")}
    assert rows["allow_model_override"].split()[1] == "true" and rows["allow_model_override"].endswith("config.yaml line 9")
    assert "[gpt-4o, gpt-4o-mini]" in rows["allowed_models"] and rows["allowed_models"].endswith("config.yaml line 10")
    assert "config.yaml line 11  (written: 'maybe')" in rows["allow_provider_override"]
    assert rows["allow_provider_override"].split()[1] == "false"
    assert rows["allow_agent_id_override"].endswith("default (fail closed)")
    assert rows["allowed_providers"].endswith("default (no allowlist)")
    assert "may override model in [gpt-4o, gpt-4o-mini]" in block
    assert "expected true or false, got a string 'maybe'" in block  # the plugin's warnings
    # an installed plugin without an entry is listed too
    assert "tldr  (installed)\n  no entry: no overrides" in out


def test_show_json_and_single_plugin(home, capsys):
    config(home, SHOW_CONFIG)
    code, out, _ = run(capsys, "trust", "show", "image_gen/openai", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [p["plugin_id"] for p in doc["plugins"]] == ["image_gen/openai"]
    plugin = doc["plugins"][0]
    assert plugin["policy"]["allowed_models"] == ["gpt-4o", "gpt-4o-mini"]
    settings = {s["key"]: s for s in plugin["settings"]}
    assert settings["allow_model_override"] == {"key": "allow_model_override", "value": True, "source": "config.yaml line 9", "line": 9}
    assert settings["allow_profile_override"]["source"] == "default (fail closed)"
    assert [w["path"] for w in plugin["warnings"]] == ['plugins.entries."image_gen/openai".llm.allow_provider_override']


def test_show_and_explain_give_the_line_of_a_grant_merged_in_or_consented(home, capsys):
    from plugin_llm.trust import consent_digest

    digest = consent_digest("image_gen/openai", ["llm.profile_override"])
    config(home, f"""
        x-grants: &grants
          allow_model_override: true
        plugins:
          entries:
            tldr:
              llm:
                <<: *grants
                allowed_models: [gpt-4o]
            image_gen/openai:
              granted_capabilities: [llm.profile_override]
              capabilities_sha256: {digest}
    """)
    code, out, _ = run(capsys, "trust", "show", "--json")
    plugins = {p["plugin_id"]: {s["key"]: s for s in p["settings"]} for p in json.loads(out)["plugins"]}
    assert plugins["tldr"]["allow_model_override"]["value"] is True
    assert plugins["tldr"]["allow_model_override"]["source"] == "config.yaml line 7"  # the merge key's line
    consented = plugins["image_gen/openai"]["granted_capabilities"]
    assert consented["value"] == ["llm.profile_override"] and consented["source"] == "config.yaml line 10"
    assert not any("fail closed" in s["source"] and s["value"] not in (False, None, [])
                   for settings in plugins.values() for s in settings.values())
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "gpt-4o")
    assert code == 0 and "allow_model_override is true, config.yaml line 7" in out


def test_show_resolves_a_bare_leaf_and_rejects_unknown_plugins(home, capsys):
    config(home, SHOW_CONFIG)
    code, out, err = run(capsys, "trust", "show", "openai")
    assert code == 0 and out.count("image_gen/openai  (installed") == 1
    assert "'openai' is the plugin 'image_gen/openai'" in err
    code, out, err = run(capsys, "trust", "show", "nope")
    assert code == 2 and out == ""
    assert err.startswith("plugin-llm: error: no plugin 'nope'") and "Traceback" not in err


def test_show_lists_entries_of_plugins_that_are_not_installed(home, capsys):
    config(home, """
        plugins:
          entries:
            ghost:
              llm: {allow_profile_override: true}
    """)
    code, out, _ = run(capsys, "trust", "show")
    assert code == 0
    assert "ghost  (NOT INSTALLED, entry at config.yaml line 3)" in out
    assert "may override profile" in out


def test_show_on_broken_yaml_is_fail_closed_and_non_zero(home, capsys):
    path = config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allow_model_override: true
               bad: indentation
    """)
    code, out, err = run(capsys, "trust", "show")
    assert code == 2
    assert f"config.yaml does not parse ({path}:6:" in err and err.count("does not parse") == 1
    assert "every plugin override is refused until it is fixed (fail closed)" in out
    assert "tldr  (installed)\n  fail closed: no overrides" in out
    assert "may override" not in out
    code, out, _ = run(capsys, "trust", "show", "--json")
    doc = json.loads(out)
    assert code == 2 and doc["fail_closed"] is True and f"{path}:6:" in doc["error"]
    assert all(not any(p["policy"][k] for k in p["policy"] if k.startswith("allow_")) for p in doc["plugins"])
    assert {s["source"] for p in doc["plugins"] for s in p["settings"]} == {"fail closed (config.yaml does not parse)"}


# ------------------------------------------------------------------ trust explain
def apply_snippet(home: Path, snippet: str) -> None:
    """Merge the printed YAML into config.yaml the way an operator would (lists replaced)."""

    def merge(into: dict, extra: dict) -> dict:
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value
        return into

    path = home / "config.yaml"
    current = yaml.safe_load(path.read_text()) if path.exists() else {}
    write_config(home, yaml.safe_dump(merge(current or {}, yaml.safe_load(snippet)), sort_keys=False))


def snippet_of(out: str) -> str:
    text = out.split("add to ", 1)[1].split(":\n\n", 1)[1]
    return text.split("\n(a list", 1)[0].split("\nor run:", 1)[0]


def test_explain_allowed_without_overrides_shows_the_route(home, capsys):
    config(home, "model: {provider: openai, model: gpt-4o-mini}\n")
    code, out, _ = run(capsys, "trust", "explain", "tldr")
    assert code == 0
    assert out.startswith("ALLOWED  no overrides requested")
    assert "route: openai / gpt-4o-mini (litellm openai/gpt-4o-mini), the provider's default endpoint" in out


def test_explain_allowed_by_flag_and_allowlist_uses_the_active_provider(home, capsys):
    config(home, """
        model: {provider: openai, model: gpt-4o}
        plugins:
          entries:
            tldr:
              llm:
                allow_model_override: true
                allowed_models: [openai/gpt-4o-mini]
    """)
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "gpt-4o-mini")
    assert code == 0
    assert out.startswith("ALLOWED  overrides granted by allow_model_override")
    assert "model='gpt-4o-mini': allow_model_override is true, config.yaml line 6" in out
    assert "'gpt-4o-mini' is on allowed_models, config.yaml line 7" in out
    assert "route: openai / gpt-4o-mini" in out
    # on another provider the same bare name is not the listed openai model
    config(home, (home / "config.yaml").read_text().replace("allow_model_override: true", "allow_model_override: true\n        allow_provider_override: true"))
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "gpt-4o-mini", "--provider", "openrouter")
    assert code == 1 and "'gpt-4o-mini' is not on allowed_models [openai/gpt-4o-mini]" in out


def test_explain_takes_the_routes_own_provider_prefix_as_the_listed_model(home, capsys):
    config(home, """
        model: {provider: openai, model: gpt-4o-mini}
        plugins:
          entries:
            tldr:
              llm: {allow_model_override: true, allowed_models: [gpt-4o]}
    """)
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "openai/gpt-4o")
    assert code == 0 and "route: openai / gpt-4o (litellm openai/gpt-4o)" in out
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "openrouter/gpt-4o")
    assert code == 1 and "'openrouter/gpt-4o' is not on allowed_models [gpt-4o]" in out


def test_explain_denied_flag_off_prints_snippet_that_works(home, capsys):
    config(home, "# keep me\nmodel: {provider: openai, model: gpt-4o-mini}\n")
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "gpt-4o")
    assert code == 1
    assert out.startswith("DENIED  plugin 'tldr' may not override model (asked for 'gpt-4o')")
    assert "refused: allow_model_override is false, default (fail closed)" in out
    snippet = snippet_of(out)
    # least privilege first: this one model; the flag alone (any model) second, saying so
    assert snippet == ("plugins:\n  entries:\n    tldr:\n      llm:\n        allow_model_override: true\n"
                       "        allowed_models: [gpt-4o]\n")
    assert "to allow only this model, set it with allowed_models: [gpt-4o]" in out.splitlines()[0]
    grants = [line.strip() for line in out.splitlines() if line.strip().startswith("plugin-llm trust grant")]
    assert grants == ["plugin-llm trust grant tldr model gpt-4o", "plugin-llm trust grant tldr model"]
    assert "broader (allows any model, not only 'gpt-4o'):\n  plugin-llm trust grant tldr model\n" in out
    assert "replaces the existing one" not in out  # there was no list
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "gpt-4o", "--json")
    doc = json.loads(out)
    assert doc["commands"] == ["plugin-llm trust grant tldr model gpt-4o"]
    assert doc["broader"] == [{"command": "plugin-llm trust grant tldr model", "allows": "any model, not only 'gpt-4o'"}]
    apply_snippet(home, snippet)
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "gpt-4o")
    assert code == 0 and out.startswith("ALLOWED")
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "gpt-4o-mini")
    assert code == 1  # only the one asked for


def test_explain_denied_allowlist_miss(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allow_model_override: true
                allowed_models: [gpt-4o-mini]
    """)
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "claude-3-5-haiku-latest")
    assert code == 1
    assert "'claude-3-5-haiku-latest' is not on allowed_models [gpt-4o-mini], config.yaml line 6" in out
    snippet = snippet_of(out)
    assert "allowed_models: [gpt-4o-mini, claude-3-5-haiku-latest]" in snippet
    assert "allow_model_override" not in snippet  # already on: minimal
    assert "(a list shown here replaces the existing one)" in out
    assert "plugin-llm trust grant tldr model claude-3-5-haiku-latest" in out
    apply_snippet(home, snippet)
    assert main(["trust", "explain", "tldr", "--model", "claude-3-5-haiku-latest"]) == 0


def test_explain_denied_empty_list(home, capsys):
    config(home, """
        plugins:
          entries:
            tldr:
              llm:
                allow_provider_override: true
                allowed_providers: []
    """)
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--provider", "anthropic", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["allowed"] is False and doc["config_key"] == "plugins.entries.tldr.llm.allowed_providers"
    assert "empty: nothing is allowed" in doc["reason"]
    assert doc["changes"] == {"allowed_providers": ["anthropic"]}
    apply_snippet(home, doc["snippet"])
    assert main(["trust", "explain", "tldr", "--provider", "anthropic"]) == 0


def test_explain_nested_key_is_quoted_and_every_needed_key_is_in_the_snippet(home, capsys):
    config(home, "model: {provider: openai, model: gpt-4o-mini}\n")
    code, out, _ = run(capsys, "trust", "explain", "image_gen/openai", "--provider", "anthropic",
                       "--model", "claude-3-5-haiku-latest", "--profile", "work", "--agent-id", "a1")
    assert code == 1
    snippet = snippet_of(out)
    assert snippet == textwrap.dedent("""\
        plugins:
          entries:
            "image_gen/openai":
              llm:
                allow_provider_override: true
                allowed_providers: [anthropic]
                allow_model_override: true
                allowed_models: [claude-3-5-haiku-latest]
                allow_agent_id_override: true
                allow_profile_override: true
    """)
    assert 'plugins.entries."image_gen/openai".llm.allow_provider_override' in out
    apply_snippet(home, snippet)
    code, out, _ = run(capsys, "trust", "explain", "image_gen/openai", "--provider", "anthropic",
                       "--model", "claude-3-5-haiku-latest", "--profile", "work", "--agent-id", "a1")
    assert code == 0
    assert "route: anthropic / claude-3-5-haiku-latest" in out and "profile work, agent_id a1" in out


def test_explain_matches_the_gateway_decision(home, capsys):
    """The dry run and a real call through PluginLlm refuse with the same config key."""
    from plugin_llm import PluginLlm
    from plugin_llm.errors import PluginLlmTrustError

    config(home, """
        plugins:
          entries:
            tldr:
              llm: {allow_model_override: true, allowed_models: [a-model]}
    """)
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--model", "b-model", "--json")
    doc = json.loads(out)
    with pytest.raises(PluginLlmTrustError) as raised:
        PluginLlm(plugin_id="tldr").complete([{"role": "user", "content": "hi"}], model="b-model")
    assert raised.value.config_key == doc["config_key"]
    assert str(raised.value) == doc["reason"]


def test_explain_on_broken_config_is_denied_and_says_why(home, capsys):
    path = config(home, "plugins: [\n")
    code, out, err = run(capsys, "trust", "explain", "tldr", "--model", "x")
    assert code == 2
    assert f"config.yaml does not parse ({path}:2:1:" in err
    assert "fail closed" in out and "to allow it" not in out


def test_explain_rejects_empty_values(home, capsys):
    code, _, err = run(capsys, "trust", "explain", "tldr", "--model", " ")
    assert code == 2 and "--model must not be empty" in err


# ------------------------------------------------------------------ grant / revoke
COMMENTED = """\
# my config: keep this comment
model:
  provider: openai   # the default route
  model: gpt-4o-mini
plugins:
  enabled: [tldr]    # only tldr
  entries:
    tldr:
      llm:
        # trusted for models
        allow_model_override: false
"""


def test_grant_and_revoke_round_trip_keeps_comments_and_writes_bak(home, capsys):
    write_config(home, COMMENTED)
    path = home / "config.yaml"
    code, out, err = run(capsys, "trust", "grant", "tldr", "model", "gpt-4o", "claude-3-5-haiku-latest")
    assert code == 0, err
    assert "+        allowed_models:" in out and "-        allow_model_override: false" in out
    assert f"wrote {path} (previous version: {path}.bak)" in out
    assert (home / "config.yaml.bak").read_text() == COMMENTED
    assert "may override model in [gpt-4o, claude-3-5-haiku-latest]" in out
    assert "allowed_models did not exist" in err  # the grant narrowed "any model"
    text = path.read_text()
    for comment in ("# my config: keep this comment", "# the default route", "# only tldr", "# trusted for models"):
        assert comment in text
    assert main(["trust", "explain", "tldr", "--model", "gpt-4o"]) == 0

    code, out, err = run(capsys, "trust", "revoke", "tldr", "model", "GPT-4o")  # case-insensitive, like the gate
    assert code == 0, err
    assert "may override model in [claude-3-5-haiku-latest]" in out
    assert main(["trust", "explain", "tldr", "--model", "gpt-4o"]) == 1

    code, out, err = run(capsys, "trust", "revoke", "tldr", "allow_model_override")  # the full key name works too
    assert code == 0
    assert "allowed_models is kept" in err
    policy = yaml.safe_load(path.read_text())["plugins"]["entries"]["tldr"]["llm"]
    assert policy == {"allow_model_override": False, "allowed_models": ["claude-3-5-haiku-latest"]}
    assert "# trusted for models" in path.read_text() and "# only tldr" in path.read_text()
    capsys.readouterr()

    # granting again restores the kept limits
    assert main(["trust", "grant", "tldr", "model"]) == 0
    assert "may override model in [claude-3-5-haiku-latest]" in capsys.readouterr().out


def test_revoke_last_value_leaves_an_empty_list_that_allows_nothing(home, capsys):
    write_config(home, COMMENTED)
    assert main(["trust", "grant", "tldr", "model", "gpt-4o"]) == 0
    capsys.readouterr()
    code, out, err = run(capsys, "trust", "revoke", "tldr", "model", "gpt-4o")
    assert code == 0
    assert "allowed_models is now empty" in err
    assert yaml.safe_load((home / "config.yaml").read_text())["plugins"]["entries"]["tldr"]["llm"]["allowed_models"] == []
    assert main(["trust", "explain", "tldr", "--model", "gpt-4o"]) == 1


def test_grant_nested_plugin_creates_a_quoted_entry(home, capsys):
    write_config(home, COMMENTED)
    code, out, _ = run(capsys, "trust", "grant", "image_gen/openai", "allowed_providers", "anthropic")
    assert code == 0
    assert "+    image_gen/openai:" in out or '+    "image_gen/openai":' in out
    assert read_config(home).config.trust_for("image_gen/openai").allowed_providers == ("anthropic",)
    assert main(["trust", "explain", "image_gen/openai", "--provider", "anthropic"]) == 0


def test_grant_dry_run_writes_nothing(home, capsys):
    write_config(home, COMMENTED)
    code, out, _ = run(capsys, "trust", "grant", "tldr", "profile", "--dry-run")
    assert code == 0
    assert "+        allow_profile_override: true" in out and "dry run: nothing was written" in out
    assert (home / "config.yaml").read_text() == COMMENTED
    assert not (home / "config.yaml.bak").exists()


def test_grant_json(home, capsys):
    write_config(home, COMMENTED)
    code, out, _ = run(capsys, "trust", "grant", "tldr", "agent-id", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["written"] is True and doc["flag"] == "allow_agent_id_override"
    assert doc["policy"]["policy"]["allow_agent_id_override"] is True
    assert doc["backup"] == str(home / "config.yaml.bak")


def test_grant_unknown_plugin_warns_unless_strict(home, capsys):
    write_config(home, COMMENTED)
    code, _, err = run(capsys, "trust", "grant", "not-yet", "model", "--strict")
    assert code == 2 and "no installed plugin has the key 'not-yet' (--strict)" in err
    assert (home / "config.yaml").read_text() == COMMENTED
    code, out, err = run(capsys, "trust", "grant", "not-yet", "model")
    assert code == 0
    assert "warning: no installed plugin has the key 'not-yet'" in err
    assert "not-yet  (NOT INSTALLED" in out


def test_grant_operator_mistakes_are_one_line_errors(home, capsys):
    write_config(home, COMMENTED)
    for argv, message in (
        (["trust", "grant", "tldr", "agent_id", "a1"], "agent_id has no allowlist"),
        (["trust", "grant", "tldr", "profile", "work"], "profile has no allowlist"),
        (["trust", "grant", "tldr", "temperature"], "unknown flag 'temperature'"),
        (["trust", "revoke", "image_gen/openai", "model", "gpt-4o"], "has no allowed_models list"),
    ):
        code, out, err = run(capsys, *argv)
        assert code == 2, argv
        assert err.startswith("plugin-llm: error: ") and message in err and err.count("\n") == 1
        assert "Traceback" not in err
    assert (home / "config.yaml").read_text() == COMMENTED


def test_grant_refuses_an_unparsable_config(home, capsys):
    path = config(home, "plugins:\n  entries: [\n")
    before = path.read_text()
    code, _, err = run(capsys, "trust", "grant", "tldr", "model")
    assert code == 2 and "does not parse" in err and f"{path}:3:1" in err
    assert path.read_text() == before and not (home / "config.yaml.bak").exists()


def test_grant_without_config_creates_one(home, capsys):
    assert main(["trust", "grant", "tldr", "model", "gpt-4o-mini"]) == 0
    assert read_config(home).config.trust_for("tldr").allowed_models == ("gpt-4o-mini",)


def test_yaml_snippet_quotes_what_yaml_would_misread():
    text = yaml_snippet("memory/honcho", {"allowed_models": ["*", "on", "anthropic.claude-v2:1", "gpt-4o"]})
    assert '"memory/honcho":' in text
    assert yaml.safe_load(text)["plugins"]["entries"]["memory/honcho"]["llm"]["allowed_models"] == [
        "*", "on", "anthropic.claude-v2:1", "gpt-4o"]


# ------------------------------------------------------------------ consistency
def test_home_option_and_missing_home(home, tmp_path, capsys):
    code, _, err = run(capsys, "trust", "check", "--home", str(tmp_path / "nowhere"))
    assert code == 2 and "does not exist" in err


def test_trust_without_action_shows(home, capsys):
    code, out, _ = run(capsys, "trust")
    assert code == 0 and "no entry: no overrides" in out


@pytest.mark.parametrize("argv", [["trust", "check"], ["trust", "show"], ["trust", "explain", "tldr", "--model", "x"]])
def test_trust_commands_never_import_litellm(home, argv):
    config(home, """
        plugins:
          entries:
            tldr:
              llm: {allow_model_override: true, allowed_models: [gpt-4o-mini, no-such-model]}
    """)
    code = (
        "import sys; from plugin_llm.cli.main import main; "
        f"rc = main({argv!r}); print('LITELLM', 'litellm' in sys.modules, rc)"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert "LITELLM False" in result.stdout, result.stdout + result.stderr


def test_check_knows_hermes_hook_callback_timeout(home, capsys):
    config(home, """
        plugins:
          hook_callback_timeout: 900
    """)
    code, out, err = run(capsys, "trust", "check")
    assert "unknown key" not in out
    assert "plugins.hook_callback_timeout" in out and "600 is used" in out
    config(home, """
        plugins:
          hook_callback_timeout: soon
    """)
    code, out, err = run(capsys, "trust", "check")
    assert code == 1 and "expected a number of seconds" in out


def test_show_says_which_plugins_may_use_the_built_in_tasks(home, capsys):
    config(home, """
        plugins:
          entries:
            tasker:
              llm: {allow_task_override: true}
    """)
    code, out, _ = run(capsys, "trust", "show")
    assert code == 0
    assert "may override task (built-in tasks)" in out and "allow_task_override" in out
    code, out, _ = run(capsys, "trust", "show", "--json")
    [entry] = [p for p in json.loads(out)["plugins"] if p["plugin_id"] == "tasker"]
    assert entry["granted_by"] == {"task": "allow_task_override"} and entry["policy"]["allow_task_override"] is True


# ------------------------------------------------------------------ tasks: task= and the auxiliary slots
TASK_CONFIG = """
    model: {provider: openai, model: gpt-4o-mini}
    models:
      cheap: {provider: openai, model: gpt-4o-mini}
      backup: {provider: anthropic, model: claude-3-5-haiku-latest}
    auxiliary:
      vision: {route: cheap, fallbacks: [backup]}
      compression: {provider: openrouter, model: openai/gpt-4o, timeout: 20}
      title_generation: {timeout: 5}
      tldr_summary: no_such_route
    plugins:
      entries:
        tldr:
          llm: {allow_task_override: true}
"""


def test_explain_shows_the_plugins_tasks_and_every_slot_with_its_route(home, capsys):
    config(home, TASK_CONFIG)
    code, out, _ = run(capsys, "trust", "explain", "tldr")
    assert code == 0 and out.startswith("ALLOWED  no overrides requested")
    tasks = out.split("\ntasks: ", 1)[1]
    assert tasks.startswith("built-in tasks allowed (by allow_task_override: true, config.yaml line 13)")
    assert ("auxiliary.vision (built-in, usable by this plugin): cheap: openai / gpt-4o-mini, the provider's "
            "default endpoint; then backup") in tasks
    assert "auxiliary.compression (built-in, usable by this plugin): openrouter / openai/gpt-4o" in tasks
    assert "timeout 20s" in tasks
    assert "auxiliary.title_generation (built-in, usable by this plugin): the default route: openai / gpt-4o-mini" in tasks
    assert ("auxiliary.tldr_summary (only the plugin that registers it): cannot be resolved: auxiliary.tldr_summary "
            "'no_such_route' is not a route of models:") in tasks
    code, out, _ = run(capsys, "trust", "explain", "image_gen/openai", "--json")
    doc = json.loads(out)["tasks"]
    assert doc["builtin_tasks_allowed"] is False and doc["granted_by"] is None
    assert doc["config_key"] == 'plugins.entries."image_gen/openai".llm.allow_task_override'
    slots = {s["task"]: s for s in doc["slots"]}
    assert [slots[t]["usable"] for t in ("vision", "compression", "tldr_summary")] == [
        "no", "no", "only the plugin that registers it"]
    assert slots["vision"]["route"]["name"] == "cheap" and slots["vision"]["route"]["fallbacks"][0]["name"] == "backup"
    assert slots["title_generation"]["default_route"] is True and slots["title_generation"]["timeout"] == 5
    assert slots["tldr_summary"]["route"] is None and "no_such_route" in slots["tldr_summary"]["error"]


def test_explain_without_slots_says_every_task_takes_the_default_route(home, capsys):
    config(home, "model: {provider: openai, model: gpt-4o-mini}\n")
    code, out, _ = run(capsys, "trust", "explain", "tldr")
    assert code == 0
    assert "\ntasks: built-in tasks refused: allow_task_override is false, default (fail closed)" in out
    assert "  no auxiliary: slots: every task takes the default route" in out


def test_explain_task_runs_the_task_gate_first_and_shows_the_slots_route(home, capsys):
    config(home, TASK_CONFIG)
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--task", "vision")
    assert code == 0
    assert out.startswith("ALLOWED  built-in task 'vision' granted by allow_task_override")
    assert "task='vision': a built-in task: allow_task_override is true, config.yaml line 13" in out
    assert "route: cheap: openai / gpt-4o-mini" in out and "then, on a failure another provider can fix: backup" in out
    code, out, _ = run(capsys, "trust", "explain", "tldr", "--task", "compression", "--json")
    doc = json.loads(out)
    assert doc["task"] == "compression" and doc["route"]["provider"] == "openrouter" and doc["route"]["timeout"] == 20
    # a task that is not built in is the registering plugin's: assumed to be this one's
    code, out, _ = run(capsys, "trust", "explain", "image_gen/openai", "--task", "tldr_summary")
    assert code == 0 and "not a built-in task: only the plugin that registers it" in out
    assert "route: cannot be resolved: auxiliary.tldr_summary 'no_such_route' is not a route of models:" in out


def test_explain_task_denied_gives_the_snippet_and_the_grant_that_allow_it(home, capsys):
    config(home, TASK_CONFIG)
    code, out, _ = run(capsys, "trust", "explain", "image_gen/openai", "--task", "vision", "--model", "gpt-4o")
    assert code == 1
    assert out.startswith("DENIED  plugin 'image_gen/openai' may not use the built-in task 'vision'")
    assert "task='vision': refused: a built-in task needs allow_task_override, which is false" in out
    snippet = snippet_of(out)
    assert snippet == ('plugins:\n  entries:\n    "image_gen/openai":\n      llm:\n        allow_task_override: true\n'
                       "        allow_model_override: true\n        allowed_models: [gpt-4o]\n")
    grants = [line.strip() for line in out.splitlines() if line.strip().startswith("plugin-llm trust grant")]
    assert grants[:2] == ["plugin-llm trust grant image_gen/openai task",
                          "plugin-llm trust grant image_gen/openai model gpt-4o"]
    assert main(["trust", "grant", "image_gen/openai", "task"]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "trust", "explain", "image_gen/openai", "--task", "vision")
    assert code == 0 and "allow_task_override is true, config.yaml line" in out
    assert main(["trust", "revoke", "image_gen/openai", "allow_task_override"]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "trust", "explain", "image_gen/openai", "--task", "vision")
    assert code == 1
