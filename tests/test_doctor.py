"""``plugin-llm doctor``: one OK/WARN/FAIL line per check, exit 1 on any FAIL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from audit import AuditLog
from plugin_llm.cli.main import main
from tests.conftest import write_config
from tests.plugin_fixtures import write_plugin

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-doctor-test-0123456789abcdefWXYZ"


def doctor(capsys, *extra: str) -> tuple[int, list[dict]]:
    code = main(["doctor", "--json", *extra])
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is (code == 0)
    return code, doc["checks"]


def lines(checks: list[dict], name: str) -> list[dict]:
    return [c for c in checks if c["check"] == name]


def status(checks: list[dict], name: str) -> str:
    found = lines(checks, name)
    assert found, (name, checks)
    worst = {"OK": 0, "WARN": 1, "FAIL": 2}
    return max((c["status"] for c in found), key=worst.__getitem__)


@pytest.fixture
def healthy(hermes_home: Path, capsys) -> Path:
    os.chmod(hermes_home, 0o700)
    assert main(["audit", "keygen"]) == 0  # a log with records and no signing key is a WARN
    capsys.readouterr()
    write_plugin(hermes_home / "plugins", "tldr", "def register(ctx):\n    ctx.register_command('tldr', lambda raw: 'ok')\n")
    write_config(hermes_home, textwrap.dedent("""\
        model: {provider: local, model: local-echo-1}
        plugins:
          enabled: [tldr]
          entries:
            tldr:
              llm: {allow_model_override: true, allowed_models: [local-echo-1]}
    """))
    log = AuditLog(hermes_home / "logs" / "agent.log")
    log.write_event("config_reloaded", trust_policy_sha256="a" * 64, changed_entries=[])
    log.close()
    return hermes_home


def test_healthy_home_is_all_ok(healthy, capsys):
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert code == 0
    rows = [line for line in out.splitlines() if line[:4] in ("OK  ", "WARN", "FAIL")]
    assert rows and all(line.startswith("OK") for line in rows), out
    assert f"OK    home: {healthy} (mode 0700)" in out
    assert "OK    config: " in out and "OK    trust: plugins section has no problems (1 entry)" in out
    assert "OK    route: local / local-echo-1" in out
    assert "OK    credentials: local needs no key" in out
    assert "appendable" in out and "OK    audit verify: chain intact: 1 record in 1 file" in out
    assert "OK    plugins: 1 found: 1 enabled" in out
    assert "OK    litellm: " in out and "not imported" in out
    assert out.rstrip().endswith(f"0 WARN, 0 FAIL ({healthy})")


def test_doctor_does_not_write_to_the_audit_log(healthy, capsys):
    log = healthy / "logs" / "agent.log"
    before = log.read_bytes()
    assert main(["doctor"]) == 0
    assert log.read_bytes() == before


def test_broken_home_fails_with_the_right_lines(hermes_home, capsys):
    write_config(hermes_home, "plugins:\n  enabled: [x\n")  # unparsable
    auth = hermes_home / "auth.json"
    auth.write_text(json.dumps({"providers": {"openai": {"api_key": SECRET}}}))
    os.chmod(auth, 0o644)
    (hermes_home / "logs").write_text("not a directory\n")  # the log cannot be created under a file
    write_plugin(hermes_home / "plugins", "bad-manifest", manifest="name: [unclosed\n")
    code = main(["doctor"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 2  # config.yaml does not parse: a configuration error (EXIT_CODES)
    assert f"FAIL  config: does not parse: {hermes_home / 'config.yaml'}:3:1:" in out
    assert f"FAIL  auth.json: {auth} has mode 0644" in out and f"fix: chmod 600 {auth}" in out
    assert f"FAIL  audit log: {hermes_home / 'logs'} is not a directory" in out
    assert "FAIL  plugin bad-manifest: failed to load:" in out
    assert "WARN  route: unknown while config.yaml does not parse" in out
    assert "WARN  trust: not checked" in out  # one cause, one FAIL
    assert out.count("FAIL  ") == 4
    assert SECRET not in out + captured.err
    assert "Traceback" not in captured.err


def test_plugin_whose_register_raises_is_a_fail(hermes_home, capsys):
    write_plugin(hermes_home / "plugins", "boom", "def register(ctx):\n    raise RuntimeError('exploded on load')\n")
    write_config(hermes_home, "plugins:\n  enabled: [boom]\n")
    code, checks = doctor(capsys)
    assert code == 1
    (line,) = lines(checks, "plugin boom")
    assert line["status"] == "FAIL" and "exploded on load" in line["message"]
    assert status(checks, "plugins") == "OK"
    assert not (hermes_home / "logs").exists()  # reported here, not appended to the audit log


def test_missing_env_of_an_enabled_plugin_is_a_warning(hermes_home, capsys, monkeypatch):
    monkeypatch.delenv("DOCTOR_TEST_TOKEN", raising=False)
    write_plugin(hermes_home / "plugins", "needs-env", manifest={"name": "needs-env", "requires_env": ["DOCTOR_TEST_TOKEN"]})
    write_config(hermes_home, "plugins:\n  enabled: [needs-env]\n")
    code, checks = doctor(capsys)
    assert code == 0
    (line,) = lines(checks, "plugin needs-env")
    assert line["status"] == "WARN" and "DOCTOR_TEST_TOKEN" in line["message"]


def test_credentials_for_the_active_route_are_masked(hermes_home, capsys, monkeypatch):
    write_config(hermes_home, "model: {provider: openai, model: gpt-4o-mini}\n")
    code, checks = doctor(capsys)
    assert code == 1
    (cred,) = lines(checks, "credentials")
    assert cred["status"] == "FAIL" and "OPENAI_API_KEY" in cred["message"]

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert code == 0
    assert "OK    credentials: openai: sk-…WXYZ from environment variable OPENAI_API_KEY" in out
    assert SECRET not in out


def test_custom_route_without_key_is_ok(hermes_home, capsys):
    write_config(hermes_home, "model: {provider: custom, model: m, base_url: 'http://127.0.0.1:9/v1'}\n")
    code, checks = doctor(capsys)
    assert code == 0
    assert lines(checks, "credentials")[0]["message"] == "custom needs no key"
    assert "http://127.0.0.1:9/v1" in lines(checks, "route")[0]["message"]


def test_trust_check_errors_and_other_config_warnings(hermes_home, capsys):
    write_plugin(hermes_home / "plugins", "tldr")
    write_config(hermes_home, textwrap.dedent("""\
        llm: {timeout: -1}
        plugins:
          entries:
            tldr:
              llm: {allow_modle_override: true}
    """))
    code, checks = doctor(capsys)
    assert code == 1
    (trust,) = lines(checks, "trust")
    assert trust["status"] == "FAIL" and "allow_modle_override" in trust["message"] and "line 5" in trust["message"]
    assert trust["fix"].startswith("plugin-llm trust check")
    config_lines = lines(checks, "config")
    assert [c["status"] for c in config_lines] == ["OK", "WARN"] and "llm.timeout" in config_lines[1]["message"]


def test_group_writable_home_is_a_warning(hermes_home, capsys):
    os.chmod(hermes_home, 0o775)
    code, checks = doctor(capsys)
    assert code == 0
    warn = [c for c in lines(checks, "home") if c["status"] == "WARN"]
    assert len(warn) == 1 and "group-writable (mode 0775)" in warn[0]["message"]
    assert warn[0]["fix"] == f"chmod go-w {hermes_home}"


@pytest.mark.slow
def test_tampered_audit_log_fails_verify(healthy, capsys):
    log = AuditLog(healthy / "logs" / "agent.log")
    log.write_event("plugin_load_failed", plugin_id="x", error="e")
    log.close()
    path = healthy / "logs" / "agent.log"
    first, second = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(first + second.replace(b'"x"', b'"y"'))
    code, checks = doctor(capsys)
    assert code == 1
    (verify,) = lines(checks, "audit verify")
    assert verify["status"] == "FAIL" and f"{path}:2: edited" in verify["message"]


def test_unappendable_log_file_is_a_fail(hermes_home, capsys):
    (hermes_home / "logs" / "agent.log").mkdir(parents=True)  # a directory where the log file should be
    code, checks = doctor(capsys)
    assert code == 1
    assert lines(checks, "audit log")[0]["status"] == "FAIL"
    assert "is not a regular file" in lines(checks, "audit log")[0]["message"]


def test_missing_home_is_a_warning_not_a_failure(tmp_path, capsys, monkeypatch):
    missing = tmp_path / "fresh-machine"
    monkeypatch.setenv("HERMES_HOME", str(missing))
    code, checks = doctor(capsys)
    assert code == 0
    assert status(checks, "home") == "WARN" and not missing.exists()


def test_home_option_must_be_a_directory(tmp_path, capsys):
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    assert main(["doctor", "--home", str(not_dir)]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.slow
def test_doctor_never_imports_litellm(healthy):
    code = "import sys; from plugin_llm.cli.main import main; rc = main(['doctor']); print('LITELLM', 'litellm' in sys.modules, rc)"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert "LITELLM False 0" in result.stdout, result.stdout + result.stderr


def test_a_known_malicious_litellm_is_a_fail(healthy, capsys, monkeypatch):
    from plugin_llm import supply_chain
    from plugin_llm.cli.doctor_cmd import FAIL, OK, _litellm

    [check] = _litellm(version_of=lambda name: "1.82.8", files_of=lambda name: ["litellm/__init__.py"])
    assert check.status == FAIL and "1.82.8 is a known-malicious release" in check.message
    assert "rotate every provider key" in check.fix and "--require-hashes" in check.fix
    [check] = _litellm(version_of=lambda name: "1.110.2", files_of=lambda name: ["litellm_init.pth"])
    assert check.status == FAIL and "litellm_init.pth" in check.message
    assert _litellm(version_of=lambda name: "1.110.2", files_of=lambda name: [])[0].status == OK
    # through the command: the installed version as package metadata gives it
    monkeypatch.setattr(supply_chain, "installed_version", lambda name: "1.82.7" if name == "litellm" else None)
    code, checks = doctor(capsys)
    assert code == 1 and status(checks, "litellm") == "FAIL"
    assert any("1.82.7 is a known-malicious release" in c["message"] for c in lines(checks, "litellm"))


def test_an_unsigned_log_is_a_warning_once_it_has_records(hermes_home, capsys):
    write_config(hermes_home, "model: {provider: local}\n")
    _, checks = doctor(capsys)
    (signing,) = lines(checks, "audit signing")
    assert signing["status"] == "OK" and "no signing key" in signing["message"]  # nothing to protect yet
    log = AuditLog(hermes_home / "logs" / "agent.log")
    log.write_event("config_reloaded", trust_policy_sha256="a" * 64, changed_entries=[])
    log.close()
    code, checks = doctor(capsys)
    (signing,) = lines(checks, "audit signing")
    assert signing["status"] == "WARN" and "no signing key" in signing["message"]
    assert "plugin-llm audit keygen" in signing["fix"] and code == 0


def test_each_auxiliary_slot_is_checked_route_and_key(hermes_home, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    write_config(hermes_home, textwrap.dedent("""\
        model: {provider: openai, model: gpt-4o-mini}
        models:
          cheap: {provider: openai, model: gpt-4o-mini}
          backup: {provider: anthropic, model: claude-3-5-haiku-latest}
        auxiliary:
          vision: {route: cheap, fallbacks: [backup]}
          title_generation: {timeout: 5}
          summary: no_such_route
    """))
    code, checks = doctor(capsys)
    assert code == 1
    (vision,) = lines(checks, "auxiliary vision")
    assert vision["status"] == "OK"
    assert vision["message"] == ("task='vision' takes cheap: openai / gpt-4o-mini, "
                                 "then backup: anthropic / claude-3-5-haiku-latest")
    (title,) = lines(checks, "auxiliary title_generation")
    assert title["message"] == "task='title_generation' takes the default route, openai / gpt-4o-mini (timeout 5s)"
    (summary,) = lines(checks, "auxiliary summary")
    assert summary["status"] == "FAIL" and "'no_such_route' is not a route of models:" in summary["message"]
    assert "auxiliary.summary" in summary["fix"]
    # the key of each provider a slot adds: openai is the default route's (checked once), anthropic is missing
    creds = lines(checks, "credentials")
    assert [c["status"] for c in creds] == ["OK", "FAIL"] and "ANTHROPIC_API_KEY" in creds[1]["message"]
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert "OK    credentials: anthropic: sk-…WXYZ from environment variable ANTHROPIC_API_KEY" in out
    assert "FAIL  auxiliary summary: every call with task='summary' is refused" in out and SECRET not in out


def test_no_auxiliary_section_adds_no_lines(healthy, capsys):
    code, checks = doctor(capsys)
    assert code == 0 and not [c for c in checks if c["check"].startswith("auxiliary")]
