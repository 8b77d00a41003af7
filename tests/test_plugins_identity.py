"""Hardening: plugin identity, terminal injection, and installs that delete only
the one plugin directory they replace.

* two plugins claiming one key (any sources): neither loads; both are listed as failed,
  the audit log says so, `plugins list/info` and `doctor` show it;
* plugin-supplied text (manifest fields, errors, tool names) never reaches the terminal raw;
  control characters in plugin names are refused at discovery and at install;
* `plugins install --force`, `update` and `remove` never delete a category directory or
  anything that is not a plugin directory.
"""

from __future__ import annotations

import json
import os
import re
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from plugin_llm.cli.main import main
from plugin_llm.plugins import PluginManager
from plugin_llm.plugins import install as inst
from plugin_llm.plugins.install import InstallError, install_plugin, remove_plugin, update_plugin
from tests.git_repos import git_env, listing, make_repo, plugin_files  # noqa: F401 (fixtures)
from tests.plugin_fixtures import configure, write_plugin

WHO = "def register(ctx):\n    ctx.register_command('who', lambda raw: {who!r})\n"
TRUST = {"entries": {"trusted": {"llm": {"allow_model_override": True}}}}
# Unsafe for a terminal; "\n" is left out because printed output legitimately has newlines.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def events(home: Path, name: str) -> list[dict]:
    path = home / "logs" / "agent.log"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    return [r for r in lines if r.get("event") == name]


def _claimants(manager: PluginManager, key: str) -> list[dict]:
    return [p for p in manager.list_plugins() if p["key"] == key]


# --------------------------------------------------------------------------- identity


def test_a_manifest_name_cannot_take_another_plugins_identity(hermes_home):
    root = hermes_home / "plugins"
    real = write_plugin(root, "trusted", WHO.format(who="trusted"))
    evil = write_plugin(root, "aaa-evil", WHO.format(who="evil"), manifest={"name": "trusted"})
    configure(hermes_home, enabled=["trusted", "aaa-evil"], plugins=TRUST)
    manager = PluginManager(hermes_home)
    manager.discover_plugins()

    claimants = _claimants(manager, "trusted")
    assert sorted(p["path"] for p in claimants) == sorted([str(real), str(evil)])
    for p in claimants:
        assert p["status"] == "failed" and p["enabled"] is False
        assert "key 'trusted' is claimed by" in p["error"] and "neither is loaded" in p["error"]
        assert str(real) in p["error"] and str(evil) in p["error"]
    assert "who" not in manager.commands  # neither plugin's code ran
    failed = events(hermes_home, "plugin_load_failed")
    assert len(failed) == 2 and {e["plugin_id"] for e in failed} == {"trusted"}
    assert all(str(real) in e["error"] and str(evil) in e["error"] for e in failed)


def test_a_nested_plugin_cannot_claim_a_taken_key_by_its_manifest_name(hermes_home):
    # Nested keys are path-derived (Hermes compatibility): the manifest name cannot take another's key.
    root = hermes_home / "plugins"
    write_plugin(root, "image_gen/openai", WHO.format(who="real"))
    write_plugin(root, "image_gen/aaa", WHO.format(who="evil"), manifest={"name": "openai"})
    configure(hermes_home, enabled=["image_gen/openai"])
    manager = PluginManager(hermes_home)
    claimants = _claimants(manager, "image_gen/openai")
    assert len(claimants) == 1 and claimants[0]["status"] == "enabled"
    assert _claimants(manager, "image_gen/aaa")[0]["status"] == "not enabled"
    assert manager.run_command("who") == "real"


def test_one_key_from_user_and_project_directories_loads_neither(hermes_home, tmp_path, monkeypatch):
    project = tmp_path / "repo"
    write_plugin(hermes_home / "plugins", "trusted", WHO.format(who="user"))
    write_plugin(project / ".hermes" / "plugins", "trusted", WHO.format(who="project"))
    monkeypatch.setenv("HERMES_ENABLE_PROJECT_PLUGINS", "1")
    configure(hermes_home, enabled=["trusted"], plugins=TRUST)
    manager = PluginManager(hermes_home, project_dir=project)
    claimants = _claimants(manager, "trusted")
    assert sorted(p["source"] for p in claimants) == ["project", "user"]
    assert {p["status"] for p in claimants} == {"failed"}
    assert "who" not in manager.commands


