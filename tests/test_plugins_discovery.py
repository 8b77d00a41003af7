"""Discovery: user dir, categories, project gating, entry points, precedence, idempotence."""

from __future__ import annotations

import sys
import textwrap
import uuid
from importlib.metadata import entry_points

import pytest

from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.discovery import project_plugins_enabled, scan_directory
from tests.plugin_fixtures import by_key, configure, write_plugin


def test_user_plugins_found_enabled_or_not(hermes_home):
    write_plugin(hermes_home / "plugins", "alpha")
    write_plugin(hermes_home / "plugins", "beta")
    configure(hermes_home, enabled=["alpha"])
    plugins = by_key(PluginManager(hermes_home).list_plugins())
    assert set(plugins) == {"alpha", "beta"}
    assert plugins["alpha"]["status"] == "enabled" and plugins["alpha"]["enabled"] is True
    assert plugins["alpha"]["source"] == "user"
    assert plugins["beta"]["status"] == "not enabled" and plugins["beta"]["enabled"] is False


def test_plugin_yml_spelling_accepted(hermes_home):
    d = hermes_home / "plugins" / "yml-one"
    d.mkdir(parents=True)
    (d / "plugin.yml").write_text("name: yml-one\n")
    (d / "__init__.py").write_text("def register(ctx):\n    pass\n")
    configure(hermes_home, enabled=["yml-one"])
    assert by_key(PluginManager(hermes_home).list_plugins())["yml-one"]["status"] == "enabled"


def test_categories_give_nested_keys_and_depth_is_two(hermes_home):
    root = hermes_home / "plugins"
    write_plugin(root, "image_gen/openai")
    write_plugin(root, "memory/honcho")
    write_plugin(root, "deep/er/plugin")  # depth 3: ignored
    (root / "empty-dir").mkdir()  # no manifest, no children: ignored
    keys = [c.key for c in scan_directory(root, "user")]
    assert keys == ["image_gen/openai", "memory/honcho"]
    plugins = by_key(PluginManager(hermes_home).list_plugins())
    assert plugins["image_gen/openai"]["name"] == "openai"


def test_enable_by_bare_name_reaches_nested_plugin(hermes_home):
    write_plugin(hermes_home / "plugins", "image_gen/openai")
    write_plugin(hermes_home / "plugins", "memory/honcho")
    configure(hermes_home, enabled=["openai", "memory/honcho"])
    plugins = by_key(PluginManager(hermes_home).list_plugins())
    assert plugins["image_gen/openai"]["status"] == "enabled"
    assert plugins["memory/honcho"]["status"] == "enabled"


def test_directory_with_init_but_no_manifest_is_reported(hermes_home):
    d = hermes_home / "plugins" / "forgot-manifest"
    d.mkdir(parents=True)
    (d / "__init__.py").write_text("def register(ctx):\n    pass\n")
    p = by_key(PluginManager(hermes_home).list_plugins())["forgot-manifest"]
    assert p["status"] == "failed" and "no plugin.yaml" in p["error"]


def test_hidden_and_private_directories_skipped(hermes_home):
    write_plugin(hermes_home / "plugins", ".hidden")
    write_plugin(hermes_home / "plugins", "__pycache__")
    assert PluginManager(hermes_home).list_plugins() == []


@pytest.mark.parametrize("value, expected", [
    ("1", True), ("true", True), ("YES", True), ("on", True), (" True ", True),
    ("0", False), ("false", False), ("", False), ("no", False), ("enabled", False),
])
def test_project_gate_values(value, expected):
    assert project_plugins_enabled({"HERMES_ENABLE_PROJECT_PLUGINS": value}) is expected
    assert project_plugins_enabled({}) is False


def test_project_plugins_only_when_gate_is_on(hermes_home, tmp_path, monkeypatch):
    project = tmp_path / "repo"
    write_plugin(project / ".hermes" / "plugins", "proj-tool")
    configure(hermes_home, enabled=["proj-tool"])
    assert PluginManager(hermes_home, project_dir=project).list_plugins() == []
    monkeypatch.setenv("HERMES_ENABLE_PROJECT_PLUGINS", "true")
    p = by_key(PluginManager(hermes_home, project_dir=project).list_plugins())["proj-tool"]
    assert p["source"] == "project" and p["status"] == "enabled"


