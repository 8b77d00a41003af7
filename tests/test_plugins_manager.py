"""Enabling, isolation of failures, module namespaces, listing, and the seeds' hello-world plugin."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from plugin_llm.plugins import PluginManager, get_plugin_manager
from plugin_llm.plugins import discover_plugins as module_discover
from plugin_llm.plugins import get_plugin_commands, get_plugin_toolsets
from tests.plugin_fixtures import HELLO_WORLD_INIT, HELLO_WORLD_MANIFEST, by_key, configure, write_plugin

REGISTERS_EVERYTHING = """
from plugin_llm.plugins import ContextEngine, MemoryProvider

class Engine(ContextEngine):
    name = "eng-{tag}"
    def compress(self, messages, *, budget_tokens):
        return messages

class Memory(MemoryProvider):
    name = "mem-{tag}"
    def recall(self, query, *, session_id):
        return None
    def remember(self, user_message, assistant_message, *, session_id):
        pass

def register(ctx):
    ctx.register_tool("tool_{tag}", {{"description": "d", "parameters": {{"type": "object"}}}}, lambda args: "ok")
    ctx.register_hook("on_session_start", lambda: "{tag}")
    ctx.register_command("cmd-{tag}", lambda a: "x")
    ctx.register_cli_command("cli-{tag}", "help", lambda p: None, lambda a: 0)
    ctx.register_context_engine(Engine())
    ctx.register_memory_provider(Memory())
    {tail}
"""


# --- enabling ----------------------------------------------------------------------------


def test_nothing_enabled_by_default_with_hint(hermes_home):
    write_plugin(hermes_home / "plugins", "image_gen/openai")
    p = by_key(PluginManager(hermes_home).list_plugins())["image_gen/openai"]
    assert p["status"] == "not enabled"
    assert p["enable_hint"] == "plugin-llm plugins enable image_gen/openai"
    assert p["enabled"] is False and p["tools"] == []


@pytest.mark.parametrize("enabled, disabled, expected", [
    (["alpha"], [], "enabled"),
    (["alpha"], ["alpha"], "disabled"),
    ([], ["alpha"], "disabled"),
    (["cat/alpha"], ["alpha"], "disabled"),  # disabled by bare name beats enabled by key
    (["alpha"], ["cat/alpha"], "disabled"),  # disabled by key beats enabled by bare name
    (["other"], [], "not enabled"),
])
def test_enable_disable_precedence(hermes_home, enabled, disabled, expected):
    write_plugin(hermes_home / "plugins", "cat/alpha")
    configure(hermes_home, enabled=enabled, disabled=disabled)
    assert by_key(PluginManager(hermes_home).list_plugins())["cat/alpha"]["status"] == expected


def test_disabled_plugin_is_never_imported(hermes_home):
    write_plugin(hermes_home / "plugins", "boom", "raise RuntimeError('imported!')\n")
    configure(hermes_home, enabled=["boom"], disabled=["boom"])
    p = by_key(PluginManager(hermes_home).list_plugins())["boom"]
    assert p["status"] == "disabled" and p["error"] is None


def test_bad_enabled_value_fails_closed_with_warning(hermes_home, caplog):
    write_plugin(hermes_home / "plugins", "alpha")
    configure(hermes_home, plugins={"enabled": {"alpha": True}})
    with caplog.at_level(logging.WARNING, logger="plugin_llm.plugins"):
        p = by_key(PluginManager(hermes_home).list_plugins())["alpha"]
    assert p["status"] == "not enabled"
    assert any("plugins.enabled must be a list" in r.getMessage() for r in caplog.records)


def test_missing_required_env_still_loads_and_is_listed(hermes_home, monkeypatch):
    monkeypatch.delenv("PLUGIN_TEST_KEY_A", raising=False)
    monkeypatch.setenv("PLUGIN_TEST_KEY_B", "set")
    write_plugin(hermes_home / "plugins", "needy", manifest={
        "name": "needy", "requires_env": ["PLUGIN_TEST_KEY_A", {"name": "PLUGIN_TEST_KEY_B", "description": "b"}]})
    configure(hermes_home, enabled=["needy"])
    p = by_key(PluginManager(hermes_home).list_plugins())["needy"]
    assert p["status"] == "enabled"
    assert p["requires_env"] == ["PLUGIN_TEST_KEY_A", "PLUGIN_TEST_KEY_B"]
    assert p["missing_env"] == ["PLUGIN_TEST_KEY_A"]


# --- isolation -----------------------------------------------------------------------------


@pytest.mark.parametrize("code, manifest, fragment", [
    ("def register(ctx):\n    raise RuntimeError('kaput')\n", None, "register() raised: RuntimeError: kaput"),
    ("x = 1\n", None, "no register() function"),
    ("import definitely_not_a_module_xyz\n", None, "import failed: ModuleNotFoundError"),
    ("def register(ctx:\n", None, "import failed: SyntaxError"),
    ("register = 5\n", None, "register is not callable"),
    ("def register(ctx):\n    import sys; sys.exit(3)\n", None, "register() raised: SystemExit"),
    (None, None, "no __init__.py"),
    ("def register(ctx):\n    pass\n", "name: [unclosed\n", "invalid YAML"),
    ("def register(ctx):\n    pass\n", "- not\n- a mapping\n", "must be a mapping"),
    ("def register(ctx):\n    pass\n", "name: ../escape\n", "without path separators"),
])
def test_each_failure_mode_marks_only_that_plugin_failed(hermes_home, code, manifest, fragment):
    write_plugin(hermes_home / "plugins", "bad", code, manifest=manifest)
    write_plugin(hermes_home / "plugins", "good", "def register(ctx):\n    ctx.register_command('good', lambda a: 'fine')\n")
    configure(hermes_home, enabled=["bad", "good"])
    m = PluginManager(hermes_home)
    plugins = by_key(m.list_plugins())
    assert plugins["bad"]["status"] == "failed", plugins["bad"]
    assert plugins["bad"]["enabled"] is False
    assert fragment in plugins["bad"]["error"]
    assert plugins["good"]["status"] == "enabled"
    assert m.run_command("good", "") == "fine"


def test_broken_manifest_is_failed_even_when_not_enabled(hermes_home):
    write_plugin(hermes_home / "plugins", "broken", manifest="name: [\n")
    p = by_key(PluginManager(hermes_home).list_plugins())["broken"]
    assert p["status"] == "failed" and "invalid YAML" in p["error"]


def test_failed_register_removes_everything_it_registered(hermes_home):
    write_plugin(hermes_home / "plugins", "half", REGISTERS_EVERYTHING.format(
        tag="half", tail="ctx.register_skill('s', 'SKILL.md')\n    raise ValueError('after registering')"),
        files={"SKILL.md": "# skill\n"})
    write_plugin(hermes_home / "plugins", "whole", REGISTERS_EVERYTHING.format(tag="whole", tail="pass"))
    configure(hermes_home, enabled=["half", "whole"], memory={"provider": "mem-whole"})
    m = PluginManager(hermes_home)
    plugins = by_key(m.list_plugins())
    assert plugins["half"]["status"] == "failed"
    assert "ValueError: after registering" in plugins["half"]["error"]
    assert plugins["half"]["tools"] == [] and plugins["half"]["hooks"] == [] and plugins["half"]["commands"] == []
    assert list(m.tools) == ["tool_whole"]
    assert list(m.commands) == ["cmd-whole"]
    assert list(m.cli_commands) == ["cli-whole"]
    assert list(m.skills) == []
    assert m.invoke_hook("on_session_start") == ["whole"]
    # the failed plugin's context engine is gone, so the good one's second registration was accepted
    assert m.context_engine is not None and m.context_engine.name == "eng-whole"
    assert m.memory_provider.name == "mem-whole"
    assert not [name for name in sys.modules if name.startswith("hermes_plugins.half")]


def test_stale_ctx_cannot_register_after_failure(hermes_home, caplog):
    write_plugin(hermes_home / "plugins", "sneaky", """
