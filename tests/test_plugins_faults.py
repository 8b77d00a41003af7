"""Hardening: plugin isolation: hanging or aborting loads, stubborn hooks, hostile values.

- loading under the hook time limit; BaseExceptions isolated; the operator's Ctrl-C still
  stops the CLI; stray non-daemon threads do not keep it alive;
- a hook that swallows its timeout is forced out, the guard fails closed, the alarm state is
  restored;
- hostile exceptions, mappings and str subclasses never escape the hook, tool and command
  dispatchers.
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from plugin_llm.host import Session
from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.hooks import HookRunner, HookTimeoutError
from tests.plugin_fixtures import by_key, configure, write_plugin

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def deadline():
    """Fail instead of hanging when a fix regresses: a KeyboardInterrupt in the main thread after
    20 s, and if plugin code swallows that too, end the test process 10 s later."""
    done = threading.Event()

    def watchdog() -> None:
        if not done.wait(20):
            _thread.interrupt_main()
            if not done.wait(10):
                print("tests/test_plugins_faults.py: a test hung; ending the test process", file=sys.stderr, flush=True)
                os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    yield
    done.set()


def _manager(home: Path, plugins: dict[str, str], **plugin_settings) -> PluginManager:
    for name, code in plugins.items():
        write_plugin(home / "plugins", name, code)
    configure(home, enabled=list(plugins), plugins=plugin_settings)
    m = PluginManager(home)
    m.discover_plugins()
    return m


def _cli(home: Path, *args: str, timeout: float = 30, **popen) -> subprocess.CompletedProcess:
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "plugin_llm", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout, **popen)


def _events(home: Path, event: str) -> list[dict]:
    path = home / "logs" / "agent.log"
    lines = path.read_text(encoding="utf-8").split("\n") if path.exists() else []
    return [r for r in map(json.loads, filter(str.strip, lines)) if r.get("event") == event]


def _assert_alarm_state_restored() -> None:
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.SIGALRM not in signal.sigpending()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


GOOD = "def register(ctx):\n    ctx.register_command('fine', lambda raw: 'still here')\n"


# --- 12: loading ------------------------------------------------------------------------------


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "SystemExit(3)", "GeneratorExit",
                                    "type('Custom', (BaseException,), {})('odd')"])
def test_register_raising_any_base_exception_is_isolated(hermes_home, raised, deadline):
    m = _manager(hermes_home, {
        "a-bad": f"def register(ctx):\n    ctx.register_command('bad', lambda raw: 'x')\n    raise {raised}\n",
        "b-good": GOOD,
    })
    plugins = by_key(m.list_plugins())
    assert plugins["a-bad"]["status"] == "failed"
    assert plugins["a-bad"]["error"].startswith("register() raised: ")
    assert plugins["b-good"]["status"] == "enabled" and m.run_command("fine") == "still here"
    assert "bad" not in m.commands  # what it registered before raising is removed
    _assert_alarm_state_restored()


def test_import_raising_keyboard_interrupt_is_isolated(hermes_home, deadline):
    m = _manager(hermes_home, {"a-bad": "raise KeyboardInterrupt\n", "b-good": GOOD})
    plugins = by_key(m.list_plugins())
    assert plugins["a-bad"]["status"] == "failed" and plugins["a-bad"]["error"] == "import failed: KeyboardInterrupt"
    assert plugins["b-good"]["status"] == "enabled"


@pytest.mark.slow
def test_register_that_never_returns_fails_with_the_time_limit(hermes_home, deadline):
    m = _manager(hermes_home, {
        "a-sleeps": "import time\n\ndef register(ctx):\n    time.sleep(1000)\n",
        "b-swallows": "import time\n\ndef register(ctx):\n    while True:\n        try:\n"
                      "            time.sleep(1000)\n        except BaseException:\n            pass\n",
        "c-import-hangs": "import time\ntime.sleep(1000)\n",
        "d-good": GOOD,
    }, hook_timeout=0.3)
    plugins = by_key(m.list_plugins())
    for key in ("a-sleeps", "b-swallows"):
        assert plugins[key]["status"] == "failed"
        assert plugins[key]["error"].startswith("register() did not return within 0.3s (plugins.hook_timeout)")
    assert plugins["c-import-hangs"]["error"].startswith(
        f"importing {hermes_home / 'plugins' / 'c-import-hangs' / '__init__.py'} did not finish within 0.3s")
    assert plugins["d-good"]["status"] == "enabled"
    events = _events(hermes_home, "plugin_load_failed")
    assert {e["plugin_id"] for e in events} == {"a-sleeps", "b-swallows", "c-import-hangs"}
    _assert_alarm_state_restored()


@pytest.mark.slow
def test_register_that_never_returns_off_the_main_thread_is_abandoned(hermes_home):
    write_plugin(hermes_home / "plugins", "slow", "import threading\n\nGO = threading.Event()\n\n"
                 "def register(ctx):\n    GO.wait(30)\n    ctx.register_command('late', lambda raw: 'x')\n")
    write_plugin(hermes_home / "plugins", "good", GOOD)
    configure(hermes_home, enabled=["slow", "good"], plugins={"hook_timeout": 0.3})
    m = PluginManager(hermes_home)
    box = {}
    worker = threading.Thread(target=lambda: box.update(plugins=by_key(m.list_plugins())))
    worker.start()
    worker.join(20)
    plugins = box["plugins"]
    assert plugins["slow"]["status"] == "failed"
    assert plugins["slow"]["error"].startswith("register() did not return within 0.3s")
    assert "keeps running in the background" in plugins["slow"]["error"]
    assert plugins["good"]["status"] == "enabled"


def test_load_failure_text_is_bounded_in_list_plugins(hermes_home):
    m = _manager(hermes_home, {"huge": "def register(ctx):\n    raise ValueError('x' * 100_000)\n"})
    error = m.list_plugins()[0]["error"]
    assert error.startswith("register() raised: ValueError: xxx") and len(error) < 1100


_HANGING_AND_ABORTING = {
    "a-raises-interrupt": "def register(ctx):\n    raise KeyboardInterrupt\n",
    "b-raises-exit": "import sys\n\ndef register(ctx):\n    sys.exit(4)\n",
    "c-hangs": "import time\n\ndef register(ctx):\n    while True:\n        try:\n"
               "            time.sleep(1000)\n        except BaseException:\n            pass\n",
    "d-leaves-thread": "import threading, time\n\ndef register(ctx):\n"
                       "    threading.Thread(target=time.sleep, args=(1000,), name='plugin-stray').start()\n"
                       "    ctx.register_command('fine', lambda raw: 'still here')\n",
}


@pytest.mark.slow
def test_cli_finishes_despite_hanging_aborting_and_thread_leaving_plugins(hermes_home):
    for name, code in _HANGING_AND_ABORTING.items():
        write_plugin(hermes_home / "plugins", name, code)
    configure(hermes_home, enabled=list(_HANGING_AND_ABORTING), plugins={"hook_timeout": 0.5})
    listed = _cli(hermes_home, "plugins", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    plugins = by_key(json.loads(listed.stdout))
    assert [plugins[k]["status"] for k in sorted(plugins)] == ["failed", "failed", "failed", "enabled"]
    assert plugins["b-raises-exit"]["error"] == "register() raised: SystemExit: 4"
    assert "did not return within 0.5s" in plugins["c-hangs"]["error"]
    ran = _cli(hermes_home, "run", "fine")
    assert ran.returncode == 0 and ran.stdout.strip() == "still here", ran.stderr
    assert "Traceback" not in listed.stderr + ran.stderr


def test_real_ctrl_c_during_a_slow_register_stops_the_cli(hermes_home, tmp_path):
    marker = tmp_path / "registering"
    write_plugin(hermes_home / "plugins", "slow", f"import time\nfrom pathlib import Path\n\n"
                 f"def register(ctx):\n    Path({str(marker)!r}).touch()\n    time.sleep(60)\n")
    configure(hermes_home, enabled=["slow"], plugins={"hook_timeout": 60})
    env = dict(os.environ, HERMES_HOME=str(hermes_home), PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "plugin_llm", "plugins", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        for _ in range(400):
            if marker.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert marker.exists(), proc.stderr.read() if proc.poll() is not None else "register() never ran"
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "plugin-llm: interrupted" in err and "Traceback" not in err


# --- 13: a hook that swallows its timeout ------------------------------------------------------

_STUBBORN_GUARD = """
import time

