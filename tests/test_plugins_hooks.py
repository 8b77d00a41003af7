"""Hooks: ordering, results, keyword filtering, isolation, time limits, block and context semantics."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from plugin_llm.plugins import VALID_HOOKS, PluginManager
from plugin_llm.plugins import hook_limits
from plugin_llm.plugins.hook_limits import mark_self_limited
from plugin_llm.plugins.hooks import HookEntry, HookRunner, HookTimeoutError
from tests.plugin_fixtures import configure, write_plugin


def manager_with(home, hooks: dict[str, str], **config) -> PluginManager:
    """One plugin per entry: ``{plugin_name: code}``; all enabled, in name order."""
    for name, code in hooks.items():
        write_plugin(home / "plugins", name, code)
    configure(home, enabled=list(hooks), **config)
    m = PluginManager(home)
    m.discover_plugins()
    return m


def test_valid_hooks_is_the_spec_set():
    assert VALID_HOOKS == {
        "pre_tool_call", "post_tool_call", "pre_llm_call", "post_llm_call", "pre_api_request",
        "post_api_request", "on_session_start", "on_session_end", "on_session_finalize", "on_session_reset",
        "transform_tool_result", "transform_llm_output",
        # added by current Hermes
        "api_request_error", "subagent_start", "subagent_stop", "transform_terminal_output",
        "pre_gateway_dispatch", "pre_approval_request", "post_approval_response",
        # Hermes 0.19.0 names this host lacked, and the ones 0.21.3 added: 39 in all
        "pre_verify", "kanban_task_claimed", "kanban_task_completed", "kanban_task_blocked",
        "on_stream_start", "on_stream_delta", "on_stream_end", "on_interim_message",
        "transform_api_error_classification", "on_skill_lifecycle", "agent_loop_stopped",
        "on_room_member_activity", "pre_transcription", "on_kanban_worker_spawned", "on_kanban_worker_exited",
        "on_kanban_worker_stale_claim", "on_kanban_task_updated", "on_kanban_dispatch_tick",
        "gateway_platform_event", "pre_command",
    }
    assert len(VALID_HOOKS) == 39


def test_results_in_registration_order_without_none(hermes_home):
    m = manager_with(hermes_home, {
        "a1": "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda: 'a-first')\n"
              "    ctx.register_hook('post_llm_call', lambda: None)\n"
              "    ctx.register_hook('post_llm_call', lambda: 'a-third')\n",
        "b2": "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda: {'b': 2})\n",
    })
    assert m.invoke_hook("post_llm_call") == ["a-first", "a-third", {"b": 2}]
    assert m.invoke_hook("on_session_end") == []


def test_callbacks_receive_only_accepted_kwargs_and_params_alias(hermes_home):
    seen = []
    runner = HookRunner(lambda: 5.0)
    runner.register("post_tool_call", "p", lambda tool_name, params, result: seen.append(("params", tool_name, params, result)))
    runner.register("post_tool_call", "p", lambda args: seen.append(("args", args)))
    runner.register("post_tool_call", "p", lambda **kw: seen.append(("kw", sorted(kw))))
    runner.register("post_tool_call", "p", lambda: seen.append(("none",)))

    def keyword_only(*, result, task_id="default"):
        seen.append(("kwonly", result, task_id))

    runner.register("post_tool_call", "p", keyword_only)
    runner.run("post_tool_call", {"tool_name": "t", "args": {"x": 1}, "result": "r", "extra": 9})
    assert seen == [
        ("params", "t", {"x": 1}, "r"),
        ("args", {"x": 1}),
        ("kw", ["args", "extra", "params", "result", "telemetry_schema_version", "tool_name"]),
        ("none",),
        ("kwonly", "r", "default"),
    ]


def test_args_alias_of_params():
    got = []
    runner = HookRunner(lambda: 5.0)
    runner.register("pre_tool_call", "p", lambda args: got.append(args))
    runner.run("pre_tool_call", {"params": {"a": 1}})
    assert got == [{"a": 1}]


def test_hook_entry_for_callable_object():
    class Callback:
        def __call__(self, result):
            return result

    entry = HookEntry.create("h", "p", Callback())
    assert entry.accepts == frozenset({"result"})
    assert entry.select_kwargs({"result": 1, "tool_name": "t"}) == {"result": 1}


def test_async_callbacks_are_awaited(hermes_home):
    m = manager_with(hermes_home, {
        "asy": "import asyncio\n\nasync def cb(tool_name):\n    await asyncio.sleep(0)\n    return 'async:' + tool_name\n\n"
               "def register(ctx):\n    ctx.register_hook('post_tool_call', cb)\n",
    })
    assert m.invoke_hook("post_tool_call", tool_name="t", args={}, result="") == ["async:t"]


def test_unknown_hook_name_warns_but_is_kept(hermes_home, caplog):
    with caplog.at_level(logging.WARNING, logger="plugin_llm.plugins"):
        m = manager_with(hermes_home, {"odd": "def register(ctx):\n    ctx.register_hook('on_full_moon', lambda: 'howl')\n"})
    assert any("unknown hook 'on_full_moon'" in r.getMessage() for r in caplog.records)
    assert m.invoke_hook("on_full_moon") == ["howl"]


def test_register_hook_rejects_non_callable(hermes_home):
    write_plugin(hermes_home / "plugins", "nc", "def register(ctx):\n    ctx.register_hook('post_llm_call', 'nope')\n")
    configure(hermes_home, enabled=["nc"])
    p = PluginManager(hermes_home).list_plugins()[0]
    assert p["status"] == "failed" and "callback must be callable" in p["error"]


def test_exception_is_isolated_and_logged_once_per_distinct_error(hermes_home, caplog):
    m = manager_with(hermes_home, {
        "a-bad": "def cb(n):\n    raise ValueError(f'bad value {n % 2}')\n\n"
                 "def register(ctx):\n    ctx.register_hook('post_llm_call', cb)\n",
        "b-good": "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda n: n)\n",
    })
    with caplog.at_level(logging.WARNING, logger="plugin_llm.plugins"):
        results = [m.invoke_hook("post_llm_call", n=n) for n in range(6)]
    assert results == [[0], [1], [2], [3], [4], [5]]
    failures = [r.getMessage() for r in caplog.records if "hook post_llm_call of plugin a-bad failed" in r.getMessage()]
    assert len(failures) == 2  # "bad value 0" and "bad value 1", each once
    assert any("ValueError: bad value 0" in f for f in failures) and any("ValueError: bad value 1" in f for f in failures)


SLOW = """
import threading
RELEASE = threading.Event()

