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
