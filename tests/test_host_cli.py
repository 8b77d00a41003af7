"""``plugin-llm run`` and ``plugin-llm chat`` (stdin piped, no TTY)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_llm.cli.main import main

from tests.test_host_support import RECORDER, add_plugin, copy_example, enable, events

COMMANDS = '''
import asyncio

def register(ctx):
    ctx.register_command("echo", lambda raw: f"echo:[{raw}]", description="echo back")

    async def upper(raw):
        await asyncio.sleep(0)
        return raw.upper()

    ctx.register_command("upper", upper)

    def explode(raw):
        raise RuntimeError("kaboom")

    ctx.register_command("explode", explode)
    ctx.register_command("tell", lambda raw: str(ctx.inject_message(raw)))
'''


@pytest.fixture
def home(hermes_home: Path) -> Path:
    add_plugin(hermes_home, "cmds", COMMANDS)
    copy_example(hermes_home, "hello-world")
    copy_example(hermes_home, "inbox-bridge")
    add_plugin(hermes_home, "recorder", RECORDER)
    enable(hermes_home, "cmds", "hello-world", "inbox-bridge", "recorder")
    return hermes_home


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))


# --- run -----------------------------------------------------------------------------------------


def test_run_prints_what_a_sync_command_returns(home: Path, capsys):
    assert main(["run", "echo", "a", "b  c"]) == 0
    assert capsys.readouterr().out == "echo:[a b  c]\n"


def test_run_async_command_and_leading_slash(home: Path, capsys):
    assert main(["run", "/upper", "quiet"]) == 0
    assert capsys.readouterr().out == "QUIET\n"


def test_run_builtin_plugins_listing(home: Path, capsys):
    assert main(["run", "plugins"]) == 0
    out = capsys.readouterr().out
    assert "hello-world" in out and "cmds" in out and "tools: hello_world" in out


def test_run_unknown_command_exits_nonzero_listing_commands(home: Path, capsys):
    assert main(["run", "nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Unknown command /nope" in captured.err
    assert "/echo" in captured.err and "/upper" in captured.err and "/help" in captured.err
    assert "Traceback" not in captured.err


def test_run_failing_command_exits_1(home: Path, capsys):
    assert main(["run", "explode"]) == 1
    err = capsys.readouterr().err
    assert "RuntimeError: kaboom" in err and "Traceback" not in err


def test_run_reads_arguments_from_stdin(home: Path, capsys, monkeypatch):
    _stdin(monkeypatch, "line one\nline two\n")
    assert main(["run", "echo", "-"]) == 0
    assert capsys.readouterr().out == "echo:[line one\nline two]\n"


def test_run_has_no_session_to_inject_into(home: Path, capsys):
    assert main(["run", "tell", "hi"]) == 0
    assert capsys.readouterr().out == "False\n"


def test_run_home_option_wins_over_environment(home: Path, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "elsewhere"))
    assert main(["run", "--home", str(home), "echo", "x"]) == 0
    assert capsys.readouterr().out == "echo:[x]\n"
    assert os.environ["HERMES_HOME"] == str(tmp_path / "elsewhere")


def test_run_of_a_builtin_does_not_import_litellm(home: Path):
    code = ("import sys; from plugin_llm.cli.main import main; rc = main(['run', 'plugins']); "
            "print('LITELLM' if 'litellm' in sys.modules else 'NO-LITELLM', rc)")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("NO-LITELLM 0")


# --- chat ----------------------------------------------------------------------------------------


def test_chat_piped_plugins_turn_and_exit(home: Path, capsys, monkeypatch):
    _stdin(monkeypatch, "/plugins\n\nuse the hello_world tool with name=Ada\n/exit\nnever read\n")
    assert main(["chat"]) == 0
    out = capsys.readouterr().out
    assert "plugin-llm chat: model local-echo-1" in out
    assert "hello-world" in out and "enabled" in out  # /plugins
    assert '[tool] hello_world({"name": "Ada"}) -> Hello, Ada!' in out
    assert "assistant> Tool hello_world returned: Hello, Ada!" in out
    assert "Bye." in out and "never read" not in out
    hooks = [e["hook"] for e in events(home)]
    assert hooks[0] == "pre_command"  # /plugins, before the session starts
    assert hooks[1] == "on_session_start" and hooks[-1] == "on_session_finalize"
    assert hooks.count("pre_command") == 2  # /plugins and /exit


def test_chat_runs_injected_messages_as_next_turns(home: Path, capsys, monkeypatch):
    (home / "inbox.jsonl").write_text('{"role": "system", "text": "webhook says hi"}\n')
    _stdin(monkeypatch, "/inbox\n")
    assert main(["chat"]) == 0
    out = capsys.readouterr().out
    assert "Queued 1 inbox message(s)." in out
    assert "[injected] [system] webhook says hi" in out
    assert 'assistant> Local model reply to: "[system] webhook says hi' in out


def test_chat_end_of_input_closes_the_session(home: Path, capsys, monkeypatch):
    _stdin(monkeypatch, "hello\n")
    assert main(["chat"]) == 0
    assert "assistant> Local model reply to: \"hello\"" in capsys.readouterr().out
    hooks = [e["hook"] for e in events(home)]
    assert hooks[-2:] == ["on_session_end", "on_session_finalize"]


def test_chat_piped_failures_give_exit_status_1(home: Path, capsys, monkeypatch):
    _stdin(monkeypatch, "/nope\n/explode\n/echo still running\n")
    assert main(["chat"]) == 1
    out = capsys.readouterr().out
    assert "Unknown command /nope" in out and "RuntimeError: kaboom" in out and "echo:[still running]" in out


def test_example_plugin_cli_command_inbox_send(home: Path, capsys):
    assert main(["inbox", "send", "from a script", "--role", "system"]) == 0
    assert '"text": "from a script"' in (home / "inbox.jsonl").read_text()
    assert main(["inbox", "show"]) == 0
    assert "[system] from a script" in capsys.readouterr().out