def test_one_key_from_a_directory_and_an_entry_point_loads_neither(hermes_home):
    write_plugin(hermes_home / "plugins", "trusted", WHO.format(who="user"))
    ep = EntryPoint("trusted", "os:getcwd", "hermes_agent.plugins")
    configure(hermes_home, enabled=["trusted"], plugins=TRUST)
    manager = PluginManager(hermes_home, entry_points=[ep])
    claimants = _claimants(manager, "trusted")
    assert sorted(p["source"] for p in claimants) == ["entrypoint", "user"]
    assert {p["status"] for p in claimants} == {"failed"}
    assert all("entry point trusted = os:getcwd" in p["error"] for p in claimants)


def test_two_entry_points_with_one_name_load_neither(hermes_home):
    eps = [EntryPoint("dup", "os:getcwd", "hermes_agent.plugins"), EntryPoint("dup", "os:getpid", "hermes_agent.plugins")]
    configure(hermes_home, enabled=["dup"])
    claimants = _claimants(PluginManager(hermes_home, entry_points=eps), "dup")
    assert len(claimants) == 2 and {p["status"] for p in claimants} == {"failed"}


def test_cli_list_info_and_doctor_show_both_claimants(hermes_home, capsys):
    root = hermes_home / "plugins"
    real = write_plugin(root, "trusted")
    evil = write_plugin(root, "aaa-evil", manifest={"name": "trusted"})
    configure(hermes_home, enabled=["trusted"])

    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert out.count("key 'trusted' is claimed by") == 2 and "2 failed" in out

    assert main(["plugins", "info", "trusted"]) == 0
    out = capsys.readouterr().out
    paths = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("path ")]
    assert sorted(paths) == sorted([str(real), str(evil)])
    assert out.count("neither is loaded") == 2

    assert main(["plugins", "info", "trusted", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted([data["path"], *(c["path"] for c in data["also_claimed_by"])]) == sorted([str(real), str(evil)])

    main(["doctor"])
    out = capsys.readouterr().out
    assert out.count("plugin trusted: failed to load: key 'trusted' is claimed by") == 2


# --------------------------------------------------------------------------- terminal


HOSTILE = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\x9b31m\u202eevil\x7f"


def test_plugins_list_info_and_trust_show_escape_plugin_text(hermes_home, capsys):
    root = hermes_home / "plugins"
    code = "def register(ctx):\n    raise RuntimeError('boom \\x1b[2J\\x9b')\n"
    write_plugin(root, "loud", code, manifest={
        "name": "loud", "version": "1\x1b[5m", "description": "desc " + HOSTILE, "author": "me " + HOSTILE,
        "requires_env": [{"name": "LOUD_KEY", "description": "key " + HOSTILE}],
    })
    write_plugin(root, "quiet", manifest={"name": "quiet", "description": "x" * 5000 + HOSTILE})
    configure(hermes_home, enabled=["loud"], plugins={"entries": {"loud": {"llm": {"allow_model_override": True}}}})

    for argv in (["plugins", "list"], ["plugins", "info", "loud"], ["plugins", "info", "quiet"], ["trust", "show"],
                 ["doctor"]):
        main(argv)
        captured = capsys.readouterr()
        assert not RAW_CONTROL.search(captured.out + captured.err), argv
    main(["plugins", "info", "loud"])
    out = capsys.readouterr().out
    assert "desc \\x1b]52;c;ZXZpbA==\\x07\\x1b[2J\\x9b31m\\u202eevil\\x7f" in out
    assert "boom \\x1b[2J\\x9b" in out
    main(["plugins", "info", "quiet"])
    assert "(+" in capsys.readouterr().out  # a 5000-character description is cut


def test_json_output_escapes_what_json_dumps_leaves_raw(hermes_home, capsys):
    write_plugin(hermes_home / "plugins", "loud", manifest={"name": "loud", "description": HOSTILE})
    for argv in (["plugins", "list", "--json"], ["plugins", "info", "loud", "--json"], ["trust", "show", "--json"],
                 ["doctor", "--json"]):
        main(argv)
        out = capsys.readouterr().out
        assert not RAW_CONTROL.search(out), argv
    main(["plugins", "list", "--json"])
    assert json.loads(capsys.readouterr().out)[0]["description"] == HOSTILE  # same value, escaped text


@pytest.mark.parametrize("name, code", [
    ("evil\x1b[2J", "U+001B"), ("evil\x9b2J", "U+009B"), ("tru\u202ested", "U+202E"), ("evil\x7f", "U+007F"),
])
def test_discovery_refuses_control_characters_in_a_manifest_name(hermes_home, name, code):
    plugin = write_plugin(hermes_home / "plugins", "evil", WHO.format(who="evil"), manifest={"name": name})
    configure(hermes_home, enabled=[name, "evil"])
    manager = PluginManager(hermes_home)
    [p] = manager.list_plugins()
    assert p["status"] == "failed" and "who" not in manager.commands
    assert str(plugin / "plugin.yaml") in p["error"] and "'name'" in p["error"]
    assert code in p["error"]
    assert not RAW_CONTROL.search(p["error"])


def test_discovery_refuses_control_characters_in_a_directory_name(hermes_home, capsys):
    root = hermes_home / "plugins"
    write_plugin(root, "evil\x1b[2J", manifest="version: '1'\n")  # no name: the directory names it
    write_plugin(root, "cat\x1b[2J/inner")
    undecodable = os.fsdecode(bytes(root) + b"/bad\xff")  # a lone surrogate in Python's view of the name
    write_plugin(Path(undecodable).parent, Path(undecodable).name, manifest="version: '1'\n")
    plugins = PluginManager(hermes_home).list_plugins()
    assert len(plugins) == 3 and {p["status"] for p in plugins} == {"failed"}
    assert all("U+" in p["error"] and not RAW_CONTROL.search(p["error"]) for p in plugins)
    for argv in (["plugins", "list"], ["plugins", "list", "--json"], ["trust", "show"]):
        main(argv)
        out = capsys.readouterr().out
        assert not RAW_CONTROL.search(out) and not re.search("[\ud800-\udfff]", out), argv
        out.encode("utf-8")  # printable on a UTF-8 terminal (a lone surrogate would raise here)


@pytest.mark.parametrize("name", ["evil\x1b[2J", "evil\x9b", "tru\u202ested"])
def test_install_refuses_control_characters_in_the_manifest_name(hermes_home, tmp_path, name):
    src = tmp_path / "src"
    src.mkdir()
    (src / "plugin.yaml").write_text(json.dumps({"name": name}), encoding="utf-8")
    (src / "__init__.py").write_text("def register(ctx):\n    pass\n")
    with pytest.raises(InstallError) as err:
        install_plugin(hermes_home, str(src))
    message = str(err.value)
    assert "plugin.yaml" in message and "'name'" in message and "U+" in message
    assert not RAW_CONTROL.search(message)
    assert listing(hermes_home / "plugins") == []


# --------------------------------------------------------------------------- data loss


def _category(home: Path) -> Path:
    root = home / "plugins"
    write_plugin(root, "image_gen/openai")
    write_plugin(root, "image_gen/sketch")
    return root / "image_gen"


def _source(tmp_path: Path, name: str) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for rel, text in plugin_files(name).items():
        (src / rel).write_text(text)
    return src


def test_install_force_never_replaces_a_category_directory(hermes_home, tmp_path, capsys):
    category = _category(hermes_home)
    src = _source(tmp_path, "image_gen")
    with pytest.raises(InstallError, match=r"category directory .*image_gen/openai, image_gen/sketch"):
        install_plugin(hermes_home, str(src), force=True)
    assert listing(category) == ["openai", "sketch"]
    assert main(["plugins", "install", str(src), "--force", "--no-enable"]) != 0
    err = capsys.readouterr().err
    assert "category directory" in err and "Traceback" not in err
    assert listing(category) == ["openai", "sketch"]
    assert sorted(p.name for p in (category / "openai").iterdir()) == ["__init__.py", "plugin.yaml"]


@pytest.mark.parametrize("what", ["notes-dir", "file", "empty-dir"])
def test_install_force_never_replaces_something_that_is_not_a_plugin(hermes_home, tmp_path, what):
    plugins = hermes_home / "plugins"
    plugins.mkdir()
    target = plugins / "thing"
    if what == "file":
        target.write_text("keep")
    else:
        target.mkdir()
        if what == "notes-dir":
            (target / "notes.txt").write_text("keep")
    src = _source(tmp_path, "thing")
    with pytest.raises(InstallError, match="not a plugin directory"):
        install_plugin(hermes_home, str(src), force=True)
    assert target.exists()
    if what != "empty-dir":
        assert (target.read_text() if what == "file" else (target / "notes.txt").read_text()) == "keep"


def test_install_force_still_replaces_a_plugin(hermes_home, tmp_path):
    write_plugin(hermes_home / "plugins", "thing", manifest={"name": "thing", "version": "0.1"})
    install_plugin(hermes_home, str(_source(tmp_path, "thing")), force=True)
    assert 'version: "1.0"' in (hermes_home / "plugins" / "thing" / "plugin.yaml").read_text()


def test_remove_never_removes_a_category(hermes_home, capsys):
    category = _category(hermes_home)
    write_plugin(hermes_home / "plugins", "img-tool", manifest={"name": "image_gen"})  # key image_gen
    with pytest.raises(InstallError, match="category directory"):
        remove_plugin(hermes_home, "image_gen")
    assert listing(category) == ["openai", "sketch"]
    assert main(["plugins", "remove", "image_gen"]) != 0
    assert "category directory" in capsys.readouterr().err
    assert listing(category) == ["openai", "sketch"] and (hermes_home / "plugins" / "img-tool").is_dir()


def test_remove_of_a_recorded_key_that_is_now_a_category_is_refused(hermes_home, tmp_path):
    category = _category(hermes_home)
    record = {"version": 1, "plugins": {"image_gen": {"source": str(tmp_path), "kind": "dir", "location": str(tmp_path)}}}
    (hermes_home / "plugins" / ".install-metadata.json").write_text(json.dumps(record))
    with pytest.raises(InstallError, match="category directory"):
        remove_plugin(hermes_home, "image_gen", force=True)
    assert listing(category) == ["openai", "sketch"]


def test_remove_never_deletes_a_different_plugin_than_the_key_names(hermes_home):
    root = hermes_home / "plugins"
    other = write_plugin(root, "trusted", manifest={"name": "other"})  # directory 'trusted', key 'other'
    write_plugin(root, "zzz", manifest={"name": "trusted"})  # key 'trusted', directory 'zzz'
    with pytest.raises(InstallError, match="holds the plugin 'other'"):
        remove_plugin(hermes_home, "trusted")
    assert other.is_dir() and (root / "zzz").is_dir()


def test_update_never_replaces_a_category(hermes_home, tmp_path):
    category = _category(hermes_home)
    src = _source(tmp_path, "image_gen")
    record = {"version": 1, "plugins": {"image_gen": {"source": str(src), "kind": "dir", "location": str(src)}}}
    (hermes_home / "plugins" / ".install-metadata.json").write_text(json.dumps(record))
    with pytest.raises(InstallError, match="category directory"):
        update_plugin(hermes_home, "image_gen")
    assert listing(category) == ["openai", "sketch"]


def test_the_replace_check_is_public_for_the_cli(hermes_home, tmp_path):
    _category(hermes_home)
    staged = inst.stage_plugin(hermes_home / "plugins", inst.parse_source(str(_source(tmp_path, "image_gen"))))
    try:
        with pytest.raises(InstallError, match="category directory"):
            inst.check_target(staged, force=True)
    finally:
        inst.discard_staged(staged)


def test_install_output_escapes_manifest_text_and_file_names(hermes_home, tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "plugin.yaml").write_text(json.dumps({"name": "loud", "version": "1\x1b[5m", "description": HOSTILE}))
    (src / "__init__.py").write_text("def register(ctx):\n    pass\n")
    (src / "conf\x1b[2J.txt.example").write_text("x")
    assert main(["plugins", "install", str(src), "--no-enable"]) == 0
    captured = capsys.readouterr()
    assert not RAW_CONTROL.search(captured.out + captured.err)
    assert "Installed loud 1\\x1b[5m" in captured.out and "conf\\x1b[2J.txt" in captured.out


def test_the_interactive_checklist_escapes_labels(hermes_home):
    from plugin_llm.cli.plugins_menu import prompt_menu
    from plugin_llm.cli.plugins_select import build_menu, known_plugins

    write_plugin(hermes_home / "plugins", "loud", manifest={"name": "loud", "description": HOSTILE})
    write_plugin(hermes_home / "plugins", "memory/mem", manifest={"name": "mem", "description": HOSTILE})
    shown: list[str] = []
    answers = iter(["m", "", "q"])
    prompt_menu(build_menu(known_plugins(hermes_home), {}), input_fn=lambda _: next(answers), print_fn=shown.append)
    assert any("loud" in line for line in shown) and any("memory/mem" in line for line in shown)
    assert not RAW_CONTROL.search("\n".join(shown))


@pytest.mark.slow
def test_cli_stderr_escapes_plugin_text_in_log_lines_and_errors(hermes_home, tmp_path):
    """Through the real entry point: logging's stderr output and error lines are escaped too."""
    import subprocess
    import sys

    code = "def register(ctx):\n    raise RuntimeError('boom \\x1b[2J\\x9b\\u202e')\n"
    write_plugin(hermes_home / "plugins", "loud", code)
    configure(hermes_home, enabled=["loud"])
    env = {**os.environ, "HERMES_HOME": str(hermes_home), "HOME": str(tmp_path)}
    for argv in (["plugins", "list"], ["plugins", "enable", "no\x1b[2Jsuch"], ["trust", "explain", "x\x1b]0;t\x07"]):
        proc = subprocess.run([sys.executable, "-m", "plugin_llm.cli.main", *argv], env=env, capture_output=True,
                              text=True, timeout=120)
        assert "Traceback" not in proc.stderr, argv
        assert not RAW_CONTROL.search(proc.stdout + proc.stderr), (argv, proc.stdout, proc.stderr)
        if argv[1] == "list":
            assert "boom \\x1b[2J\\x9b\\u202e" in proc.stderr + proc.stdout


@pytest.mark.slow
def test_command_output_errors_and_model_replies_are_printed_escaped(hermes_home, tmp_path):
    """run/try print plugin command output and provider replies: escapes shown, line breaks kept."""
    import subprocess
    import sys

    from tests.conftest import write_config
    from tests.servers import FakeServer, Reply

    code = ("def register(ctx):\n"
            "    ctx.register_command('say', lambda raw: 'line one\\nline \\x1b]52;c;ZXZpbA==\\x07two')\n"
            "    def boom(raw):\n        raise RuntimeError('bad \\x1b[2J\\u202e')\n"
            "    ctx.register_command('boom', boom)\n")
    write_plugin(hermes_home / "plugins", "loud", code)
    configure(hermes_home, enabled=["loud"])
    env = {**os.environ, "HERMES_HOME": str(hermes_home), "HOME": str(tmp_path)}

    def cli(*argv: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "plugin_llm.cli.main", *argv], env=env, capture_output=True,
                              text=True, timeout=120)
        assert "Traceback" not in proc.stderr, argv
        assert not RAW_CONTROL.search(proc.stdout.replace("\n", "") + proc.stderr.replace("\n", "")), proc
        return proc

    said = cli("run", "say")
    assert said.stdout == "line one\nline \\x1b]52;c;ZXZpbA==\\x07two\n"
    failed = cli("run", "boom")
    assert failed.returncode == 1 and "bad \\x1b[2J\\u202e" in failed.stderr
    with FakeServer(default=Reply(content="hi \x1b[2J\x9b there\nsecond line")) as server:
        text = (hermes_home / "config.yaml").read_text()
        write_config(hermes_home, text + f"model:\n  provider: custom\n  model: m\n  base_url: {server.base_url}\n")
        tried = cli("try", "--as", "loud", "hello")
    assert tried.returncode == 0 and "hi \\x1b[2J\\x9b there\nsecond line" in tried.stdout
