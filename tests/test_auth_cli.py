"""``plugin-llm auth list|add|remove``: atomic 0600 writes, masked output, no key on the command line."""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import stat
import sys
from pathlib import Path

import pytest

from plugin_llm.cli import auth_cmd
from plugin_llm.cli.main import main


def canary(prefix: str = "cnry") -> str:
    return f"{prefix}{secrets.token_hex(16)}"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir(mode=0o700)
    return h


def run(capsys, *argv: str, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def read_auth(home: Path) -> dict:
    return json.loads((home / "auth.json").read_text())


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --------------------------------------------------------------------------- add


def test_add_from_stdin_writes_0600_atomically_and_prints_only_a_mask(home, capsys, monkeypatch):
    key = canary("sk-")
    old_umask = os.umask(0)  # even a permissive umask cannot make the file readable by others
    try:
        code, out, err = run(capsys, "auth", "add", "openai", "--from-stdin", "--home", str(home),
                             stdin=key + "\n", monkeypatch=monkeypatch)
    finally:
        os.umask(old_umask)
    assert code == 0, err
    assert read_auth(home) == {"providers": {"openai": {"api_key": key}}}
    assert mode_of(home / "auth.json") == 0o600
    assert key not in out + err and f"sk-…{key[-4:]}" in out
    assert [p.name for p in home.iterdir() if p.name.endswith(".tmp")] == []


def test_add_replaces_the_file_rather_than_rewriting_it_in_place(home, capsys, monkeypatch):
    run(capsys, "auth", "add", "openai", "--from-stdin", "--home", str(home), stdin=canary() + "\n",
        monkeypatch=monkeypatch)
    inode = (home / "auth.json").stat().st_ino
    code, _, err = run(capsys, "auth", "add", "groq", "--key-env", "MY_GROQ", "--home", str(home))
    assert code == 0, err
    assert (home / "auth.json").stat().st_ino != inode  # a new file renamed over the old one


def test_failed_write_leaves_the_old_file_intact(home, capsys, monkeypatch):
    key = canary()
    run(capsys, "auth", "add", "openai", "--from-stdin", "--home", str(home), stdin=key + "\n",
        monkeypatch=monkeypatch)
    before = (home / "auth.json").read_bytes()

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    code, out, err = run(capsys, "auth", "add", "groq", "--key-env", "GROQ_KEY", "--home", str(home))
    assert code == 1 and "No space left on device" in err and "Traceback" not in err
    assert (home / "auth.json").read_bytes() == before
    assert sorted(p.name for p in home.iterdir()) == [".auth.json.lock", "auth.json"]


def test_add_from_a_terminal_uses_a_hidden_prompt(home, capsys, monkeypatch):
    key = canary()

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    prompts = []
    monkeypatch.setattr(sys, "stdin", Tty(""))
    monkeypatch.setattr(auth_cmd.getpass, "getpass", lambda prompt: prompts.append(prompt) or key)
    code, out, err = run(capsys, "auth", "add", "anthropic", "--profile", "work", "--from-stdin", "--home", str(home))
    assert code == 0, err
    assert prompts == ["API key for anthropic (input hidden): "]
    assert read_auth(home) == {"profiles": {"work": {"anthropic": {"api_key": key}}}}
    assert key not in out + err


def test_add_key_env_and_key_cmd(home, capsys):
    code, out, err = run(capsys, "auth", "add", "custom", "--key-env", "MY_GATEWAY_KEY", "--home", str(home))
    assert code == 0 and "$MY_GATEWAY_KEY is not set" in err
    code, out, err = run(capsys, "auth", "add", "openai", "--profile", "work", "--key-cmd",
                         "pass show 'api keys/openai'", "--home", str(home))
    assert code == 0, err
    assert read_auth(home) == {
        "providers": {"custom": {"key_env": "MY_GATEWAY_KEY"}},
        "profiles": {"work": {"openai": {"key_cmd": ["pass", "show", "api keys/openai"]}}},
    }


def test_add_refuses_to_overwrite_without_replace_and_keeps_comments(home, capsys, monkeypatch):
    path = home / "auth.json"
    path.write_text(json.dumps({"_comment": "mine", "providers": {"OpenAI": {"_note": "team key", "api_key": "a" * 20}}}))
    os.chmod(path, 0o600)
    code, _, err = run(capsys, "auth", "add", "openai", "--key-env", "X_KEY", "--home", str(home))
    assert code == 2 and "already has a key source (api_key)" in err and "--replace" in err
    code, _, err = run(capsys, "auth", "add", "openai", "--key-env", "X_KEY", "--replace", "--home", str(home))
    assert code == 0, err
    assert read_auth(home) == {"_comment": "mine", "providers": {"openai": {"_note": "team key", "key_env": "X_KEY"}}}


def test_add_pool_keys(home, capsys, monkeypatch):
    a, b, c = canary(), canary(), canary()
    for key in (a, b):
        run(capsys, "auth", "add", "openrouter", "--from-stdin", "--pool", "--home", str(home), stdin=key + "\n",
            monkeypatch=monkeypatch)
    code, out, err = run(capsys, "auth", "add", "openrouter", "--from-stdin", "--pool", "--home", str(home),
                         stdin=c + "\n", monkeypatch=monkeypatch)
    assert code == 0 and "pool key #2" in out and "(3 keys)" in out
    assert read_auth(home)["providers"]["openrouter"] == {"keys": [a, b, c]}
    code, _, err = run(capsys, "auth", "add", "openrouter", "--from-stdin", "--pool", "--home", str(home),
                       stdin=b + "\n", monkeypatch=monkeypatch)
    assert code == 2 and "already in the pool" in err and b not in err


@pytest.mark.parametrize("stdin, problem", [("\n", "no key on standard input"), ("two words\n", "spaces")])
def test_add_rejects_bad_stdin(home, capsys, monkeypatch, stdin, problem):
    code, _, err = run(capsys, "auth", "add", "openai", "--from-stdin", "--home", str(home), stdin=stdin,
                       monkeypatch=monkeypatch)
    assert code == 2 and problem in err and not (home / "auth.json").exists()


def test_add_refuses_to_edit_an_unsafe_or_broken_file(home, capsys):
    path = home / "auth.json"
    path.write_text('{"providers": {"openai": {"api_key": "' + "k" * 20 + '"}}}')
    os.chmod(path, 0o644)
    code, _, err = run(capsys, "auth", "add", "groq", "--key-env", "G", "--home", str(home))
    assert code == 1 and f"chmod 600 {path}" in err
    path.write_text('{"providers": ')
    os.chmod(path, 0o600)
    code, _, err = run(capsys, "auth", "add", "groq", "--key-env", "G", "--home", str(home))
    assert code == 1 and "invalid JSON at line 1" in err
    assert path.read_text() == '{"providers": '


# --------------------------------------------------------------------------- no key on the command line


def _add_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    auth_cmd.register(parser.add_subparsers())
    auth_parser = parser._subparsers._group_actions[0].choices["auth"]
    return auth_parser._subparsers._group_actions[0].choices["add"]


def test_add_has_no_option_or_argument_that_takes_a_key():
    add = _add_parser()
    valued = set()
    for action in add._actions:
        if action.option_strings and action.nargs != 0:
            valued.update(action.option_strings)
        if not action.option_strings:
            assert action.dest == "provider"
    assert valued == {"--home", "--profile", "--key-env", "--key-cmd"}


@pytest.mark.parametrize(
    "argv",
    [
        ["auth", "add", "openai", "--from-stdin", "{key}"],
        ["auth", "add", "openai", "{key}", "--from-stdin"],
        ["auth", "add", "openai", "--from-stdin", "--api-key={key}"],
        ["auth", "add", "openai", "--from-stdin", "--key={key}"],
        ["auth", "add", "openai", "--key", "{key}"],
        ["auth", "add", "openai", "{key}"],
    ],
)
def test_a_key_on_the_command_line_is_refused_and_never_echoed(home, capsys, monkeypatch, argv):
    key = canary()
    argv = [a.replace("{key}", key) for a in argv] + ["--home", str(home)]
    code, out, err = run(capsys, *argv, stdin="", monkeypatch=monkeypatch)
    assert code == 2
    assert key not in out and key not in err
    assert not (home / "auth.json").exists()


# --------------------------------------------------------------------------- list


def test_list_shows_masked_keys_sources_and_env(home, capsys, monkeypatch):
    file_key, pool_a, pool_b, env_key = canary("sk-"), canary(), canary(), canary()
    path = home / "auth.json"
    path.write_text(json.dumps({
        "providers": {"openai": {"api_key": file_key}, "openrouter": {"keys": [pool_a, pool_b]},
                      "custom": {"key_env": "GW_KEY"}},
        "profiles": {"work": {"anthropic": {"key_cmd": ["pass", "show", "anthropic"]}}},
        "default_profile": "work",
    }))
    os.chmod(path, 0o600)
    monkeypatch.setenv("GROQ_API_KEY", env_key)
    monkeypatch.setenv("GW_KEY", canary())
    code, out, err = run(capsys, "auth", "list", "--home", str(home))
    assert code == 0, err
    for secret in (file_key, pool_a, pool_b, env_key, os.environ["GW_KEY"]):
        assert secret not in out + err
    assert "profiles: work (default)" in out
    lines = {line.split()[0] + ":" + line.split()[2]: line for line in out.splitlines()[2:] if line.strip()}
    assert f"sk-…{file_key[-4:]}" in lines["openai:auth.json"]
    assert "2 keys" in lines["openrouter:pool"] and "healthy" in lines["openrouter:pool"]
    assert "$GW_KEY" in lines["custom:key_env"]
    assert "not run yet" in lines["anthropic:key_cmd"] and "pass show anthropic" in lines["anthropic:key_cmd"]
    assert "$GROQ_API_KEY" in lines["groq:env"]
    assert f"…{pool_b[-4:]}" in out

    code, out, err = run(capsys, "auth", "list", "--json", "--home", str(home))
    data = json.loads(out)
    assert data["default_profile"] == "work" and data["profiles"] == ["work"] and data["exists"] is True
    by_provider = {r["provider"]: r for r in data["credentials"]}
    assert by_provider["openrouter"]["keys"][1] == {"key_id": "openrouter#1", "key": f"…{pool_b[-4:]}",
                                                    "health": "healthy"}
    assert all(s not in out for s in (file_key, pool_a, pool_b, env_key))


def test_list_with_no_file(home, capsys):
    code, out, _ = run(capsys, "auth", "list", "--home", str(home))
    assert code == 0 and "not present" in out and "auth add" in out


def test_list_refuses_an_unsafe_file_without_a_traceback(home, capsys):
    key = canary()
    path = home / "auth.json"
    path.write_text(json.dumps({"providers": {"openai": {"api_key": key}}}))
    os.chmod(path, 0o640)
    code, out, err = run(capsys, "auth", "list", "--home", str(home))
    assert code == 1 and f"chmod 600 {path}" in err and "Traceback" not in err and key not in out + err


def test_list_reports_a_malformed_file_with_its_position(home, capsys):
    path = home / "auth.json"
    path.write_text('{\n  "providers": {\n    "openai": {"api_key": "x" "y"}\n  }\n}\n')
    os.chmod(path, 0o600)
    code, _, err = run(capsys, "auth", "list", "--home", str(home))
    assert code == 1 and str(path) in err and "line 3, column" in err


def test_home_defaults_to_hermes_home(home, capsys, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(home))
    code, out, _ = run(capsys, "auth", "add", "groq", "--key-env", "G")
    assert code == 0 and str(home / "auth.json") in out
    assert (home / "auth.json").exists()


# --------------------------------------------------------------------------- remove


def test_remove(home, capsys, monkeypatch):
    run(capsys, "auth", "add", "openai", "--from-stdin", "--home", str(home), stdin=canary() + "\n",
        monkeypatch=monkeypatch)
    run(capsys, "auth", "add", "openai", "--profile", "work", "--key-env", "W", "--home", str(home))
    code, out, err = run(capsys, "auth", "remove", "openai", "--profile", "work", "--home", str(home))
    assert code == 0 and "removed profiles.work.openai" in out and "now empty" in err
    assert read_auth(home)["profiles"] == {"work": {}}
    assert mode_of(home / "auth.json") == 0o600
    code, out, _ = run(capsys, "auth", "remove", "OpenAI", "--home", str(home))
    assert code == 0 and read_auth(home)["providers"] == {}
    code, _, err = run(capsys, "auth", "remove", "openai", "--home", str(home))
    assert code == 2 and "has no entry providers.openai" in err
    code, _, err = run(capsys, "auth", "remove", "openai", "--profile", "nope", "--home", str(home))
    assert code == 2 and "no profile 'nope'" in err


def test_auth_without_action_prints_help(capsys):
    code, out, _ = run(capsys, "auth")
    assert code == 2 and "list" in out and "add" in out


# --------------------------------------------------------------------------- test


def _route(home: Path, base_url: str, keys: dict) -> None:
    (home / "config.yaml").write_text(
        f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {base_url}\nllm:\n  max_retries: 0\n")
    path = home / "auth.json"
    path.write_text(json.dumps(keys))
    os.chmod(path, 0o600)


def test_auth_test_makes_one_real_call_with_the_profile_key(home, capsys):
    from tests.conftest import audit_lines
    from tests.servers import FakeServer, Reply

    default_key, work_key = canary(), canary()
    with FakeServer([Reply(content="ok"), Reply(content="ok")]) as server:
        _route(home, server.base_url, {"providers": {"custom": {"api_key": default_key}},
                                       "profiles": {"work": {"custom": {"keys": [work_key]}}}})
        code, out, err = run(capsys, "auth", "test", "custom", "--profile", "work", "--home", str(home))
        assert code == 0, err
        code2, out2, err2 = run(capsys, "auth", "test", "custom", "--home", str(home))
        assert code2 == 0, err2
        sent = [r.headers.get("Authorization") or r.headers.get("authorization") for r in server.requests]
    assert sent == [f"Bearer {work_key}", f"Bearer {default_key}"]
    assert "via pool work:custom#0" in out and "OK: custom/" in out and f"…{work_key[-4:]}" in out
    for text in (out, err, out2, err2):
        assert work_key not in text and default_key not in text
    records = audit_lines(home)
    assert [(r["plugin_id"], r["profile"], r["status"]) for r in records] == [
        ("auth-test", "work", "ok"), ("auth-test", None, "ok")]


def test_auth_test_reports_the_providers_error_redacted(home, capsys):
    from tests.servers import FakeServer, Reply

    key = canary()

    def echo(_json, headers, path):
        auth = headers.get("Authorization") or headers.get("authorization")
        return 401, {"error": {"message": f"Incorrect API key provided: {auth} ({path}?key={key})",
                               "type": "invalid_request_error"}}

    with FakeServer([Reply(body=echo)]) as server:
        _route(home, server.base_url, {"providers": {"custom": {"api_key": key}}})
        code, out, err = run(capsys, "auth", "test", "custom", "--home", str(home))
    assert code == 1
    assert "FAILED: PluginLlmProviderError" in err and "401" in err and "Incorrect API key provided" in err
    assert key not in out + err


def test_auth_test_without_a_key_or_with_an_unknown_profile_makes_no_call(home, capsys, monkeypatch):
    monkeypatch.delenv("GROQ_API_KEY", raising=False)
    code, _, err = run(capsys, "auth", "test", "groq", "--home", str(home))
    assert code == 1 and "no API key for provider 'groq'" in err and "GROQ_API_KEY" in err
    code, _, err = run(capsys, "auth", "test", "groq", "--profile", "nope", "--home", str(home))
    assert code == 1 and "unknown credential profile 'nope'" in err


def test_auth_test_needs_a_model_for_an_unconfigured_exotic_provider(home, capsys, monkeypatch):
    monkeypatch.setenv("DEEPINFRA_API_KEY", canary())
    code, _, err = run(capsys, "auth", "test", "deepinfra", "--home", str(home))
    assert code == 2 and "pass --model" in err
    # a name that is no provider at all is refused before its key is looked for
    monkeypatch.setenv("ACME_API_KEY", canary())
    code, _, err = run(capsys, "auth", "test", "acme", "--home", str(home))
    assert code == 2 and "unknown provider 'acme'" in err and "no call was made" in err
