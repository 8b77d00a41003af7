"""A config.yaml that does not parse: every denial and command says so instead of misleading."""

from __future__ import annotations

import pytest

from plugin_llm import PluginLlm, PluginLlmTrustError
from plugin_llm.cli.main import main
from tests.conftest import audit_lines, write_config

GOOD = "plugins:\n  enabled: [tldr]\n  entries:\n    tldr:\n      llm:\n        allow_model_override: true\n"
BROKEN = GOOD + "  oops: [\n"
CLOSED = "config.yaml does not parse"
GATE = "the trust gate is closed until it is fixed"


def test_a_denial_says_the_gate_is_closed_not_that_the_flag_is_unset(hermes_home):
    write_config(hermes_home, BROKEN)
    with pytest.raises(PluginLlmTrustError) as caught:
        PluginLlm("tldr").complete([{"role": "user", "content": "hi"}], model="gpt-4o")
    message = str(caught.value)
    assert CLOSED in message and GATE in message and "config.yaml:8:1:" in message  # file:line:col of the problem
    assert "has not set" not in message
    [line] = audit_lines(hermes_home)
    assert line["status"] == "denied" and GATE in line["decision_reason"]


def test_try_run_and_trust_explain_say_config_does_not_parse(hermes_home, capsys):
    write_config(hermes_home, BROKEN)
    # a configuration error (exit 2): refused before a call is made on the defaults instead of the route
    assert main(["try", "--as", "tldr", "--model", "gpt-4o", "hi"]) == 2
    err = capsys.readouterr().err
    assert GATE in err and "has not set" not in err
    assert main(["run", "tldr", "hi"]) == 2
    err = capsys.readouterr().err
    assert "Unknown command" not in err and CLOSED in err and GATE in err
    assert main(["trust", "explain", "tldr", "--model", "gpt-4o"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("DENIED") and GATE in out.splitlines()[0] and "has not set" not in out


def test_a_good_config_keeps_the_precise_reason(hermes_home):
    write_config(hermes_home, "plugins:\n  entries:\n    other:\n      llm: {}\n")
    with pytest.raises(PluginLlmTrustError, match="has not set plugins.entries.tldr.llm.allow_model_override"):
        PluginLlm("tldr").complete([{"role": "user", "content": "hi"}], model="gpt-4o")


# ---- a duplicate key where trust, routing, limits, the service or auditing are decided: the file is refused
DUPLICATE_PLUGINS = ("plugins:\n  enabled: [tldr]\n  entries:\n    tldr:\n      llm: {allow_model_override: true}\n"
                     "model: {provider: local}\nplugins:\n  enabled: [tldr]\n")
DUPLICATE_FLAG = ("plugins:\n  enabled: [tldr]\n  entries:\n    tldr:\n      llm:\n"
                  "        allow_model_override: false\n        allow_model_override: true\n")


def test_a_second_top_level_plugins_key_is_an_error_naming_both_lines(hermes_home, capsys):
    write_config(hermes_home, DUPLICATE_PLUGINS)
    assert main(["trust", "check"]) == 2  # a configuration error, like YAML that does not parse
    out = capsys.readouterr().out
    assert "duplicate key 'plugins' at the top level (lines 1 and 7)" in out and "config.yaml:7:1:" in out
    assert main(["doctor"]) == 2  # its FAIL line, and the configuration error's exit code
    out = capsys.readouterr().out
    assert any(line.startswith("FAIL") and "duplicate key 'plugins'" in line for line in out.splitlines())


def test_a_duplicate_trust_key_closes_the_gate(hermes_home, capsys):
    write_config(hermes_home, DUPLICATE_FLAG)
    with pytest.raises(PluginLlmTrustError) as caught:
        PluginLlm("tldr").complete([{"role": "user", "content": "hi"}], model="gpt-4o")
    message = str(caught.value)
    assert GATE in message and "duplicate key 'allow_model_override' in plugins.entries.tldr.llm (lines 6 and 7)" in message
    [line] = audit_lines(hermes_home)
    assert line["status"] == "denied" and GATE in line["decision_reason"]
    assert main(["trust", "check"]) == 2
    assert "plugins.entries.tldr.llm (lines 6 and 7)" in capsys.readouterr().out


@pytest.mark.parametrize("text", [
    "limits:\n  defaults:\n    budget_usd: {day: 1}\n    budget_usd: {day: 100}\n",
    "service:\n  failed_auth: {max_failures: 3, max_failures: 1000}\n",
    "audit:\n  required: true\n  required: false\n",
    "limits: {defaults: {}}\nlimits: {}\n",
])
def test_a_duplicate_key_in_limits_service_or_audit_is_refused(hermes_home, capsys, text):
    write_config(hermes_home, text)
    assert main(["trust", "check"]) == 2
    assert "duplicate key" in capsys.readouterr().out


def test_duplicates_elsewhere_stay_a_warning(hermes_home, capsys):
    write_config(hermes_home, "display: {skin: a, skin: b}\nplugins: {enabled: []}\n")
    assert main(["trust", "check"]) == 0
    assert "duplicate key (also at line 1)" in capsys.readouterr().out
