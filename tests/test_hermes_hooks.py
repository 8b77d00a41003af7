"""Hermes 0.21.3's hook contract: the 39 names, ``plugins.hook_callback_timeout`` with its
fail-open / fail-closed split and 60 s suppression, the pre_tool_call directives (block, approve,
modify), pre_verify, error classification, pre_command and the observer schema version."""

from __future__ import annotations

import json
import threading

import pytest

from plugin_llm.plugins import PluginManager
from plugin_llm.plugins import hooks as hooks_module
from plugin_llm.plugins.hooks import HookRunner
from plugin_llm.plugins.settings import settings_from_raw
from tests.plugin_fixtures import configure, write_plugin

RELEASE = threading.Event()  # set at teardown: abandoned callbacks finish
SEEN: list = []  # what the test plugins record


@pytest.fixture(autouse=True)
def _release_hung_callbacks():
    RELEASE.clear()
    SEEN.clear()
    yield
    RELEASE.set()


def manager_with(home, plugins: dict[str, str], **plugin_settings) -> PluginManager:
    for name, code in plugins.items():
        write_plugin(home / "plugins", name, code)
    configure(home, enabled=list(plugins), plugins=plugin_settings)
    m = PluginManager(home)
    m.discover_plugins()
    return m


# --- plugins.hook_callback_timeout ------------------------------------------------------------


def test_callback_timeout_setting_is_read_like_hermes():
    read = lambda value: settings_from_raw({"plugins": {"hook_callback_timeout": value}})  # noqa: E731
    assert settings_from_raw({}).hook_callback_timeout is None  # unset: plugins.hook_timeout applies
    assert read(5).hook_callback_timeout == 5.0
    assert read(10_000).hook_callback_timeout == 600.0  # clamped
    assert read(0).hook_callback_timeout is None and read(-1).hook_callback_timeout is None  # disabled
    bad = read("soon")
    assert bad.hook_callback_timeout is None
    assert any("plugins.hook_callback_timeout" in p for p in bad.problems)
    assert read(5).hook_timeout == 30.0  # the older key keeps its own default


def test_callback_timeout_bounds_hermes_hot_path_hooks_only():
    runner = HookRunner(lambda: 30.0, callback_timeout=lambda: 2.0)
    assert runner.limit("pre_tool_call") == (2.0, "plugins.hook_callback_timeout")
    assert runner.limit("post_llm_call") == (2.0, "plugins.hook_callback_timeout")
    # Hermes leaves these unbounded; here the older plugins.hook_timeout still bounds them
    assert runner.limit("on_session_finalize") == (30.0, "plugins.hook_timeout")
    assert runner.limit("pre_command") == (30.0, "plugins.hook_timeout")
    assert HookRunner(lambda: 7.0, callback_timeout=lambda: None).limit("pre_tool_call") == (7.0, "plugins.hook_timeout")


HUNG_GUARD = """
import threading
from tests.test_hermes_hooks import RELEASE, SEEN

def register(ctx):
    def guard(tool_name, args):
        SEEN.append(tool_name)
        RELEASE.wait(30)
    ctx.register_hook("pre_tool_call", guard)
    ctx.register_tool("echo", {"name": "echo", "parameters": {"type": "object"}},
                      lambda args: "ran")
"""


def off_main_thread(fn):
    """``fn()`` on another thread (the hook runner's worker pool path: a timed-out callback is left running)."""
    box = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join(60)
    assert box, "hang guard: the call did not return"
    return box[0]


@pytest.mark.slow
def test_pre_tool_call_timeout_fails_closed_and_is_suppressed(hermes_home):
    m = manager_with(hermes_home, {"hung": HUNG_GUARD}, hook_timeout=30, hook_callback_timeout=0.3)
    directive = {"action": "block", "message": "pre_tool_call plugin callback timed out or is still running"}
    assert off_main_thread(lambda: m.invoke_hook("pre_tool_call", tool_name="echo", args={})) == [directive]
    # left running, so suppressed for 60 s: not called again, still blocks
    assert off_main_thread(lambda: m.invoke_hook("pre_tool_call", tool_name="echo", args={})) == [directive]
    result = json.loads(off_main_thread(lambda: m.dispatch_tool("echo", {})))
    assert "blocked" in result["error"] and "timed out" in result["error"] and "ran" not in result["error"]
    assert SEEN == ["echo"]