def guard(tool_name, args):
    while True:
        try:
            time.sleep(1000)
        except BaseException:
            pass

def register(ctx):
    ctx.register_tool("echo", {"parameters": {"type": "object", "properties": {}}}, lambda args: "ran")
    ctx.register_hook("pre_tool_call", guard)
"""


@pytest.mark.slow
def test_guard_swallowing_its_timeout_is_forced_out_and_blocks(hermes_home, deadline):
    m = _manager(hermes_home, {"stubborn": _STUBBORN_GUARD}, hook_timeout=0.3)
    result = json.loads(m.dispatch_tool("echo", {}))
    assert "blocked" in result["error"] and "fail-closed" in result["error"]
    assert "pre_tool_call guard of plugin 'stubborn' timed out" in result["error"]
    assert "did not return within 0.3s" in result["error"]
    _assert_alarm_state_restored()
    time.sleep(0.05)  # no stray periodic alarm arrives later (SIG_DFL would end the process)
    assert m.invoke_hook("post_tool_call") == []


@pytest.mark.slow
def test_spinning_callback_that_catches_everything_is_forced_out(deadline):
    def spin():
        while True:
            try:
                while True:  # every check point of this loop is inside the try
                    pass
            except BaseException:
                pass

    runner = HookRunner(lambda: 0.2)
    runner.register("post_llm_call", "spinner", spin)
    runner.register("post_llm_call", "after", lambda: "after ran")
    outcomes = runner.run("post_llm_call", {})
    assert type(outcomes[0].error) is HookTimeoutError and outcomes[1].value == "after ran"
    _assert_alarm_state_restored()


# --- 14: hostile values -----------------------------------------------------------------------

HOSTILE = '''
from collections.abc import Mapping

class Boom(Exception):
    def __str__(self):
        raise RuntimeError("__str__ refuses")

class Sneaky(Mapping):
    def __init__(self, **data):
        self._data = data
    def __getitem__(self, key):
        return self._data[key]
    def __iter__(self):
        return iter(self._data)
    def __len__(self):
        return len(self._data)
    def get(self, *a, **k):
        raise RuntimeError("get refuses")

class Slippery(str):
    def strip(self, *a):
        raise RuntimeError("strip refuses")
    def __eq__(self, other):
        raise RuntimeError("eq refuses")
    __hash__ = str.__hash__

class Unprintable:
    def __str__(self):
        raise RuntimeError("no str")
    __repr__ = __str__

SCHEMA = {"parameters": {"type": "object", "properties": {}}}

def boom(**kw):
    raise Boom()

def register(ctx):
    mode = ctx.manifest.name
    if mode == "raiser":
        for hook in ("post_llm_call", "pre_tool_call", "pre_llm_call"):
            ctx.register_hook(hook, boom)
    elif mode == "mapper":
        ctx.register_hook("pre_tool_call", lambda **kw: Sneaky(action=Slippery("block"), message=Slippery("mapped no")))
        ctx.register_hook("pre_llm_call", lambda **kw: Sneaky(context=Slippery("from a mapping")))
    elif mode == "stringer":
        ctx.register_hook("pre_llm_call", lambda **kw: Slippery("from a str subclass"))
        ctx.register_hook("transform_tool_result", lambda **kw: Slippery("transformed"))
        ctx.register_hook("post_llm_call", lambda **kw: Unprintable())
    elif mode == "tools":
        ctx.register_tool("raises_boom", SCHEMA, lambda args: (_ for _ in ()).throw(Boom()))
        ctx.register_tool("raises_exit", SCHEMA, lambda args: (_ for _ in ()).throw(SystemExit(2)))
        ctx.register_tool("raises_interrupt", SCHEMA, lambda args: (_ for _ in ()).throw(KeyboardInterrupt()))
        ctx.register_tool("returns_slippery", SCHEMA, lambda args: Slippery("slippery result"))
        ctx.register_tool("returns_sneaky", SCHEMA, lambda args: Sneaky(a=Slippery("b")))
        ctx.register_tool("returns_unprintable", SCHEMA, lambda args: Unprintable())
        ctx.register_tool("dispatches", SCHEMA, lambda args: ctx.dispatch_tool(Slippery("returns_sneaky"), Sneaky()))
        ctx.register_command("boom", lambda raw: (_ for _ in ()).throw(Boom()))
        ctx.register_command("exits", lambda raw: (_ for _ in ()).throw(SystemExit(5)))
        ctx.register_command("unprintable", lambda raw: Unprintable())
        ctx.register_command("slippery", lambda raw: Slippery("slippery text"))
        ctx.register_command("sneaky", lambda raw: Sneaky(a=Slippery("b")))
'''


def _hostile(home: Path, *modes: str) -> PluginManager:
    return _manager(home, {mode: HOSTILE for mode in modes})


def test_hostile_exception_from_a_hook_is_isolated_and_reported(hermes_home):
    m = _hostile(hermes_home, "raiser")
    assert m.invoke_hook("post_llm_call") == []
    assert m.get_pre_llm_call_context() == ""
    message = m.get_pre_tool_call_block_message("anything", {})
    assert message == ("the pre_tool_call guard of plugin 'raiser' failed (Boom (its message could not be read)); "
                       "'anything' is blocked (fail-closed)")
    [event, *_] = _events(hermes_home, "hook_error")
    assert event["error.type"] == "Boom" and event["plugin_id"] == "raiser"


def test_hostile_mapping_and_str_subclass_results_are_read_as_plain_data(hermes_home):
    m = _hostile(hermes_home, "mapper", "stringer")
    assert m.get_pre_tool_call_block_message("t", {}) == "mapped no"
    assert type(m.get_pre_tool_call_block_message("t", {})) is str
    assert m.get_pre_llm_call_context() == "from a mapping\n\nfrom a str subclass"
    [mapped, stringed] = m.invoke_hook("pre_llm_call")
    assert type(mapped) is dict and type(mapped["context"]) is str and type(stringed) is str
    assert len(m.invoke_hook("post_llm_call")) == 1  # an opaque object is passed through untouched


def test_hostile_tool_handlers_always_give_a_string(hermes_home):
    m = _hostile(hermes_home, "tools")
    results = {name: m.dispatch_tool(name, {}) for name in (
        "raises_boom", "raises_exit", "raises_interrupt", "returns_slippery", "returns_sneaky",
        "returns_unprintable", "dispatches")}
    assert all(type(r) is str for r in results.values())
    assert json.loads(results["raises_boom"])["error"] == "Tool 'raises_boom' failed: Boom (its message could not be read)"
    assert json.loads(results["raises_exit"])["error"] == "Tool 'raises_exit' failed: SystemExit: 2"
    assert json.loads(results["raises_interrupt"])["error"] == "Tool 'raises_interrupt' failed: KeyboardInterrupt"
    assert results["returns_slippery"] == "slippery result"
    assert json.loads(results["returns_sneaky"]) == {"a": "b"}
    assert results["returns_unprintable"] == '"<Unprintable>"'
    assert json.loads(results["dispatches"]) == {"a": "b"}  # ctx.dispatch_tool with a str subclass and a Mapping


def test_transform_tool_result_str_subclass_becomes_the_result(hermes_home):
    m = _hostile(hermes_home, "tools", "stringer")
    result = m.dispatch_tool("returns_sneaky", {})
    assert result == "transformed" and type(result) is str


def test_hostile_command_handlers_are_reported_not_raised(hermes_home):
    m = _hostile(hermes_home, "tools")
    session = Session(m, platform="cli")
    boom = session.run_turn("/boom")
    assert boom.kind == "command_error" and boom.text == "/boom failed: Boom (its message could not be read)"
    exits = session.run_turn("/exits")
    assert exits.kind == "command_error" and "SystemExit: 5" in exits.text and "plugin tools" in exits.text
    assert session.run_turn("/unprintable").text == "<Unprintable>"
    slippery = session.run_turn("/slippery")
    assert slippery.text == "slippery text" and type(slippery.text) is str
    assert session.run_turn("/sneaky").text == "{'a': 'b'}"


def test_plugin_keyboard_interrupt_in_a_hook_is_isolated(hermes_home):
    runner = HookRunner(lambda: 5.0)
    runner.register("post_llm_call", "p", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    runner.register("post_llm_call", "q", lambda: "next")
    outcomes = runner.run("post_llm_call", {})
    assert outcomes[0].error_text == "KeyboardInterrupt" and outcomes[1].value == "next"
    _assert_alarm_state_restored()


def test_hostile_handlers_on_the_async_paths(hermes_home):
    import asyncio

    from plugin_llm.plugins.manager import PluginCommandError

    m = _hostile(hermes_home, "tools")

    async def run():
        tools = [await m.adispatch_tool(name, {}) for name in ("raises_boom", "raises_interrupt", "returns_sneaky")]
        with pytest.raises(PluginCommandError, match=r"/exits \(plugin tools\) raised SystemExit: 5"):
            await m.arun_command("exits")
        return tools, await Session(m, platform="cli").arun_turn("/boom")

    (boom, interrupt, sneaky), turn = asyncio.run(run())
    assert json.loads(boom)["error"] == "Tool 'raises_boom' failed: Boom (its message could not be read)"
    assert json.loads(interrupt)["error"] == "Tool 'raises_interrupt' failed: KeyboardInterrupt"
    assert json.loads(sneaky) == {"a": "b"}
    assert turn.kind == "command_error" and "Boom (its message could not be read)" in turn.text


@pytest.mark.slow
def test_exception_whose_str_hangs_is_read_under_the_time_limit(hermes_home, deadline):
    class Stuck(Exception):
        def __str__(self):
            threading.Event().wait(30)
            return "never"

    def raiser():
        raise Stuck()

    runner = HookRunner(lambda: 0.3)
    runner.register("post_llm_call", "p", raiser)
    [outcome] = runner.run("post_llm_call", {})
    assert outcome.timed_out and "did not return within 0.3s" in outcome.error_text
    _assert_alarm_state_restored()


def test_plugin_cli_command_raising_a_hostile_exception(hermes_home, capsys):
    from plugin_llm.cli.main import main

    write_plugin(hermes_home / "plugins", "clip", HOSTILE.replace(
        'def register(ctx):\n', 'def register(ctx):\n'
        '    ctx.register_cli_command("boom-cli", "raises", lambda parser: None, lambda args: boom())\n', 1))
    configure(hermes_home, enabled=["clip"])
    assert main(["boom-cli"]) == 1
    assert "plugin-llm boom-cli: error: Boom (its message could not be read) (plugin clip)" in capsys.readouterr().err
