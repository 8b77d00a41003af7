"""Hermes 0.21's ``ctx`` additions, each checked in process and in an isolated plugin's process (the
same plugin code, the same answers): identity, config, durable state, unload callbacks, tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from plugin_llm.plugins import PluginManager
from tests.conftest import write_config
from tests.plugin_fixtures import write_plugin

MODES = ["in-process", pytest.param("process", marks=pytest.mark.slow)]


def _config(home: Path, enabled: list[str], isolated: list[str], entries: dict | None = None, **extra) -> None:
    all_entries = {key: dict((entries or {}).get(key, {})) for key in set(enabled) | set(entries or {})}
    for key in isolated:
        all_entries.setdefault(key, {})["isolation"] = "process"
    write_config(home, yaml.safe_dump({"plugins": {"enabled": enabled, "entries": all_entries}, **extra}))


@pytest.fixture
def managers():
    made: list[PluginManager] = []
    yield made
    for manager in made:
        manager.shutdown()


def _load(home: Path, managers: list, key: str, code: str, mode: str, others: dict | None = None,
          entries: dict | None = None, manifest: dict | None = None) -> PluginManager:
    write_plugin(home / "plugins", key, code, manifest)
    for other, other_code in (others or {}).items():
        if other_code is not None:
            write_plugin(home / "plugins", other, other_code)
    _config(home, [key, *(others or {})], [key] if mode == "process" else [], entries)
    manager = PluginManager(home)
    managers.append(manager)
    manager.discover_plugins()
    plugin = manager.get_plugin(key)
    assert plugin["status"] == "enabled", plugin["error"]
    return manager


def _probe(manager: PluginManager, **args) -> object:
    return json.loads(manager.dispatch_tool("probe", args))


# --- identity -------------------------------------------------------------------------------

IDENTITY = '''
import json

def register(ctx):
    def probe(args):
        return json.dumps({"id": ctx.plugin_id, "other": ctx.has_plugin("image_gen/other"), "by_name": ctx.has_plugin("other"),
                           "missing": ctx.has_plugin("nope"), "off": ctx.has_plugin("off"), "odd": ctx.has_plugin(3)})
    ctx.register_tool("probe", {"name": "probe", "description": "p"}, probe)
'''


@pytest.mark.parametrize("mode", MODES)
def test_plugin_id_and_has_plugin(hermes_home, managers, mode):
    write_plugin(hermes_home / "plugins", "off")  # found, not enabled
    manager = _load(hermes_home, managers, "probe-plugin", IDENTITY, mode,
                    others={"image_gen/other": "def register(ctx):\n    pass\n"})
    assert _probe(manager) == {"id": "probe-plugin", "other": True, "by_name": True, "missing": False,
                               "off": False, "odd": False}


# --- get_config / set_config ------------------------------------------------------------------

CONFIG = '''
import json

def register(ctx):
    def probe(args):
        out = {"endpoint": ctx.get_config("endpoint"), "policy": ctx.get_config("retry.policy"),
               "legacy": ctx.get_config("old"), "missing": ctx.get_config("nope", 7)}
        for bad in ("", "plugins.enabled", "model", "Settings.x", "a/b", "a\\\\b", "../x", "a..b", ".a", "-a"):
            try:
                ctx.get_config(bad)
                out[bad] = "read"
            except ValueError:
                out[bad] = "ValueError"
            try:
                ctx.set_config(bad, 1)
                out["set " + bad] = "written"
            except ValueError:
                out["set " + bad] = "ValueError"
        for name, value in (("object", object()), ("nan", float("nan")), ("huge", "x" * 70000), ("keys", {1: 2})):
            try:
                ctx.set_config("bad", value)
                out[name] = "written"
            except (ValueError, TypeError) as exc:
                out[name] = type(exc).__name__
        ctx.set_config("retry.policy", {"max": 3, "on": ["429", "503"]})
        ctx.set_config("endpoint", "https://new.example")
        ctx.set_config("deep.a.b", True)
        out["after"] = [ctx.get_config("retry.policy"), ctx.get_config("endpoint"), ctx.get_config("deep")]
        return json.dumps(out)
    ctx.register_tool("probe", {"name": "probe", "description": "p"}, probe)
'''


@pytest.mark.parametrize("mode", MODES)
def test_get_and_set_config_are_jailed_to_the_plugins_settings(hermes_home, managers, mode):
    entries = {"cfg": {"settings": {"endpoint": "https://old.example", "retry": {"policy": "fixed"}},
                       "config": {"old": "legacy", "endpoint": "shadowed"}}}
    manager = _load(hermes_home, managers, "cfg", CONFIG, mode, entries=entries)
    path = hermes_home / "config.yaml"
    path.write_text("# operator's comment\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
    before = yaml.safe_load(path.read_text(encoding="utf-8"))
    out = _probe(manager)
    assert out.pop("after") == [{"max": 3, "on": ["429", "503"]}, "https://new.example", {"a": {"b": True}}]
    assert out == {"endpoint": "https://old.example", "policy": "fixed", "legacy": "legacy", "missing": 7,
                   **{k: v for bad in ("", "plugins.enabled", "model", "Settings.x", "a/b", "a\\b", "../x", "a..b",
                                       ".a", "-a") for k, v in ((bad, "ValueError"), ("set " + bad, "ValueError"))},
                   "object": "ValueError", "nan": "ValueError", "huge": "ValueError", "keys": "ValueError"}
    text = path.read_text(encoding="utf-8")
    after = yaml.safe_load(text)
    assert text.startswith("# operator's comment\n") and (hermes_home / "config.yaml.bak").exists()
    settings = after["plugins"]["entries"]["cfg"].pop("settings")
    assert settings == {"endpoint": "https://new.example", "retry": {"policy": {"max": 3, "on": ["429", "503"]}},
                        "deep": {"a": {"b": True}}}
    before["plugins"]["entries"]["cfg"].pop("settings")
    assert after == before  # nothing else changed
