"""``dispatch_tool`` / ``adispatch_tool``: the one tool execution path."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from plugin_llm.plugins import PluginManager
from tests.plugin_fixtures import by_key, configure, write_plugin

SCHEMA = {"description": "test tool", "parameters": {"type": "object", "properties": {}}}

TOOLS = """
import asyncio, json
CALLS = []
SCHEMA = {"description": "d", "parameters": {"type": "object"}}

def echo(args):
    CALLS.append(("echo", args))
    return "echo:" + json.dumps(args, sort_keys=True)

def with_kwargs(args, **kw):
    CALLS.append(("with_kwargs", sorted(kw)))
    return {"kw": sorted(kw)}

def picky(args, task_id=None):
    CALLS.append(("picky", task_id))
    return None

async def slow_async(args):
    await asyncio.sleep(0)
    return ["async", args.get("n")]

def broken(args):
    raise KeyError("missing thing")

def register(ctx):
    ctx.register_tool("echo", SCHEMA, echo)
    ctx.register_tool("with_kwargs", "kits", SCHEMA, with_kwargs)
    ctx.register_tool("picky", SCHEMA, picky)
    ctx.register_tool("slow_async", "kits", SCHEMA, slow_async, is_async=True)
    ctx.register_tool("broken", SCHEMA, broken)
    ctx.register_tool("off", "kits", SCHEMA, echo, check_fn=lambda: False)
    ctx.register_tool("raising_check", "kits", SCHEMA, echo, check_fn=lambda: 1 / 0)
"""

HOOKS = """
EVENTS = []

def guard(tool_name, args):
    EVENTS.append(("pre", tool_name))
    if args.get("forbidden"):
        return {"action": "block", "message": "forbidden flag set"}

def transform(tool_name, result):
    EVENTS.append(("transform", tool_name, result))
    if tool_name == "echo":
        return result.upper()

def post(tool_name, params, result, session_id=None):
    EVENTS.append(("post", tool_name, params, result, session_id))

def register(ctx):
    ctx.register_hook("pre_tool_call", guard)
    ctx.register_hook("transform_tool_result", transform)
    ctx.register_hook("transform_tool_result", lambda tool_name: "never used" if tool_name == "echo" else None)
    ctx.register_hook("post_tool_call", post)
"""


@pytest.fixture
def setup(hermes_home):
    write_plugin(hermes_home / "plugins", "kit", TOOLS)
    write_plugin(hermes_home / "plugins", "watch", HOOKS)
    configure(hermes_home, enabled=["kit", "watch"])
    m = PluginManager(hermes_home)
    modules = {k: sys.modules[p["module"]] for k, p in by_key(m.list_plugins()).items()}
    return m, modules["kit"], modules["watch"]


def test_full_pipeline_order(setup):
    m, kit, watch = setup
    assert m.dispatch_tool("echo", {"a": 1}) == 'ECHO:{"A": 1}'
    assert watch.EVENTS == [
        ("pre", "echo"),
        ("transform", "echo", 'echo:{"a": 1}'),
        ("post", "echo", {"a": 1}, 'ECHO:{"A": 1}', None),
    ]


def test_unknown_tool_is_json_error_without_hooks(setup):
    m, _, watch = setup
    result = json.loads(m.dispatch_tool("nope", {}))
    assert "Unknown tool" in result["error"]
    assert watch.EVENTS == []


@pytest.mark.parametrize("tool", ["off", "raising_check"])
def test_failing_check_fn_is_json_error(setup, tool):
    m, kit, _ = setup
    assert "unavailable" in json.loads(m.dispatch_tool(tool, {}))["error"]
    assert kit.CALLS == []


def test_blocked_call_never_reaches_handler(setup):
    m, kit, watch = setup
    result = json.loads(m.dispatch_tool("echo", {"forbidden": True}))
    assert "blocked" in result["error"] and result["error"].endswith(": forbidden flag set")
    assert kit.CALLS == []
    assert [e[0] for e in watch.EVENTS] == ["pre"]


def test_handler_exception_is_json_error_and_hooks_still_fire(setup):
    m, _, watch = setup
    result = json.loads(m.dispatch_tool("broken", {}))
    assert result["error"] == "Tool 'broken' failed: KeyError: 'missing thing'"
    assert watch.EVENTS[-1][0] == "post"


def test_non_string_results_json_encoded(setup):
    m, _, _ = setup
    assert m.dispatch_tool("slow_async", {"n": 4}) == '["async", 4]'
    assert m.dispatch_tool("picky", {}) == "null"


def test_handler_gets_only_kwargs_it_accepts(setup):
    m, kit, _ = setup
    session = object()
    m.dispatch_tool("with_kwargs", {}, parent_agent=session, task_id="t1")
    m.dispatch_tool("with_kwargs", {}, task_id="t2")
    m.dispatch_tool("picky", {}, parent_agent=session, task_id="t3", unrelated=1)
    assert kit.CALLS == [("with_kwargs", ["parent_agent", "task_id"]), ("with_kwargs", ["task_id"]), ("picky", "t3")]


def test_session_id_of_parent_agent_reaches_hooks(setup):
    m, _, watch = setup

    class Session:
        session_id = "s-42"

    m.dispatch_tool("picky", {}, parent_agent=Session())
    assert watch.EVENTS[-1] == ("post", "picky", {}, "null", "s-42")


def test_string_arguments_parsed_as_json(setup):
    m, kit, _ = setup
    assert m.dispatch_tool("echo", '{"x": 2}') == 'ECHO:{"X": 2}'
    assert "not valid JSON" in json.loads(m.dispatch_tool("echo", "{oops"))["error"]
    assert "must be a JSON object" in json.loads(m.dispatch_tool("echo", [1, 2]))["error"]


def test_async_dispatch_matches_sync(setup):
    m, kit, watch = setup

    async def run():
        return await asyncio.gather(
            m.adispatch_tool("echo", {"a": 1}),
            m.adispatch_tool("slow_async", {"n": 1}),
            m.adispatch_tool("echo", {"forbidden": True}),
            m.adispatch_tool("broken", {}),
            m.adispatch_tool("nope", {}),
        )

    echo, slow, blocked, broken, unknown = asyncio.run(run())
    assert echo == 'ECHO:{"A": 1}' and slow == '["async", 1]'
    assert "forbidden flag set" in json.loads(blocked)["error"]
    assert "KeyError" in json.loads(broken)["error"]
    assert "Unknown tool" in json.loads(unknown)["error"]


def test_sync_dispatch_of_async_tool_inside_running_loop(setup):
    m, _, _ = setup

    async def run():
        return m.dispatch_tool("slow_async", {"n": 9})

    assert asyncio.run(run()) == '["async", 9]'


def test_handler_can_use_a_guard_that_times_out(hermes_home):
    write_plugin(hermes_home / "plugins", "kit", "def register(ctx):\n    ctx.register_tool('t', {'description': 'd'}, lambda a: 'ran')\n")
    write_plugin(hermes_home / "plugins", "stuck", """
