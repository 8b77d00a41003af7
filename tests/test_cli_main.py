"""The CLI: plugin frames of plugin failures, --debug anywhere, --version,
exit codes, each failure printed once, colour only on a terminal, plugin CLI commands in --help,
chat line editing. Every case runs the real entry point in a subprocess with a temporary home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(home: Path, *args: str, input: str | None = None, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    full.update(HERMES_HOME=str(home), HOME=str(home.parent / "user-home"), PYTHONPATH=str(ROOT))
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "plugin_llm.cli.main", *args], input=input, env=full,
                          capture_output=True, text=True, timeout=timeout, cwd=str(home.parent))


def add_plugin(home: Path, name: str, code: str, manifest: str = "") -> Path:
    path = home / "plugins" / name
    path.mkdir(parents=True)
    (path / "plugin.yaml").write_text(f"name: {name}\nversion: 0.1.0\n{manifest}", encoding="utf-8")
    (path / "__init__.py").write_text(textwrap.dedent(code), encoding="utf-8")
    return path


def enable(home: Path, *names: str, extra: str = "") -> None:
    (home / "config.yaml").write_text(
        "model:\n  provider: local\n  model: local-echo-1\nplugins:\n  enabled: [" + ", ".join(names) + "]\n" + extra,
        encoding="utf-8")


BOOM = """
def helper(x):
    return x / 0          # the plugin's bug


def register(ctx):
    ctx.register_command("boom", lambda raw: helper(1), description="divide by zero")
"""


@pytest.fixture
def boom_home(hermes_home: Path) -> Path:
    add_plugin(hermes_home, "boom", BOOM)
    enable(hermes_home, "boom")
    return hermes_home


@pytest.mark.slow
def test_command_failure_is_printed_once_and_debug_shows_the_plugin_frames(boom_home: Path):
    plain = cli(boom_home, "run", "boom")
    assert plain.returncode == 1
    assert plain.stderr.count("division by zero") == 1, plain.stderr  # printed once, not log line + error
    assert "--debug shows where" in plain.stderr
    assert "__init__.py" not in plain.stderr
    for args in (["--debug", "run", "boom"], ["run", "--debug", "boom"]):  # before or after the subcommand
        out = cli(boom_home, *args)
        assert out.returncode == 1, out.stderr
        assert out.stderr.count("division by zero") == 1, out.stderr
        assert "__init__.py:3 in helper: return x / 0" in out.stderr
        assert "__init__.py:7 in <lambda>" in out.stderr
        assert "plugin_llm" not in out.stderr.split("plugin traceback", 1)[1]  # only the plugin's frames


@pytest.mark.slow
def test_import_failure_frames_in_plugins_info_list_and_audit(hermes_home: Path):
    add_plugin(hermes_home, "broken", "import json\nX = {}['missing']\n\ndef register(ctx):\n    pass\n")
    enable(hermes_home, "broken")
    info = cli(hermes_home, "plugins", "info", "broken")
    assert info.returncode == 0, info.stderr
    assert "import failed: KeyError: 'missing'" in info.stdout
    assert "__init__.py:2 in <module>: X = {}['missing']" in info.stdout  # always, without --debug
    listing = cli(hermes_home, "plugins", "list")
    assert "plugins info broken shows where" in listing.stdout
    cli(hermes_home, "run", "nosuch")  # a loading command records the failure in the audit log
    events = [json.loads(line) for line in (hermes_home / "logs" / "agent.log").read_text().splitlines()]
    failed = [e for e in events if e.get("event") == "plugin_load_failed"]
    assert failed and failed[-1]["error"] == "import failed: KeyError: 'missing'"
    assert any("__init__.py:2 in <module>" in f for f in failed[-1]["frames"])
    data = json.loads(cli(hermes_home, "plugins", "info", "broken", "--json").stdout)
    assert data["error_frames"] == ["__init__.py:2 in <module>: X = {}['missing']"]


@pytest.mark.slow
def test_hook_and_tool_failures_carry_the_plugin_frames(hermes_home: Path):
    add_plugin(hermes_home, "hooky", """
        def _context(**kw):
            raise RuntimeError("hook bug")


        def register(ctx):
            ctx.register_hook("pre_llm_call", _context)
    """)
    enable(hermes_home, "hooky")
    out = cli(hermes_home, "--debug", "chat", input="hello\n/exit\n")
    assert "hook bug" in out.stdout + out.stderr
    assert "__init__.py:3 in _context" in out.stderr, out.stderr  # on screen with --debug
    events = [json.loads(line) for line in (hermes_home / "logs" / "agent.log").read_text().splitlines()]
    hook_errors = [e for e in events if e.get("event") == "hook_error"]
    assert hook_errors and any("__init__.py:3 in _context" in f for f in hook_errors[-1]["frames"])


@pytest.mark.slow
def test_version_and_exit_codes(boom_home: Path):
    version = cli(boom_home, "--version")
    assert version.returncode == 0 and version.stdout.startswith("plugin-llm 0.")
    assert cli(boom_home, "run", "nosuch").returncode == 2          # an unknown name: usage error
    assert cli(boom_home, "plugins", "--no-such-flag").returncode == 2
    assert cli(boom_home, "run", "boom").returncode == 1            # the call failed
    assert cli(boom_home, "run", "help").returncode == 0
    helptext = cli(boom_home, "--help").stdout
    assert "Exit codes: 0 ok; 1 " in helptext and "2 usage or configuration error" in helptext


def test_plugin_cli_commands_are_listed_in_help(hermes_home: Path):
    add_plugin(hermes_home, "inbox", """
        def register(ctx):
            ctx.register_cli_command("inbox-send", "send a message to the inbox", lambda p: None,
                                     handler_fn=lambda args: 0)
    """)
    enable(hermes_home, "inbox")
    out = cli(hermes_home, "--help")
    assert out.returncode == 0
    assert "plugin commands:" in out.stdout
    line = next(l for l in out.stdout.splitlines() if "inbox-send" in l)
    assert "send a message to the inbox" in line and "(plugin inbox)" in line
    assert not (hermes_home / "logs" / "agent.log").exists()  # --help writes no load events


def test_error_type_is_not_repeated():
    from plugin_llm.cli.main import error_line
    from plugin_llm.errors import PluginLlmError

    class APIConnectionError(PluginLlmError):
        pass

    assert error_line(APIConnectionError("APIConnectionError: APIConnectionError: refused")) == \
        "APIConnectionError: refused"
    assert error_line(APIConnectionError("refused")) == "APIConnectionError: refused"


def _pty_run(home: Path, args: list[str], keys: list[bytes], env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal, typing ``keys`` one chunk after each prompt."""
    return pty_dialog(home, args, [(b"you>", key) for key in keys], env=env)