def test_project_dir_defaults_to_cwd(hermes_home, tmp_path, monkeypatch):
    project = tmp_path / "repo2"
    write_plugin(project / ".hermes" / "plugins", "cwd-tool")
    monkeypatch.chdir(project)
    monkeypatch.setenv("HERMES_ENABLE_PROJECT_PLUGINS", "1")
    assert "cwd-tool" in by_key(PluginManager(hermes_home).list_plugins())


def test_project_and_user_plugin_with_one_key_load_neither(hermes_home, tmp_path, monkeypatch):
    # A project plugin must not take a user plugin's identity (and trust grants): neither loads.
    project = tmp_path / "repo"
    write_plugin(hermes_home / "plugins", "same", "def register(ctx):\n    ctx.register_command('who', lambda a: 'user')\n")
    write_plugin(project / ".hermes" / "plugins", "same", "def register(ctx):\n    ctx.register_command('who', lambda a: 'project')\n")
    configure(hermes_home, enabled=["same"])
    monkeypatch.setenv("HERMES_ENABLE_PROJECT_PLUGINS", "on")
    m = PluginManager(hermes_home, project_dir=project)
    m.discover_plugins()
    assert sorted((p["key"], p["source"], p["status"]) for p in m.list_plugins()) == [
        ("same", "project", "failed"), ("same", "user", "failed")]
    assert "who" not in m.commands


# --- entry points: a real distribution on sys.path ---------------------------------------


@pytest.fixture
def distribution(tmp_path, monkeypatch):
    """Write ``<name>-1.2.3.dist-info`` + modules into a tmp site dir and put it on sys.path."""
    site = tmp_path / "site"
    site.mkdir()
    created: list[str] = []

    def make(entry_lines: dict[str, str], modules: dict[str, str], dist: str | None = None) -> str:
        dist = dist or f"hermes_test_dist_{uuid.uuid4().hex[:8]}"
        info = site / f"{dist}-1.2.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\nSummary: A pip-installed plugin\nAuthor: Pip Author\n"
        )
        (info / "entry_points.txt").write_text(
            "[hermes_agent.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry_lines.items())
            + "\n[console_scripts]\nunrelated = os:getcwd\n"
        )
        for name, code in modules.items():
            (site / f"{name}.py").write_text(textwrap.dedent(code))
            created.append(name)
        return dist

    monkeypatch.syspath_prepend(str(site))
    yield make
    for name in created:
        sys.modules.pop(name, None)


def test_entry_point_register_callable_and_module(hermes_home, distribution):
    suffix = uuid.uuid4().hex[:8]
    distribution(
        {"ep-func": f"epmod_{suffix}:register", "ep-module": f"epmod2_{suffix}"},
        {
            f"epmod_{suffix}": "def register(ctx):\n    ctx.register_command('from-func', lambda a: 'func')\n",
            f"epmod2_{suffix}": "def register(ctx):\n    ctx.register_command('from-module', lambda a: 'module')\n",
        },
    )
    configure(hermes_home, enabled=["ep-func", "ep-module"])
    m = PluginManager(hermes_home)  # default: importlib.metadata.entry_points()
    plugins = by_key(m.list_plugins())
    assert plugins["ep-func"]["source"] == "entrypoint"
    assert plugins["ep-func"]["status"] == "enabled"
    assert plugins["ep-func"]["version"] == "1.2.3"
    assert plugins["ep-func"]["description"] == "A pip-installed plugin"
    assert plugins["ep-module"]["status"] == "enabled"
    assert m.run_command("from-func", "") == "func"
    assert m.run_command("from-module", "") == "module"


def test_entry_points_injectable(hermes_home, distribution):
    suffix = uuid.uuid4().hex[:8]
    distribution({"injected": f"inj_{suffix}:register"}, {f"inj_{suffix}": "def register(ctx):\n    pass\n"})
    eps = entry_points(group="hermes_agent.plugins")
    assert "injected" in eps.names
    configure(hermes_home, enabled=["injected"])
    m = PluginManager(hermes_home, entry_points=[ep for ep in eps if ep.name == "injected"])
    assert [p["key"] for p in m.list_plugins()] == ["injected"]


