"""Typos that used to go unflagged (issue 13 item 8): top-level sections, providers, audit.required."""

from __future__ import annotations

import sys


from plugin_llm.cli.main import main
from plugin_llm.config import parse_config
from plugin_llm.provider_names import known_providers, unknown_provider_problem
from tests.conftest import write_config


def test_a_top_level_typo_gets_a_did_you_mean_but_hermes_sections_do_not(tmp_path):
    config = parse_config(tmp_path, "plugin:\n  enabled: [x]\nmodels: {}\nterminal: {backend: local}\ndisplay: {}\n")
    assert any("'plugin': unknown top-level section (did you mean 'plugins'?)" in w for w in config.warnings)
    assert any("'models'" in w and "'model'" in w for w in config.warnings)
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
