"""`plugin-llm try` and `serve-local` argument handling, through main()."""

from __future__ import annotations

import pytest

import json
import subprocess
import sys

from plugin_llm.cli.main import main
from tests.conftest import write_config


def test_try_prints_result_usage_cost_and_audit_record(hermes_home, capsys):
    assert main(["try", "--as", "my-plugin", "--force", "Summarise: the cat sat. It purred."]) == 0
    out = capsys.readouterr().out
    assert "the cat sat." in out
    assert "route:  local / local-echo-1" in out and "cost: $0.000000" in out
    audit_line = next(line for line in out.splitlines() if line.startswith("audit:"))
    record = json.loads(audit_line.split("audit:", 1)[1])
    assert record["plugin_id"] == "my-plugin" and record["status"] == "ok" and record["purpose"] == "plugin-llm try"


def test_try_json_and_structured(hermes_home, capsys):
    schema = json.dumps({"type": "object", "properties": {"vendor": {"type": "string"}}, "required": ["vendor"]})
    assert main(["try", "--as", "p", "--force", "--schema", schema, "--json", "Vendor: ACME"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parsed"] == {"vendor": "ACME"} and out["audit_record"]["api"] == "structured"
    assert out["audit"]["call_id"] == out["audit_record"]["call_id"]


def test_try_denied_override_is_one_line_with_the_key(hermes_home, capsys):
    assert main(["try", "--as", "p", "--force", "--model", "gpt-4o", "hi"]) == 1
    err = capsys.readouterr().err
    assert "PluginLlmTrustError" in err and "plugins.entries.p.llm.allow_model_override" in err
    assert "Traceback" not in err


def test_try_granted_override_goes_through(hermes_home, capsys):
    write_config(hermes_home, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: true\n        allowed_models: [local-echo-2]\n")
    assert main(["try", "--as", "p", "--model", "local-echo-2", "hi"]) == 0


def test_try_bad_schema_is_an_operator_error(hermes_home, capsys):
    assert main(["try", "--as", "p", "--schema", "{not json", "hi"]) == 2
    assert "--schema is not valid JSON" in capsys.readouterr().err
    assert main(["try", "--as", "p", "--schema", '{"type": "nope"}', "hi"]) == 2
    assert "schema" in capsys.readouterr().err


def test_serve_local_rejects_bad_port(capsys):
    assert main(["serve-local", "--port", "70000"]) == 2
    assert "--port must be between 0 and 65535" in capsys.readouterr().err


@pytest.mark.slow
def test_unknown_command_and_help_never_import_litellm():
    code = ("import sys; from plugin_llm.cli.main import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('litellm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False")
    bad = subprocess.run([sys.executable, "-m", "plugin_llm", "no-such-command"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and "Traceback" not in bad.stderr


def test_try_refuses_a_config_that_does_not_parse(hermes_home, capsys):
    write_config(hermes_home, "model: [broken\n")
    # refused (a configuration error): a fresh process would call the defaults, not the operator's route
    assert main(["try", "--as", "p", "hi"]) == 2
    err = capsys.readouterr().err
    assert "config.yaml:2:1" in err and "the trust gate is closed until it is fixed" in err


def test_a_hostile_plugin_id_cannot_draw_on_the_terminal_in_try_or_audit(hermes_home, capsys):
    """An id with an OSC title, a screen clear, a newline and a bidi override is printed escaped by
    ``try`` and by ``audit tail`` / ``audit stats``, text and --json."""
    hostile = "X\x1b]0;PWN\x07\x1b[2J\nFAKE: line\u202eevil"
    assert main(["try", "--as", hostile, "--force", "hi"]) == 0
    out = capsys.readouterr().out
    for args in (["audit", "tail"], ["audit", "tail", "--json"], ["audit", "stats"], ["audit", "stats", "--json"]):
        assert main(args) == 0
        out += capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert not any(line.startswith("FAKE") for line in out.splitlines())