import threading
EV = threading.Event()
def register(ctx):
    ctx.register_hook("pre_tool_call", lambda: EV.wait(5))
""")
    configure(hermes_home, enabled=["kit", "stuck"], plugins={"hook_timeout": 0.2})
    m = PluginManager(hermes_home)
    stuck = sys.modules[by_key(m.list_plugins())["stuck"]["module"]]
    try:
        result = json.loads(m.dispatch_tool("t", {}))
        assert "stuck" in result["error"] and "timed out" in result["error"]
    finally:
        stuck.EV.set()


# --- a guard whose verdict cannot be read fails closed, in process and in its own process -----------

HOSTILE_GUARD = """
from collections.abc import Mapping

class GetRaises(Mapping):  # a well-formed block that only a .get() would miss
    def __getitem__(self, key):
        return {"action": "block", "message": "mapping says no"}[key]
    def __iter__(self):
        return iter(["action", "message"])
    def __len__(self):
        return 2
    def get(self, key, default=None):
        raise RuntimeError("get is hostile")

class Unreadable(Mapping):
    def __getitem__(self, key):
        raise RuntimeError("getitem is hostile")
    def __iter__(self):
        return iter(["action"])
    def __len__(self):
        return 1
    def get(self, key, default=None):
        raise RuntimeError("get is hostile")
    def items(self):
        raise RuntimeError("items is hostile")

class HostileDict(dict):
    def __eq__(self, other):
        raise RuntimeError("eq is hostile")
    __hash__ = None
    def items(self):
        raise RuntimeError("items is hostile")

def deep():
    value = {}
    for _ in range(200):
        value = {"nested": value}
    return value

VERDICTS = {
    "get_raises": GetRaises,
    "unreadable": Unreadable,
    "hostile_dict": lambda: HostileDict(action="block", message="dict says no"),
    "deep": deep,
    "huge": lambda: {"action": "block", "pad": list(range(200_000))},
    "int_action": lambda: {"action": 1, "message": "no"},
    "list_action": lambda: {"action": ["block"], "message": "no"},
}

def register(ctx):
    ctx.register_hook("pre_tool_call", lambda tool_name, args: VERDICTS[args["verdict"]]())
"""


def _hook_errors(home) -> list[dict]:
    path = home / "logs" / "agent.log"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [r for r in map(json.loads, filter(None, lines)) if r.get("event") == "hook_error"]


@pytest.mark.slow
@pytest.mark.parametrize("isolated", [False, True], ids=["in_process", "own_process"])
def test_a_guard_whose_verdict_cannot_be_read_fails_closed(hermes_home, isolated):
    write_plugin(hermes_home / "plugins", "kit", TOOLS)
    write_plugin(hermes_home / "plugins", "hostile", HOSTILE_GUARD)
    plugins = {"entries": {"hostile": {"isolation": "process"}}} if isolated else {}
    configure(hermes_home, enabled=["kit", "hostile"], plugins=plugins)
    m = PluginManager(hermes_home)
    try:
        kit = sys.modules[by_key(m.list_plugins())["kit"]["module"]]
        # a mapping read by its items, a dict by its real items: its block is the guard's verdict
        assert json.loads(m.dispatch_tool("echo", {"verdict": "get_raises"}))["error"].endswith(": mapping says no")
        assert json.loads(m.dispatch_tool("echo", {"verdict": "hostile_dict"}))["error"].endswith(": dict says no")
        for verdict in ("unreadable", "deep", "huge", "int_action", "list_action"):
            for result in (m.dispatch_tool("echo", {"verdict": verdict}),
                           asyncio.run(m.adispatch_tool("echo", {"verdict": verdict}))):
                error = json.loads(result)["error"]
                assert "pre_tool_call guard of plugin 'hostile' returned a verdict that could not be read" in error, (
                    verdict, error)
                assert "'echo' is blocked (fail-closed)" in error
        assert kit.CALLS == []  # the tool never ran
        audited = [e for e in _hook_errors(hermes_home) if e["plugin_id"] == "hostile"]
        assert {e["hook"] for e in audited} == {"pre_tool_call"} and len(audited) >= 5
        assert all(e["error.type"] == "UnusableValue" for e in audited)
    finally:
        m.shutdown()
