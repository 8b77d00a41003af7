"""plugin_llm.plugins.install: sources, staging, atomic installs, updates, removal, .env."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from plugin_llm.plugins import PluginManager
from plugin_llm.plugins import install as inst
from plugin_llm.plugins.install import InstallError, install_plugin, parse_source, remove_plugin, update_plugin
from tests.git_repos import git, git_env, listing, make_repo, plugin_files  # noqa: F401 (fixtures)
from tests.plugin_fixtures import configure


def plugins_dir(home: Path) -> Path:
    return home / "plugins"


def metadata(home: Path) -> dict:
    return json.loads((plugins_dir(home) / ".install-metadata.json").read_text())["plugins"]


def assert_nothing_installed(home: Path, before: list[str] | None = None) -> None:
    """No plugin directory, no staging directory, no metadata entry were left behind."""
    assert listing(plugins_dir(home)) == (before or [])


# --------------------------------------------------------------------------- sources


def test_owner_repo_expands_to_a_github_https_url(tmp_path):
    src = parse_source("acme/weather-plugin", cwd=tmp_path)
    assert (src.kind, src.location, src.subdir) == ("git", "https://github.com/acme/weather-plugin.git", None)
    src = parse_source("acme/plugins.git#image_gen/openai", cwd=tmp_path)
    assert (src.location, src.subdir) == ("https://github.com/acme/plugins.git", "image_gen/openai")
    assert src.default_name() == "openai"


@pytest.mark.parametrize(
    ("given", "location", "subdir", "protocol"),
    [
        ("https://git.example.com/team/tool.git", "https://git.example.com/team/tool.git", None, "https"),
        ("ssh://git@git.example.com/team/tool.git#plugins/x", "ssh://git@git.example.com/team/tool.git", "plugins/x", "ssh"),
        ("git@github.com:team/tool.git", "git@github.com:team/tool.git", None, "ssh"),
        ("file:///srv/repos/tool#./a/b/", "file:///srv/repos/tool", "a/b", "file"),
    ],
)
def test_git_urls(tmp_path, given, location, subdir, protocol):
    src = parse_source(given, cwd=tmp_path)
    assert (src.kind, src.location, src.subdir, src.protocol) == ("git", location, subdir, protocol)


def test_local_directory_sources(tmp_path):
    (tmp_path / "work" / "my-plugin" / "sub").mkdir(parents=True)
    src = parse_source("work/my-plugin", cwd=tmp_path)
    assert (src.kind, src.location, src.subdir) == ("dir", str(tmp_path / "work" / "my-plugin"), None)
    src = parse_source(str(tmp_path / "work" / "my-plugin") + "#sub", cwd=tmp_path)
    assert (src.kind, src.subdir) == ("dir", "sub")
    odd = tmp_path / "dir#with-hash"
    odd.mkdir()
    assert parse_source(str(odd)).location == str(odd)  # an existing directory wins over '#'


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("", "empty SOURCE"),
        ("--upload-pack=touch /tmp/pwned", "starts with '-'"),
        ("http://example.com/x.git", "plain http://"),
        ("ext::sh -c touch% /tmp/pwned", "whitespace"),
        ("ext::sh", "unsupported URL scheme"),
        ("ftp://example.com/x", "unsupported URL scheme"),
        ("./no/such/dir", "no such directory"),
        ("just-a-word", "cannot tell what"),
        ("acme/repo#../escape", "must not contain '..'"),
        ("acme/repo#/etc", "relative to the repository root"),
        ("acme/repo#a\\b", "no backslashes"),
        ("acme/repo#", "empty #subdir"),
        ("acme/repo#.", "names the repository root"),
    ],
)
def test_rejected_sources(tmp_path, given, message):
    with pytest.raises(InstallError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse_source(given, cwd=tmp_path)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("..", "'..'"),
        ("a..b", "'..'"),
        ("a/b", "'/'"),
        ("a\\b", "'/'"),
        ("/etc", "'/'"),
        ("C:evil", "absolute"),
        (".hidden", "start with '.'"),
        ("_private", "start with '.'"),
        ("two words", "whitespace"),
        ("tab\tname", "whitespace"),
        ("x" * 101, "longer than 100"),
        ("", "empty"),
    ],
)
def test_rejected_names(name, message):
    with pytest.raises(InstallError, match=message):
        inst.validate_install_name(name)


def test_accepted_names():
    for name in ("hello-world", "tool_guard", "v2.plugin", "Ünïcode"):
        assert inst.validate_install_name(name) == name


# --------------------------------------------------------------------------- git installs


def test_install_from_a_local_git_repository(hermes_home, make_repo):
    repo = make_repo("weather", plugin_files("weather", "1.0"))
    head = git(repo.path, "rev-parse", "HEAD")
    entry = install_plugin(hermes_home, repo.url)
    target = plugins_dir(hermes_home) / "weather"
    assert entry.key == "weather" and entry.revision == head and entry.ref is None and entry.subdir is None
    assert (target / "plugin.yaml").is_file() and (target / ".git").is_dir()
    assert git(target, "rev-parse", "--is-shallow-repository") == "true"
    record = metadata(hermes_home)["weather"]
    assert record["source"] == repo.url and record["revision"] == head and record["kind"] == "git"
    assert record["installed_at"].endswith("+00:00") and record["subdir"] is None
    assert listing(plugins_dir(hermes_home)) == [".install-metadata.json", "weather"]
    configure(hermes_home, enabled=["weather"])
    manager = PluginManager(hermes_home)
    assert manager.get_plugin("weather")["status"] == "enabled"
    assert manager.run_command("weather-version") == "1.0"


def test_install_a_subdirectory_of_a_repository(hermes_home, make_repo):
    files = {**plugin_files("openai", "2.0", prefix="image_gen/openai/"), **plugin_files("other", prefix="misc/other/")}
    repo = make_repo("collection", files)
    entry = install_plugin(hermes_home, f"{repo.url}#image_gen/openai")
    link = plugins_dir(hermes_home) / "openai"
    assert entry.subdir == "image_gen/openai" and entry.repo == ".repos/openai"
    assert link.is_symlink() and os.readlink(link) == os.path.join(".repos", "openai", "image_gen", "openai")
    assert (plugins_dir(hermes_home) / ".repos" / "openai" / ".git").is_dir()
    configure(hermes_home, enabled=["openai"])
    manager = PluginManager(hermes_home)
    assert [p["key"] for p in manager.list_plugins()] == ["openai"]  # .repos is hidden from discovery
    assert manager.run_command("openai-version") == "2.0"


def test_install_into_a_category(hermes_home, make_repo):
    repo = make_repo("jsonl", plugin_files("jsonl", manifest_extra="kind: memory\n"))
    entry = install_plugin(hermes_home, repo.url, category="memory")
    assert entry.key == "memory/jsonl"
    assert [p["key"] for p in PluginManager(hermes_home).list_plugins()] == ["memory/jsonl"]
    remove_plugin(hermes_home, "jsonl")
    assert listing(plugins_dir(hermes_home)) == [".install-metadata.json"]  # empty category pruned


def test_install_pinned_to_a_commit(hermes_home, make_repo):
    repo = make_repo("pinned", plugin_files("pinned", "1.0"))
    first = git(repo.path, "rev-parse", "HEAD")
    repo.write(plugin_files("pinned", "2.0")).commit("v2")
    entry = install_plugin(hermes_home, repo.url, ref=first)
    target = plugins_dir(hermes_home) / "pinned"
    assert entry.ref == first and entry.revision == first
    assert 'version: "1.0"' in (target / "plugin.yaml").read_text()
    with pytest.raises(InstallError, match=r"pinned to .* \(installed with --ref\).*--ref NEW --force"):
        update_plugin(hermes_home, "pinned")


def test_install_pinned_to_an_abbreviated_sha_and_a_subdir(hermes_home, make_repo):
    repo = make_repo("multi", plugin_files("inner", "1.0", prefix="plugins/inner/"))
    first = git(repo.path, "rev-parse", "HEAD")
    repo.write(plugin_files("inner", "2.0", prefix="plugins/inner/")).commit("v2")
    entry = install_plugin(hermes_home, f"{repo.url}#plugins/inner", ref=first[:10])
    assert entry.revision == first
    assert 'version: "1.0"' in (plugins_dir(hermes_home) / "inner" / "plugin.yaml").read_text()


def test_unknown_ref_fails_and_leaves_nothing(hermes_home, make_repo):
    repo = make_repo("r")
    with pytest.raises(InstallError, match="cannot check out --ref"):
        install_plugin(hermes_home, repo.url, ref="0" * 40)
    with pytest.raises(InstallError, match="not a commit SHA or ref name"):
        install_plugin(hermes_home, repo.url, ref="--upload-pack=x")
    assert_nothing_installed(hermes_home)


def test_unreachable_git_source_fails_cleanly(hermes_home, tmp_path, git_env):
    with pytest.raises(InstallError, match="git clone failed"):
        install_plugin(hermes_home, (tmp_path / "missing-repo").as_uri())
    assert_nothing_installed(hermes_home)


def test_git_runs_without_shell_prompts_or_option_injection(hermes_home, tmp_path, monkeypatch):
    """A fake git records how it is called: argument list, '--' before the URL, no prompts."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "git-calls.jsonl"
    fake = bindir / "git"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'prompt': os.environ.get('GIT_TERMINAL_PROMPT'),\n"
        "        'allow': os.environ.get('GIT_ALLOW_PROTOCOL'), 'ssh': os.environ.get('GIT_SSH_COMMAND'),\n"
        "        'stdin_tty': os.isatty(0)}) + '\\n')\n"
        "sys.stderr.write('fatal: could not read Username: terminal prompts disabled\\n')\n"
        "sys.exit(128)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("GIT_SSH_COMMAND", raising=False)
    with pytest.raises(InstallError, match="terminal prompts disabled"):
        install_plugin(hermes_home, "acme/private-plugin")
    call = json.loads(log.read_text().splitlines()[0])
    argv = call["argv"]
    assert "clone" in argv and "--depth" in argv
    assert argv[argv.index("--") + 1] == "https://github.com/acme/private-plugin.git"
    assert call["prompt"] == "0" and call["allow"] == "https" and not call["stdin_tty"]
    assert call["ssh"] == "ssh -o BatchMode=yes"
    assert_nothing_installed(hermes_home)


