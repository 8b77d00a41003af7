"""Typos that used to go unflagged: top-level sections, providers, audit.required."""

from __future__ import annotations

import json
import sys
import textwrap

from plugin_llm.cli.main import main
from plugin_llm.config import parse_config
from plugin_llm.provider_names import known_providers, unknown_provider_problem
from tests.conftest import write_config


def test_a_top_level_typo_gets_a_did_you_mean_but_hermes_sections_do_not(tmp_path):
    config = parse_config(tmp_path, "plugin:\n  enabled: [x]\nmodle: {}\nterminal: {backend: local}\ndisplay: {}\n")
    assert any("'plugin': unknown top-level section (did you mean 'plugins'?)" in w for w in config.warnings)
    assert any("'modle'" in w and "'model'" in w for w in config.warnings)
    assert not any("terminal" in w or "display" in w for w in config.warnings)


def test_an_unknown_provider_gets_a_did_you_mean_without_importing_litellm(tmp_path):
    config = parse_config(tmp_path, "model:\n  provider: opnai\n  model: gpt-4o\n")
    assert any("unknown provider 'opnai' (did you mean 'openai'?)" in w for w in config.warnings)
    assert {"openai", "anthropic", "ollama", "bedrock", "custom", "local"} <= known_providers()
    for fine in ("openai", "ollama", "vertex_ai", "custom", "local", "together_ai"):
        assert unknown_provider_problem(fine) is None, fine


def test_a_non_boolean_audit_required_fails_closed_and_doctor_fails(hermes_home, capsys):
    write_config(hermes_home, 'audit:\n  required: "yes"\n')
    config = parse_config(hermes_home, 'audit:\n  required: "yes"\n')
    assert config.audit.required is True
    assert any("treated as true (fail closed" in w for w in config.warnings)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert any(line.startswith("FAIL") and "audit.required" in line for line in out.splitlines())


def test_auth_add_refuses_a_provider_typo_and_adds_nothing(hermes_home, capsys):
    assert main(["auth", "add", "opneai", "--key-env", "MY_KEY"]) != 0
    err = capsys.readouterr().err
    assert "unknown provider 'opneai' (did you mean 'openai'?)" in err and "nothing was added" in err
    assert not (hermes_home / "auth.json").exists()
    assert main(["auth", "test", "opneai"]) == 2  # not "no key: run auth add opneai"
    err = capsys.readouterr().err
    assert "unknown provider 'opneai' (did you mean 'openai'?)" in err and "no call was made" in err
    assert "auth add" not in err and "OPNEAI_API_KEY" not in err