@pytest.mark.slow
def test_suppression_ends_after_its_window(hermes_home, monkeypatch):
    monkeypatch.setattr(hooks_module, "SUPPRESSION_SECONDS", 0.0)
    m = manager_with(hermes_home, {"hung": HUNG_GUARD}, hook_callback_timeout=0.3)
    off_main_thread(lambda: m.invoke_hook("pre_tool_call", tool_name="a", args={}))
    off_main_thread(lambda: m.invoke_hook("pre_tool_call", tool_name="b", args={}))
    assert SEEN == ["a", "b"]


@pytest.mark.slow
def test_an_interrupted_callback_is_not_suppressed(hermes_home):
    """On the main thread the callback is interrupted, not left running: tried again at once."""
    m = manager_with(hermes_home, {"hung": HUNG_GUARD}, hook_callback_timeout=0.3)
    m.invoke_hook("pre_tool_call", tool_name="a", args={})
    m.invoke_hook("pre_tool_call", tool_name="b", args={})
    assert SEEN == ["a", "b"]


@pytest.mark.slow
def test_observer_timeout_fails_open(hermes_home, caplog):
    m = manager_with(hermes_home, {
        "a_hung": "from tests.test_hermes_hooks import RELEASE\n"
                  "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda: RELEASE.wait(30))\n",
        "b_ok": "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda: 'fine')\n",
    }, hook_callback_timeout=0.3)
    assert m.invoke_hook("post_llm_call", session_id="s") == ["fine"]
    assert any("within 0.3s (plugins.hook_callback_timeout)" in r.getMessage() for r in caplog.records)


def test_pre_tool_call_that_raises_gives_hermes_block_directive(hermes_home):
    m = manager_with(hermes_home, {
        "boom": "def register(ctx):\n"
                "    def strict_guard(**kw):\n        raise RuntimeError('policy store down')\n"
                "    ctx.register_hook('pre_tool_call', strict_guard)\n",
    })
    [directive] = m.invoke_hook("pre_tool_call", tool_name="t", args={})
    assert directive["action"] == "block"
    assert directive["message"] == "pre_tool_call plugin callback strict_guard raised RuntimeError: policy store down"
    # an observer that raises contributes nothing (fail-open)
    assert m.invoke_hook("post_tool_call", tool_name="t", args={}, result="r") == []


# --- pre_tool_call directives -----------------------------------------------------------------


TOOL = """
SEEN = []
def register(ctx):
    def handler(args):
        SEEN.append(dict(args))
        return "ok " + ",".join(f"{k}={v}" for k, v in sorted(args.items()))
    ctx.register_tool("write", {"name": "write", "parameters": {"type": "object"}}, handler)
"""


def test_modify_directives_are_shallow_merged_in_order(hermes_home):
    m = manager_with(hermes_home, {
        "a_tool": TOOL,
        "b_mod": "def register(ctx):\n"
                 "    ctx.register_hook('pre_tool_call', lambda args: {'action': 'modify', 'args': {'path': '/safe/a', 'mode': 'ro'}})\n",
        "c_mod": "def register(ctx):\n"
                 "    ctx.register_hook('pre_tool_call', lambda args: {'action': 'modify', 'args': {'path': '/safe/c'}})\n",
        "d_bad": "def register(ctx):\n"
                 "    ctx.register_hook('pre_tool_call', lambda args: {'action': 'modify', 'args': 'not a dict'})\n",
    })
    seen_after = []
    m._hooks.register("post_tool_call", "test", lambda args, result: seen_after.append((args, result)))
    out = m.dispatch_tool("write", {"path": "/etc/passwd", "text": "x"})
    assert out == "ok mode=ro,path=/safe/c,text=x"
    assert seen_after == [({"path": "/safe/c", "text": "x", "mode": "ro"}, out)]


def test_modify_directive_applies_on_the_async_path(hermes_home):
    import asyncio

    m = manager_with(hermes_home, {
        "a_tool": TOOL,
        "b_mod": "def register(ctx):\n"
                 "    ctx.register_hook('pre_tool_call', lambda args: {'action': 'modify', 'args': {'path': '/safe'}})\n",
    })
    assert asyncio.run(m.adispatch_tool("write", {"path": "/etc"})) == "ok path=/safe"