@pytest.mark.slow
def test_git_timeout_kills_git_and_leaves_nothing(hermes_home, tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "git").write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    (bindir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(InstallError, match=r"git clone timed out after 0.3 s"):
        install_plugin(hermes_home, "acme/slow", timeout=0.3)
    assert_nothing_installed(hermes_home)


# --------------------------------------------------------------------------- directory installs


def test_install_from_a_directory(hermes_home, tmp_path):
    src = tmp_path / "work" / "local-tool"
    src.mkdir(parents=True)
    for rel, text in plugin_files("local-tool").items():
        (src / rel).write_text(text)
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (src / ".git").mkdir()
    (src / "data").mkdir()
    (src / "data" / "words.txt").write_text("hello\n")
    entry = install_plugin(hermes_home, str(src))
    target = plugins_dir(hermes_home) / "local-tool"
    assert entry.kind == "dir" and entry.revision is None and entry.tree_sha256
    assert (target / "data" / "words.txt").read_text() == "hello\n"
    assert not (target / "__pycache__").exists() and not (target / ".git").exists()
    assert not target.is_symlink()


def test_name_comes_from_the_manifest_else_the_directory(hermes_home, tmp_path):
    src = tmp_path / "checkout-dir"
    src.mkdir()
    (src / "plugin.yaml").write_text("name: real-name\n")
    (src / "__init__.py").write_text("def register(ctx):\n    pass\n")
    assert install_plugin(hermes_home, str(src)).key == "real-name"
    unnamed = tmp_path / "unnamed-tool"
    unnamed.mkdir()
    (unnamed / "plugin.yaml").write_text("version: '1'\n")
    (unnamed / "__init__.py").write_text("def register(ctx):\n    pass\n")
    assert install_plugin(hermes_home, str(unnamed)).key == "unnamed-tool"
    keys = {p["key"] for p in PluginManager(hermes_home).list_plugins()}
    assert keys == {"real-name", "unnamed-tool"}  # directory name == key, as discovery sees it


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("name: ..\n", "invalid manifest"),
        ("name: ../../outside\n", "invalid manifest"),
        ("name: /etc/passwd\n", "invalid manifest"),
        ("name: 'a\\\\b'\n", "invalid manifest"),
        ("name: .hidden\n", "must not start with '.'"),
        ("name: _private\n", "must not start with '.'"),
        ("name: [not, a, string]\n", "invalid manifest"),
        ("name: ok\nrequires_env: 5\n", "invalid manifest"),
        ("- a list\n", "invalid manifest"),
        ("name: [unclosed\n", "invalid manifest"),
    ],
)
def test_bad_manifests_and_names_are_rejected_and_leave_nothing(hermes_home, tmp_path, manifest, message):
    src = tmp_path / "candidate"
    src.mkdir()
    (src / "plugin.yaml").write_text(manifest)
    (src / "__init__.py").write_text("def register(ctx):\n    pass\n")
    with pytest.raises(InstallError, match=message):
        install_plugin(hermes_home, str(src))
    assert_nothing_installed(hermes_home)
    assert not (tmp_path / "outside").exists()