import builtins

def register(ctx):
    builtins._plugin_llm_stale_ctx = ctx
    raise RuntimeError("fail")
""")
    configure(hermes_home, enabled=["sneaky"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    import builtins

    ctx = builtins._plugin_llm_stale_ctx
    del builtins._plugin_llm_stale_ctx
    with caplog.at_level(logging.WARNING, logger="plugin_llm.plugins"):
        assert ctx.register_command("late", lambda a: "x") is None
    assert "late" not in m.commands
    assert any("stale ctx" in r.getMessage() for r in caplog.records)


def _audit_events(home, event):
    path = home / "logs" / "agent.log"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return [r for r in lines if r.get("event") == event]


def test_load_failure_written_to_audit_log(hermes_home):
    write_plugin(hermes_home / "plugins", "bad", "def register(ctx):\n    raise RuntimeError('nope')\n")
    configure(hermes_home, enabled=["bad"])
    PluginManager(hermes_home).discover_plugins()
    [event] = _audit_events(hermes_home, "plugin_load_failed")
    assert event["plugin_id"] == "bad" and "RuntimeError: nope" in event["error"]
    assert "hash" in event and "seq" in event  # chained like every audit line


def test_hook_error_written_to_audit_log_once_per_distinct_error(hermes_home):
    write_plugin(hermes_home / "plugins", "flaky", "def register(ctx):\n    ctx.register_hook('post_llm_call', lambda: 1 / 0)\n")
    configure(hermes_home, enabled=["flaky"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    for _ in range(5):
        assert m.invoke_hook("post_llm_call") == []
    [event] = _audit_events(hermes_home, "hook_error")
    assert (event["hook"], event["plugin"], event["error.type"]) == ("post_llm_call", "flaky", "ZeroDivisionError")
    assert "division by zero" in event["message"]


# --- module namespaces ---------------------------------------------------------------------


def test_same_file_names_in_two_plugins_never_collide(hermes_home):
    for name, word in (("one", "first"), ("two", "second")):
        write_plugin(
            hermes_home / "plugins", name,
            "from .tools import answer\nfrom . import schemas\n\n"
            "def register(ctx):\n"
            f"    ctx.register_tool('{name}_tool', schemas.SCHEMA, answer)\n",
            files={"tools.py": f"def answer(args):\n    return '{word}'\n",
                   "schemas.py": "SCHEMA = {'description': 'x', 'parameters': {'type': 'object'}}\n"},
        )
    configure(hermes_home, enabled=["one", "two"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    assert m.dispatch_tool("one_tool", {}) == "first"
    assert m.dispatch_tool("two_tool", {}) == "second"
    modules = {k: p["module"] for k, p in by_key(m.list_plugins()).items()}
    assert sys.modules[modules["one"] + ".tools"] is not sys.modules[modules["two"] + ".tools"]


def test_nested_key_gets_its_own_namespace_and_data_files(hermes_home):
    write_plugin(hermes_home / "plugins", "image_gen/openai", """