def test_block_wins_over_modify_and_approve_is_refused_here(hermes_home):
    m = manager_with(hermes_home, {
        "a_tool": TOOL,
        "b_approve": "def register(ctx):\n"
                     "    ctx.register_hook('pre_tool_call', lambda tool_name: {'action': 'approve', 'message': 'writes files', 'rule_key': 'write:x'} if tool_name == 'write' else None)\n",
    })
    assert m.get_pre_tool_call_directive("write", {}) == ("approve", "writes files")
    assert m.get_pre_tool_call_directive("other", {}) == (None, None)
    assert m.get_pre_tool_call_block_message("write", {}) is None  # Hermes: approve is invisible to it
    out = json.loads(m.dispatch_tool("write", {}))
    assert "plugin approval required for write (writes files)" in out["error"]


def test_pre_verify_continue_message(hermes_home):
    m = manager_with(hermes_home, {
        "a_ignore": "def register(ctx):\n    ctx.register_hook('pre_verify', lambda: {'action': 'finish'})\n",
        "b_claude": "def register(ctx):\n"
                    "    ctx.register_hook('pre_verify', lambda coding, attempt: {'decision': 'block', 'reason': ' run the tests '} if coding and attempt == 0 else None)\n",
    })
    assert m.get_pre_verify_continue_message(session_id="s", coding=True, attempt=0, final_response="done") == "run the tests"
    assert m.get_pre_verify_continue_message(session_id="s", coding=True, attempt=1) is None


def test_error_classification_runs_all_and_picks_the_first(hermes_home):
    m = manager_with(hermes_home, {
        "a_none": "CALLED = []\ndef register(ctx):\n    ctx.register_hook('transform_api_error_classification', lambda **kw: CALLED.append(1))\n",
        "b_first": "def register(ctx):\n    ctx.register_hook('transform_api_error_classification', "
                   "lambda status_code: {'reason': 'rate_limit', 'retryable': True, 'junk': 1} if status_code == 429 else None)\n",
        "c_second": "def register(ctx):\n    ctx.register_hook('transform_api_error_classification', "
                    "lambda: {'reason': 'billing'})\n",
    })
    assert m.get_plugin_error_classification(status_code=429, provider="p") == {"reason": "rate_limit", "retryable": True}
    assert m.get_plugin_error_classification(status_code=500) == {"reason": "billing"}


def test_every_hook_gets_the_observer_schema_version_but_gateway_platform_event(hermes_home):
    m = manager_with(hermes_home, {
        "rec": "from tests.test_hermes_hooks import SEEN\ndef register(ctx):\n"
               "    ctx.register_hook('pre_command', lambda **kw: SEEN.append(('pre_command', dict(kw))))\n"
               "    ctx.register_hook('gateway_platform_event', lambda **kw: SEEN.append(('gw', dict(kw))))\n",
    })
    m.fire_pre_command_hook(surface="cli", command="deploy", args_raw="now", platform="cli")
    m.invoke_hook("gateway_platform_event", platform="x", event_type="y", payload={})
    seen = SEEN
    assert seen[0] == ("pre_command", {"surface": "cli", "command": "deploy", "alias_used": None, "args_raw": "now",
                                       "session_key": None, "platform": "cli",
                                       "telemetry_schema_version": "hermes.observer.v1"})
    assert "telemetry_schema_version" not in seen[1][1]


# --- the host session fires them ----------------------------------------------------------------


SESSION_RECORDER = """
from tests.test_hermes_hooks import SEEN

def register(ctx):
    for name in ("pre_command", "on_stream_start", "on_stream_delta", "on_stream_end", "api_request_error"):
        ctx.register_hook(name, (lambda n: lambda **kw: SEEN.append((n, kw)))(name))
    ctx.register_hook("transform_api_error_classification",
                      lambda status_code, **kw: {"reason": "server_error", "retryable": status_code == 500})
    ctx.register_hook("pre_verify", lambda attempt, final_response: {"action": "continue", "message": "check it"}
                      if attempt == 0 and final_response == "draft" else None)
    ctx.register_command("deploy", lambda raw: "deployed " + raw)
"""