def test_not_a_plugin(hermes_home, tmp_path, make_repo):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InstallError, match="no plugin.yaml"):
        install_plugin(hermes_home, str(empty))
    no_init = tmp_path / "no-init"
    no_init.mkdir()
    (no_init / "plugin.yaml").write_text("name: no-init\n")
    with pytest.raises(InstallError, match="no __init__.py"):
        install_plugin(hermes_home, str(no_init))
    repo = make_repo("collection", {**plugin_files("a", prefix="a/"), **plugin_files("b", prefix="group/b/")})
    with pytest.raises(InstallError, match=r"contains plugins at: a, group/b \(install one with SOURCE#<path>\)"):
        install_plugin(hermes_home, repo.url)
    assert_nothing_installed(hermes_home)


def test_symlinks_escaping_the_plugin_are_rejected(hermes_home, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy")
    for link, target, message in [
        ("leak", "../../secret.txt", "points outside the plugin directory"),
        ("abs", str(secret), "is absolute"),
        ("sub/deeper", "../../secret.txt", "points outside the plugin directory"),
    ]:
        src = tmp_path / f"linky-{link.replace('/', '-')}"
        src.mkdir()
        for rel, text in plugin_files("linky").items():
            (src / rel).write_text(text)
        (src / link).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, src / link)
        with pytest.raises(InstallError, match=message):
            install_plugin(hermes_home, str(src))
        assert_nothing_installed(hermes_home)


