"""What a plugin's name carries across remove, disable and a new install: its private data and its tokens.

A plugin installed under a removed plugin's name starts with no data; ``plugins remove`` moves the
data aside (asking, or --yes / --keep-data) and revokes the plugin's service tokens; a disabled
plugin's tokens are refused by the service (403) until it is enabled again; ``tokens create`` and
``try --as`` refuse a name no plugin here has (a typo), with a "did you mean", unless --force;
tokens expire after 90 days unless ``--expires never`` says otherwise.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from plugin_llm import limits
from plugin_llm.cli.plugins import terminal
from plugin_llm.cli.main import main
from plugin_llm.plugins.isolation.sandbox import plugin_data_dir
from plugin_llm.service.app import FILE_CHECK_SECONDS
from plugin_llm.service.tokens import TokenStore
from tests.conftest import audit_lines, write_config
from tests.plugin_fixtures import write_plugin
from tests.service_server import ServiceServer


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


def plugin_data_path(home: Path, key: str) -> Path:
    return home / "plugin-data" / key  # a plain key is its own directory name


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _install(capsys, home: Path, tmp_path: Path, name: str = "notes", code: str = "def register(ctx):\n    pass\n",
             *extra: str) -> tuple[int, str, str]:
    source = write_plugin(tmp_path / "src" / name, name, code)
    return run(capsys, "plugins", "install", str(source), "--no-enable", "--json", *extra)


def _tokens(home: Path) -> list:
    store = TokenStore(home)
    try:
        return store.list()
    finally:
        store.close()


# --------------------------------------------------------------------------- private data


def test_remove_without_a_terminal_asks_for_yes_or_keep_data_and_removes_nothing(hermes_home, tmp_path, capsys):
    assert _install(capsys, hermes_home, tmp_path)[0] == 0
    data = plugin_data_dir(hermes_home, "notes")
    (data / "memory.json").write_text('{"secret": "the old plugin\'s memory"}')
    code, _, err = run(capsys, "plugins", "remove", "notes")
    assert code == 2 and "private data" in err and "--yes" in err and "--keep-data" in err
    assert "nothing was removed" in err
    assert (hermes_home / "plugins" / "notes").is_dir() and (data / "memory.json").exists()


def test_remove_moves_the_data_aside_and_a_new_install_under_the_name_starts_empty(hermes_home, tmp_path, capsys):
    assert _install(capsys, hermes_home, tmp_path)[0] == 0
    data = plugin_data_dir(hermes_home, "notes")
    (data / "memory.json").write_text("the old plugin's memory")
    code, out, err = run(capsys, "plugins", "remove", "notes", "--yes", "--json")
    assert code == 0, err
    moved = Path(json.loads(out)["data_moved_to"])
    assert moved.parent == hermes_home / "plugin-data" / ".removed" and (moved / "memory.json").exists()
    assert not plugin_data_path(hermes_home, "notes").exists()
    assert _install(capsys, hermes_home, tmp_path, "notes")[0] == 0
    assert list(plugin_data_dir(hermes_home, "notes").iterdir()) == []  # the new notes starts with nothing


def test_keep_data_keeps_it_and_a_new_install_still_does_not_inherit_it(hermes_home, tmp_path, capsys):
    assert _install(capsys, hermes_home, tmp_path)[0] == 0
    data = plugin_data_dir(hermes_home, "notes")
    (data / "token.txt").write_text("a token the old plugin stored")
    code, out, err = run(capsys, "plugins", "remove", "notes", "--keep-data")
    assert code == 0, err
    assert f"Kept its private data in {data}" in out and (data / "token.txt").exists()
    code, out, err = _install(capsys, hermes_home, tmp_path, "notes")
    assert code == 0, err
    moved = Path(json.loads(out)["data_moved_to"])
    assert (moved / "token.txt").exists() and moved.parent.name == ".removed"
    assert not plugin_data_path(hermes_home, "notes").exists()
    # install --force over a plugin of the same name: the replaced one's data is not handed over either
    (plugin_data_dir(hermes_home, "notes") / "token.txt").write_text("second")
    code, out, err = _install(capsys, hermes_home, tmp_path, "notes", "def register(ctx):\n    pass\n", "--force")
    assert code == 0, err
    assert json.loads(out)["data_moved_to"]
    assert not plugin_data_path(hermes_home, "notes").exists()


def test_remove_on_a_terminal_asks_and_no_removes_nothing(hermes_home, tmp_path, capsys, monkeypatch):
    assert _install(capsys, hermes_home, tmp_path)[0] == 0
    (plugin_data_dir(hermes_home, "notes") / "memory.json").write_text("x")
    monkeypatch.setattr(terminal, "interactive", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    code, _, err = run(capsys, "plugins", "remove", "notes")
    assert code == 2 and "nothing was removed" in err and (hermes_home / "plugins" / "notes").is_dir()
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    code, out, err = run(capsys, "plugins", "remove", "notes")
    assert code == 0, err
    assert "Moved its private data aside to" in out and not plugin_data_path(hermes_home, "notes").exists()


@pytest.mark.slow
def test_an_isolated_plugin_installed_under_a_removed_ones_name_never_reads_its_memory(hermes_home, tmp_path,
                                                                                       capsys):
    from plugin_llm.plugins import PluginManager

    writer = ("import os, pathlib\n\ndef register(ctx):\n"
              "    pathlib.Path(os.environ['HOME'], 'memory.txt').write_text('the old plugin remembers')\n")
    reader = ("import os, pathlib\n\ndef register(ctx):\n"
              "    p = pathlib.Path(os.environ['HOME'], 'memory.txt')\n"
              "    ctx.register_command('recall', lambda raw: p.read_text() if p.exists() else 'nothing')\n")
    write_config(hermes_home, "plugins:\n  enabled: [notes]\n  entries:\n    notes: {isolation: process}\n")
    assert _install(capsys, hermes_home, tmp_path / "a", "notes", writer, "--accept-existing-grants")[0] == 0
    manager = PluginManager(hermes_home)
    try:
        manager.discover_plugins()
        assert manager.get_plugin("notes")["status"] == "enabled", manager.get_plugin("notes")["error"]
    finally:
        manager.shutdown()
    assert (plugin_data_path(hermes_home, "notes") / "memory.txt").exists()
    assert run(capsys, "plugins", "remove", "notes", "--yes", "--keep-config")[0] == 0
    assert _install(capsys, hermes_home, tmp_path / "b", "notes", reader, "--accept-existing-grants")[0] == 0
    manager = PluginManager(hermes_home)
    try:
        manager.discover_plugins()
        assert manager.get_plugin("notes")["status"] == "enabled", manager.get_plugin("notes")["error"]
        assert manager.run_command("recall", "") == "nothing"
    finally:
        manager.shutdown()


# --------------------------------------------------------------------------- tokens: which plugin


def test_tokens_create_refuses_a_name_no_plugin_has_with_a_did_you_mean(hermes_home, tmp_path, capsys):
    assert _install(capsys, hermes_home, tmp_path, "weather")[0] == 0
    code, out, err = run(capsys, "tokens", "create", "wether")
    assert code == 2 and "did you mean 'weather'" in err and "--force" in err and "Traceback" not in err
    assert "plg_" not in out and _tokens(hermes_home) == []
    assert run(capsys, "tokens", "create", "weather")[0] == 0
    assert run(capsys, "tokens", "create", "remote-one", "--force")[0] == 0  # a plugin of another machine
    assert [t.plugin for t in _tokens(hermes_home)] == ["weather", "remote-one"]


def test_tokens_create_resolves_a_bare_name_to_the_key_and_knows_configured_plugins(hermes_home, capsys):
    write_plugin(hermes_home / "plugins", "image_gen/openai")
    write_config(hermes_home, "plugins:\n  entries:\n    remote-bot:\n      llm: {allow_model_override: false}\n")
    code, out, err = run(capsys, "tokens", "create", "openai", "--json")
    assert code == 0, err
    assert json.loads(out)["plugin"] == "image_gen/openai"
    assert run(capsys, "tokens", "create", "remote-bot")[0] == 0  # configured for this gateway: known


def test_tokens_expire_after_90_days_unless_never_is_explicit(hermes_home, capsys):
    write_config(hermes_home, "plugins:\n  enabled: [notes]\n")
    code, out, err = run(capsys, "tokens", "create", "notes", "--json")
    assert code == 0, err
    row = json.loads(out)
    assert row["expires"] is not None and row["expires_unix"] - row["created_unix"] == pytest.approx(90 * 86400)
    code, out, err = run(capsys, "tokens", "create", "notes", "--expires", "never")
    assert code == 0, err
    assert "expires never (until revoked)" in err
    assert [t.expires is None for t in _tokens(hermes_home)] == [False, True]


def test_try_as_refuses_an_unknown_or_disabled_plugin_before_any_call(hermes_home, tmp_path, capsys):
    assert _install(capsys, hermes_home, tmp_path, "weather")[0] == 0
    code, _, err = run(capsys, "try", "--as", "wether", "hi")
    assert code == 2 and "did you mean 'weather'" in err and "no call was made" in err
    assert audit_lines(hermes_home) == []
    write_config(hermes_home, "plugins:\n  disabled: [weather]\n")
    code, _, err = run(capsys, "try", "--as", "weather", "hi")
    assert code == 2 and "is disabled" in err and audit_lines(hermes_home) == []
    assert run(capsys, "try", "--as", "weather", "--force", "hi")[0] == 0
    assert [r["plugin_id"] for r in audit_lines(hermes_home)] == ["weather"]


# --------------------------------------------------------------------------- tokens: remove, disable


def test_remove_revokes_the_plugins_tokens_and_says_how_many(hermes_home, tmp_path, capsys):
    assert _install(capsys, hermes_home, tmp_path, "weather")[0] == 0
    assert _install(capsys, hermes_home, tmp_path, "other")[0] == 0
    for plugin in ("weather", "weather", "other"):
        assert run(capsys, "tokens", "create", plugin)[0] == 0
    code, out, err = run(capsys, "plugins", "remove", "weather")
    assert code == 0, err
    assert "Revoked 2 service tokens of weather" in out
    status = {(t.plugin, t.status()) for t in _tokens(hermes_home)}
    assert status == {("weather", "revoked"), ("other", "active")}


@pytest.mark.slow
def test_a_disabled_plugins_tokens_are_refused_with_403_until_it_is_enabled(hermes_home, tmp_path, capsys):
    assert _install(capsys, hermes_home, tmp_path, "weather")[0] == 0
    with ServiceServer(hermes_home) as service:
        token = service.token("weather")
        call = lambda: httpx.post(service.url + "/v1/plugin-llm/complete", headers=service.auth(token),  # noqa: E731
                                  json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60)
        assert call().status_code == 200
        code, out, err = run(capsys, "plugins", "disable", "weather")
        assert code == 0, err
        assert "403 plugin_disabled" in out
        time.sleep(FILE_CHECK_SECONDS)  # the service looks at config.yaml again after this long
        refused = call()
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "plugin_disabled" and "plugin-llm plugins enable weather" in error["message"]
        assert run(capsys, "plugins", "enable", "weather")[0] == 0
        time.sleep(FILE_CHECK_SECONDS)
        assert call().status_code == 200
    denied = [json.loads(line) for line in (hermes_home / "logs" / "agent.log").read_text().splitlines()]
    denied = [e for e in denied if e.get("event") == "service.auth_denied"]
    assert [(e["reason"], e["plugin_id"]) for e in denied] == [("plugin_disabled", "weather")]
