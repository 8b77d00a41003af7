"""Hardening: hostile files in the home: YAML alias bombs, FIFOs and special files, deep JSON.

Whatever an attacker (or an accident) puts in place of ``config.yaml``,
``auth.json``, ``.env``, a ``plugin.yaml`` or the install record, every command
and every call returns, promptly, with an error naming the file. Cases that
made the old code hang or eat memory run in a subprocess with a timeout and an
address-space limit, or in a thread that the test releases, so a regression
fails the test instead of the machine.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.hardened.safe_json import JsonTooDeepError, loads_bounded
from plugin_llm.hardened.safe_yaml import YamlLimitError, load_yaml
from tests.conftest import write_config
from tests.plugin_fixtures import write_plugin

REPO = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "Hello from the test"}]
#: seconds a bounded subprocess may take (it takes a few; the old code never returned)
SUBPROCESS_TIMEOUT = 30
#: address space a bounded subprocess may use: the old code needed gigabytes
SUBPROCESS_MEMORY = 3 << 30


def bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs" document: ``width ** levels`` strings from a few hundred bytes."""
    names = "abcdefghijklmnopqrstuvwxyz"
    lines = [f"{names[0]}: &{names[0]} [" + ", ".join(['"x"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"{names[i]}: &{names[i]} [" + ", ".join([f"*{names[i - 1]}"] * width) + "]")
    return "\n".join(lines) + "\n"


#: the bomb, then used where the old parser printed the value into a warning
CONFIG_BOMB = bomb() + "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: *i\n"
SELF_ALIAS = "a: &a [*a]\nplugins:\n  entries:\n    p:\n      llm:\n        allowed_models: *a\n"


def _limit_memory() -> None:  # pragma: no cover - runs in the child
    resource.setrlimit(resource.RLIMIT_AS, (SUBPROCESS_MEMORY, SUBPROCESS_MEMORY))


def run_bounded(script: str, home: Path, *args: str) -> Any:
    """Run ``script`` in a fresh interpreter (bounded time and memory); its last stdout line is JSON."""
    env = {**os.environ, "HERMES_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=str(home), env=env, capture_output=True, text=True,
        timeout=SUBPROCESS_TIMEOUT, preexec_fn=_limit_memory,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: runs CLI commands in-process, one after another, and reports each outcome
CLI_RUNNER = """
import contextlib, io, json, sys, traceback
from plugin_llm.cli.main import main

results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except BaseException as exc:
            rc = "raised " + type(exc).__name__
            err.write(traceback.format_exc())
    results.append({"argv": argv, "rc": rc, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps(results))
"""


def run_cli_bounded(home: Path, *commands: list[str]) -> list[dict[str, Any]]:
    return run_bounded(CLI_RUNNER, home, json.dumps(list(commands)))


# ====================================================================== YAML aliases
@pytest.mark.parametrize("pure", [False, True], ids=["libyaml", "pure"])
def test_loader_refuses_alias_bomb_recursion_and_depth_with_the_line(pure):
    with pytest.raises(YamlLimitError, match="alias bomb") as bombed:
        load_yaml(bomb(), pure=pure)
    assert bombed.value.problem_mark.line + 1 in range(2, 10)  # at an anchor of the bomb
    with pytest.raises(YamlLimitError, match="recursive alias") as recursive:
        load_yaml("ok: 1\na: &a [*a]\n", pure=pure)
    assert recursive.value.problem_mark.line + 1 == 2
    with pytest.raises(YamlLimitError, match="recursive alias"):
        load_yaml("a: &a {<<: *a}\n", pure=pure)  # through a merge key
    with pytest.raises(yaml.YAMLError, match="nest"):
        load_yaml("[" * 100 + "]" * 100, pure=pure)
    with pytest.raises(yaml.YAMLError, match="nest"):
        load_yaml("- " * 5000 + "x\n", pure=pure)  # the pure composer would overflow the stack
    long_string = 's: &s "' + "x" * 100_000 + '"\nl: [' + ", ".join(["*s"] * 100) + "]\n"
    with pytest.raises(YamlLimitError, match="alias bomb"):  # 10 MB of text from 100 KB
        load_yaml(long_string, pure=pure)
    # ordinary aliases and merge keys keep working
    assert load_yaml("base: &b {x: 1}\nuse: {<<: *b, y: 2}\nlist: &l [1, 2]\nagain: *l\n", pure=pure) == {
        "base": {"x": 1}, "use": {"x": 1, "y": 2}, "list": [1, 2], "again": [1, 2],
    }


GATEWAY_SCRIPT = """
import json, os, sys
from pathlib import Path
from plugin_llm import PluginLlm, PluginLlmTrustError
from plugin_llm.config import get_config_source

home = Path(os.environ["HERMES_HOME"])
USER = [{"role": "user", "content": "hi"}]
GOOD = "plugins:\\n  entries:\\n    p:\\n      llm:\\n        allow_model_override: true\\n"

def write(text):
    path = home / "config.yaml"
    old = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == old:
        os.utime(path, ns=(old + 1_000_000, old + 1_000_000))

llm = PluginLlm("p")
out = {}
for name, text in json.loads(sys.argv[1]).items():
    write(GOOD)
    out[name + ":good"] = llm.complete(USER, model="local-echo-2").provider  # the override is allowed
    write(text)
    try:
        llm.complete(USER, model="local-echo-2")
        out[name + ":override"] = "allowed"
    except PluginLlmTrustError:
        out[name + ":override"] = "denied"
    out[name + ":plain"] = llm.complete(USER).provider  # the last good route
    out[name + ":error"] = get_config_source(home).current().error
print(json.dumps(out))
"""


@pytest.mark.slow
def test_gateway_fails_closed_on_alias_bomb_and_recursive_alias_and_keeps_calling(hermes_home):
    out = run_bounded(GATEWAY_SCRIPT, hermes_home, json.dumps({"bomb": CONFIG_BOMB, "self": SELF_ALIAS}))
    for name, problem in (("bomb", "alias bomb"), ("self", "recursive alias")):
        assert out[f"{name}:good"] == "local"
        assert out[f"{name}:override"] == "denied"  # fail closed: no overrides for anyone
        assert out[f"{name}:plain"] == "local"  # the call still runs
        error = out[f"{name}:error"]
        assert str(hermes_home / "config.yaml") in error and problem in error
        assert len(error) < 400  # the value is never printed


@pytest.mark.slow
@pytest.mark.parametrize("doc", [CONFIG_BOMB, SELF_ALIAS], ids=["bomb", "self-alias"])
def test_cli_commands_report_a_bad_alias_in_config_in_one_line(hermes_home, doc):
    write_plugin(hermes_home / "plugins", "p")
    write_config(hermes_home, doc)
    problem = "alias bomb" if doc is CONFIG_BOMB else "recursive alias"
    results = run_cli_bounded(
        hermes_home,
        ["trust", "show"], ["trust", "check"], ["trust", "explain", "p", "--model", "m"],
        ["trust", "grant", "p", "model"], ["doctor"], ["plugins", "list"],
    )
    for r in results:
        text = r["out"] + r["err"]
        assert "Traceback" not in text and isinstance(r["rc"], int), r
        assert problem in text and f"{hermes_home / 'config.yaml'}:" in text, r
    # a config.yaml that does not parse is a configuration error for every command (EXIT_CODES: 2)
    assert {tuple(r["argv"]): r["rc"] for r in results} == {
        ("trust", "show"): 2, ("trust", "check"): 2, ("trust", "explain", "p", "--model", "m"): 2,
        ("trust", "grant", "p", "model"): 2, ("doctor",): 2, ("plugins", "list"): 2,
    }
    assert (hermes_home / "config.yaml").read_text() == doc  # grant wrote nothing


@pytest.mark.slow
def test_alias_bomb_in_a_manifest_fails_that_plugin_only_and_install_refuses_it(hermes_home, tmp_path):
    plugins = hermes_home / "plugins"
    write_plugin(plugins, "bombed", manifest="name: bombed\n" + bomb() + "provides_tools: *i\n")  # not enabled
    write_plugin(plugins, "fine")
    write_config(hermes_home, "plugins:\n  enabled: [fine]\n")
    source = write_plugin(tmp_path / "src", "selfish", manifest="name: selfish\nprovides_tools: &t [*t]\n")
    results = run_cli_bounded(hermes_home, ["plugins", "list"], ["doctor"], ["plugins", "install", str(source)])
    for r in results:
        assert "Traceback" not in r["out"] + r["err"] and isinstance(r["rc"], int), r
    listing, doctor, install = results
    assert "fine" in listing["out"] and "alias bomb" in listing["out"] + listing["err"]
    assert str(plugins / "bombed" / "plugin.yaml") in listing["out"] + listing["err"]
    assert doctor["rc"] == 1 and "alias bomb" in doctor["out"]
    assert install["rc"] != 0 and "recursive alias" in install["err"] and "nothing was installed" in install["err"]
    assert not (plugins / "selfish").exists()


# ====================================================================== special files
def no_block(fn: Callable[[], Any], *fifos: Path, timeout: float = 10.0) -> Any:
    """``fn()``, failing the test (instead of hanging) if it blocks on one of ``fifos``."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        for fifo in fifos:  # a writer releases a reader blocked in open(); it then sees EOF
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        thread.join(timeout)
        pytest.fail(f"blocked reading {', '.join(map(str, fifos))}")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def make_special(path: Path, kind: str) -> str:
    """Put a FIFO or a directory at ``path``; returns the words the error must use."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path, 0o600)
        return "is a FIFO (named pipe), not a regular file"
    path.mkdir()
    return "is a directory, not a regular file"


KINDS = ["fifo", "directory"]


@pytest.mark.parametrize("kind", KINDS)
def test_special_config_yaml_is_an_error_for_the_gateway_the_cli_and_the_editor(hermes_home, kind, capsys):
    from plugin_llm.cli.main import main
    from plugin_llm.config import ConfigSource
    from plugin_llm.config_edit import ConfigEditError, edit_config
    from plugin_llm.trust_report import read_config

    path = hermes_home / "config.yaml"
    words = make_special(path, kind)
    config = no_block(lambda: ConfigSource(hermes_home).current(), path)
    assert config.error == f"{path} {words}: replace it with a regular file" and dict(config.trust) == {}
    assert no_block(lambda: read_config(hermes_home).error, path) == config.error
    with pytest.raises(ConfigEditError, match=re.escape(words) + ".*nothing was written"):
        no_block(lambda: edit_config(hermes_home, lambda doc: doc.update(x=1)), path)
    assert no_block(lambda: main(["trust", "show"]), path) == 2  # a configuration error
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize("kind", KINDS)
def test_special_auth_json_is_a_config_error_for_the_store_and_auth_list(hermes_home, kind, capsys):
    from auth.authfile import load_auth
    from plugin_llm.cli.main import main

    path = hermes_home / "auth.json"
    words = make_special(path, kind)
    with pytest.raises(PluginLlmConfigError, match=re.escape(words)) as exc:
        no_block(lambda: load_auth(path), path)
    assert str(path) in str(exc.value)
    assert no_block(lambda: main(["auth", "list"]), path) == 1
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_special_env_file_is_skipped_with_a_warning_and_install_refuses_to_rewrite_it(hermes_home, kind, caplog):
    from plugin_llm.home_env import read_env_file
    from plugin_llm.plugins.install import write_env_values

    path = hermes_home / ".env"
    words = make_special(path, kind)
    with caplog.at_level(logging.WARNING):
        assert no_block(lambda: read_env_file(hermes_home), path) == {}
    assert any(str(path) in r.getMessage() and words in r.getMessage() for r in caplog.records)
    with pytest.raises(PluginLlmConfigError, match=re.escape(words)):
        no_block(lambda: write_env_values(hermes_home, {"X_TOKEN": "v"}), path)


@pytest.mark.parametrize("kind", KINDS)
def test_special_manifest_fails_that_plugin_with_the_reason(hermes_home, kind):
    from plugin_llm.plugins.manager import PluginManager

    plugins = hermes_home / "plugins"
    write_plugin(plugins, "odd")
    write_plugin(plugins, "fine")
    path = plugins / "odd" / "plugin.yaml"
    words = make_special(path, kind)
    listed = {p["key"]: p for p in no_block(lambda: PluginManager(hermes_home).list_plugins(), path)}
    assert listed["fine"]["status"] != "failed"
    assert listed["odd"]["status"] == "failed" and str(path) in listed["odd"]["error"] and words in listed["odd"]["error"]


@pytest.mark.parametrize("kind", KINDS)
def test_special_install_record_is_an_install_error(hermes_home, kind):
    from plugin_llm.plugins.install import METADATA_FILENAME, InstallError, read_metadata

    path = hermes_home / "plugins" / METADATA_FILENAME
    words = make_special(path, kind)
    with pytest.raises(InstallError, match=re.escape(words)):
        no_block(lambda: read_metadata(path.parent), path)


def test_doctor_names_a_fifo_auth_json_and_env_for_what_they_are(hermes_home, capsys):
    from plugin_llm.cli.main import main

    auth_json, env = hermes_home / "auth.json", hermes_home / ".env"
    make_special(auth_json, "fifo")
    make_special(env, "fifo")
    assert no_block(lambda: main(["doctor"]), auth_json, env) == 1
    out = capsys.readouterr().out
    assert f"FAIL  auth.json: {auth_json} is a FIFO (named pipe), not a regular file" in out
    assert f"{env} is a FIFO (named pipe), not a regular file" in out and "its variables are not loaded" in out
    assert "mode 0600" not in out and "Traceback" not in out


DEV_ZERO_SCRIPT = """
import json, os
from pathlib import Path
from auth.authfile import load_auth
from plugin_llm.config import ConfigSource
from plugin_llm.home_env import read_env_file
from plugin_llm.plugins.manifest import ManifestError, load_manifest

home = Path(os.environ["HERMES_HOME"])
out = {"config": ConfigSource(home).current().error, "env": read_env_file(home)}
try:
    load_auth(home / "auth.json")
except Exception as exc:
    out["auth"] = str(exc)
try:
    load_manifest(home / "plugins" / "p" / "plugin.yaml")
except ManifestError as exc:
    out["manifest"] = str(exc)
print(json.dumps(out))
"""


def test_dev_zero_symlinks_are_refused_unread(hermes_home):
    write_plugin(hermes_home / "plugins", "p")
    for rel in ("config.yaml", "auth.json", ".env", "plugins/p/plugin.yaml"):
        path = hermes_home / rel
        path.unlink(missing_ok=True)
        path.symlink_to("/dev/zero")
    out = run_bounded(DEV_ZERO_SCRIPT, hermes_home)
    for name, rel in (("config", "config.yaml"), ("auth", "auth.json"), ("manifest", "plugins/p/plugin.yaml")):
        assert f"{hermes_home / rel} is a character device, not a regular file" in out[name]
    assert out["env"] == {}


def test_symlinked_files_to_regular_files_keep_working(hermes_home, tmp_path):
    from plugin_llm.config import ConfigSource
    from plugin_llm.home_env import read_env_file
    from plugin_llm.plugins.manifest import load_manifest

    real = tmp_path / "real"
    real.mkdir()
    (real / "config.yaml").write_text("model: local-echo-3\n")
    (real / "env").write_text("SOME_NAME=value\n")
    (real / "plugin.yaml").write_text("name: linked\nversion: '2'\n")
    (hermes_home / "config.yaml").symlink_to(real / "config.yaml")
    (hermes_home / ".env").symlink_to(real / "env")
    (hermes_home / "plugins" / "linked").mkdir(parents=True)
    (hermes_home / "plugins" / "linked" / "plugin.yaml").symlink_to(real / "plugin.yaml")
    assert ConfigSource(hermes_home).current().model.model == "local-echo-3"
    assert read_env_file(hermes_home) == {"SOME_NAME": "value"}
    assert load_manifest(hermes_home / "plugins" / "linked" / "plugin.yaml").version == "2"


def test_oversized_config_and_manifest_are_refused_unparsed(hermes_home):
    from plugin_llm.config import CONFIG_MAX_BYTES, ConfigSource
    from plugin_llm.plugins.manifest import MANIFEST_MAX_BYTES, ManifestError, load_manifest

    write_config(hermes_home, "# padding\n" * (CONFIG_MAX_BYTES // 10 + 1))
    assert "larger than the 4 MiB allowed" in ConfigSource(hermes_home).current().error
    manifest = write_plugin(hermes_home / "plugins", "big") / "plugin.yaml"
    manifest.write_text("name: big\n" + "#" * MANIFEST_MAX_BYTES)
    with pytest.raises(ManifestError, match="larger than the 256 KiB allowed"):
        load_manifest(manifest)


# ====================================================================== deep JSON
DEEP = "[" * 100_000 + "]" * 100_000  # 200 KB


def test_deep_auth_json_is_a_config_error_naming_the_file_everywhere(hermes_home, capsys):
    from auth.authfile import load_auth
    from plugin_llm import PluginLlm
    from plugin_llm.cli.main import main

    path = hermes_home / "auth.json"
    path.write_text(DEEP)
    os.chmod(path, 0o600)
    with pytest.raises(PluginLlmConfigError, match=r"auth\.json: invalid JSON at line 1, column 65: nested deeper than 64 levels"):
        load_auth(path)
    assert main(["auth", "list"]) == 1
    err = capsys.readouterr().err.strip()
    assert str(path) in err and "nested deeper" in err and len(err.splitlines()) == 1
    write_config(hermes_home, "model:\n  provider: openai\n  model: gpt-4o-mini\n")
    with pytest.raises(PluginLlmConfigError, match="nested deeper") as exc:
        PluginLlm("p").complete(USER)
    assert str(path) in str(exc.value)


def test_deep_install_record_is_an_install_error(hermes_home):
    from plugin_llm.plugins.install import METADATA_FILENAME, InstallError, read_metadata

    plugins = hermes_home / "plugins"
    plugins.mkdir()
    (plugins / METADATA_FILENAME).write_text('{"plugins": ' + DEEP + "}")
    with pytest.raises(InstallError, match="nested deeper than 64 levels"):
        read_metadata(plugins)


def test_json_depth_scan_skips_strings_and_allows_the_limit():
    assert loads_bounded('{"a": "' + "[" * 500 + '"}') == {"a": "[" * 500}
    assert loads_bounded('["\\"' + "{" * 100 + '"]') == ['"' + "{" * 100]
    assert loads_bounded("[" * 64 + "]" * 64) is not None
    with pytest.raises(JsonTooDeepError) as exc:
        loads_bounded("\n" + "[" * 65 + "]" * 65)
    assert (exc.value.lineno, exc.value.colno, exc.value.doc) == (2, 65, "")


def test_a_skill_file_that_is_or_becomes_a_fifo_is_refused_unread(hermes_home):
    from plugin_llm.plugins.manager import PluginManager
    from tests.plugin_fixtures import configure

    plugins = hermes_home / "plugins"
    code = "def register(ctx):\n    ctx.register_skill('guide', 'SKILL.md', description='how to')\n"
    write_plugin(plugins, "skilled", code, files={"SKILL.md": "# Guide\n"})
    write_plugin(plugins, "piped", code)
    make_special(plugins / "piped" / "SKILL.md", "fifo")
    configure(hermes_home, enabled=["skilled", "piped"])
    manager = PluginManager(hermes_home)
    listed = {p["key"]: p for p in no_block(manager.list_plugins, plugins / "piped" / "SKILL.md")}
    assert listed["piped"]["status"] == "failed" and "FIFO" in listed["piped"]["error"]
    skill = manager.find_skill("skilled:guide")
    make_special(plugins / "skilled" / "SKILL.md", "fifo")  # swapped after registration
    with pytest.raises(Exception, match="FIFO"):
        no_block(skill.read, plugins / "skilled" / "SKILL.md")


def test_install_refuses_a_plugin_source_holding_a_fifo(hermes_home, tmp_path):
    from plugin_llm.plugins.install import InstallError, install_plugin

    src = write_plugin(tmp_path / "src", "piper")
    make_special(src / "data.bin", "fifo")
    with pytest.raises(InstallError, match=r"data\.bin .* is a FIFO"):
        no_block(lambda: install_plugin(hermes_home, str(src)), src / "data.bin")
    assert not (hermes_home / "plugins" / "piper").exists()


@pytest.mark.parametrize("pure", [False, True])
def test_loader_refuses_duplicate_keys_in_the_named_sections_only(pure):
    from plugin_llm.hardened.safe_yaml import YamlDuplicateKeyError

    sections = {"plugins", "limits"}
    for text, where in (
        ("plugins: {}\nx: 1\nplugins: {}\n", "'plugins' at the top level (lines 1 and 3)"),
        ("limits:\n  a:\n    - {k: 1, k: 2}\n", "'k' in limits.a[0] (lines 3 and 3)"),
        ("limits: {1: a, 0x1: b}\n", "'0x1' in limits (lines 1 and 1)"),  # one key once constructed
        ('plugins:\n  entries:\n    "a.b": {x: 1, x: 2}\n', "'x' in plugins.entries.\"a.b\""),
    ):
        with pytest.raises(YamlDuplicateKeyError) as caught:
            load_yaml(text, unique_keys=sections, pure=pure)
        assert where in caught.value.problem, caught.value.problem
        assert caught.value.context_mark is not None and caught.value.problem_mark is not None
    # elsewhere, without the option, through a merge key, and an alias checked once: as YAML says
    assert load_yaml("x: 1\nx: 2\nplugins: {a: 1}\n", unique_keys=sections, pure=pure) == {"x": 2, "plugins": {"a": 1}}
    assert load_yaml("plugins: {a: 1, a: 2}\n", pure=pure) == {"plugins": {"a": 2}}
    merged = load_yaml("x: &b {k: 1}\nlimits: {<<: *b, k: 2}\nplugins: [*b, *b]\n", unique_keys=sections, pure=pure)
    assert merged["limits"] == {"k": 2} and merged["plugins"] == [{"k": 1}, {"k": 1}]
