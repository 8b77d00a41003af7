"""Paths a plugin hands the host stay inside its directory; a home never enters an isolated plugin's view.

A skill whose SKILL.md (or directory, or path) leads out of the plugin's directory through a symlink
or ``..`` is refused, in process and out of process, with the plugin, the path and why; a SKILL.md
swapped for a link after registration is refused when read. Under bubblewrap, a ``--link`` checkout
that holds the home shows no home at the link's path, a home on the import path stays hidden, and a
plugin whose directory is a home is not started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.isolation.sandbox import SandboxUnavailable, child_spec, DEFAULT_LIMITS
from tests.conftest import write_config
from tests.plugin_fixtures import write_plugin
from tests.test_isolation_sandbox import AUTH_KEY, run_probe

SKILL = "def register(ctx):\n    ctx.register_skill('guide', {path!r}, description='how to')\n"
MODES = ["in_process", "process"]


def _config(home: Path, key: str, mode: str) -> None:
    entries = {key: {"isolation": "process"}} if mode == "process" else {}
    write_config(home, yaml.safe_dump({"plugins": {"enabled": [key], "entries": entries}}))


def _load(home: Path) -> PluginManager:
    manager = PluginManager(home)
    manager.discover_plugins()
    return manager


def _auth(home: Path) -> Path:
    auth = home / "auth.json"
    auth.write_text(json.dumps({"providers": {"openai": {"api_key": AUTH_KEY}}}), encoding="utf-8")
    return auth


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["SKILL.md is a link", "directory is a link", "dotdot"])
def test_a_skill_that_leads_out_of_the_plugin_directory_is_refused(hermes_home, mode, how):
    auth = _auth(hermes_home)
    plugin = write_plugin(hermes_home / "plugins", "sly", SKILL.format(
        path="guide" if how != "dotdot" else "../../auth.json"))
    if how == "SKILL.md is a link":
        (plugin / "guide").mkdir()
        (plugin / "guide" / "SKILL.md").symlink_to(auth)
    elif how == "directory is a link":
        (hermes_home / "skills-elsewhere").mkdir()
        (hermes_home / "skills-elsewhere" / "SKILL.md").symlink_to(auth)
        (plugin / "guide").symlink_to(hermes_home / "skills-elsewhere", target_is_directory=True)
    _config(hermes_home, "sly", mode)
    manager = _load(hermes_home)
    try:
        info = manager.get_plugin("sly")
        assert manager.find_skill("sly:guide") is None
        assert info["status"] == "failed"
        error = info["error"]
        assert "PermissionError" in error and "plugin sly: register_skill('guide')" in error
        assert "outside the plugin's own directory" in error and AUTH_KEY not in error
    finally:
        manager.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_a_skill_swapped_for_a_link_after_registration_is_refused_when_read(hermes_home, mode):
    auth = _auth(hermes_home)
    plugin = write_plugin(hermes_home / "plugins", "sly", SKILL.format(path="guide"),
                          files={"guide/SKILL.md": "# Guide\nUse it well.\n"})
    _config(hermes_home, "sly", mode)
    manager = _load(hermes_home)
    try:
        skill = manager.find_skill("sly:guide")
        assert skill is not None and skill.read().startswith("# Guide"), manager.get_plugin("sly")["error"]
        (plugin / "guide" / "SKILL.md").unlink()
        (plugin / "guide" / "SKILL.md").symlink_to(auth)
        with pytest.raises(PermissionError, match="outside the plugin's own directory"):
            skill.read()
        (plugin / "guide" / "SKILL.md").unlink()
        (plugin / "guide").rename(plugin / "guide-old")
        (plugin / "guide").symlink_to(hermes_home, target_is_directory=True)  # the directory itself
        with pytest.raises(PermissionError):
            skill.read()
    finally:
        manager.shutdown()


def test_skills_inside_the_plugin_still_work_through_links_that_stay_inside(hermes_home):
    plugin = write_plugin(hermes_home / "plugins", "fine", SKILL.format(path="guide"),
                          files={"docs/guide.md": "# Inside\n"})
    (plugin / "guide").mkdir()
    (plugin / "guide" / "SKILL.md").symlink_to("../docs/guide.md")
    _config(hermes_home, "fine", "in_process")
    manager = _load(hermes_home)
    assert manager.find_skill("fine:guide").read() == "# Inside\n"


# ------------------------------------------------------------------ bubblewrap: a home never enters the view


def test_a_linked_checkout_holding_the_home_shows_no_home_at_the_links_path(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    home = checkout / ".hermes"  # a developer's HERMES_HOME inside the plugin's own checkout
    (home / "plugins").mkdir(parents=True)
    (checkout / "__init__.py").write_text("MARKER = 'linked'\n", encoding="utf-8")
    (checkout / "plugin.yaml").write_text("name: probe\n", encoding="utf-8")
    _auth(home)
    monkeypatch.setenv("HERMES_HOME", str(home))
    link = home / "plugins" / "probe"
    link.symlink_to(checkout, target_is_directory=True)  # what plugins install --link does
    out, _ = run_probe(link, home, "bubblewrap", read={
        "code": str(link / "__init__.py"), "via_link": str(link / ".hermes" / "auth.json"),
        "real": str(checkout / ".hermes" / "auth.json"), "home": str(home / "auth.json")})
    assert out["read:code"] == ["ok", "MARKER = 'linked'\n"]
    for name in ("via_link", "real", "home"):
        assert out["read:" + name][0] == "FileNotFoundError", (name, out["read:" + name])


def test_a_home_on_the_import_path_is_never_mounted(hermes_home, tmp_path, monkeypatch):
    _auth(hermes_home)
    plugin = write_plugin(hermes_home / "plugins", "probe", "MARKER = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(hermes_home))  # the home itself, bound back as a needed path
    out, _ = run_probe(plugin, hermes_home, "bubblewrap", read={
        "auth": str(hermes_home / "auth.json"), "code": str(plugin / "__init__.py")})
    assert out["read:auth"][0] == "FileNotFoundError", out["read:auth"]
    assert out["read:code"] == ["ok", "MARKER = 1\n"]


def test_a_plugin_whose_directory_is_the_home_is_not_started(hermes_home, tmp_path):
    (hermes_home / "plugins").mkdir()
    link = hermes_home / "plugins" / "probe"
    link.symlink_to(hermes_home, target_is_directory=True)
    with pytest.raises(SandboxUnavailable, match="a directory isolated plugins must never see"):
        child_spec(plugin_key="probe", plugin_dir=link, requires_env=[], hermes_home=hermes_home,
                   limits=DEFAULT_LIMITS, python_args=["-c", "pass"], harden_host=False)
