"""``ctx.llm`` from plugin code: inside hooks, fanned out in async commands, and the nested-key trust block.

Runs offline: without ``model:`` in config.yaml the route is the embedded ``local`` model.
"""

from __future__ import annotations

import asyncio

import pytest

from plugin_llm.errors import PluginLlmTrustError
from plugin_llm.plugins import PluginManager
from tests.plugin_fixtures import configure, write_plugin

HOOK_CALLS_LLM = """
def register(ctx):
    def on_start(session_id):
        r = ctx.llm.complete([{"role": "user", "content": "Say hi to " + session_id}], purpose="greeting")
        return {"text": r.text, "provider": r.provider, "plugin_id": r.audit["plugin_id"]}

    ctx.register_hook("on_session_start", on_start)
"""

FANOUT = """
import asyncio

def register(ctx):
    async def fanout(raw_args):
        questions = [q.strip() for q in raw_args.split("|")]
        results = await asyncio.gather(*(
            ctx.llm.acomplete([{"role": "user", "content": q}], purpose="fanout") for q in questions
        ))
        return "\\n".join(f"{r.provider}:{bool(r.text)}:{r.audit['call_id']}" for r in results)

    ctx.register_command("fanout", fanout, description="ask three questions at once")
"""

MODEL_OVERRIDE = """
def register(ctx):
    def draw(raw_args):
        r = ctx.llm.complete([{"role": "user", "content": "describe " + raw_args}], model="local-echo-1")
        return f"{r.provider}/{r.model}"

    ctx.register_command("draw", draw)
"""


def test_hook_calls_ctx_llm_complete(hermes_home):
    write_plugin(hermes_home / "plugins", "greeter", HOOK_CALLS_LLM)
    configure(hermes_home, enabled=["greeter"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    [result] = m.invoke_hook("on_session_start", session_id="s1")
    assert result["provider"] == "local" and result["text"] and result["plugin_id"] == "greeter"


def test_hook_calls_sync_llm_even_when_fired_from_an_event_loop(hermes_home):
    write_plugin(hermes_home / "plugins", "greeter", HOOK_CALLS_LLM)
    configure(hermes_home, enabled=["greeter"])
    m = PluginManager(hermes_home)
    m.discover_plugins()

    async def session():
        direct = m.invoke_hook("on_session_start", session_id="s2")
        offloaded = await m.ainvoke_hook("on_session_start", session_id="s3")
        return direct + offloaded

    results = asyncio.run(session())
    assert [r["provider"] for r in results] == ["local", "local"]


def test_async_command_gathers_three_acomplete_calls(hermes_home):
    write_plugin(hermes_home / "plugins", "async-fanout", FANOUT)
    configure(hermes_home, enabled=["async-fanout"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    out = asyncio.run(m.arun_command("/fanout", "What is 2+2? | Name a colour | Capital of France?"))
    lines = out.splitlines()
    assert len(lines) == 3
    assert all(line.startswith("local:True:") for line in lines)
    assert len({line.rsplit(":", 1)[1] for line in lines}) == 3  # three distinct audited calls
    assert len(m.run_command("fanout", "a | b | c").splitlines()) == 3  # sync wrapper too


def test_nested_key_model_override_denied_without_its_trust_entry(hermes_home):
    write_plugin(hermes_home / "plugins", "image_gen/openai", MODEL_OVERRIDE)
    # a trust block for the bare name is NOT the plugin's identity
    configure(hermes_home, enabled=["image_gen/openai"],
              plugins={"entries": {"openai": {"llm": {"allow_model_override": True}}}})
    m = PluginManager(hermes_home)
    m.discover_plugins()
    with pytest.raises(PluginLlmTrustError) as err:
        m.run_command("draw", "a cat")
    assert err.value.plugin_id == "image_gen/openai"
    assert "image_gen/openai" in err.value.config_key and err.value.config_key.endswith("allow_model_override")


def test_nested_key_model_override_allowed_by_its_own_entry(hermes_home):
    write_plugin(hermes_home / "plugins", "image_gen/openai", MODEL_OVERRIDE)
    configure(hermes_home, enabled=["image_gen/openai"],
              plugins={"entries": {"image_gen/openai": {"llm": {"allow_model_override": True}}}})
    m = PluginManager(hermes_home)
    m.discover_plugins()
    assert m.run_command("draw", "a cat") == "local/local-echo-1"
