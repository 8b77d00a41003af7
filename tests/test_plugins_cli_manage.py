"""``plugin-llm plugins install|update|remove|enable|disable|info`` and the interactive screen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from plugin_llm.cli.plugins import terminal
from plugin_llm.cli.main import main
from plugin_llm.cli.plugins_menu import prompt_menu
from plugin_llm.cli.plugins_select import (
    PluginRef,
    apply_menu,
    build_menu,
    disable_in,
    enable_in,
)
from plugin_llm.config_edit import edit_config
from tests.git_repos import git_env, make_repo, plugin_files  # noqa: F401 (fixtures)
from tests.plugin_fixtures import write_plugin

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = (REPO / "config_examples" / "config.yaml").read_text(encoding="utf-8")


def config(home: Path) -> dict:
    path = home / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def plugins_section(home: Path) -> dict:
    return config(home).get("plugins") or {}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- install


def test_install_non_tty_does_not_enable_and_reports_missing_env(hermes_home, make_repo, capsys, monkeypatch):
    monkeypatch.delenv("WEATHER_API_KEY", raising=False)
    repo = make_repo("weather", plugin_files("weather", manifest_extra="requires_env:\n  - {name: WEATHER_API_KEY, description: from weather.example}\n"))
    (hermes_home / "config.yaml").write_text(EXAMPLE)
    code, out, err = run(capsys, "plugins", "install", repo.url)
    assert code == 0, err
    assert "Installed weather 1.0 from " + repo.url in out
    assert "Missing environment: WEATHER_API_KEY" in out
    assert "Not enabled; enable it with: plugin-llm plugins enable weather" in out
    assert (hermes_home / "config.yaml").read_text() == EXAMPLE  # not asked, not enabled
    assert not (hermes_home / ".env").exists()
    assert (hermes_home / "plugins" / "weather" / "plugin.yaml").exists()


def test_install_with_enable_edits_config_keeping_comments(hermes_home, make_repo, capsys):
    repo = make_repo("weather", plugin_files("weather"))
    (hermes_home / "config.yaml").write_text(EXAMPLE)
    code, out, err = run(capsys, "plugins", "install", repo.url, "--enable")
    assert code == 0, err
    assert "Enabled weather in" in out
    text = (hermes_home / "config.yaml").read_text()
    assert "weather" in plugins_section(hermes_home)["enabled"]
    assert text.count("#") == EXAMPLE.count("#")
    assert (hermes_home / "config.yaml.bak").read_text() == EXAMPLE
    code, out, _ = run(capsys, "plugins", "list", "--json")
    assert {p["key"]: p["status"] for p in json.loads(out)}["weather"] == "enabled"


def test_install_json_output(hermes_home, make_repo, capsys):
    repo = make_repo("tool", plugin_files("tool"))
    code, out, err = run(capsys, "plugins", "install", f"{repo.url}", "--no-enable", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["key"] == "tool" and data["enabled"] is False and data["kind"] == "git"
    assert len(data["revision"]) == 40 and data["ref"] is None


def test_install_prompts_on_a_terminal_masking_secrets(hermes_home, make_repo, capsys, monkeypatch):
    for name in ("WEATHER_API_KEY", "WEATHER_UNITS", "WEATHER_REGION"):
        monkeypatch.delenv(name, raising=False)
    extra = "requires_env:\n  - WEATHER_API_KEY\n  - {name: WEATHER_UNITS, description: metric or imperial}\n  - WEATHER_REGION\n"
    repo = make_repo("weather", plugin_files("weather", manifest_extra=extra))
    asked: list[tuple[str, str]] = []
    answers = iter(["metric", "", "y"])  # units / region (skipped) / enable? (environment first)

    def fake_input(prompt):
        asked.append(("input", prompt))
        return next(answers)

    def fake_getpass(prompt):
        asked.append(("getpass", prompt))
        return "sk-weather-SECRET-1234"

    monkeypatch.setattr(terminal, "interactive", lambda: True)
    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr("getpass.getpass", fake_getpass)
    code, out, err = run(capsys, "plugins", "install", repo.url)
    assert code == 0, err
    assert asked == [
        ("getpass", "  WEATHER_API_KEY: "),
        ("input", "  WEATHER_UNITS (metric or imperial): "),
        ("input", "  WEATHER_REGION: "),
        ("input", "Enable weather now? [y/N] "),
    ]
    assert "sk-weather-SECRET-1234" not in out + err
    assert "Saved WEATHER_API_KEY, WEATHER_UNITS to" in out and "(values not shown)" in out
    assert "Missing environment: WEATHER_REGION" in out
    env = (hermes_home / ".env").read_text()
    assert "WEATHER_API_KEY=sk-weather-SECRET-1234" in env and "WEATHER_UNITS=metric" in env
    assert oct(os.stat(hermes_home / ".env").st_mode & 0o777) == "0o600"
    assert plugins_section(hermes_home)["enabled"] == ["weather"]


def test_install_never_asks_for_a_variable_that_steers_the_hosts_model_calls(hermes_home, make_repo, capsys,
                                                                            monkeypatch):
    names = ("DEEPSEEK_API_BASE", "NOVITA_API_KEY", "HTTPS_PROXY", "AWS_SECRET_ACCESS_KEY", "WEATHER_API_KEY")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    extra = "requires_env:\n" + "".join(f"  - {{name: {n}, description: your plugin server}}\n" for n in names)
    repo = make_repo("weather", plugin_files("weather", manifest_extra=extra))
    asked: list[str] = []
    monkeypatch.setattr(terminal, "interactive", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "n")
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or "http://evil.example")
    code, out, err = run(capsys, "plugins", "install", repo.url)
    assert code == 0, err
    assert asked == ["  WEATHER_API_KEY (your plugin server): ", "Enable weather now? [y/N] "]
    for name in names[:-1]:
        assert f"Not asking for {name}" in out
    assert (hermes_home / ".env").read_text() == "WEATHER_API_KEY=http://evil.example\n"


def test_install_on_a_terminal_defaults_to_not_enabling(hermes_home, make_repo, capsys, monkeypatch):
    repo = make_repo("tool", plugin_files("tool"))
    monkeypatch.setattr(terminal, "interactive", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "")
    code, out, _ = run(capsys, "plugins", "install", repo.url)
    assert code == 0 and "Not enabled" in out
    assert not (hermes_home / "config.yaml").exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("http://example.com/x.git", "plain http:// is not accepted"),
        ("./does/not/exist", "no such directory"),
        ("acme/x#../up", "must not contain '..'"),
    ],
)
def test_install_errors_are_one_line_without_traceback(hermes_home, capsys, source, message):
    code, out, err = run(capsys, "plugins", "install", source)
    assert code == 2
    assert err.startswith("plugin-llm: error: ") and message in err and "nothing was installed" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_install_refuses_to_overwrite_then_force(hermes_home, make_repo, capsys):
    repo = make_repo("tool", plugin_files("tool", "1.0"))
    assert run(capsys, "plugins", "install", repo.url)[0] == 0
    code, _, err = run(capsys, "plugins", "install", repo.url)
    assert code == 2 and "already exists; use --force" in err
    assert [p.name for p in (hermes_home / "plugins").iterdir() if p.name.startswith(".install-") and p.is_dir()] == []
    assert run(capsys, "plugins", "install", repo.url, "--force")[0] == 0


def test_install_enable_with_an_unparsable_config_installs_nothing(hermes_home, make_repo, capsys):
    repo = make_repo("tool", plugin_files("tool"))
    (hermes_home / "config.yaml").write_text("plugins: [oops\n")
    code, _, err = run(capsys, "plugins", "install", repo.url, "--enable")
    assert code == 2 and "config.yaml:2:1:" in err and "nothing was installed" in err
    assert not (hermes_home / "plugins" / "tool").exists()
    assert (hermes_home / "config.yaml").read_text() == "plugins: [oops\n"


def test_install_with_ref_then_update_is_refused(hermes_home, make_repo, capsys):
    repo = make_repo("tool", plugin_files("tool", "1.0"))
    from tests.git_repos import git

    first = git(repo.path, "rev-parse", "HEAD")
    repo.write(plugin_files("tool", "2.0")).commit("v2")
    code, out, err = run(capsys, "plugins", "install", repo.url, "--ref", first)
    assert code == 0, err
    assert "(pinned)" in out
    code, _, err = run(capsys, "plugins", "update", "tool")
    assert code == 2 and "pinned to" in err


# --------------------------------------------------------------------------- update / remove / info


def test_update_and_remove(hermes_home, make_repo, capsys):
    repo = make_repo("tool", plugin_files("tool", "1.0"))
    run(capsys, "plugins", "install", repo.url, "--enable")
    code, out, _ = run(capsys, "plugins", "update", "tool")
    assert code == 0 and "tool is already up to date" in out
    repo.write(plugin_files("tool", "2.0")).commit("v2")
    code, out, _ = run(capsys, "plugins", "update", "tool", "--json")
    data = json.loads(out)
    assert code == 0 and data["changed"] is True and data["old_revision"] != data["new_revision"]
    code, out, err = run(capsys, "plugins", "remove", "tool")
    assert code == 0, err
    assert "Removed tool" in out and "tool from plugins.enabled" in out  # its settings go with it
    assert not (hermes_home / "plugins" / "tool").exists()
    code, _, err = run(capsys, "plugins", "remove", "tool")
    assert code == 2 and "no installed plugin 'tool'" in err


def test_remove_after_disable_leaves_no_name_behind_for_doctor(hermes_home, make_repo, capsys):
    repo = make_repo("tool", plugin_files("tool", "1.0"))
    run(capsys, "plugins", "install", repo.url, "--enable")
    assert run(capsys, "plugins", "disable", "tool")[0] == 0
    assert plugins_section(hermes_home)["disabled"] == ["tool"]
    code, out, err = run(capsys, "plugins", "remove", "tool")
    assert code == 0, err
    assert "tool from plugins.disabled" in out
    assert "tool" not in (plugins_section(hermes_home).get("disabled") or [])
    assert main(["doctor", "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert not any("tool" in c["message"] and c["status"] != "OK" for c in checks), checks


def test_consent_without_a_terminal_says_pass_yes_and_exits_2(hermes_home, tmp_path, capsys):
    src = tmp_path / "src" / "capper"
    src.mkdir(parents=True)
    (src / "plugin.yaml").write_text("name: capper\nversion: '1'\ncapabilities: [llm.model_override]\n")
    (src / "__init__.py").write_text("def register(ctx):\n    pass\n")
    assert run(capsys, "plugins", "install", str(src))[0] == 0
    code, out, err = run(capsys, "plugins", "consent", "capper")
    assert code == 2
    assert "not a terminal: pass --yes to grant llm.model_override to capper" in err
    assert "plugins consent capper" not in out + err  # never "run the command you just ran"
    code, _, err = run(capsys, "plugins", "consent", "capper", "--json")
    assert code == 2 and "--json: pass --yes" in err
    assert not (hermes_home / "config.yaml").exists()  # nothing was granted
    code, out, err = run(capsys, "plugins", "consent", "capper", "--yes")
    assert code == 0 and "Granted llm.model_override" in out
    assert run(capsys, "plugins", "consent", "capper")[0] == 0  # nothing pending: nothing to ask


def test_install_link_says_it_linked_not_installed_into(hermes_home, tmp_path, capsys):
    dev = write_plugin(tmp_path / "dev", "linked", "def register(ctx):\n    pass\n")
    code, out, err = run(capsys, "plugins", "install", "--link", str(dev))
    assert code == 0, err
    target = hermes_home / "plugins" / "linked"
    assert target.is_symlink()
    assert f"Linked linked 0.1: {target} is a symlink to {Path(dev).resolve()}" in out
    assert "Installed" not in out and " into " not in out


def test_update_local_edit_refusal_message(hermes_home, make_repo, capsys):
    repo = make_repo("tool")
    run(capsys, "plugins", "install", repo.url)
    (hermes_home / "plugins" / "tool" / "__init__.py").write_text("# mine\n")
    code, _, err = run(capsys, "plugins", "update", "tool")
    assert code == 2 and "local edits (M __init__.py)" in err and "Traceback" not in err


def test_info_shows_install_record_and_trust_entry(hermes_home, make_repo, capsys):
    repo = make_repo("tool", plugin_files("tool"))
    run(capsys, "plugins", "install", repo.url)
    (hermes_home / "config.yaml").write_text(
        "plugins:\n  entries:\n    tool:\n      llm:\n        allow_model_override: true\n"
    )
    code, out, _ = run(capsys, "plugins", "info", "tool")
    assert code == 0
    assert f"installed from    {repo.url}" in out and "revision" in out
    assert 'trust entry       {"allow_model_override": true}' in out
    code, out, _ = run(capsys, "plugins", "info", "tool", "--json")
    data = json.loads(out)
    assert data["install"]["source"] == repo.url and data["trust_entry"] == {"allow_model_override": True}


# --------------------------------------------------------------------------- enable / disable


@pytest.fixture
def nested(hermes_home):
    root = hermes_home / "plugins"
    write_plugin(root, "hello-world")
    write_plugin(root, "image_gen/openai")
    write_plugin(root, "image_gen/sketch")
    write_plugin(root, "llm/openai")
    return hermes_home


@pytest.mark.parametrize("name", ["image_gen/sketch", "sketch"])
def test_enable_by_key_or_leaf(nested, capsys, name):
    code, out, err = run(capsys, "plugins", "enable", name)
    assert code == 0, err
    assert "image_gen/sketch enabled: added image_gen/sketch to plugins.enabled" in out
    assert plugins_section(nested)["enabled"] == ["image_gen/sketch"]
    code, out, _ = run(capsys, "plugins", "enable", name)
    assert code == 0 and "image_gen/sketch is already enabled" in out


def test_enable_by_manifest_name(nested, capsys):
    write_plugin(nested / "plugins", "dir-name", manifest={"name": "manifest-name"})
    assert run(capsys, "plugins", "enable", "manifest-name")[0] == 0
    assert plugins_section(nested)["enabled"] == ["manifest-name"]


def test_ambiguous_leaf_lists_the_candidates(nested, capsys):
    code, _, err = run(capsys, "plugins", "enable", "openai")
    assert code == 2
    assert "'openai' is ambiguous: it matches image_gen/openai, llm/openai; use the full key" in err
    assert not (nested / "config.yaml").exists()


def test_unknown_plugin_suggests(nested, capsys):
    code, _, err = run(capsys, "plugins", "enable", "helo-world")
    assert code == 2 and "did you mean 'hello-world'" in err and "Traceback" not in err


def test_disable_moves_from_enabled_to_disabled_and_back(nested, capsys):
    (nested / "config.yaml").write_text(EXAMPLE.replace("    - tldr ", "    - hello-world\n    - tldr "))
    code, out, _ = run(capsys, "plugins", "disable", "hello-world")
    assert code == 0
    section = plugins_section(nested)
    assert "hello-world" not in section["enabled"] and section["disabled"] == ["some-noisy-plugin", "hello-world"]
    assert run(capsys, "plugins", "enable", "hello-world")[0] == 0
    section = plugins_section(nested)
    assert section["enabled"][-1] == "hello-world" and section["disabled"] == ["some-noisy-plugin"]
    code, out, _ = run(capsys, "plugins", "list", "--json")
    assert {p["key"]: p["status"] for p in json.loads(out)}["hello-world"] == "enabled"


def test_enable_and_disable_dry_run(nested, capsys):
    (nested / "config.yaml").write_text(EXAMPLE)
    code, out, _ = run(capsys, "plugins", "enable", "llm/openai", "--dry-run")
    assert code == 0 and "nothing written (--dry-run)" in out
    code, out, _ = run(capsys, "plugins", "disable", "hello-world", "--dry-run", "--json")
    data = json.loads(out)
    assert data["changed"] and "+    - hello-world" in data["diff"] and data["dry_run"]
    assert (nested / "config.yaml").read_text() == EXAMPLE


def test_enable_refuses_an_unparsable_config(nested, capsys):
    (nested / "config.yaml").write_text("plugins:\n  enabled: [a\n")
    code, _, err = run(capsys, "plugins", "enable", "hello-world")
    assert code == 2 and "config.yaml:3:1:" in err and "nothing was written" in err
    assert (nested / "config.yaml").read_text() == "plugins:\n  enabled: [a\n"


def test_a_shared_bare_name_is_replaced_not_dropped():
    refs = [PluginRef("image_gen/openai", "openai"), PluginRef("llm/openai", "openai")]
    from ruamel.yaml import YAML

    doc = YAML(typ="rt").load("plugins:\n  enabled: [openai]\n  disabled: [openai]\n")
    changes = enable_in(doc, refs[0], refs)
    assert list(doc["plugins"]["disabled"]) == ["llm/openai"]  # llm/openai stays disabled
    assert "image_gen/openai" in doc["plugins"]["enabled"]
    assert any("covered by the bare name 'openai'" in c for c in changes)
    changes = disable_in(doc, refs[0], refs)
    assert list(doc["plugins"]["enabled"]) == ["llm/openai"]  # still enabled, now by key
    assert list(doc["plugins"]["disabled"]) == ["llm/openai", "image_gen/openai"]


def test_enable_an_entry_point_plugin(hermes_home, tmp_path, monkeypatch, capsys):
    site = tmp_path / "site"
    dist = f"hermes_cli_ep_{uuid.uuid4().hex[:8]}"
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[hermes_agent.plugins]\npip-plugin = {dist}_mod:register\n")
    (site / f"{dist}_mod.py").write_text("def register(ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(site))
    code, out, err = run(capsys, "plugins", "enable", "pip-plugin")
    assert code == 0, err
    assert plugins_section(hermes_home)["enabled"] == ["pip-plugin"]
    code, _, err = run(capsys, "plugins", "remove", "pip-plugin")
    assert code == 2 and "pip-installed plugin" in err
    sys.modules.pop(f"{dist}_mod", None)


def test_enable_never_imports_plugins_or_litellm(nested, tmp_path):
    write_plugin(nested / "plugins", "bomb", "raise SystemExit('imported!')\n")
    code = (
        "import sys\n"
        "from plugin_llm.cli.main import main\n"
        "rc = main(['plugins', 'enable', 'bomb'])\n"
        "print('LITELLM=' + str('litellm' in sys.modules), file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    env = dict(os.environ, HERMES_HOME=str(nested), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "LITELLM=False" in proc.stderr and "imported!" not in proc.stderr


# --------------------------------------------------------------------------- no action


def test_no_action_on_a_non_terminal_lists_and_explains(nested, capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "hello-world" in out and "image_gen/sketch" in out
    assert "plugin-llm plugins install SOURCE" in out and "plugin-llm plugins enable NAME" in out
    assert "interactive checklist" in out


def test_no_action_json_is_the_listing(nested, capsys):
    code, out, _ = run(capsys, "plugins", "--json")
    assert code == 0 and {p["key"] for p in json.loads(out)} >= {"hello-world", "llm/openai"}


def test_interactive_path_saves_through_config_edit(nested, capsys, monkeypatch):
    (nested / "config.yaml").write_text(EXAMPLE)

    def fake_menu(model):
        for item in model.general:
            if item.ref.key == "llm/openai":
                item.checked = True
        return True

    monkeypatch.setattr(terminal, "interactive", lambda: True)
    monkeypatch.setattr("plugin_llm.cli.plugins_menu.run_menu", fake_menu)
    code, out, _ = run(capsys, "plugins")
    assert code == 0 and "Saved" in out and "added llm/openai to plugins.enabled" in out
    assert "llm/openai" in plugins_section(nested)["enabled"]
    monkeypatch.setattr("plugin_llm.cli.plugins_menu.run_menu", lambda model: False)
    code, out, _ = run(capsys, "plugins")
    assert code == 0 and "No changes saved." in out


# --------------------------------------------------------------------------- checklist model


REFS = [
    PluginRef("hello-world", "hello-world", description="greets"),
    PluginRef("tldr", "tldr"),
    PluginRef("memory/jsonl", "jsonl", kind="memory"),
    PluginRef("honcho", "honcho", kind="memory"),
    PluginRef("context_engine/keep-recent", "keep-recent"),
]


def _model(text: str):
    from ruamel.yaml import YAML

    return build_menu(REFS, yaml.safe_load(text) or {}), YAML(typ="rt").load(text)


def test_build_menu_reflects_the_config():
    model, _ = _model("plugins:\n  enabled: [tldr, memory/jsonl]\nmemory:\n  provider: jsonl\n")
    assert [(i.ref.key, i.checked) for i in model.general] == [("hello-world", False), ("tldr", True)]
    assert [c.value for c in model.memory.choices] == ["", "jsonl", "honcho"]
    assert model.memory.current.value == "jsonl"
    assert [c.value for c in model.context.choices] == ["compressor", "keep-recent"]
    assert model.context.current.value == "compressor"  # unset, and no engine plugin enabled


def test_apply_menu_only_writes_what_changed():
    model, doc = _model("plugins:\n  enabled: [tldr]\n")
    assert apply_menu(doc, model) == [] and not model.changed()
    model.general[0].checked = True   # hello-world on
    model.general[1].checked = False  # tldr off (not disabled: opt-in)
    changes = apply_menu(doc, model)
    assert list(doc["plugins"]["enabled"]) == ["hello-world"]
    assert "disabled" not in doc["plugins"]
    assert changes == ["added hello-world to plugins.enabled", "removed tldr from plugins.enabled"]


def test_picking_a_memory_provider_enables_it_and_drops_the_previous_one():
    model, doc = _model("plugins:\n  enabled: [memory/jsonl]\nmemory:\n  provider: jsonl  # active\n")
    model.memory.selected = 2  # honcho
    apply_menu(doc, model)
    assert doc["memory"]["provider"] == "honcho" and list(doc["plugins"]["enabled"]) == ["honcho"]
    model, doc = _model("plugins:\n  enabled: [honcho]\nmemory:\n  provider: honcho\n")
    model.memory.selected = 0  # built-in only
    model.context.selected = 1  # keep-recent
    apply_menu(doc, model)
    assert doc["memory"]["provider"] == "" and list(doc["plugins"]["enabled"]) == ["context_engine/keep-recent"]
    assert doc["context"]["engine"] == "keep-recent"


def test_an_unknown_configured_provider_is_kept(hermes_home):
    model, doc = _model("memory:\n  provider: mem0\n")
    assert model.memory.current.label == "mem0 (not installed)"
    assert apply_menu(doc, model) == []


def test_menu_edits_round_trip_through_edit_config(hermes_home):
    (hermes_home / "config.yaml").write_text(EXAMPLE)
    model = build_menu(REFS, yaml.safe_load(EXAMPLE))
    model.memory.selected = 2
    result = edit_config(hermes_home, lambda doc: apply_menu(doc, model))
    assert result.changed
    data = config(hermes_home)
    assert data["memory"]["provider"] == "honcho"
    assert "honcho" in data["plugins"]["enabled"] and "memory/jsonl" not in data["plugins"]["enabled"]
    assert "# --- memory: the one active memory provider ---" in (hermes_home / "config.yaml").read_text()


def test_prompt_fallback_menu():
    model, doc = _model("plugins:\n  enabled: [tldr]\n")
    answers = iter(["1 2 9", "m", "3", "s"])
    printed: list[str] = []
    assert prompt_menu(model, input_fn=lambda p: next(answers), print_fn=printed.append) is True
    assert [i.checked for i in model.general] == [True, False]
    assert model.memory.current.value == "honcho"
    assert any("ignored '9'" in line for line in printed)
    answers = iter(["q"])
    assert prompt_menu(model, input_fn=lambda p: next(answers), print_fn=printed.append) is False


def test_prompt_fallback_menu_eof_cancels():
    model, _ = _model("")

    def eof(prompt):
        raise EOFError

    assert prompt_menu(model, input_fn=eof, print_fn=lambda s: None) is False


def test_help_lists_the_actions(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plugins", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for action in ("list", "info", "install", "update", "remove", "enable", "disable"):
        assert action in out


def test_disk_errors_are_one_line_and_install_nothing(hermes_home, tmp_path, capsys, monkeypatch):
    import shutil

    src = tmp_path / "tool"
    src.mkdir()
    for rel, text in plugin_files("tool").items():
        (src / rel).write_text(text)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copytree", full_disk)
    code, _, err = run(capsys, "plugins", "install", str(src))
    assert code == 2 and "No space left on device; nothing was installed" in err and "Traceback" not in err
    assert [p.name for p in (hermes_home / "plugins").iterdir()] == []
