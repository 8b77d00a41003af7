"""UX gaps: ``plugins info/list`` report ``enabled`` as configured and ``loaded``
separately; every command that reads config.yaml says the same thing and exits 2 when it does not
parse; tool and middleware failures reach the log and the audit log with the plugin's frames."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_llm.cli.main import main
from tests.bounded import run_bounded
from tests.conftest import write_config
from tests.plugin_fixtures import write_plugin

ROOT = Path(__file__).resolve().parents[1]
GATE = "the trust gate is closed until it is fixed"


def _info(capsys: pytest.CaptureFixture[str], name: str) -> tuple[dict, str]:
    assert main(["plugins", "info", name, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["plugins", "info", name]) == 0
    return data, capsys.readouterr().out


def _field(text: str, name: str) -> str:
    [line] = [line for line in text.splitlines() if line.split("  ", 1)[0].strip() == name]
    return line.split(None, 1)[1]


# --------------------------------------------------------------------------- 1. enabled vs loaded


def test_plugins_info_enabled_is_what_the_operator_configured_and_loaded_is_separate(hermes_home, capsys):
    plugins = hermes_home / "plugins"
    write_plugin(plugins, "broken", "def register(ctx):\n    raise RuntimeError('exploded')\n")
    write_plugin(plugins, "fine", "def register(ctx):\n    ctx.register_command('fine', lambda raw: 'ok')\n")
    write_plugin(plugins, "muted")
    write_plugin(plugins, "idle")
    write_config(hermes_home, "plugins:\n  enabled: [broken, fine, muted]\n  disabled: [muted]\n")

    broken, text = _info(capsys, "broken")  # enabled in config.yaml, failed to load
    assert broken["enabled"] is True and broken["loaded"] is False and broken["status"] == "failed"
    assert "RuntimeError: exploded" in broken["not_loaded_reason"]
    assert _field(text, "enabled").startswith("yes") and _field(text, "loaded").startswith("no: it failed to load")

    fine, text = _info(capsys, "fine")
    assert (fine["enabled"], fine["loaded"], fine["not_loaded_reason"]) == (True, True, None)
    assert _field(text, "enabled").startswith("yes") and _field(text, "loaded") == "yes"

    muted, text = _info(capsys, "muted")  # plugins.disabled wins over plugins.enabled
    assert (muted["enabled"], muted["loaded"]) == (False, False)
    assert "plugins.disabled" in muted["not_loaded_reason"] and "plugins.disabled" in _field(text, "loaded")

    idle, text = _info(capsys, "idle")
    assert (idle["enabled"], idle["loaded"]) == (False, False) and _field(text, "enabled") == "no"
    assert "plugin-llm plugins enable idle" in idle["not_loaded_reason"]

    assert main(["plugins", "list", "--json"]) == 0  # the listing reports the same fields
    listed = {p["key"]: p for p in json.loads(capsys.readouterr().out)}
    assert {k: (p["enabled"], p["loaded"]) for k, p in listed.items()} == {
        "broken": (True, False), "fine": (True, True), "muted": (False, False), "idle": (False, False)}


def test_the_python_api_keeps_enabled_meaning_loaded(hermes_home):
    from plugin_llm.plugins import PluginManager

    write_plugin(hermes_home / "plugins", "broken", "def register(ctx):\n    1 / 0\n")
    write_config(hermes_home, "plugins:\n  enabled: [broken]\n")
    [p] = PluginManager(hermes_home, audit_events=False).list_plugins()
    assert p["enabled"] is False and p["enabled_in_config"] is True  # SPEC: enabled only when loaded


# --------------------------------------------------------------------------- 2. config.yaml does not parse

BROKEN = "model:\n  provider: local\nplugins:\n  enabled: [tldr\n"
#: every command that reads config.yaml; the first ones still report what they can
READS_CONFIG = [
    ["trust", "show"], ["trust", "show", "--json"], ["trust", "check"], ["trust", "check", "--json"],
    ["trust", "explain", "tldr", "--model", "gpt-4o"], ["trust", "explain", "tldr"],
    ["trust", "grant", "tldr", "model", "gpt-4o"], ["trust", "revoke", "tldr", "model"],
    ["plugins", "list"], ["plugins", "list", "--json"], ["plugins", "info", "tldr"], ["plugins", "enable", "tldr"],
    ["plugins", "disable", "tldr"], ["doctor"], ["doctor", "--json"],
    ["run", "tldr", "hi"], ["run", "help"], ["try", "--as", "tldr", "hi"], ["try", "--as", "tldr", "--model", "x", "hi"],
    ["chat"], ["limits", "show"], ["limits", "reset", "tldr"], ["tokens", "list"], ["tokens", "create", "tldr"],
    ["serve", "--port", "0"],
]


@pytest.mark.parametrize("argv", READS_CONFIG, ids=" ".join)
def test_every_command_on_a_config_that_does_not_parse_says_so_once_and_exits_2(hermes_home, capsys, argv):
    write_plugin(hermes_home / "plugins", "tldr", "def register(ctx):\n    ctx.register_command('tldr', lambda r: r)\n")
    path = write_config(hermes_home, BROKEN)
    before = path.read_text()
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    expected = f"config.yaml does not parse ({path}:5:1: did not find expected ',' or ']'): {GATE}"
    assert captured.err.count(expected) == 1, captured.err
    assert "Unknown command" not in captured.err and "has not set" not in captured.err
    assert "Traceback" not in captured.err
    assert path.read_text() == before  # nothing was written
    assert not (hermes_home / "logs" / "agent.log").exists() or '"llm.call"' not in (
        hermes_home / "logs" / "agent.log").read_text()  # no call was made on the defaults


def test_scaffolding_a_plugin_reads_no_config(hermes_home, tmp_path, capsys):
    write_config(hermes_home, BROKEN)
    assert main(["plugins", "new", "fresh", "--dir", str(tmp_path)]) == 0
    assert "does not parse" not in capsys.readouterr().err


def test_a_plugin_command_on_a_config_that_does_not_parse(hermes_home, capsys):
    write_config(hermes_home, BROKEN)
    assert main(["tldr2", "hi"]) == 2
    err = capsys.readouterr().err
    assert GATE in err and "no plugin command is available" in err and "invalid choice" not in err
    with pytest.raises(SystemExit) as exited:  # a typo of a built-in command: argparse's list of them
        main(["plugns", "list"])
    assert exited.value.code == 2 and "invalid choice: 'plugns'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_problem_is_printed_once_through_the_real_entry_point(hermes_home):
    """The first load's log line and the command's own error are not both printed (a subprocess:
    in-process, pytest captures log records instead of printing them)."""
    write_plugin(hermes_home / "plugins", "tldr", "def register(ctx):\n    ctx.register_command('tldr', lambda r: r)\n")
    write_config(hermes_home, BROKEN + "plugin: {}\n")
    env = {**os.environ, "HERMES_HOME": str(hermes_home), "PYTHONPATH": str(ROOT)}
    for argv in (["run", "tldr", "hi"], ["plugins", "list"], ["tldr2"]):
        out = subprocess.run([sys.executable, "-m", "plugin_llm.cli.main", *argv], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2, out
        assert out.stderr.count("does not parse") == 1 and out.stderr.count(GATE) == 1, out.stderr
        assert "unusable" not in out.stderr and "Traceback" not in out.stderr


# --------------------------------------------------------------------------- 3. tool and middleware failures

CANARY = "canary-ux13-0c8e1f5a9b7d4e2f"

TOOLS = f'''
def helper(x):
    raise ValueError("leaked {CANARY}")   # the plugin's bug


def calc(args):
    return helper(args)


def register(ctx):
    ctx.register_tool("calc", {{"name": "calc", "parameters": {{"type": "object"}}}}, calc)
    ctx.register_tool("echo", {{"name": "echo", "parameters": {{"type": "object"}}}}, lambda args: "echo")
'''

MIDDLEWARE = '''
def wrap(args, next_call, **kw):
    return fail_here(args)


def fail_here(args):
    return {}["missing"]


def rewrite(args, **kw):
    raise RuntimeError("request rewrite bug")


def register(ctx):
    ctx.register_middleware("tool_execution", wrap)
    ctx.register_middleware("tool_request", rewrite)
'''


def _events(home: Path, name: str) -> list[dict]:
    path = home / "logs" / "agent.log"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    return [r for r in records if r.get("event") == name]


def _manager(home: Path):
    from plugin_llm.plugins import PluginManager

    manager = PluginManager(home)
    manager.discover_plugins()
    return manager


def test_a_failing_tool_is_logged_and_audited_once_with_its_frames_bounded_and_redacted(hermes_home, caplog):
    import logging

    from auth import register_secret

    register_secret(CANARY)
    write_plugin(hermes_home / "plugins", "tools", TOOLS)
    write_config(hermes_home, "plugins:\n  enabled: [tools]\n")
    manager = _manager(hermes_home)
    with caplog.at_level(logging.DEBUG, logger="plugin_llm.plugins"):
        for _ in range(3):  # the same failure every call: reported once
            result = json.loads(manager.dispatch_tool("calc", {}))
            assert "Tool 'calc' failed: ValueError" in result["error"]
    [event] = _events(hermes_home, "tool_error")
    assert event["kind"] == "event" and event["plugin_id"] == "tools" and event["tool"] == "calc"
    assert event["error.type"] == "ValueError" and event["message"].startswith("leaked ")
    assert event["frames"][-1].startswith("__init__.py:3 in helper: raise ValueError(")  # relative to the plugin
    assert "__init__.py:7 in calc: return helper(args)" in event["frames"]
    assert not any("plugin_llm" in f for f in event["frames"])  # only the plugin's own frames
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "tool calc" in r.getMessage()]
    assert len(warnings) == 1 and "ValueError" in warnings[0].getMessage()
    [debug] = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "plugin traceback" in r.getMessage()]
    assert "__init__.py:3 in helper" in debug and "__init__.py:7 in calc" in debug
    log_text = (hermes_home / "logs" / "agent.log").read_text(encoding="utf-8")
    assert CANARY not in log_text and CANARY not in caplog.text  # the message and the source line, redacted
    assert manager.dispatch_tool("echo", {}) == "echo"  # the other tools still work


def test_async_tool_dispatch_reports_the_failure_the_same_way(hermes_home):
    import asyncio

    write_plugin(hermes_home / "plugins", "tools", TOOLS)
    write_config(hermes_home, "plugins:\n  enabled: [tools]\n")
    manager = _manager(hermes_home)
    result = run_bounded(lambda: asyncio.run(manager.adispatch_tool("calc", {})), 30)
    assert "Tool 'calc' failed" in result
    [event] = _events(hermes_home, "tool_error")
    assert any(f.startswith("__init__.py:3 in helper") for f in event["frames"])


def test_failing_middleware_is_audited_as_hook_error_with_its_frames_once(hermes_home, caplog):
    import logging

    write_plugin(hermes_home / "plugins", "tools", TOOLS)
    write_plugin(hermes_home / "plugins", "mw", MIDDLEWARE)
    write_config(hermes_home, "plugins:\n  enabled: [tools, mw]\n")
    manager = _manager(hermes_home)
    with caplog.at_level(logging.DEBUG, logger="plugin_llm.plugins"):
        for _ in range(2):
            assert run_bounded(lambda: manager.dispatch_tool("echo", {}), 30) == "echo"  # skipped, the call goes on
    events = {e["hook"]: e for e in _events(hermes_home, "hook_error")}
    assert len(_events(hermes_home, "hook_error")) == 2  # one per distinct failure, not one per call
    execution, request = events["middleware:tool_execution"], events["middleware:tool_request"]
    assert execution["plugin_id"] == request["plugin_id"] == "mw"
    assert execution["error.type"] == "KeyError" and "__init__.py:7 in fail_here: return {}[\"missing\"]" in execution["frames"]
    assert "__init__.py:3 in wrap: return fail_here(args)" in execution["frames"]
    assert request["error.type"] == "RuntimeError" and request["frames"] == [
        "__init__.py:11 in rewrite: raise RuntimeError(\"request rewrite bug\")"]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "plugin traceback" in r.getMessage()]
    assert any("middleware tool_execution" in m and "__init__.py:7 in fail_here" in m for m in debug)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "middleware" in r.getMessage()]
    assert len(warned) == 2


def test_a_timed_out_middleware_is_audited_without_frames(hermes_home):
    write_plugin(hermes_home / "plugins", "tools", TOOLS)
    write_plugin(hermes_home / "plugins", "slow", """
        import time
        def mw(args, next_call, **kw):
            time.sleep(5)
        def register(ctx):
            ctx.register_middleware("tool_execution", mw)
    """)
    write_config(hermes_home, "plugins:\n  enabled: [tools, slow]\n  hook_timeout: 0.2\n")
    manager = _manager(hermes_home)
    assert run_bounded(lambda: manager.dispatch_tool("echo", {}), 30) == "echo"
    [event] = _events(hermes_home, "hook_error")
    assert event["plugin_id"] == "slow" and "plugins.hook_timeout" in event["message"] and event["frames"] == []


def test_a_failing_command_is_audited_with_its_frames_and_printed_once(hermes_home, capsys):
    write_plugin(hermes_home / "plugins", "boom", """
        def helper(raw):
            return raw + 1      # the plugin's bug

        def register(ctx):
            ctx.register_command("boom", helper)
    """)
    write_config(hermes_home, "plugins:\n  enabled: [boom]\n")
    assert main(["run", "boom", "x"]) == 1
    err = capsys.readouterr().err
    assert err.count("TypeError") == 1 and "--debug shows where" in err
    [event] = _events(hermes_home, "command_error")
    assert event["plugin_id"] == "boom" and event["command"] == "boom" and event["error.type"] == "TypeError"
    assert event["frames"] == ["__init__.py:3 in helper: return raw + 1      # the plugin's bug"]


def test_install_and_remove_refuse_a_config_that_does_not_parse_leaving_no_grants_behind(hermes_home, tmp_path, capsys):
    """Leftover grants cannot be ruled out (install) nor removed (remove) while config.yaml does not
    parse: both refuse and change nothing, unless told to ignore the config."""
    source = write_plugin(tmp_path / "src", "calc")
    write_config(hermes_home, BROKEN)
    assert main(["plugins", "install", str(source), "--no-enable"]) == 2
    err = capsys.readouterr().err
    assert err.count(GATE) == 1 and "nothing was installed" in err and "--accept-existing-grants" in err
    assert not (hermes_home / "plugins" / "calc").exists()
    assert main(["plugins", "install", str(source), "--no-enable", "--accept-existing-grants"]) == 2
    assert (hermes_home / "plugins" / "calc" / "plugin.yaml").is_file()
    capsys.readouterr()
    assert main(["plugins", "remove", "calc"]) == 2
    err = capsys.readouterr().err
    assert err.count(GATE) == 1 and "nothing was removed" in err and "--keep-config" in err
    assert (hermes_home / "plugins" / "calc").is_dir()
    assert main(["plugins", "remove", "calc", "--keep-config"]) == 2  # removed; the config is still broken
    assert not (hermes_home / "plugins" / "calc").exists()


def test_the_config_problem_is_printed_redacted(hermes_home, capsys):
    from auth import register_secret

    secret = "canary-ux13-alias-5d1e9a7c3b"
    register_secret(secret)
    write_config(hermes_home, f"model:\n  api_key: *{secret}\n")  # YAML quotes the unknown alias in its error
    assert main(["trust", "show"]) == 2
    captured = capsys.readouterr()
    assert GATE in captured.err and "found undefined alias" in captured.err
    assert secret not in captured.err