def test_entry_point_user_and_project_with_one_key_load_none(hermes_home, tmp_path, monkeypatch, distribution):
    suffix = uuid.uuid4().hex[:8]
    write_plugin(hermes_home / "plugins", "shared", "def register(ctx):\n    ctx.register_command('src', lambda a: 'user')\n")
    write_plugin(tmp_path / "p" / ".hermes" / "plugins", "shared",
                 "def register(ctx):\n    ctx.register_command('src', lambda a: 'project')\n")
    distribution({"shared": f"shared_{suffix}:register"},
                 {f"shared_{suffix}": "def register(ctx):\n    ctx.register_command('src', lambda a: 'pip')\n"})
    monkeypatch.setenv("HERMES_ENABLE_PROJECT_PLUGINS", "yes")
    configure(hermes_home, enabled=["shared"])
    m = PluginManager(hermes_home, project_dir=tmp_path / "p")
    assert [(p["key"], p["source"], p["status"]) for p in m.list_plugins()] == [
        ("shared", "user", "failed"), ("shared", "project", "failed"), ("shared", "entrypoint", "failed")]
    assert "src" not in m.commands


def test_entry_point_failures_are_isolated(hermes_home, distribution):
    suffix = uuid.uuid4().hex[:8]
    distribution(
        {"ep-missing": f"nonexistent_{suffix}:register", "ep-not-callable": f"epnc_{suffix}:VALUE",
         "ep-ok": f"epok_{suffix}:register"},
        {f"epnc_{suffix}": "VALUE = 42\n", f"epok_{suffix}": "def register(ctx):\n    pass\n"},
    )
    configure(hermes_home, enabled=["ep-missing", "ep-not-callable", "ep-ok"])
    plugins = by_key(PluginManager(hermes_home).list_plugins())
    assert plugins["ep-missing"]["status"] == "failed"
    assert "ModuleNotFoundError" in plugins["ep-missing"]["error"]
    assert plugins["ep-not-callable"]["status"] == "failed"
    assert "must name a register(ctx) callable" in plugins["ep-not-callable"]["error"]
    assert plugins["ep-ok"]["status"] == "enabled"


# --- idempotence and forced re-discovery --------------------------------------------------


COUNTING_PLUGIN = """
import builtins
builtins.__dict__.setdefault("_plugin_llm_test_loads", []).append(__name__)

def register(ctx):
    ctx.register_tool("count_tool", {"description": "d", "parameters": {"type": "object"}}, lambda args: "ok")
    ctx.register_hook("on_session_start", lambda: "started")
    ctx.register_command("count", lambda a: "n")
"""


def test_discovery_is_idempotent(hermes_home):
    import builtins

    builtins.__dict__["_plugin_llm_test_loads"] = []
    write_plugin(hermes_home / "plugins", "counting", COUNTING_PLUGIN)
    configure(hermes_home, enabled=["counting"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    m.discover_plugins()
    m.list_plugins()
    assert len(builtins._plugin_llm_test_loads) == 1
    assert m.invoke_hook("on_session_start") == ["started"]


def test_force_rediscovery_starts_clean(hermes_home):
    import builtins

    builtins.__dict__["_plugin_llm_test_loads"] = []
    write_plugin(hermes_home / "plugins", "counting", COUNTING_PLUGIN)
    configure(hermes_home, enabled=["counting"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    m.discover_plugins(force=True)
    assert len(builtins._plugin_llm_test_loads) == 2  # code re-executed
    # nothing doubled: one tool, one hook callback, one command, no clash warnings
    assert list(m.tools) == ["count_tool"]
    assert m.invoke_hook("on_session_start") == ["started"]
    p = by_key(m.list_plugins())["counting"]
    assert p["warnings"] == [] and p["status"] == "enabled"


def test_force_rediscovery_applies_config_changes(hermes_home):
    write_plugin(hermes_home / "plugins", "counting", COUNTING_PLUGIN)
    configure(hermes_home, enabled=["counting"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    assert "count_tool" in m.tools
    configure(hermes_home, enabled=["counting"], disabled=["counting"])
    m.discover_plugins(force=True)
    assert dict(m.tools) == {} and m.invoke_hook("on_session_start") == []
    assert by_key(m.list_plugins())["counting"]["status"] == "disabled"
