"""Safe plugin lifecycle (including --link installs) through the real entry point."""

from __future__ import annotations

import pytest

import json
from pathlib import Path

from tests.test_cli_main import cli, pty_dialog


def make_plugin(where: Path, name: str, body: str = "", manifest: str = "") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "plugin.yaml").write_text(f"name: {name}\nversion: 0.1.0\n{manifest}", encoding="utf-8")
    (where / "__init__.py").write_text(body or "def register(ctx):\n    pass\n", encoding="utf-8")
    return where


GRANTS = """model:
  provider: local
plugins:
  enabled: [helper]
  entries:
    helper:
      llm:
        allow_model_override: true
"""


@pytest.mark.slow
def test_remove_cleans_enabled_and_trust_grants_and_shows_them(hermes_home: Path, tmp_path: Path):
    src = make_plugin(tmp_path / "src" / "helper", "helper")
    (hermes_home / "config.yaml").write_text(GRANTS, encoding="utf-8")
    assert cli(hermes_home, "plugins", "install", str(src), "--no-enable", "--accept-existing-grants").returncode == 0
    out = cli(hermes_home, "plugins", "remove", "helper")
    assert out.returncode == 0, out.stderr
    assert "helper from plugins.enabled" in out.stdout and "plugins.entries.helper (llm)" in out.stdout
    text = (hermes_home / "config.yaml").read_text()
    assert "helper" not in text and "allow_model_override" not in text
    # the next plugin installed under that name inherits nothing
    again = cli(hermes_home, "plugins", "install", str(src), "--no-enable", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["enabled"] is False
    listing = json.loads(cli(hermes_home, "plugins", "list", "--json").stdout)
    assert [p["status"] for p in listing if p["key"] == "helper"] == ["not enabled"]


@pytest.mark.slow
def test_remove_keep_config_then_install_refuses_without_accept(hermes_home: Path, tmp_path: Path):
    src = make_plugin(tmp_path / "src" / "helper", "helper")
    (hermes_home / "config.yaml").write_text(GRANTS, encoding="utf-8")
    assert cli(hermes_home, "plugins", "install", str(src), "--no-enable", "--accept-existing-grants").returncode == 0
    kept = cli(hermes_home, "plugins", "remove", "helper", "--keep-config")
    assert kept.returncode == 0 and "kept: --keep-config" in kept.stdout
    assert "allow_model_override" in (hermes_home / "config.yaml").read_text()
    refused = cli(hermes_home, "plugins", "install", str(src), "--no-enable")  # not a terminal: refuse
    assert refused.returncode == 2
    assert "plugins.entries.helper" in refused.stderr and "--accept-existing-grants" in refused.stderr
    assert "nothing was installed" in refused.stderr and not (hermes_home / "plugins" / "helper").exists()
    accepted = cli(hermes_home, "plugins", "install", str(src), "--no-enable", "--accept-existing-grants", "--json")
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["enabled"] is True  # truthful: plugins.enabled still names it


def test_install_on_a_terminal_asks_about_leftover_grants(hermes_home: Path, tmp_path: Path):
    src = make_plugin(tmp_path / "src" / "helper", "helper")
    (hermes_home / "config.yaml").write_text(GRANTS, encoding="utf-8")
    code, out = pty_dialog(hermes_home, ["plugins", "install", str(src)], [(b"have them", b"n\r")])
    assert code == 2, out
    assert "already has settings for helper" in out and not (hermes_home / "plugins" / "helper").exists()


@pytest.mark.slow
def test_install_asks_for_environment_values_masked_before_enable(hermes_home: Path, tmp_path: Path):
    src = make_plugin(tmp_path / "src" / "envy", "envy", manifest="requires_env:\n  - ENVY_API_KEY\n")
    code, out = pty_dialog(hermes_home, ["plugins", "install", str(src)],
                           [(b"ENVY_API_KEY", b"s3cr3t-value\r"), (b"Enable envy now?", b"y\r")])
    assert code == 0, out
    assert out.index("ENVY_API_KEY") < out.index("Enable envy now?")
    assert "s3cr3t-value" not in out  # masked
    assert "ENVY_API_KEY=" in (hermes_home / ".env").read_text()
    assert "envy" in (hermes_home / "config.yaml").read_text()


@pytest.mark.slow
def test_install_link_uses_the_directory_in_place(hermes_home: Path, tmp_path: Path):
    dev = make_plugin(tmp_path / "dev" / "linked", "linked", body=(
        "def register(ctx):\n    ctx.register_command('hi', lambda raw: 'version one')\n"))
    out = cli(hermes_home, "plugins", "install", "--link", str(dev), "--enable")
    assert out.returncode == 0, out.stderr
    target = hermes_home / "plugins" / "linked"
    assert target.is_symlink() and target.resolve() == dev.resolve()
    assert cli(hermes_home, "run", "hi").stdout.strip() == "version one"
    (dev / "__init__.py").write_text("def register(ctx):\n    ctx.register_command('hi', lambda raw: 'version two')\n")
    assert cli(hermes_home, "run", "hi").stdout.strip() == "version two"  # edits apply on the next load
    update = cli(hermes_home, "plugins", "update", "linked")
    assert update.returncode == 0 and "nothing to update" in update.stdout
    info = json.loads(cli(hermes_home, "plugins", "info", "linked", "--json").stdout)
    assert info["install"]["kind"] == "link"
    removed = cli(hermes_home, "plugins", "remove", "linked")
    assert removed.returncode == 0, removed.stderr
    assert not target.exists() and not target.is_symlink() and (dev / "__init__.py").is_file()  # DIR untouched


CALC = """
def register(ctx):
    ctx.register_tool("calc", {"name": "calc", "description": "calculator", "parameters": {"type": "object"}},
                      lambda args, **kw: "from {me}")
"""


@pytest.mark.slow
def test_tool_name_clash_is_won_by_the_plugin_installed_first(hermes_home: Path, tmp_path: Path):
    (hermes_home / "config.yaml").write_text("model:\n  provider: local\n", encoding="utf-8")
    hermesy = make_plugin(tmp_path / "src" / "hermesy", "hermesy", CALC.replace("{me}", "hermesy"))
    edge = make_plugin(tmp_path / "src" / "edge", "edge", CALC.replace("{me}", "edge"))
    assert cli(hermes_home, "plugins", "install", str(hermesy), "--enable").returncode == 0
    out = cli(hermes_home, "plugins", "install", str(edge), "--enable")  # alphabetically first, installed later
    assert out.returncode == 0, out.stderr
    assert "warning: edge: tool 'calc' refused: the name is already registered by plugin hermesy (it loads first" in out.stdout, out.stdout
    assert out.stdout.index("warning: edge") < out.stdout.index("Enabled edge")  # warned before enabling
    listing = cli(hermes_home, "plugins", "list")
    assert "registered by plugin hermesy (it loads first: the first plugin to register a name keeps it)" \
        in listing.stdout
    tools = json.loads(cli(hermes_home, "plugins", "list", "--json").stdout)
    assert {p["key"]: p["tools"] for p in tools} == {"edge": [], "hermesy": ["calc"]}
    assert [p["key"] for p in tools] == ["edge", "hermesy"]  # listed in discovery order still
    cli(hermes_home, "plugins", "disable", "edge")
    again = cli(hermes_home, "plugins", "enable", "edge")
    assert "warning: edge: tool 'calc' refused" in again.stdout
