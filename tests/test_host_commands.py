"""Session slash commands (built-in, plugin sync/async) and injected messages (both queues)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from plugin_llm.host import Session
from plugin_llm.host.bootstrap import load_manager

from tests.test_host_support import RECORDER, ScriptedLlm, add_plugin, copy_example, enable, events, reply, tool_request

COMMANDS = '''
import asyncio

def register(ctx):
    ctx.register_command("echo", lambda raw: f"echo:{raw}", description="echo back", args_hint="<text>")

    async def slow_upper(raw):
        await asyncio.sleep(0)
        return raw.upper()

    ctx.register_command("/Upper ", slow_upper, description="async upper")
    ctx.register_command("nothing", lambda raw: None)

    def explode(raw):
        raise RuntimeError("kaboom")

    ctx.register_command("explode", explode)
    ctx.register_command("say", lambda raw: str(ctx.inject_message(raw, role="system")))
    ctx.register_command("tell", lambda raw: str(ctx.inject_message(raw)))

    def injector(args):
        ok = ctx.inject_message(args.get("text", ""), role=args.get("role", "user"))
        return f"injected={ok}"

    ctx.register_tool("injector", "test", {"name": "injector", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}, "role": {"type": "string"}}}}, injector)
'''


def _session(home: Path, *extra_keys: str, llm=None) -> Session:
    add_plugin(home, "cmds", COMMANDS)
    enable(home, "cmds", *extra_keys)
    return Session(load_manager(home), llm=llm or ScriptedLlm(reply("model reply")))


# --- slash commands ----------------------------------------------------------------------------


def test_sync_and_async_plugin_commands(hermes_home: Path):
    session = _session(hermes_home)
    result = session.run_turn("/echo hello world")
    assert (result.kind, result.text, result.command) == ("command", "echo:hello world", "echo")
    assert session.run_turn("/upper shout").text == "SHOUT"  # name normalised at registration
    assert session.run_turn("/UPPER  spaced ").text == "SPACED"
    assert session.run_turn("/nothing").text is None
    assert session.history == []  # commands are not conversation


def test_async_commands_under_arun_turn(hermes_home: Path):
    session = _session(hermes_home)

    async def main():
        return [await session.arun_turn("/upper abc"), await session.arun_command("echo", "x")]

    first, second = asyncio.run(main())
    assert first.text == "ABC" and second.text == "echo:x"


def test_multiline_arguments_are_kept(hermes_home: Path):
    session = _session(hermes_home)
    assert session.run_turn("/echo Title: a\nOwner: b").text == "echo:Title: a\nOwner: b"


def test_unknown_command_lists_what_exists(hermes_home: Path):
    session = _session(hermes_home)
    result = session.run_turn("/nope")
    assert result.kind == "unknown_command" and not result.ok
    assert "Unknown command /nope" in result.text
    for name in ("/echo", "/upper", "/help", "/plugins", "/exit"):
        assert name in result.text


def test_raising_command_is_reported_not_raised(hermes_home: Path):
    result = _session(hermes_home).run_turn("/explode")
    assert result.kind == "command_error"
    assert "RuntimeError: kaboom" in result.text


def test_builtin_commands(hermes_home: Path):
    copy_example(hermes_home, "hello-world")
    session = _session(hermes_home, "hello-world")
    help_text = session.run_turn("/help").text
    assert "/plugins" in help_text and "/echo <text>" in help_text and "echo back" in help_text

    plugins = session.run_turn("/plugins").text
    assert "cmds" in plugins and "hello-world" in plugins and "enabled" in plugins
    assert "tools: hello_world" in plugins

    tools = session.run_turn("/tools").text
    assert "hello_world" in tools and "injector" in tools

    assert session.run_turn("/history").text == "No messages yet."
    session.run_turn("hi there")
    history = session.run_turn("/history").text
    assert "user" in history and "hi there" in history and "model reply" in history

    assert "local-echo-1" in session.run_turn("/model").text

    result = session.run_turn("/exit")
    assert result.kind == "exit" and session.exit_requested


def test_reset_forgets_history_and_fires_hooks(hermes_home: Path):
    add_plugin(hermes_home, "recorder", RECORDER)
    session = _session(hermes_home, "recorder")
    session.run_turn("remember this")
    old_id = session.session_id
    result = session.run_turn("/reset")
    assert "New conversation" in result.text
    assert session.history == [] and session.session_id != old_id
    session.run_turn("fresh start")
    hooks = [(e["hook"], e.get("session_id")) for e in events(hermes_home)]
    assert ("on_session_finalize", old_id) in hooks
    assert ("on_session_reset", session.session_id) in hooks
    starts = [sid for hook, sid in hooks if hook == "on_session_start"]
    assert starts == [old_id, session.session_id]


def test_plugin_cannot_shadow_builtin_commands(hermes_home: Path):
    add_plugin(hermes_home, "shadow", '''
def register(ctx):
    ctx.register_command("help", lambda raw: "hijacked")
''')
    enable(hermes_home, "shadow")
    session = Session(load_manager(hermes_home), llm=ScriptedLlm(reply("x")))
    assert "Built-in commands" in session.run_turn("/help").text


# --- injected messages ---------------------------------------------------------------------------


def test_inject_returns_false_without_an_attached_session(hermes_home: Path):
    session = _session(hermes_home)  # built but never attached
    assert session.run_turn("/tell hello").text == "False"
    assert session.drain_pending() == []


def test_inject_while_idle_queues_the_next_input_with_role_prefix(hermes_home: Path):
    llm = ScriptedLlm(reply("answered"))
    with _session(hermes_home, llm=llm) as session:
        assert session.run_turn("/say maintenance at noon").text == "True"
        assert session.run_turn("/tell plain message").text == "True"
        assert session.has_pending()
        results = session.run_pending()
    assert [r.kind for r in results] == ["reply", "reply"]
    sent = [req["messages"][-1]["content"] for req in llm.requests]
    assert sent == ["[system] maintenance at noon", "plain message"]
    assert not session.has_pending()


def test_inject_during_a_turn_interrupts_and_the_turn_continues(hermes_home: Path):
    llm = ScriptedLlm(tool_request("injector", {"text": "breaking news", "role": "system"}), reply("handled"))
    with _session(hermes_home, llm=llm) as session:
        result = session.run_turn("start working")
    assert result.tool_runs[0].result == "injected=True"
    assert result.injected == ("[system] breaking news",)
    second = llm.requests[1]["messages"]
    assert second[-2]["role"] == "tool"
    assert second[-1] == {"role": "user", "content": "[system] breaking news"}
    assert session.drain_pending() == []
    assert session.history[-1]["content"] == "handled"


def test_inject_refuses_blank_content_and_closed_sessions(hermes_home: Path):
    session = _session(hermes_home).attach()
    assert session.inject("   ") is False
    assert session.inject("ok", role="tool") is True
    assert session.drain_pending() == ["[tool] ok"]
    session.close()
    assert session.manager.active_session is None
    assert session.inject("late") is False


def test_context_manager_attaches_and_detaches(hermes_home: Path):
    session = _session(hermes_home)
    assert session.manager.active_session is None
    with session:
        assert session.manager.active_session is session
    assert session.manager.active_session is None


def test_example_inbox_bridge_injects_through_ctx(hermes_home: Path):
    copy_example(hermes_home, "inbox-bridge")
    enable(hermes_home, "inbox-bridge")
    manager = load_manager(hermes_home)
    assert "inbox" in manager.platforms and "inbox" in manager.cli_commands
    inbox = hermes_home / "inbox.jsonl"
    inbox.write_text('{"role": "user", "text": "from the webhook"}\n{"role": "system", "text": "deploy done"}\n')
    llm = ScriptedLlm(reply("noted"))

    detached = Session(manager, llm=llm)
    assert "No active session" in detached.run_turn("/inbox").text

    with Session(manager, llm=llm) as session:
        assert session.run_turn("/inbox").text == "Queued 2 inbox message(s)."
        assert session.run_turn("/inbox").text == "Inbox empty."
        session.run_pending()
    assert [r["messages"][-1]["content"] for r in llm.requests] == ["from the webhook", "[system] deploy done"]


def test_async_turn_picks_up_a_message_injected_during_the_model_request(hermes_home: Path):
    holder = {}

    def first(messages, tools):
        assert holder["session"].turn_active
        assert holder["session"].inject("late news", role="webhook")  # arrives mid-request
        return reply("first answer")

    llm = ScriptedLlm(first, reply("second answer"))
    session = _session(hermes_home, llm=llm)
    holder["session"] = session

    async def main():
        with session:
            return await session.arun_turn("hello")

    result = asyncio.run(main())
    assert result.text == "second answer" and result.model_requests == 2
    assert result.injected == ("[webhook] late news",)
    assert [m["content"] for m in session.history] == ["hello", "first answer", "[webhook] late news",
                                                       "second answer"]
    assert not session.turn_active and session.drain_pending() == []