#: polls of 0.2 s with no output after which typed input that was not taken is typed again
QUIET_POLLS = 15


def pty_dialog(home: Path, args: list[str], steps: list[tuple[Any, "bytes | tuple[bytes, bytes]"]],
               env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal: for each (expected, reply), wait until the output since
    the last reply contains ``expected`` (or until ``expected()`` is true), then type ``reply``.
    A reply ``(text, keys)`` types ``text``, waits for its echo, then types ``keys``: on a loaded
    machine typeahead can reach the terminal before the line editor is ready and be dropped, so
    text that is not echoed within 3 s is typed again, and so are keys followed by no output at all
    (a final Ctrl-D that ends nothing is sent again too). The whole transcript is returned."""
    import pty
    import select
    import time

    full = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    full.update(HERMES_HOME=str(home), HOME=str(home.parent / "user-home"), PYTHONPATH=str(ROOT),
                TERM="xterm", INPUTRC="/dev/null")
    full.update(env or {})
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(str(home.parent))
        os.execve(sys.executable, [sys.executable, "-m", "plugin_llm.cli.main", *args], full)
    out, since = b"", 0
    pending = list(steps)
    retype: bytes | None = None  # typed and not taken yet (no echo, or a final Ctrl-D that ended nothing)
    keys = b""  # typed once the text in ``retype`` is echoed
    unanswered: bytes | None = None  # keys typed and followed by no output at all yet (each key redraws the line)
    quiet = 0  # polls with no output since the last write
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        quiet = 0 if ready else quiet + 1
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            unanswered = None
        if retype is not None and retype != b"\x04" and retype[-4:] in out[since:]:  # echoed: the editor has it
            os.write(fd, keys)
            retype, unanswered, quiet = None, keys or None, 0
        elif unanswered is not None and quiet >= QUIET_POLLS:  # no redraw, no reply: the keys were dropped
            try:
                os.write(fd, unanswered)
            except OSError:
                break
            quiet = 0
        elif retype is not None and quiet >= QUIET_POLLS:
            try:
                os.write(fd, retype)
            except OSError:
                break
            quiet = 0
        elif retype is None and pending and (
                pending[0][0]() if callable(pending[0][0]) else pending[0][0] in out[since:]):
            since = len(out)
            reply = pending.pop(0)[1]
            text, keys = reply if isinstance(reply, tuple) else (reply, b"")
            os.write(fd, text)
            quiet = 0
            retype = text if isinstance(reply, tuple) or (reply == b"\x04" and not pending) else None
    done, status = os.waitpid(pid, os.WNOHANG)
    if not done:  # still running after the deadline: stop it (the test fails on its exit status)
        os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")


@pytest.mark.slow
def test_chat_line_editing_history_ctrl_c_and_ctrl_d(hermes_home: Path):
    enable(hermes_home)
    # each reply is typed at a fresh prompt: the text that precedes it, then "you> " (a readline
    # redisplay of the line being edited does not match)
    steps = [
        (b"to leave.\r\nyou> ", (b"helo", b"\x1b[Dl\r")),       # left arrow then a correction: the model gets "hello"
        (b"word)\r\nyou> ", (b"something to discard", b"\x03")),  # Ctrl-C: the line is cancelled, the session goes on
        (b"leaves)\r\nyou> ", b"\x04"),                    # Ctrl-D on an empty line: leave
    ]
    code, out = pty_dialog(hermes_home, ["chat"], steps)
    assert code == 0, out
    assert "\x1b[D" not in out.split("assistant>")[1] if "assistant>" in out else False, out
    assert "(cancelled" in out
    assert "discard" not in out.split("(cancelled")[1]  # never sent as a turn
    history = (hermes_home / "chat_history").read_text()
    assert "hello" in history and "discard" not in history
    assert (hermes_home / "chat_history").stat().st_mode & 0o077 == 0


@pytest.mark.slow
def test_colour_only_on_a_terminal_and_never_with_no_color(boom_home: Path):
    piped = cli(boom_home, "run", "nosuch")
    assert "\x1b[" not in piped.stderr
    _, coloured = _pty_run(boom_home, ["run", "nosuch"], [])
    assert "\x1b[31merror\x1b[0m" in coloured
    _, plain = _pty_run(boom_home, ["run", "nosuch"], [], env={"NO_COLOR": "1"})
    assert "\x1b[31m" not in plain and "error:" in plain


@pytest.mark.slow
def test_bare_trust_grant_warns_that_it_allows_any_model(boom_home: Path):
    out = cli(boom_home, "trust", "grant", "boom", "model")
    assert out.returncode == 0, out.stderr
    assert "this allows any model" in out.stderr and "plugin-llm trust grant boom model VALUE" in out.stderr
    narrowed = cli(boom_home, "trust", "grant", "boom", "model", "gpt-4o-mini")
    assert "this allows any model" not in narrowed.stderr


def test_did_you_mean_names_each_candidate_once(boom_home: Path):
    out = cli(boom_home, "plugins", "info", "bom")
    assert out.returncode == 2
    assert "did you mean 'boom'?" in out.stderr and "'boom' or 'boom'" not in out.stderr


@pytest.mark.slow
def test_provider_errors_do_not_stutter(hermes_home: Path):
    from tests.servers import FakeServer, Reply

    with FakeServer(default=Reply(status=502, body="Bad gateway")) as server:
        (hermes_home / "config.yaml").write_text(
            f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {server.base_url}\nllm:\n  max_retries: 0\n",
            encoding="utf-8")
        for fast in ("1", "0"):  # the fast path and the litellm fallback
            out = cli(hermes_home, "try", "--as", "tester", "--force", "hello", env={"PLUGIN_LLM_FAST_PATH": fast})
            assert out.returncode == 1, out.stderr
            assert out.stderr.count("plugin-llm: error:") == 1, out.stderr
            words = out.stderr.replace(":", " ").split()
            assert not any(a == b and a.endswith("Error") for a, b in zip(words, words[1:])), out.stderr


@pytest.mark.slow
def test_plugins_list_and_info_report_a_load_failure_once(hermes_home: Path):
    add_plugin(hermes_home, "broken", "raise RuntimeError('at import')\n")
    enable(hermes_home, "broken")
    for args in (["plugins", "list"], ["plugins", "info", "broken"]):
        out = cli(hermes_home, *args)
        assert (out.stdout + out.stderr).count("RuntimeError: at import") == 1, (args, out.stdout, out.stderr)


@pytest.mark.slow
def test_chat_ctrl_c_cancels_a_turn_in_progress(hermes_home: Path):
    from tests.servers import FakeServer, Reply

    with FakeServer([Reply(content="too late", delay=30)], default=Reply(content="second answer")) as server:
        (hermes_home / "config.yaml").write_text(
            f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {server.base_url}\n", encoding="utf-8")
        code, out = pty_dialog(hermes_home, ["chat"], [
            (b"you>", b"first question\r"),
            (lambda: len(server.requests) == 1, b"\x03"),  # Ctrl-C while the model has not answered
            (b"leaves)\r\nyou> ", b"again\r"),           # the session goes on
            (b"second answer\r\nyou> ", b"/exit\r"),
        ])
    assert code == 0, out
    assert "too late" not in out and "second answer" in out and "Traceback" not in out