def _session(home, *script):
    from plugin_llm.host import Session
    from tests.test_host_support import ScriptedLlm

    m = manager_with(home, {"rec": SESSION_RECORDER})
    llm = ScriptedLlm(*script)
    return Session(m, llm=llm), llm


def test_session_fires_pre_command_for_plugin_and_builtin_commands(hermes_home):
    from tests.test_host_support import reply

    session, _ = _session(hermes_home, reply("x"))
    assert session.run_command("deploy", "prod").text == "deployed prod"
    session.run_command("quit")
    calls = [kw for name, kw in SEEN if name == "pre_command"]
    assert [(c["command"], c["alias_used"], c["args_raw"], c["surface"]) for c in calls] == [
        ("deploy", None, "prod", "cli"), ("exit", "quit", "", "cli")]
    assert calls[0]["session_key"] == session.session_id


def test_session_stream_observers_and_pre_verify(hermes_home):
    from tests.test_host_support import reply

    session, llm = _session(hermes_home, reply("draft"), reply("final"))
    result = session.run_turn("go")
    assert result.text == "final" and result.model_requests == 2
    assert llm.requests[1]["messages"][-1] == {"role": "user", "content": "check it"}
    stream = [(name, kw.get("delta"), kw.get("final_text")) for name, kw in SEEN if name.startswith("on_stream")]
    assert stream == [("on_stream_start", None, None), ("on_stream_delta", "draft", None),
                      ("on_stream_end", None, "draft"),
                      ("on_stream_start", None, None), ("on_stream_delta", "final", None),
                      ("on_stream_end", None, "final")]


def test_session_classifies_api_errors_through_plugins(hermes_home):
    from plugin_llm.errors import PluginLlmProviderError

    def boom(messages, tools):
        raise PluginLlmProviderError("upstream 500", status=500, provider="fake")

    session, _ = _session(hermes_home, boom)
    with pytest.raises(PluginLlmProviderError):
        session.run_turn("go")
    [error] = [kw for name, kw in SEEN if name == "api_request_error"]
    assert error["error_classification"] == {"reason": "server_error", "retryable": True}
    end = [kw for name, kw in SEEN if name == "on_stream_end"]
    assert end[0]["finished"] is False and end[0]["error"]["type"] == "PluginLlmProviderError"


# --- what differed from Hermes 0.19.0 ------------------------------------------------------------


def test_invoke_middleware_calls_each_callback_with_keywords(hermes_home):
    m = manager_with(hermes_home, {
        "a_mw": "def register(ctx):\n    ctx.register_middleware('llm_request', lambda request, **kw: {'seen': request})\n",
        "b_mw": "def register(ctx):\n"
                "    def broken(**kw):\n        raise ValueError('nope')\n"
                "    ctx.register_middleware('llm_request', broken)\n"
                "    ctx.register_middleware('llm_request', lambda: None)\n",
    })
    assert m.invoke_middleware("llm_request", request={"model": "m"}, extra=1) == [{"seen": {"model": "m"}}]
    assert m.invoke_middleware("tool_request") == []


def test_a_hook_name_shared_by_plugins_is_credited_to_each(hermes_home):
    from tests.plugin_fixtures import by_key

    m = manager_with(hermes_home, {
        "one": "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda: 1)\n",
        "two": "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda: 2)\n"
               "    ctx.register_hook('pre_llm_call', lambda: None)\n",
    })
    plugins = by_key(m.list_plugins())
    assert plugins["one"]["hooks"] == ["post_llm_call"]
    assert plugins["two"]["hooks"] == ["post_llm_call", "pre_llm_call"]


def test_get_plugin_commands_returns_hermes_dicts(hermes_home, monkeypatch):
    import plugin_llm.plugins as plugins

    manager_with(hermes_home, {
        "cmd": "def register(ctx):\n    ctx.register_command('deploy', lambda raw: raw, description='Ship it', args_hint='<env>')\n",
    })
    monkeypatch.setattr(plugins, "_MANAGERS", {})
    commands = plugins.get_plugin_commands()
    assert set(commands) == {"deploy"}
    entry = commands["deploy"]
    assert {k: entry[k] for k in ("description", "plugin", "args_hint")} == {
        "description": "Ship it", "plugin": "cmd", "args_hint": "<env>"}
    assert entry["handler"]("prod") == "prod"
    assert plugins.get_plugin_manager().list_plugins()[0]["commands"] == ["deploy"]