from pathlib import Path
DATA = (Path(__file__).parent / "data" / "greeting.txt").read_text().strip()

def register(ctx):
    ctx.register_command("greet", lambda a: DATA + " from " + __name__)
""", files={"data/greeting.txt": "hi\n"})
    configure(hermes_home, enabled=["image_gen/openai"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    module = by_key(m.list_plugins())["image_gen/openai"]["module"]
    assert module.startswith("hermes_plugins.image_gen__openai")
    assert m.run_command("greet", "") == "hi from " + module


def test_two_homes_in_one_process_keep_separate_modules(tmp_path):
    homes = []
    for word in ("left", "right"):
        home = tmp_path / word
        write_plugin(home / "plugins", "same", f"def register(ctx):\n    ctx.register_command('w', lambda a: '{word}')\n")
        configure(home, enabled=["same"])
        homes.append(PluginManager(home))
    for m in homes:
        m.discover_plugins()
    assert [m.run_command("w", "") for m in homes] == ["left", "right"]


# --- listing and module-level API ----------------------------------------------------------


def test_list_plugins_fields(hermes_home):
    write_plugin(hermes_home / "plugins", "full", REGISTERS_EVERYTHING.format(tag="full", tail="pass"), manifest={
        "name": "full", "version": "3.0", "description": "Does it all", "author": "Ann", "kind": "general",
        "provides_tools": ["tool_full"]})
    configure(hermes_home, enabled=["full"])
    p = by_key(PluginManager(hermes_home).list_plugins())["full"]
    for field in ("name", "key", "version", "description", "source", "enabled", "status", "tools", "hooks",
                  "commands", "error", "missing_env", "enable_hint"):
        assert field in p
    assert (p["name"], p["version"], p["description"], p["author"], p["kind"]) == ("full", "3.0", "Does it all", "Ann", "standalone")
    assert p["tools"] == ["tool_full"] and p["hooks"] == ["on_session_start"] and p["commands"] == ["cmd-full"]
    assert p["cli_commands"] == ["cli-full"] and p["context_engines"] == ["eng-full"] and p["memory_providers"] == ["mem-full"]
    assert p["error"] is None and p["enable_hint"] is None and p["enabled"] is True
    json.dumps(p)  # JSON-serialisable for `plugins list --json`


def test_module_level_api_uses_one_manager_per_home(hermes_home, tmp_path):
    write_plugin(hermes_home / "plugins", "full", REGISTERS_EVERYTHING.format(tag="mod", tail="pass"))
    configure(hermes_home, enabled=["full"])
    assert get_plugin_manager() is get_plugin_manager(hermes_home)
    assert get_plugin_manager(tmp_path / "elsewhere") is not get_plugin_manager()
    module_discover()
    assert list(get_plugin_commands()) == ["cmd-mod"]
    assert get_plugin_toolsets() == [("full", "full (plugin full)", "tool_mod")]


# --- the seeds' hello-world plugin, verbatim -----------------------------------------------


def test_seed_hello_world_runs_unchanged(hermes_home, capsys):
    write_plugin(hermes_home / "plugins", "hello-world", HELLO_WORLD_INIT, manifest=HELLO_WORLD_MANIFEST)
    configure(hermes_home, enabled=["hello-world"])
    m = PluginManager(hermes_home)
    p = by_key(m.list_plugins())["hello-world"]
    assert (p["status"], p["version"], p["tools"], p["hooks"]) == ("enabled", "1.0", ["hello_world"], ["post_tool_call"])
    tool = m.tools["hello_world"]
    assert tool.toolset == "hello-world" and tool.plugin_key == "hello-world"
    assert tool.openai_tool()["function"]["parameters"]["required"] == ["name"]
    result = m.dispatch_tool("hello_world", {"name": "Ada"})
    assert result == "Hello, Ada! 👋  (from the hello-world plugin)"
    assert "[hello-world] tool called: hello_world" in capsys.readouterr().out
