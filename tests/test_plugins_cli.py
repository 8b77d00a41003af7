"""``plugin-llm plugins list|info``: table, JSON, errors, and no litellm import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_llm.cli.main import main
from tests.plugin_fixtures import HELLO_WORLD_INIT, HELLO_WORLD_MANIFEST, configure, write_plugin

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def populated(hermes_home, monkeypatch):
    monkeypatch.delenv("CLI_TEST_MISSING_KEY", raising=False)
    root = hermes_home / "plugins"
    write_plugin(root, "hello-world", HELLO_WORLD_INIT, manifest=HELLO_WORLD_MANIFEST)
    write_plugin(root, "image_gen/openai", manifest={"name": "openai", "version": "0.2", "requires_env": ["CLI_TEST_MISSING_KEY"]})
    write_plugin(root, "broken", "def register(ctx):\n    raise RuntimeError('exploded on load')\n")
    write_plugin(root, "muted")
    configure(hermes_home, enabled=["hello-world", "broken", "muted"], disabled=["muted"])
    return hermes_home


def test_list_table(populated, capsys):
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "KEY", "STATUS", "VERSION", "SOURCE", "TOOLS", "HOOKS", "CMDS"]
    hello = next(r for r in rows if r.startswith("hello-world"))
    assert hello.split() == ["hello-world", "hello-world", "enabled", "1.0", "user", "1", "1", "0"]
    assert "error: register() raised: RuntimeError: exploded on load" in out
    assert "enable: plugin-llm plugins enable image_gen/openai" in out
    assert "missing env: CLI_TEST_MISSING_KEY" in out
    assert "disabled" in out
    assert "4 plugins (" in out and "1 failed" in out


def test_plugins_without_action_lists(populated, capsys):
    assert main(["plugins"]) == 0
    assert "hello-world" in capsys.readouterr().out


def test_list_json(populated, capsys):
    assert main(["plugins", "list", "--json"]) == 0
    data = {p["key"]: p for p in json.loads(capsys.readouterr().out)}
    assert data["hello-world"]["tools"] == ["hello_world"]
    assert data["image_gen/openai"]["status"] == "not enabled"
    assert data["image_gen/openai"]["enable_hint"] == "plugin-llm plugins enable image_gen/openai"
    assert data["image_gen/openai"]["missing_env"] == ["CLI_TEST_MISSING_KEY"]
    assert data["broken"]["status"] == "failed" and "exploded on load" in data["broken"]["error"]
    assert data["muted"]["status"] == "disabled"


def test_json_flag_before_action_and_home_option(populated, tmp_path, capsys):
    other = tmp_path / "other-home"
    write_plugin(other / "plugins", "elsewhere")
    assert main(["plugins", "--json", "list", "--home", str(other)]) == 0
    assert [p["key"] for p in json.loads(capsys.readouterr().out)] == ["elsewhere"]


def test_empty_home(hermes_home, capsys):
    assert main(["plugins", "list"]) == 0
    assert "No plugins found" in capsys.readouterr().out


def test_info(populated, capsys):
    assert main(["plugins", "info", "openai"]) == 0
    out = capsys.readouterr().out
    assert "image_gen/openai" in out and "not enabled" in out
    assert 'plugins.entries."image_gen/openai".llm' in out
    assert main(["plugins", "info", "hello-world", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hooks"] == ["post_tool_call"]


def test_info_unknown_plugin_is_a_clear_error(populated, capsys):
    assert main(["plugins", "info", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no plugin 'nope'" in err and "hello-world" in err and "Traceback" not in err


def test_invalid_config_is_reported(hermes_home, capsys):
    write_plugin(hermes_home / "plugins", "alpha")
    (hermes_home / "config.yaml").write_text("plugins: [unclosed\n")
    assert main(["plugins", "list"]) == 2  # listed, and a configuration error
    captured = capsys.readouterr()
    assert "no plugin is enabled until it is fixed" in captured.out and "not enabled" in captured.out
    assert "config.yaml does not parse (" in captured.err


def test_list_never_imports_litellm(populated):
    code = (
        "import sys\n"
        "from plugin_llm.cli.main import main\n"
        "rc = main(['plugins', 'list', '--json'])\n"
        "print('LITELLM_IMPORTED=' + str('litellm' in sys.modules), file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    env = dict(os.environ, HERMES_HOME=str(populated), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "LITELLM_IMPORTED=False" in proc.stderr
    assert {p["key"] for p in json.loads(proc.stdout)} == {"hello-world", "image_gen/openai", "broken", "muted"}