def test_symlinks_inside_the_plugin_are_kept(hermes_home, tmp_path):
    src = tmp_path / "linky"
    src.mkdir()
    for rel, text in plugin_files("linky").items():
        (src / rel).write_text(text)
    (src / "data").mkdir()
    (src / "data" / "real.txt").write_text("x")
    os.symlink("data/real.txt", src / "alias.txt")
    install_plugin(hermes_home, str(src))
    alias = plugins_dir(hermes_home) / "linky" / "alias.txt"
    assert alias.is_symlink() and alias.read_text() == "x"


def test_a_subdir_symlink_escaping_the_source_is_rejected(hermes_home, tmp_path):
    outside = tmp_path / "outside-plugin"
    outside.mkdir()
    for rel, text in plugin_files("outside-plugin").items():
        (outside / rel).write_text(text)
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(outside, src / "sub")
    with pytest.raises(InstallError, match="resolves outside"):
        install_plugin(hermes_home, f"{src}#sub")
    assert_nothing_installed(hermes_home)


def test_a_target_that_resolves_outside_the_plugins_directory_is_refused(hermes_home, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    plugins_dir(hermes_home).mkdir()
    os.symlink(elsewhere, plugins_dir(hermes_home) / "evil")
    src = tmp_path / "evil"
    src.mkdir()
    for rel, text in plugin_files("evil").items():
        (src / rel).write_text(text)
    with pytest.raises(InstallError, match="is a symlink not made by plugin-llm"):
        install_plugin(hermes_home, str(src), force=True)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    os.symlink(elsewhere, plugins_dir(hermes_home) / "cat")
    with pytest.raises(InstallError, match="resolves outside"):
        install_plugin(hermes_home, str(src), category="cat")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]