def slow(**kw):
    RELEASE.wait(10)
    return "too late"

def register(ctx):
    ctx.register_hook("{hook}", slow)
"""


def _release(m, key):
    import sys

    from tests.plugin_fixtures import by_key

    sys.modules[by_key(m.list_plugins())[key]["module"]].RELEASE.set()


def test_timed_out_callback_is_abandoned_and_others_still_run(hermes_home, caplog):
    m = manager_with(hermes_home, {
        "a-first": "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda: 'first')\n",
        "b-slow": SLOW.format(hook="post_llm_call"),
        "c-last": "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda: 'last')\n",
    }, plugins={"hook_timeout": 0.2})
    try:
        with caplog.at_level(logging.WARNING, logger="plugin_llm.plugins"):
            assert m.invoke_hook("post_llm_call") == ["first", "last"]
        assert any("b-slow failed: HookTimeoutError" in r.getMessage() and "0.2s" in r.getMessage()
                   for r in caplog.records)
    finally:
        _release(m, "b-slow")


def test_default_hook_timeout_is_30s(hermes_home):
    m = PluginManager(hermes_home)
    assert m.settings.hook_timeout == 30.0
    configure(hermes_home, plugins={"hook_timeout": 2.5})
    assert m.settings.hook_timeout == 2.5


def test_hook_may_invoke_hooks_itself(hermes_home):
    write_plugin(hermes_home / "plugins", "nest", """
def register(ctx):
    ctx.register_hook("on_session_reset", lambda: "inner")
    ctx.register_hook("on_session_start", lambda: ctx.dispatch_tool("nope", {}))
