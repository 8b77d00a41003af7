"""Session: full offline turns on the local model, hooks in order, tools, blocks, context, caps, errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from plugin_llm.errors import PluginLlmProviderError
from plugin_llm.host import Session
from plugin_llm.host.bootstrap import load_manager
from plugin_llm.plugins import PluginManager

from tests.test_host_support import (
    RECORDER,
    ScriptedLlm,
    add_plugin,
    copy_example,
    enable,
    events,
    reply,
    tool_request,
)

GUARD = '''
def register(ctx):
    def guard(tool_name, args=None, **_):
        if tool_name == "hello_world" and (args or {}).get("name") == "Mallory":
            return {"action": "block", "message": "Mallory may not be greeted"}
    ctx.register_hook("pre_tool_call", guard)
'''

CONTEXT = '''
def register(ctx):
    ctx.register_hook("pre_llm_call", lambda user_message, **_: {"context": "CTX-MARKER for " + user_message})
    ctx.register_hook("pre_llm_call", lambda **_: "second part")
'''


def _manager(home: Path, *keys: str, extra: str = "") -> PluginManager:
    enable(home, *keys, extra=extra)
    return load_manager(home)


# --- full turns on the embedded local model --------------------------------------------------


def test_full_turn_with_a_tool_call_offline_fires_hooks_in_order(hermes_home: Path):
    copy_example(hermes_home, "hello-world")
    add_plugin(hermes_home, "recorder", RECORDER)
    manager = _manager(hermes_home, "hello-world", "recorder")
    with Session(manager) as session:
        result = session.run_turn("use the hello_world tool with name=Ada")

    assert result.kind == "reply" and result.stop_reason == "done"
    assert [(r.name, r.arguments) for r in result.tool_runs] == [("hello_world", {"name": "Ada"})]
    assert result.tool_runs[0].result == "Hello, Ada! (from the hello-world plugin)"
    assert not result.tool_runs[0].blocked
    assert "Hello, Ada!" in result.text  # the local model quotes the tool result
    assert result.model_requests == 2
    assert result.provider == "local" and result.usage.total_tokens > 0

    assert [e["hook"] for e in events(hermes_home)] == [
        "on_session_start",
        "pre_llm_call",
        "pre_api_request", "on_stream_start", "on_stream_end", "post_api_request",  # no text: no delta
        "pre_tool_call", "transform_tool_result", "post_tool_call",
        "pre_api_request", "on_stream_start", "on_stream_delta", "on_stream_end", "post_api_request",
        "pre_verify",
        "transform_llm_output",
        "post_llm_call",
        "on_session_end",          # end of the turn
        "on_session_end", "on_session_finalize",  # session closed
    ]
    seen = events(hermes_home)
    assert seen[1]["user_message"] == "use the hello_world tool with name=Ada"
    assert {"session_id", "conversation_history", "is_first_turn", "model"} <= set(seen[1]["keys"])
    assert [e.get("api_call_count") for e in seen if e["hook"] == "pre_api_request"] == [1, 2]
    assert next(e for e in seen if e["hook"] == "pre_tool_call")["tool_name"] == "hello_world"
    assert next(e for e in seen if e["hook"] == "post_llm_call")["assistant_response"] == result.text
    assert [e.get("reason") for e in seen if e["hook"] == "on_session_end"] == ["turn", "exit"]
    assert len({e["session_id"] for e in seen if "session_id" in e}) == 1

    # history: user, assistant tool call, tool result, assistant reply
    assert [m["role"] for m in session.history] == ["user", "assistant", "tool", "assistant"]
    assert session.history[1]["tool_calls"][0]["id"] == session.history[2]["tool_call_id"]


def test_second_turn_does_not_fire_session_start_again(hermes_home: Path):
    add_plugin(hermes_home, "recorder", RECORDER)
    manager = _manager(hermes_home, "recorder")
    session = Session(manager, llm=ScriptedLlm(reply("one"), reply("two")))
    session.run_turn("first")
    session.run_turn("second")
    hooks = [e["hook"] for e in events(hermes_home)]
    assert hooks.count("on_session_start") == 1
    assert hooks.count("post_llm_call") == 2


def test_blocked_tool_call_never_runs_and_the_model_sees_the_block(hermes_home: Path):
    copy_example(hermes_home, "hello-world")
    add_plugin(hermes_home, "guard", GUARD)
    add_plugin(hermes_home, "recorder", RECORDER)
    manager = _manager(hermes_home, "hello-world", "guard", "recorder")
    with Session(manager) as session:
        result = session.run_turn("use the hello_world tool with name=Mallory")
    run = result.tool_runs[0]
    assert run.blocked
    assert "Mallory may not be greeted" in run.result
    assert "Hello" not in run.result
    assert "Mallory may not be greeted" in result.text
    hooks = [e["hook"] for e in events(hermes_home)]
    assert "pre_tool_call" in hooks and "post_tool_call" not in hooks  # the handler never ran


def test_example_tool_guard_blocks_delete_file_and_protected_paths(hermes_home: Path):
    for key in ("workspace", "tool-guard"):
        copy_example(hermes_home, key)
    (hermes_home / "workspace").mkdir()
    victim = hermes_home / "workspace" / "notes.txt"
    victim.write_text("keep me")
    manager = _manager(hermes_home, "workspace", "tool-guard")
    with Session(manager) as session:
        result = session.run_turn('call delete_file with {"path": "notes.txt"}')
        listing = session.run_turn('call list_files with {"path": "/etc"}')
    assert result.tool_runs[0].blocked and "deleting files is disabled" in result.tool_runs[0].result
    assert victim.read_text() == "keep me"
    assert listing.tool_runs[0].blocked and "/etc" in listing.tool_runs[0].result


# --- what the model receives -----------------------------------------------------------------


def test_pre_llm_call_context_rides_on_the_current_user_message_only(hermes_home: Path):
    add_plugin(hermes_home, "ctxplug", CONTEXT)
    manager = _manager(hermes_home, "ctxplug")
    llm = ScriptedLlm(reply("first answer"), reply("second answer"))
    session = Session(manager, llm=llm, system_prompt="SYSTEM PROMPT")
    session.run_turn("hello there")
    session.run_turn("and again")

    first = llm.requests[0]["messages"]
    assert first[0] == {"role": "system", "content": "SYSTEM PROMPT"}
    assert first[-1] == {"role": "user", "content": "hello there\n\nCTX-MARKER for hello there\n\nsecond part"}

    second = llm.requests[1]["messages"]
    assert second[0]["content"] == "SYSTEM PROMPT"  # never in the system prompt
    assert [m["content"] for m in second[1:]] == [
        "hello there",  # the earlier turn's context is gone
        "first answer",
        "and again\n\nCTX-MARKER for and again\n\nsecond part",
    ]
    # never persisted
    assert all("CTX-MARKER" not in str(m["content"]) for m in session.history)


def test_context_is_applied_to_every_request_of_the_turn(hermes_home: Path):
    copy_example(hermes_home, "hello-world")
    add_plugin(hermes_home, "ctxplug", CONTEXT)
    manager = _manager(hermes_home, "hello-world", "ctxplug")
    llm = ScriptedLlm(tool_request("hello_world", {"name": "Ada"}), reply("done"))
    session = Session(manager, llm=llm)
    session.run_turn("greet Ada")
    for request in llm.requests:
        users = [m for m in request["messages"] if m["role"] == "user"]
        assert "CTX-MARKER for greet Ada" in users[-1]["content"]
    offered = [t["function"]["name"] for t in llm.requests[0]["tools"]]
    assert offered == ["hello_world"]
    assert llm.requests[1]["messages"][-1] == {
        "role": "tool", "tool_call_id": "call_1", "name": "hello_world",
        "content": "Hello, Ada! (from the hello-world plugin)"}


def test_tools_whose_check_fails_are_not_offered(hermes_home: Path):
    add_plugin(hermes_home, "tools", '''
def register(ctx):
    schema = {"name": "x", "parameters": {"type": "object", "properties": {}}}
    ctx.register_tool("on_tool", "t", dict(schema, name="on_tool"), lambda a: "on", check_fn=lambda: True)
    ctx.register_tool("off_tool", "t", dict(schema, name="off_tool"), lambda a: "off", check_fn=lambda: False)
    ctx.register_tool("env_tool", "t", dict(schema, name="env_tool"), lambda a: "env", requires_env=["NOPE_NOT_SET"])
''')
    manager = _manager(hermes_home, "tools")
    llm = ScriptedLlm(reply("ok"))
    Session(manager, llm=llm).run_turn("hi")
    assert [t["function"]["name"] for t in llm.requests[0]["tools"]] == ["on_tool"]


def test_no_tools_means_tools_none(hermes_home: Path):
    manager = _manager(hermes_home)
    llm = ScriptedLlm(reply("ok"))
    Session(manager, llm=llm).run_turn("hi")
    assert llm.requests[0]["tools"] is None


# --- caps, transforms, errors ----------------------------------------------------------------


def test_tool_iteration_cap_stops_with_a_clear_note(hermes_home: Path):
    copy_example(hermes_home, "hello-world")
    manager = _manager(hermes_home, "hello-world")
    llm = ScriptedLlm(tool_request("hello_world", {"name": "again"}))  # asks for the tool forever
    session = Session(manager, llm=llm, max_tool_iterations=3)
    result = session.run_turn("loop please")
    assert result.stop_reason == "tool_limit"
    assert len(result.tool_runs) == 3
    assert result.model_requests == 4
    assert "limit of 3 tool iteration" in result.text and "hello_world" in result.text
    # history stays valid: every tool call is answered
    calls = [c["id"] for m in session.history for c in m.get("tool_calls") or ()]
    answers = [m["tool_call_id"] for m in session.history if m["role"] == "tool"]
    assert calls == answers
    assert session.history[-1] == {"role": "assistant", "content": result.text}


def test_transform_llm_output_replaces_the_final_text(hermes_home: Path):
    add_plugin(hermes_home, "shout", '''
def register(ctx):
    ctx.register_hook("transform_llm_output", lambda response_text, **_: response_text.upper())
''')
    manager = _manager(hermes_home, "shout")
    session = Session(manager, llm=ScriptedLlm(reply("quiet words")))
    result = session.run_turn("hi")
    assert result.text == "QUIET WORDS"
    assert session.history[-1]["content"] == "QUIET WORDS"


def test_model_error_rolls_back_the_turn_and_propagates(hermes_home: Path):
    add_plugin(hermes_home, "recorder", RECORDER)
    manager = _manager(hermes_home, "recorder")

    def boom(messages, tools):
        raise PluginLlmProviderError("upstream 500", status=500, provider="fake")

    session = Session(manager, llm=ScriptedLlm(reply("ok"), boom))
    session.run_turn("first")
    with pytest.raises(PluginLlmProviderError):
        session.run_turn("second")
    assert [m["content"] for m in session.history] == ["first", "ok"]
    assert not session.turn_active
    hooks = [e for e in events(hermes_home)]
    assert [e["hook"] for e in hooks].count("post_llm_call") == 1
    assert hooks[-1]["hook"] == "on_session_end" and hooks[-1]["completed"] is False


def test_empty_input_is_refused():
    session = Session(PluginManager(), llm=ScriptedLlm(reply("x")))
    with pytest.raises(ValueError):
        session.run_turn("   ")


# --- async path --------------------------------------------------------------------------------


def test_arun_turn_with_async_tool_on_the_local_model(hermes_home: Path):
    copy_example(hermes_home, "workspace")
    add_plugin(hermes_home, "recorder", RECORDER)
    manager = _manager(hermes_home, "workspace", "recorder")

    async def main():
        with Session(manager) as session:
            return await session.arun_turn("use the count_words tool with text=\"one two three\"")

    result = asyncio.run(main())
    assert json.loads(result.tool_runs[0].result) == {"words": 3, "characters": 13}
    assert '"words": 3' in result.text
    hooks = [e["hook"] for e in events(hermes_home)]
    assert hooks[:3] == ["on_session_start", "pre_llm_call", "pre_api_request"]
    assert "post_llm_call" in hooks


# --- context engines -----------------------------------------------------------------------------


def test_builtin_compressor_trims_what_the_model_receives_but_not_history(hermes_home: Path):
    manager = _manager(hermes_home)
    llm = ScriptedLlm(reply("a" * 400))
    session = Session(manager, llm=llm, context_budget_tokens=300, system_prompt="sys")
    for i in range(6):
        session.run_turn(f"question {i} " + "q" * 400)
    last = llm.requests[-1]["messages"]
    assert last[0]["content"] == "sys"
    assert last[-1]["content"].startswith("question 5")
    assert "omitted" in last[1]["content"]
    assert len(session.history) == 12  # the session keeps everything


def test_budget_from_config(hermes_home: Path):
    manager = _manager(hermes_home, extra="context:\n  budget_tokens: 1234\n")
    assert Session(manager).context_budget_tokens == 1234


def test_plugin_context_engine_replaces_the_builtin_and_failures_fall_back(hermes_home: Path):
    add_plugin(hermes_home, "ctx_engine", '''
from plugin_llm.plugins import ContextEngine

class LastOnly(ContextEngine):
    name = "last-only"
    fail = False
    def compress(self, messages, *, budget_tokens):
        if LastOnly.fail:
            raise RuntimeError("engine broke")
        return [messages[0], messages[-1]]

ENGINE = LastOnly()

def register(ctx):
    ctx.register_context_engine(ENGINE)
    ctx.register_command("break-engine", lambda raw: setattr(LastOnly, "fail", True) or "broken")
''')
    manager = _manager(hermes_home, "ctx_engine")
    llm = ScriptedLlm(reply("r"))
    session = Session(manager, llm=llm)
    session.run_turn("one")
    session.run_turn("two")
    assert [m["content"] for m in llm.requests[-1]["messages"][1:]] == ["two"]
    session.run_turn("/break-engine")
    session.run_turn("three")  # the built-in compressor takes over: full history under budget
    assert [m["content"] for m in llm.requests[-1]["messages"][1:]] == ["one", "r", "two", "r", "three"]


# --- memory provider -------------------------------------------------------------------------------


def test_memory_provider_is_consulted_and_told(hermes_home: Path):
    add_plugin(hermes_home, "mem", '''
from plugin_llm.plugins import MemoryProvider

class Mem(MemoryProvider):
    name = "testmem"
    def __init__(self):
        self.calls = []
    def recall(self, query, *, session_id):
        self.calls.append(("recall", query))
        return "the user likes tea"
    def remember(self, user_message, assistant_message, *, session_id):
        self.calls.append(("remember", user_message, assistant_message))

MEM = Mem()

def register(ctx):
    ctx.register_memory_provider(MEM)
''')
    manager = _manager(hermes_home, "mem", extra="memory:\n  provider: testmem\n")
    llm = ScriptedLlm(reply("Tea it is."))
    session = Session(manager, llm=llm)
    session.run_turn("what do I like?")
    sent = llm.requests[0]["messages"][-1]["content"]
    assert sent == "what do I like?\n\nRelevant memory:\nthe user likes tea"
    assert session.history[0]["content"] == "what do I like?"
    provider = manager.memory_provider
    assert provider.calls == [("recall", "what do I like?"), ("remember", "what do I like?", "Tea it is.")]


def test_memory_provider_not_selected_is_not_consulted(hermes_home: Path):
    copy_example(hermes_home, "memory/jsonl")
    manager = _manager(hermes_home, "memory/jsonl")  # no memory.provider
    llm = ScriptedLlm(reply("ok"))
    Session(manager, llm=llm).run_turn("remember: x is 1")
    assert not (hermes_home / "memory").exists()