# --------------------------------------------------------------------------- overwrite, atomicity


@pytest.mark.slow
def test_no_overwrite_without_force(hermes_home, make_repo):
    repo = make_repo("tool", plugin_files("tool", "1.0"))
    install_plugin(hermes_home, repo.url)
    target = plugins_dir(hermes_home) / "tool"
    (target / "local-note.txt").write_text("mine")
    repo.write(plugin_files("tool", "2.0")).commit("v2")
    with pytest.raises(InstallError, match="already exists; use --force"):
        install_plugin(hermes_home, repo.url)
    assert (target / "local-note.txt").read_text() == "mine"
    old_record = metadata(hermes_home)["tool"]
    entry = install_plugin(hermes_home, repo.url, force=True)
    assert 'version: "2.0"' in (target / "plugin.yaml").read_text()
    assert not (target / "local-note.txt").exists()
    assert entry.revision != old_record["revision"]
    assert listing(plugins_dir(hermes_home)) == [".install-metadata.json", "tool"]


def test_hand_made_plugin_directories_are_not_overwritten_either(hermes_home, tmp_path):
    (plugins_dir(hermes_home) / "mine").mkdir(parents=True)
    src = tmp_path / "mine"
    src.mkdir()
    for rel, text in plugin_files("mine").items():
        (src / rel).write_text(text)
    with pytest.raises(InstallError, match="already exists"):
        install_plugin(hermes_home, str(src))


