"""What `trust check`, `doctor` and `limits show|reset` say about broken limits and unknown plugin names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from plugin_llm import limits
from plugin_llm.cli.main import main
from plugin_llm.config import parse_config
from tests.conftest import write_config
from tests.plugin_fixtures import write_plugin

ROOT = Path(__file__).resolve().parents[1]
HOST_TYPO = "limits: {on_store_eror: allow}\nplugins: {entries: {my-plugin: {limits: {requests_per_minute: 30}}}}\n"
DEFAULTS_TYPO = "limits: {defaults: {requests_per_minut: 60}}\nplugins: {enabled: [my-plugin]}\n"
LIMITED = ("limits:\n  defaults: {requests_per_minute: 60}\nplugins:\n  enabled: [other]\n  entries:\n"
           "    my-plugin:\n      limits: {requests_per_minute: 30}\n    free: {llm: {}}\n")


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


def check(capsys) -> tuple[int, dict]:
    code = main(["trust", "check", "--json"])
    return code, json.loads(capsys.readouterr().out)


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = err.strip().splitlines()
    return line


# ------------------------------------------------------------------ 1. host section errors are trust errors
@pytest.mark.parametrize("text, path, line", [
    (HOST_TYPO, "limits.on_store_eror", 1),
    (DEFAULTS_TYPO, "limits.defaults.requests_per_minut", 1),
    ("limits:\n  prices:\n    Custom/M: {input_per_mtok: 1}\n", 'limits.prices."custom/m"', 3),
])
def test_trust_check_fails_on_an_error_in_the_limits_section(hermes_home, capsys, text, path, line):
    write_config(hermes_home, text)
    code, doc = check(capsys)
    assert code == 1 and doc["ok"] is False
    [finding] = [f for f in doc["findings"] if f["path"] == path]
    assert finding["severity"] == "error" and finding["line"] == line
    assert main(["trust", "check"]) == 1
    captured = capsys.readouterr()
    assert f"error    {path} (config.yaml line {line})" in captured.out
    assert "trust check failed: 1 error" in captured.err


def test_doctor_fails_a_limits_section_error_once_as_trust_not_as_a_config_warning(hermes_home, capsys):
    write_config(hermes_home, HOST_TYPO)
    code = main(["doctor", "--json"])
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert code == 1
    mentions = [c for c in checks if "on_store_eror" in c["message"]]
    assert [(c["check"], c["status"]) for c in mentions] == [("trust", "FAIL")]
    assert "limits.on_store_eror (line 1)" in mentions[0]["message"]
    assert [c["status"] for c in checks if c["check"] == "config"] == ["OK"]


def test_doctor_keeps_other_config_warnings(hermes_home, capsys):
    write_config(hermes_home, DEFAULTS_TYPO + "llm: {timeot: 3}\n")
    assert main(["doctor", "--json"]) == 1
    checks = json.loads(capsys.readouterr().out)["checks"]
    config = [c for c in checks if c["check"] == "config" and c["status"] != "OK"]
    assert config and not any("requests_per_minut" in c["message"] for c in config)
    assert any("llm.timeot" in c["message"] for c in config)


# ------------------------------------------------------------------ 2. each limits finding has its line
def test_limit_findings_carry_their_config_line(hermes_home, capsys):
    write_config(hermes_home, "model: {provider: custom, model: m, base_url: 'http://127.0.0.1:9/v1'}\n"
                              "plugins:\n  entries:\n    image_gen/openai:\n      limits:\n"
                              "        budget_usd: {day: '$1'}\n"
                              "    capped:\n      limits:\n        budget_usd: {day: 1.0}\n")
    code, doc = check(capsys)
    assert code == 1
    lines = {f["path"]: f["line"] for f in doc["findings"]}
    assert lines['plugins.entries."image_gen/openai".limits.budget_usd.day'] == 6
    # the price to add is not written, nor is any limits: section: no line to point at
    assert 'limits.prices."custom/m"' in lines and lines['limits.prices."custom/m"'] is None
    main(["trust", "check"])
    assert 'plugins.entries."image_gen/openai".limits.budget_usd.day (config.yaml line 6)' in capsys.readouterr().out


def test_trust_check_lists_every_problem_of_a_limits_block_with_its_line(hermes_home, capsys):
    write_config(hermes_home, "plugins:\n  entries:\n    my-plugin:\n      limits:\n"
                              "        requests_per_minut: 30\n        max_concurrent: 0.5\n"
                              "        budget_usd: {day: -1}\n")
    code, doc = check(capsys)
    assert code == 1
    found = {f["path"]: f["line"] for f in doc["findings"] if f["severity"] == "error"}
    base = "plugins.entries.my-plugin.limits."
    assert found == {base + "requests_per_minut": 5, base + "max_concurrent": 6, base + "budget_usd.day": 7}


def test_a_path_maps_back_to_the_longest_prefix_with_a_line(hermes_home):
    from plugin_llm import trust_report as tr

    write_config(hermes_home, "limits:\n  prices:\n    Custom/Big: {input_per_mtok: 1, output_per_mtok: 1}\n"
                              "plugins:\n  entries:\n    \"a.b\":\n      limits: {}\n")
    view = tr.read_config(hermes_home)
    assert view.line_of_path('plugins.entries."a.b".limits.requests_per_minute') == 7
    assert view.line_of_path('plugins.entries."a.b"') == 6
    assert view.line_of_path('limits.prices."custom/big"') == 3  # prices paths are lower-cased
    assert view.line_of_path('limits.prices."custom/none"') == 2
    assert view.line_of_path("service.port") is None


# ------------------------------------------------------------------ 3. unknown plugin names
def test_reset_of_an_unknown_plugin_is_refused_with_a_did_you_mean_and_not_audited(hermes_home, capsys):
    write_config(hermes_home, LIMITED)
    assert main(["limits", "reset", "my-plugn"]) == 2
    line = error_line(capsys)
    assert "'my-plugn'" in line and "did you mean 'my-plugin'?" in line
    assert "plugins with limits: my-plugin, other" in line and str(hermes_home / "config.yaml") in line
    log = hermes_home / "logs" / "agent.log"
    assert not log.exists() or "limits.reset" not in log.read_text()
    assert main(["limits", "show", "nosuch"]) == 2
    line = error_line(capsys)
    assert "unknown plugin 'nosuch'" in line and "did you mean" not in line and "plugins with limits:" in line
    assert capsys.readouterr().out == ""


def test_known_names_are_configured_enabled_or_installed(hermes_home, capsys):
    write_config(hermes_home, LIMITED)
    write_plugin(hermes_home / "plugins", "image_gen/openai")
    assert main(["limits", "show", "other"]) == 0  # enabled, under limits.defaults
    assert capsys.readouterr().out.startswith("other: 60 requests/min (limits.defaults)")
    assert main(["limits", "show", "image_gen/openai", "--json"]) == 0  # installed only
    assert json.loads(capsys.readouterr().out)["plugins"][0]["plugin_id"] == "image_gen/openai"
    assert main(["limits", "show", "openai"]) == 2  # a bare leaf: its key is suggested
    assert "did you mean 'image_gen/openai'?" in error_line(capsys)
    write_config(hermes_home, "plugins:\n  entries:\n    capped:\n      limits: {requests_per_minute: 2}\n"
                              "    unlimited: {llm: {}}\n")
    assert main(["limits", "reset", "unlimited"]) == 2  # known, without limits: as before
    assert "has no limits" in error_line(capsys)
    write_config(hermes_home, "model: {provider: local, model: local-echo-1}\n")
    assert main(["limits", "reset", "ghost"]) == 2
    assert "no plugin has limits in" in error_line(capsys)


# ------------------------------------------------------------------ 4. usage of `limits` itself
def test_limits_without_an_action_prints_its_own_usage(hermes_home, capsys):
    assert main(["limits"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: plugin-llm limits") and "show" in out and "reset" in out
    assert "demo" not in out  # not the top-level command list


def test_an_unknown_option_shows_the_usage_of_the_action_it_was_given_to(hermes_home, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["limits", "show", "--jsn"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: plugin-llm limits show") and "unrecognized arguments: --jsn" in err


# ------------------------------------------------------------------ 5. broken limits make `limits show` fail
@pytest.mark.parametrize("text, plugin", [
    ("plugins: {entries: {my-plugin: {limits: {requests_per_minut: 30}}}}\n", "my-plugin"),
    (HOST_TYPO, "my-plugin"),
    (DEFAULTS_TYPO, "my-plugin"),
])
def test_show_exits_1_when_a_shown_plugin_has_broken_limits(hermes_home, capsys, text, plugin):
    write_config(hermes_home, text)
    assert main(["limits", "show"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{plugin}: calls refused: ") and "until it is fixed" in out
    assert main(["limits", "show", plugin, "--json"]) == 1
    [row] = json.loads(capsys.readouterr().out)["plugins"]
    assert row["limits"]["error"] and row["summary"].startswith("calls refused")


def test_show_exits_0_when_the_limits_are_fine(hermes_home, capsys):
    write_config(hermes_home, LIMITED)
    assert main(["limits", "show"]) == 0


# ------------------------------------------------------------------ 6. docs
def test_docs_limits_example_exempts_an_entry_with_an_empty_block(tmp_path):
    section = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    snippet = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    config = parse_config(tmp_path, snippet)
    assert config.limits.for_plugin("trusted-plugin").empty  # `limits: {}`: no limits.defaults
    assert config.limits.for_plugin("elsewhere").requests_per_minute == 60
    assert "the plugins that run" in section and "limits show" in section


def test_config_example_calls_no_entry_with_limits_the_same_as_no_entry():
    lines = (ROOT / "config_examples" / "config.yaml").read_text(encoding="utf-8").splitlines()
    entries = yaml.safe_load("\n".join(lines))["plugins"]["entries"]
    for line in lines:
        if "same as no entry" in line:
            key = line.split(":", 1)[0].strip().strip('"')
            assert not entries[key].get("limits"), line


def test_a_key_with_a_newline_cannot_forge_a_line_of_trust_show_or_trust_check(hermes_home, capsys):
    write_config(hermes_home, 'plugins:\n  entries:\n    "p\\nplugin-llm: error: forged":\n'
                              '      limits: {requests_per_minut: 5}\n')
    main(["trust", "show"])
    main(["trust", "check"])
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert lines and not any(line.startswith("plugin-llm: error: forged") for line in lines)
    assert "Traceback" not in captured.err


# ------------------------------------------------------------------ 4. the plugins that run, by key
def test_the_overview_lists_the_plugins_that_run_by_their_keys(hermes_home, capsys):
    plugins = hermes_home / "plugins"
    write_plugin(plugins, "image_gen/sketch", manifest={"name": "sketch-gen", "version": "0.1"})
    write_plugin(plugins, "memory/jsonl", manifest={"name": "jsonl", "version": "0.1", "kind": "exclusive"})
    write_plugin(plugins, "off", manifest={"name": "off", "version": "0.1"})
    write_config(hermes_home, "limits:\n  defaults: {requests_per_minute: 10}\nmemory: {provider: jsonl}\n"
                              "plugins:\n  enabled: [sketch-gen, not-installed-yet, off]\n  disabled: [off]\n")
    assert main(["limits", "show", "--json"]) == 0
    shown = [row["plugin_id"] for row in json.loads(capsys.readouterr().out)["plugins"]]
    assert shown == ["image_gen/sketch", "memory/jsonl", "not-installed-yet"]  # calls are metered by key
    for action in ("show", "reset"):  # the manifest name is not the key its usage is counted under
        assert main(["limits", action, "sketch-gen"]) == 2
        line = error_line(capsys)
        assert "did you mean 'image_gen/sketch'?" in line and "installed plugin" in line
    log = hermes_home / "logs" / "agent.log"
    assert not log.exists() or "limits.reset" not in log.read_text()
    assert main(["limits", "show", "not-installed-yet"]) == 0  # enabled, not installed: as written


@pytest.mark.parametrize("enabled, shown", [("5", []), ("true", []), ("1.5", []), ("abc", ["abc"])])
def test_a_plugins_enabled_that_is_not_a_list_is_read_as_the_plugin_manager_reads_it(hermes_home, capsys, enabled, shown):
    write_config(hermes_home, f"limits:\n  defaults: {{requests_per_minute: 10}}\nplugins:\n  enabled: {enabled}\n")
    assert main(["limits", "show", "--json"]) == 0
    assert [row["plugin_id"] for row in json.loads(capsys.readouterr().out)["plugins"]] == shown
    assert main(["limits", "show", "x"]) == 2 and "Traceback" not in capsys.readouterr().err