""")
    configure(hermes_home, enabled=["nest"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    assert "Unknown tool" in m.invoke_hook("on_session_start")[0]


def _in_thread(fn):
    """Run ``fn()`` on a fresh non-main thread and return its result (the pool path)."""
    box = {}
    worker = threading.Thread(target=lambda: box.update(value=fn()))
    worker.start()
    worker.join(10)
    return box["value"]


def test_callbacks_see_the_callers_context_on_both_paths(hermes_home):
    import contextvars

    var = contextvars.ContextVar("test_var", default="unset")
    seen = []
    runner = HookRunner(lambda: 5.0)
    runner.register("post_llm_call", "p", lambda: seen.append((threading.current_thread().name, var.get())))
    var.set("caller")
    runner.run("post_llm_call", {})  # main thread: inline, under SIGALRM
    assert seen[-1] == ("MainThread", "caller")

    def off_main():
        var.set("worker-caller")
        return runner.run("post_llm_call", {})

    _in_thread(off_main)  # any other thread: on the pool, in the caller's context
    assert seen[-1][0].startswith("plugin-hooks-") and seen[-1][1] == "worker-caller"


def _slow_runner(timeout, log):
    runner = HookRunner(lambda: timeout)
    runner.register("post_llm_call", "a", lambda: "first")

    def slow():
        release = threading.Event()
        try:
            release.wait(10)
            return "too late"
        finally:
            log.append("slow left")

    runner.register("post_llm_call", "b", slow)
    runner.register("post_llm_call", "c", lambda: "last")
    return runner


def test_inline_timeout_interrupts_the_callback(hermes_home):
    log = []
    outcomes = _slow_runner(0.2, log).run("post_llm_call", {})
    assert [o.value for o in outcomes] == ["first", None, "last"]
    assert isinstance(outcomes[1].error, HookTimeoutError) and "interrupted" in str(outcomes[1].error)
    assert log == ["slow left"]  # interrupted, not left running
    import signal

    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_pool_timeout_abandons_the_callback(hermes_home):
    log = []
    outcomes = _in_thread(lambda: _slow_runner(0.2, log).run("post_llm_call", {}))
    assert [o.value for o in outcomes] == ["first", None, "last"]
    assert isinstance(outcomes[1].error, HookTimeoutError) and "background" in str(outcomes[1].error)


def test_except_exception_in_a_plugin_does_not_swallow_the_time_limit(hermes_home):
    def stubborn():
        try:
            threading.Event().wait(10)
        except Exception:  # a plugin's broad handler
            return "swallowed"

    runner = HookRunner(lambda: 0.2)
    runner.register("post_llm_call", "p", stubborn)
    [outcome] = runner.run("post_llm_call", {})
    assert isinstance(outcome.error, HookTimeoutError)


def test_foreign_sigalrm_handler_or_running_loop_uses_the_pool(hermes_home):
    import asyncio
    import signal

    names = []
    runner = HookRunner(lambda: 5.0)
    runner.register("post_llm_call", "p", lambda: names.append(threading.current_thread().name))
    mine = lambda signum, frame: None  # noqa: E731
    previous = signal.signal(signal.SIGALRM, mine)
    try:
        runner.run("post_llm_call", {})
        assert signal.getsignal(signal.SIGALRM) is mine
    finally:
        signal.signal(signal.SIGALRM, previous)

    async def inside_loop():
        runner.run("post_llm_call", {})

    asyncio.run(inside_loop())
    assert names[0].startswith("plugin-hooks-") and names[1].startswith("plugin-hooks-")


def test_nested_invocation_inside_an_inline_callback(hermes_home):
    runner = HookRunner(lambda: 5.0)
    runner.register("on_session_reset", "inner", lambda: threading.current_thread().name)
    runner.register("on_session_start", "outer", lambda: runner.results("on_session_reset", {}))
    [names] = runner.results("on_session_start", {})
    assert names[0].startswith("plugin-hooks-")  # the nested one cannot share the timer


def test_keyboard_interrupt_is_not_swallowed_inline(hermes_home):
    import os
    import signal

    def interrupted():  # the operator's Ctrl-C arrives while the callback runs
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(5)

    runner = HookRunner(lambda: 5.0)
    runner.register("post_llm_call", "p", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run("post_llm_call", {})
    # a KeyboardInterrupt the plugin raises itself is its own failure, isolated (tests/test_plugins_faults.py)


# --- pre_tool_call -------------------------------------------------------------------------


@pytest.mark.parametrize("directive, expected", [
    ({"action": "block", "message": "no deletes"}, "no deletes"),
    ({"action": "block", "message": ""}, None),
    ({"action": "block", "message": "   "}, None),
    ({"action": "block"}, None),
    ({"action": "block", "message": 42}, None),
    ({"action": "allow", "message": "fine"}, None),
    ({"action": "BLOCK", "message": "case matters"}, None),
    ("block", None),
    (["block"], None),
    (True, None),
    (None, None),
])
def test_block_directive_validity(hermes_home, directive, expected):
    runner_home = hermes_home
    write_plugin(runner_home / "plugins", "guard", f"def register(ctx):\n    ctx.register_hook('pre_tool_call', lambda: {directive!r})\n")
    configure(runner_home, enabled=["guard"])
    m = PluginManager(runner_home)
    m.discover_plugins()
    assert m.get_pre_tool_call_block_message("rm", {"path": "/"}) == expected


def test_first_valid_block_wins(hermes_home):
    m = manager_with(hermes_home, {
        "a": "def register(ctx):\n    ctx.register_hook('pre_tool_call', lambda: {'action': 'block'})\n",
        "b": "def register(ctx):\n    ctx.register_hook('pre_tool_call', lambda tool_name: {'action': 'block', 'message': 'b says no to ' + tool_name})\n",
        "c": "def register(ctx):\n    ctx.register_hook('pre_tool_call', lambda: {'action': 'block', 'message': 'c says no'})\n",
    })
    assert m.get_pre_tool_call_block_message("rm", {}) == "b says no to rm"


def test_guard_sees_tool_name_and_args_as_params(hermes_home):
    m = manager_with(hermes_home, {
        "g": "def guard(tool_name, params, task_id=None):\n"
             "    if params.get('path') == '/':\n        return {'action': 'block', 'message': f'{tool_name} on / ({task_id})'}\n\n"
             "def register(ctx):\n    ctx.register_hook('pre_tool_call', guard)\n",
    })
    assert m.get_pre_tool_call_block_message("rm", {"path": "/"}, task_id="t1") == "rm on / (t1)"
    assert m.get_pre_tool_call_block_message("rm", {"path": "/tmp"}) is None


def test_raising_guard_fails_closed_naming_the_plugin(hermes_home):
    m = manager_with(hermes_home, {"guard": "def register(ctx):\n    ctx.register_hook('pre_tool_call', lambda: 1 / 0)\n"})
    message = m.get_pre_tool_call_block_message("rm", {})
    assert "guard" in message and "ZeroDivisionError" in message and "blocked" in message


def test_timed_out_guard_fails_closed(hermes_home):
    m = manager_with(hermes_home, {"slowguard": SLOW.format(hook="pre_tool_call")}, plugins={"hook_timeout": 0.2})
    try:
        message = m.get_pre_tool_call_block_message("rm", {})
        assert "slowguard" in message and "timed out" in message and "blocked" in message
    finally:
        _release(m, "slowguard")


def test_no_guards_means_no_block(hermes_home):
    assert PluginManager(hermes_home).get_pre_tool_call_block_message("anything", {}) is None


# --- pre_llm_call ----------------------------------------------------------------------------


def test_pre_llm_call_context_strings_and_dicts_joined(hermes_home):
    m = manager_with(hermes_home, {
        "a": "def register(ctx):\n    ctx.register_hook('pre_llm_call', lambda user_message: 'Today is Monday.')\n",
        "b": "def register(ctx):\n    ctx.register_hook('pre_llm_call', lambda: {'context': 'User likes tea.'})\n",
        "c": "def register(ctx):\n    ctx.register_hook('pre_llm_call', lambda: {'other': 'ignored'})\n"
             "    ctx.register_hook('pre_llm_call', lambda: 7)\n"
             "    ctx.register_hook('pre_llm_call', lambda: '   ')\n"
             "    ctx.register_hook('pre_llm_call', lambda: 1 / 0)\n",
    })
    assert m.get_pre_llm_call_context(user_message="hi", session_id="s") == "Today is Monday.\n\nUser likes tea."


def test_pre_llm_call_context_empty_without_hooks(hermes_home):
    assert PluginManager(hermes_home).get_pre_llm_call_context(user_message="hi") == ""


def _past_the_limit_runner(limit):
    """A runner whose one callback enforces the limit itself and returns after the limit has passed."""
    runner = HookRunner(lambda: limit)

    def self_limited():
        deadline = time.monotonic() + 3 * limit
        while time.monotonic() < deadline:  # past the hook's limit, by the clock and not by a sleep's length
            time.sleep(limit / 4)
        return "answered"

    runner.register("post_llm_call", "isolated", mark_self_limited(self_limited))
    return runner


def test_a_self_limited_callback_is_not_raced_by_the_runner_inline(hermes_home, monkeypatch):
    monkeypatch.setattr(hook_limits, "_SELF_LIMITED_SLACK", 60.0)  # the callback's own limit decides
    [outcome] = _past_the_limit_runner(0.1).run("post_llm_call", {})
    assert outcome.error is None and outcome.value == "answered"


def test_a_self_limited_callback_is_not_raced_by_the_runner_on_the_pool(hermes_home, monkeypatch):
    monkeypatch.setattr(hook_limits, "_SELF_LIMITED_SLACK", 60.0)
    [outcome] = _in_thread(lambda: _past_the_limit_runner(0.1).run("post_llm_call", {}))
    assert outcome.error is None and outcome.value == "answered"


def test_a_self_limited_callback_still_has_an_outer_limit(hermes_home, monkeypatch):
    monkeypatch.setattr(hook_limits, "_SELF_LIMITED_SLACK", 0.1)
    runner = HookRunner(lambda: 0.1)
    runner.register("post_llm_call", "isolated", mark_self_limited(lambda: threading.Event().wait(30)))
    [outcome] = runner.run("post_llm_call", {})
    assert isinstance(outcome.error, HookTimeoutError)