def test_profile_name_follows_hermes_home(hermes_home, tmp_path, monkeypatch):
    from plugin_llm.plugins.listing import _home_profile_name

    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    default = tmp_path / "user" / ".hermes"
    assert _home_profile_name(default) == "default"
    assert _home_profile_name(default / "profiles" / "work") == "work"
    assert _home_profile_name(default / "profiles" / "Bad Name") == "custom"
    assert _home_profile_name(tmp_path / "elsewhere") == "custom"
    assert PluginManager(hermes_home).profile_name() == "custom"  # the test home is a custom HERMES_HOME


def test_a_plugin_without_register_is_reported_in_hermes_words(hermes_home):
    from tests.plugin_fixtures import by_key

    m = manager_with(hermes_home, {"empty": "x = 1\n"})
    assert by_key(m.list_plugins())["empty"]["error"].startswith("no register() function")


def test_session_hooks_carry_hermes_turn_ids(hermes_home):
    from plugin_llm.host import Session
    from tests.test_host_support import ScriptedLlm, reply, tool_request

    m = manager_with(hermes_home, {
        "a_tool": TOOL,
        "ids": "from tests.test_hermes_hooks import SEEN\ndef register(ctx):\n"
               "    for n in ('pre_llm_call', 'pre_api_request', 'post_api_request', 'pre_tool_call', 'post_tool_call',"
               " 'post_llm_call', 'on_session_end'):\n"
               "        ctx.register_hook(n, (lambda n: lambda **kw: SEEN.append((n, kw)))(n))\n",
    })
    llm = ScriptedLlm(tool_request("write", {"path": "p"}), reply("done"))
    session = Session(m, llm=llm)
    session.run_turn("go")
    turn_id = f"{session.session_id}:1"
    for name, kw in SEEN:
        assert kw["turn_id"] == turn_id and kw["task_id"] == session.session_id, name
    requests = [kw for name, kw in SEEN if name == "pre_api_request"]
    assert [kw["api_request_id"] for kw in requests] == [f"{turn_id}:1", f"{turn_id}:2"]
    sent = llm.requests[0]["messages"]
    assert requests[0]["request_char_count"] == sum(len(x["content"]) for x in sent if isinstance(x["content"], str))
    assert requests[0]["max_tokens"] is None
    [tool] = [kw for name, kw in SEEN if name == "pre_tool_call"]
    assert tool["api_request_id"] == f"{turn_id}:1" and tool["tool_call_id"] == "call_1"


@pytest.mark.slow
def test_an_isolated_plugin_gets_the_new_hooks_and_directives(hermes_home):
    """Out of process: the new hooks reach the plugin and its directives come back."""
    write_plugin(hermes_home / "plugins", "a_tool", TOOL)
    write_plugin(hermes_home / "plugins", "iso", """
        def register(ctx):
            ctx.register_hook("pre_tool_call", lambda args, telemetry_schema_version:
                              {"action": "modify", "args": {"path": "/iso", "v": telemetry_schema_version}})
            ctx.register_hook("pre_verify", lambda attempt: {"action": "continue", "message": "again"} if attempt == 0 else None)
            ctx.register_hook("transform_api_error_classification", lambda status_code: {"reason": "billing", "code": status_code})
    """)
    configure(hermes_home, enabled=["a_tool", "iso"], plugins={"entries": {"iso": {"isolation": "process"}}})
    m = PluginManager(hermes_home)
    try:
        m.discover_plugins()
        assert m.get_plugin("iso")["pid"]
        assert m.dispatch_tool("write", {"path": "/etc"}) == "ok path=/iso,v=hermes.observer.v1"
        assert m.get_pre_verify_continue_message(attempt=0) == "again"
        assert m.get_plugin_error_classification(status_code=402) == {"reason": "billing"}
    finally:
        m.shutdown()