def test_a_failing_copy_leaves_nothing(hermes_home, tmp_path, monkeypatch):
    src = tmp_path / "tool"
    src.mkdir()
    for rel, text in plugin_files("tool").items():
        (src / rel).write_text(text)

    def broken_copytree(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copytree", broken_copytree)
    with pytest.raises(OSError, match="No space left"):
        install_plugin(hermes_home, str(src))
    assert_nothing_installed(hermes_home)


def test_a_failing_metadata_write_restores_the_previous_install(hermes_home, make_repo):
    repo = make_repo("tool", plugin_files("tool", "1.0"))
    install_plugin(hermes_home, repo.url)
    before = metadata(hermes_home)
    repo.write(plugin_files("tool", "2.0")).commit("v2")
    staged = inst.stage_plugin(plugins_dir(hermes_home), parse_source(repo.url))

    def failing_writer(*args, **kwargs):
        raise OSError(5, "I/O error")

    with pytest.raises(OSError, match="I/O error"):
        inst.commit_staged(staged, force=True, _metadata_writer=failing_writer)
    target = plugins_dir(hermes_home) / "tool"
    assert 'version: "1.0"' in (target / "plugin.yaml").read_text()  # the old one is back
    assert metadata(hermes_home) == before
    assert listing(plugins_dir(hermes_home)) == [".install-metadata.json", "tool"]


def test_a_failing_subdir_install_leaves_no_clone_behind(hermes_home, make_repo):
    repo = make_repo("coll", plugin_files("inner", prefix="p/inner/"))
    staged = inst.stage_plugin(plugins_dir(hermes_home), parse_source(f"{repo.url}#p/inner"))

    def failing_writer(*args, **kwargs):
        raise OSError(5, "I/O error")

    with pytest.raises(OSError):
        inst.commit_staged(staged, _metadata_writer=failing_writer)
    assert_nothing_installed(hermes_home)


# --------------------------------------------------------------------------- *.example


def test_example_files_are_copied_without_overwriting(hermes_home, make_repo):
    files = {
        **plugin_files("configurable"),
        "settings.json.example": '{"units": "metric"}\n',
        "conf/app.ini.example": "[app]\n",
        "keep.txt.example": "example\n",
        "keep.txt": "the real one\n",
    }
    repo = make_repo("configurable", files)
    entry = install_plugin(hermes_home, repo.url)
    target = plugins_dir(hermes_home) / "configurable"
    assert sorted(entry.created_files) == ["conf/app.ini", "settings.json"]
    assert (target / "settings.json").read_text() == '{"units": "metric"}\n'
    assert (target / "keep.txt").read_text() == "the real one\n"
    assert (target / "settings.json.example").exists()
    # created files are untracked: they never count as local edits
    assert update_plugin(hermes_home, "configurable").changed is False


# --------------------------------------------------------------------------- update


@pytest.mark.slow
def test_update_pulls_new_commits(hermes_home, make_repo):
    repo = make_repo("tool", plugin_files("tool", "1.0"))
    first = install_plugin(hermes_home, repo.url).revision
    result = update_plugin(hermes_home, "tool")
    assert (result.changed, result.old_revision, result.new_revision) == (False, first, first)
    second = repo.write({**plugin_files("tool", "2.0"), "extra.cfg.example": "x=1\n"}).commit("v2")
    result = update_plugin(hermes_home, "tool")
    assert (result.changed, result.old_revision, result.new_revision) == (True, first, second)
    assert result.created_files == ("extra.cfg",)
    target = plugins_dir(hermes_home) / "tool"
    assert 'version: "2.0"' in (target / "plugin.yaml").read_text()
    record = metadata(hermes_home)["tool"]
    assert record["revision"] == second and record["updated_at"]


def test_update_of_a_subdir_install(hermes_home, make_repo):
    repo = make_repo("coll", plugin_files("inner", "1.0", prefix="p/inner/"))
    install_plugin(hermes_home, f"{repo.url}#p/inner")
    repo.write(plugin_files("inner", "1.1", prefix="p/inner/")).commit("v1.1")
    assert update_plugin(hermes_home, "inner").changed
    assert 'version: "1.1"' in (plugins_dir(hermes_home) / "inner" / "plugin.yaml").read_text()


def test_update_refuses_local_edits_but_not_pycache(hermes_home, make_repo):
    repo = make_repo("tool")
    install_plugin(hermes_home, repo.url)
    target = plugins_dir(hermes_home) / "tool"
    (target / "__pycache__").mkdir()
    (target / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (target / "runtime-data.json").write_text("{}")
    repo.write({"NEWS": "v2\n"}).commit("news")
    assert update_plugin(hermes_home, "tool").changed  # untracked files are not edits
    with open(target / "__init__.py", "a") as f:
        f.write("# my local tweak\n")
    repo.write({"NEWS": "v3\n"}).commit("news 3")
    with pytest.raises(InstallError, match=r"tool has local edits \(M __init__.py\); update refused"):
        update_plugin(hermes_home, "tool")
    assert "# my local tweak" in (target / "__init__.py").read_text()


def test_update_rolls_back_a_new_version_with_a_broken_manifest(hermes_home, make_repo):
    repo = make_repo("tool", plugin_files("tool", "1.0"))
    first = install_plugin(hermes_home, repo.url).revision
    repo.write({"plugin.yaml": "name: [broken\n"}).commit("oops")
    with pytest.raises(InstallError, match="rolled back to .*invalid manifest"):
        update_plugin(hermes_home, "tool")
    target = plugins_dir(hermes_home) / "tool"
    assert git(target, "rev-parse", "HEAD") == first
    assert metadata(hermes_home)["tool"]["revision"] == first


def test_update_refuses_diverged_history(hermes_home, make_repo):
    repo = make_repo("tool")
    install_plugin(hermes_home, repo.url)
    git(repo.path, "commit", "--amend", "--quiet", "-m", "rewritten")
    repo.write({"x": "1"}).commit("after rewrite")
    with pytest.raises(InstallError, match="git pull --ff-only failed"):
        update_plugin(hermes_home, "tool")


def test_update_of_a_directory_install(hermes_home, tmp_path):
    src = tmp_path / "tool"
    src.mkdir()
    for rel, text in {**plugin_files("tool", "1.0"), "opts.ini.example": "a=1\n"}.items():
        (src / rel).write_text(text)
    install_plugin(hermes_home, str(src))
    target = plugins_dir(hermes_home) / "tool"
    (target / "opts.ini").write_text("a=2  # operator's choice\n")
    assert update_plugin(hermes_home, "tool").changed is False
    (src / "plugin.yaml").write_text('name: tool\nversion: "1.1"\n')
    assert update_plugin(hermes_home, "tool").changed is True
    assert 'version: "1.1"' in (target / "plugin.yaml").read_text()
    assert (target / "opts.ini").read_text() == "a=2  # operator's choice\n"  # kept
    (target / "__init__.py").write_text("def register(ctx):\n    pass  # edited\n")
    with pytest.raises(InstallError, match="local edits"):
        update_plugin(hermes_home, "tool")


def test_update_unknown_or_unrecorded(hermes_home):
    with pytest.raises(InstallError, match="no installed plugin 'ghost'"):
        update_plugin(hermes_home, "ghost")
    (plugins_dir(hermes_home) / "handmade").mkdir(parents=True)
    (plugins_dir(hermes_home) / "handmade" / "plugin.yaml").write_text("name: handmade\n")
    with pytest.raises(InstallError, match="was not installed with `plugin-llm plugins install`"):
        update_plugin(hermes_home, "handmade")


# --------------------------------------------------------------------------- remove


def test_remove_deletes_directory_and_record(hermes_home, make_repo):
    a = make_repo("a", plugin_files("a"))
    coll = make_repo("coll", plugin_files("b", prefix="x/b/"))
    install_plugin(hermes_home, a.url)
    install_plugin(hermes_home, f"{coll.url}#x/b")
    result = remove_plugin(hermes_home, "b")
    assert result.key == "b" and result.had_metadata
    assert listing(plugins_dir(hermes_home)) == [".install-metadata.json", "a"]  # clone and .repos gone too
    assert set(metadata(hermes_home)) == {"a"}
    remove_plugin(hermes_home, "a")
    assert metadata(hermes_home) == {}
    with pytest.raises(InstallError, match="no installed plugin 'a'"):
        remove_plugin(hermes_home, "a")


def test_remove_refuses_local_edits_without_force(hermes_home, make_repo):
    repo = make_repo("tool")
    install_plugin(hermes_home, repo.url)
    (plugins_dir(hermes_home) / "tool" / "plugin.yaml").write_text("name: tool\n# edited\n")
    with pytest.raises(InstallError, match="local edits .*--force"):
        remove_plugin(hermes_home, "tool")
    assert (plugins_dir(hermes_home) / "tool").exists()
    remove_plugin(hermes_home, "tool", force=True)
    assert not (plugins_dir(hermes_home) / "tool").exists()


def test_remove_a_hand_made_symlink_never_deletes_its_target(hermes_home, tmp_path):
    real = tmp_path / "dev" / "my-plugin"
    real.mkdir(parents=True)
    for rel, text in plugin_files("my-plugin").items():
        (real / rel).write_text(text)
    plugins_dir(hermes_home).mkdir()
    os.symlink(real, plugins_dir(hermes_home) / "my-plugin")
    result = remove_plugin(hermes_home, "my-plugin")
    assert result.had_metadata is False
    assert not (plugins_dir(hermes_home) / "my-plugin").exists()
    assert sorted(p.name for p in real.iterdir()) == ["__init__.py", "plugin.yaml"]


def test_name_resolution_by_key_name_and_leaf(hermes_home, tmp_path):
    for key in ("image_gen/openai", "llm/openai", "image_gen/sketch"):
        d = plugins_dir(hermes_home).joinpath(*key.split("/"))
        d.mkdir(parents=True)
        (d / "plugin.yaml").write_text(f"name: {key.split('/')[1]}\n")
    assert inst.resolve_installed(plugins_dir(hermes_home), "sketch") == "image_gen/sketch"
    assert inst.resolve_installed(plugins_dir(hermes_home), "llm/openai") == "llm/openai"
    with pytest.raises(InstallError, match="'openai' is ambiguous: it matches image_gen/openai, llm/openai"):
        inst.resolve_installed(plugins_dir(hermes_home), "openai")
    with pytest.raises(InstallError, match="did you mean 'sketch'"):
        inst.resolve_installed(plugins_dir(hermes_home), "sketc")


def test_corrupt_metadata_is_a_clear_error(hermes_home, make_repo):
    plugins_dir(hermes_home).mkdir()
    (plugins_dir(hermes_home) / ".install-metadata.json").write_text("{not json")
    repo = make_repo("tool")
    with pytest.raises(InstallError, match=r"\.install-metadata\.json is unreadable .*move it aside"):
        install_plugin(hermes_home, repo.url)
    assert listing(plugins_dir(hermes_home)) == [".install-metadata.json"]


# --------------------------------------------------------------------------- env


def test_env_file_is_private_and_keeps_other_lines(hermes_home):
    env = hermes_home / ".env"
    env.write_text("# mine\nEXISTING=1\nWEATHER_API_KEY=old\n")
    inst.write_env_values(hermes_home, {"WEATHER_API_KEY": "s3cr3t value", "UNITS": "metric"})
    assert stat.S_IMODE(os.stat(env).st_mode) == 0o600
    assert env.read_text() == '# mine\nEXISTING=1\nWEATHER_API_KEY="s3cr3t value"\nUNITS=metric\n'
    assert inst.read_env_file(hermes_home) == {"EXISTING": "1", "WEATHER_API_KEY": "s3cr3t value", "UNITS": "metric"}
    with pytest.raises(InstallError, match="line break"):
        inst.write_env_values(hermes_home, {"X": "a\nEVIL=1"})
    assert "EVIL" not in env.read_text()


def test_missing_env_looks_at_the_environment_and_the_env_file(hermes_home, monkeypatch):
    monkeypatch.setenv("IN_ENVIRON", "1")
    monkeypatch.delenv("IN_FILE", raising=False)
    monkeypatch.delenv("NOWHERE", raising=False)
    inst.write_env_values(hermes_home, {"IN_FILE": "x"})
    assert inst.missing_env(hermes_home, ["IN_ENVIRON", "IN_FILE", "NOWHERE"]) == ["NOWHERE"]


def test_secret_names():
    assert all(inst.is_secret_name(n) for n in ("OPENAI_API_KEY", "github_token", "DB_PASSWORD", "CLIENT_SECRET"))
    assert not any(inst.is_secret_name(n) for n in ("UNITS", "BASE_URL", "REGION"))