def test_the_checks_do_not_import_litellm(hermes_home, tmp_path):
    import subprocess

    write_config(hermes_home, "plugin: {}\nmodel:\n  provider: opnai\n  model: x\n")
    code = ("import sys; from pathlib import Path; from plugin_llm.config import get_config_source; "
            f"c = get_config_source(Path({str(hermes_home)!r})).current(); "
            "assert any('opnai' in w for w in c.warnings); print('litellm' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"HERMES_HOME": str(hermes_home), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# ---- unknown top-level sections: errors for `trust check` and `doctor`, Hermes's own sections are fine
HERMES_SECTIONS = textwrap.dedent("""\
    _config_version: 14
    agent: {max_turns: 60}
    terminal: {backend: local}
    display: {skin: default}
    memory: {provider: ""}
    toolsets: [hermes-cli]
    mcp_servers: {}
    auxiliary: {vision: {provider: auto}}
    providers: {}
    fallback_model: {}
    custom_providers: []
    platforms: {}
    platform_toolsets: {}
    session_reset: {mode: idle}
    smart_model_routing: {enabled: false}
    video_gen: {}
    max_turns: 60
    """)


def _trust_check(capsys) -> tuple[int, list[dict]]:
    code = main(["trust", "check", "--json"])
    return code, json.loads(capsys.readouterr().out)["findings"]


def _doctor(capsys) -> tuple[int, list[dict]]:
    code = main(["doctor", "--json"])
    return code, json.loads(capsys.readouterr().out)["checks"]


def test_a_misspelt_limits_section_fails_trust_check_and_doctor(hermes_home, capsys):
    write_config(hermes_home, "model: {provider: local}\nlimts:\n  defaults:\n    budget_usd: {day: 1}\n")
    code, findings = _trust_check(capsys)
    assert code == 1
    (finding,) = [f for f in findings if f["path"] == "limts"]
    assert finding["severity"] == "error" and finding["line"] == 2
    assert "did you mean 'limits'?" in finding["problem"] and finding["fix"] == "rename it to limits"
    code, checks = _doctor(capsys)
    assert code == 1
    (trust,) = [c for c in checks if c["check"] == "trust"]
    assert trust["status"] == "FAIL" and "limts" in trust["message"] and "'limits'" in trust["message"]
    # one cause, one FAIL: the config line does not repeat it as a warning
    assert not any(c["check"] == "config" and "limts" in c["message"] for c in checks)


def test_an_unknown_top_level_key_far_from_any_section_is_an_error_too(hermes_home, capsys):
    write_config(hermes_home, "budgets:\n  day: 1\n")
    code, findings = _trust_check(capsys)
    assert code == 1
    (finding,) = findings
    assert finding["path"] == "budgets" and finding["severity"] == "error" and "did you mean" not in finding["problem"]
    assert "plugins" in finding["fix"] and "limits" in finding["fix"]


def test_hermes_own_top_level_sections_are_accepted(hermes_home, capsys):
    write_config(hermes_home, HERMES_SECTIONS + "model: {provider: local}\nplugins: {enabled: []}\n")
    config = parse_config(hermes_home, (hermes_home / "config.yaml").read_text())
    assert not any("top-level" in w for w in config.warnings), config.warnings
    code, findings = _trust_check(capsys)
    assert code == 0 and findings == []
    code, checks = _doctor(capsys)
    assert not any(c["status"] == "FAIL" and c["check"] in ("config", "trust") for c in checks), checks


# ---- an unknown provider is a configuration error, reported first; no fix repeats the typo
TYPO_ROUTE = ("model:\n  provider: opeanai\n  model: gpt-4o-mini\n"
              "limits:\n  defaults:\n    budget_usd: {day: 1}\n"
              "plugins:\n  entries:\n    p:\n      llm: {allow_provider_override: true, allowed_providers: [antropic]}\n")


def test_an_unknown_provider_is_the_first_error_and_no_fix_repeats_it(hermes_home, capsys):
    write_config(hermes_home, TYPO_ROUTE)
    code, findings = _trust_check(capsys)
    assert code == 1
    first = findings[0]
    assert first["path"] == "model.provider" and first["severity"] == "error" and first["line"] == 2
    assert "unknown provider 'opeanai' (did you mean 'openai'?)" in first["problem"]
    assert first["fix"] == "set model.provider: openai"
    (listed,) = [f for f in findings if f["path"].startswith("plugins.entries.p.llm.allowed_providers")]
    assert "did you mean 'anthropic'?" in listed["problem"] and "anthropic" in listed["fix"]
    for finding in findings:  # the price of "opeanai/..." is not what needs fixing
        assert "opeanai" not in finding["fix"] and "antropic" not in finding["fix"], finding
        assert "limits.prices" not in finding["path"], finding
    code, checks = _doctor(capsys)
    assert code == 1
    (trust,) = [c for c in checks if c["check"] == "trust"]
    assert trust["status"] == "FAIL" and "first: model.provider" in trust["message"]
    for check in checks:
        assert "opeanai" not in (check["fix"] or ""), check
        if check["check"] != "trust":
            assert "opeanai" not in check["message"], check


def test_the_short_model_form_names_an_unknown_provider_the_same_way(hermes_home, capsys):
    config = parse_config(hermes_home, "model: opeanai/gpt-4o-mini\n")
    assert any("model.provider: unknown provider 'opeanai' (did you mean 'openai'?)" in w for w in config.warnings)
    write_config(hermes_home, "model: opeanai/gpt-4o-mini\n")
    code, findings = _trust_check(capsys)
    assert code == 1 and findings[0]["path"] == "model" and findings[0]["fix"] == "model: openai/gpt-4o-mini"


def test_a_call_on_an_unknown_provider_is_a_config_error_not_a_price_or_key_problem(hermes_home):
    import pytest

    from plugin_llm import PluginLlm
    from plugin_llm.errors import PluginLlmConfigError
    from tests.conftest import audit_lines

    write_config(hermes_home, TYPO_ROUTE)
    with pytest.raises(PluginLlmConfigError) as caught:
        PluginLlm("p").complete([{"role": "user", "content": "hi"}])
    message = str(caught.value)
    assert "unknown provider 'opeanai' (did you mean 'openai'?)" in message and "set model.provider: openai" in message
    assert "limits.prices" not in message and "auth add" not in message
    (record,) = [r for r in audit_lines(hermes_home) if r.get("status") == "error"]
    assert record["error.type"] == "PluginLlmConfigError"
