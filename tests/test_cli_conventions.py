"""One set of conventions for every ``plugin-llm`` command: a global ``--home``, "did you mean" for
mistyped commands, one time format in ``--json`` output, help without reST markup, and shell
completion generated from the command table."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from plugin_llm.cli.main import SUBCOMMANDS, main
from tests.conftest import write_config

ISO_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
#: keys of --json output that hold a time
TIME_KEYS = frozenset({"ts", "created", "expires", "revoked", "at", "last_time"})


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def other_home(tmp_path: Path) -> Path:
    """A second home beside the default one ($HERMES_HOME), with a plugin and limits of its own."""
    home = tmp_path / "other"
    home.mkdir()
    write_config(home, "model:\n  provider: local\n  model: local-echo-1\nplugins:\n  enabled: [elsewhere]\n"
                 "  entries:\n    elsewhere:\n      limits:\n        requests_per_minute: 5\n")
    plugin = home / "plugins" / "elsewhere"
    plugin.mkdir(parents=True)
    (plugin / "plugin.yaml").write_text("name: elsewhere\nversion: 0.1.0\n")
    (plugin / "__init__.py").write_text("def register(ctx):\n    pass\n")
    return home


def _used_home(capsys, argv: list[str], default: Path, other: Path) -> Path | None:
    code, out, err = _run(capsys, *argv)
    assert code in (0, 1), (argv, err)
    if str(other) in out:
        return other
    return default if str(default) in out else None


# ------------------------------------------------------------------ --home
@pytest.mark.parametrize("command", [["doctor", "--json"], ["auth", "list", "--json"], ["trust", "show", "--json"],
                                     ["limits", "show", "--json"], ["plugins", "list", "--json"]])
def test_home_works_before_and_after_the_command(hermes_home, other_home, capsys, command):
    write_config(hermes_home, "model:\n  provider: local\n  model: local-echo-1\n")
    before = ["--home", str(other_home), *command]
    after = [*command[:-1], "--home", str(other_home), command[-1]]
    outs = []
    for argv in (before, after):
        code, out, err = _run(capsys, *argv)
        assert code in (0, 1), (argv, err)
        outs.append(out)
    if command[0] in ("doctor", "auth"):  # they name the home they read
        assert all(str(other_home) in out and str(hermes_home) not in out for out in outs), outs
    else:  # they show the other home's plugin
        assert all("elsewhere" in out for out in outs), outs
    assert os.environ["HERMES_HOME"] == str(hermes_home)  # given back after the command


def test_home_reaches_every_level_and_refuses_commands_without_a_home(hermes_home, other_home, capsys):
    write_config(hermes_home, "model:\n  provider: local\n  model: local-echo-1\n")
    code, out, err = _run(capsys, "--home", str(other_home), "tokens", "create", "elsewhere", "--json")
    assert code == 0, err
    token_id = json.loads(out)["id"]
    for argv in (["--home", str(other_home), "tokens", "list", "--json"],
                 ["tokens", "--home", str(other_home), "list", "--json"],
                 ["tokens", "list", "--home", str(other_home), "--json"]):
        code, out, err = _run(capsys, *argv)
        assert code == 0 and [row["id"] for row in json.loads(out)] == [token_id], (argv, err)
    code, out, err = _run(capsys, "tokens", "list", "--json")  # the default home has none
    assert code == 0 and json.loads(out) == []
    code, out, err = _run(capsys, "--home", str(other_home), "audit", "tail", "--json")
    assert code == 0 and '"service.token_created"' in out
    code, out, err = _run(capsys, "--home", str(other_home), "demo")
    assert code == 2 and "demo reads no home" in err


# ------------------------------------------------------------------ did you mean
@pytest.mark.parametrize("argv, hint", [(["plugin", "list"], "did you mean 'plugins'?"),
                                        (["audit", "tial"], "did you mean 'tail'?"),
                                        (["tokens", "lsit"], "did you mean 'list'?"),
                                        (["plugins", "new", "x", "--template", "strucured"],
                                         "did you mean 'structured'?")])
def test_typos_get_a_did_you_mean(hermes_home, capsys, argv, hint):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and hint in err, err
    assert "Traceback" not in err


# ------------------------------------------------------------------ one time format
def _times(value: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in TIME_KEYS or key.endswith("_at") or key.endswith("_unix"):
                yield f"{path}.{key}", key, item
            else:
                yield from _times(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _times(item, f"{path}[{i}]")


def test_json_outputs_write_times_one_way(hermes_home, tmp_path, capsys):
    plugin = tmp_path / "src" / "timed"
    plugin.mkdir(parents=True)
    (plugin / "plugin.yaml").write_text("name: timed\nversion: 0.1.0\n")
    (plugin / "__init__.py").write_text("def register(ctx):\n    pass\n")
    assert _run(capsys, "plugins", "install", "--link", str(plugin), "--enable")[0] == 0
    text = (hermes_home / "config.yaml").read_text()
    write_config(hermes_home, text + "  entries:\n    timed:\n      limits:\n        budget_usd: {day: 5}\n")
    assert _run(capsys, "try", "--as", "timed", "hello", "--json")[0] == 0
    outputs = {}
    for argv in (["tokens", "create", "timed", "--expires", "30d", "--json"], ["tokens", "list", "--json"],
                 ["limits", "show", "--json"], ["audit", "stats", "--json"], ["plugins", "info", "timed", "--json"],
                 ["audit", "tail", "--json"]):
        code, out, err = _run(capsys, *argv)
        assert code == 0, (argv, err)
        docs = [json.loads(line) for line in out.splitlines() if line.strip()] if argv[1] == "tail" else [json.loads(out)]
        outputs[" ".join(argv[:2])] = docs
    found = {}
    for name, docs in outputs.items():
        for where, key, value in _times(docs):
            found[f"{name}{where}"] = value
            if key.endswith("_unix"):
                assert value is None or isinstance(value, (int, float)), (name, where, value)
            else:
                assert value is None or (isinstance(value, str) and ISO_Z.fullmatch(value)), (name, where, value)
    created = outputs["tokens create"][0]
    assert created["expires_unix"] - created["created_unix"] == pytest.approx(30 * 86400)
    assert ISO_Z.fullmatch(created["expires"]) and created["revoked"] is None and created["revoked_unix"] is None
    windows = {w["limit"]: w for w in outputs["limits show"][0]["plugins"][0]["usage"]["limits"]}
    assert ISO_Z.fullmatch(windows["budget_usd.day"]["resets_at"])
    assert isinstance(windows["budget_usd.day"]["resets_at_unix"], float)
    assert ISO_Z.fullmatch(outputs["audit stats"][0]["budgets"]["timed"]["day"]["resets_at"])
    assert ISO_Z.fullmatch(outputs["plugins info"][0]["install"]["installed_at"])
    token_event = next(r for r in outputs["audit tail"] if r["event"] == "service.token_created")
    assert ISO_Z.fullmatch(token_event["expires"]) and isinstance(token_event["expires_unix"], float)


# ------------------------------------------------------------------ help text
def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def test_help_shows_no_rest_markup(hermes_home, capsys):
    from plugin_llm.cli.main import _build_parser

    leaks = [p.prog for p in _parsers(_build_parser("*")) if "``" in p.format_help() or ":func:`" in p.format_help()]
    assert leaks == []
    code, out, _ = _run(capsys, "tokens", "--help")
    assert code == 0 and "create PLUGIN prints a new token once (plg_...)" in " ".join(out.split())


# ------------------------------------------------------------------ shell completion
def _tree_names() -> tuple[set[str], dict[str, set[str]]]:
    from plugin_llm.cli.completion_cmd import command_tree

    tree = command_tree()
    return set(tree.commands), {name: set(node.commands) for name, node in tree.commands.items() if node.commands}


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_name_every_command_and_action(hermes_home, capsys, shell):
    code, script, err = _run(capsys, "completion", shell)
    assert code == 0, err
    commands, groups = _tree_names()
    assert commands == set(SUBCOMMANDS)
    assert {"plugins", "audit", "tokens", "trust", "auth", "limits"} <= set(groups)
    for name in commands | {action for actions in groups.values() for action in actions}:
        assert re.search(rf"(^|[\s'])({re.escape(name)})([\s']|$)", script, re.M), (shell, name)


def test_bash_completion_completes_commands_actions_and_choices(hermes_home, tmp_path, capsys):
    code, script, _ = _run(capsys, "completion", "bash")
    assert code == 0
    path = tmp_path / "plugin-llm.bash"
    path.write_text(script)
    probe = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _plugin_llm; '
             'printf "%s\\n" "${COMPREPLY[@]}"')

    def complete(*words: str) -> list[str]:
        done = subprocess.run(["bash", "--norc", "--noprofile", "-c", probe, "_", str(path), "plugin-llm", *words],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return sorted(line for line in done.stdout.splitlines() if line)

    assert complete("pl") == ["plugins"]
    assert complete("--home", "/x", "aud") == ["audit"]  # the global option's value is skipped
    assert complete("audit", "t") == ["tail"]
    assert complete("audit", "tail", "--j") == ["--json"]
    assert complete("plugins", "new", "x", "--template", "s") == ["stream", "structured"]
    assert complete("completion", "") == sorted(["bash", "zsh", "fish", "--help", "--debug"])
    assert "doctor" in complete("") and "--home" in complete("")
