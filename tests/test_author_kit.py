"""The author kit — `plugins new` scaffolds a plugin whose test passes as
generated, plugin_llm.testing (a real ctx on a temporary home, scripted replies), py.typed."""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tests.test_cli_main import ROOT, cli


@pytest.mark.slow
def test_scaffolded_plugins_pass_their_own_tests_and_run(hermes_home: Path, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    made_with = {"summ": ("--kind", "command", "ctx.llm.complete("), "counter": ("--kind", "tool", "register_tool"),
                 "hinter": ("--kind", "hook", "register_hook"),
                 "shaper": ("--template", "structured", "ctx.llm.complete_structured("),
                 "flow": ("--template", "stream", "ctx.llm.stream(")}
    for name, (flag, kind, call) in made_with.items():
        made = cli(hermes_home, "plugins", "new", name, flag, kind, "--dir", str(work))
        assert made.returncode == 0, made.stderr
        assert {"plugin.yaml", "__init__.py", "README.md", "tests"} <= {p.name for p in (work / name).iterdir()}
        assert call in (work / name / "__init__.py").read_text()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "user-home")}
    env.pop("HERMES_HOME", None)  # the generated tests make their own homes
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            *(str(work / n / "tests") for n in made_with)],
                           cwd=str(work), env=env, capture_output=True, text=True, timeout=300)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    # command 2, tool 4 (dispatch, and the model calling it), hook 3; structured and stream 4 each
    # (their tests script a schema repair, a provider error, chunks, a broken stream and a rate limit)
    assert "17 passed" in tests.stdout
    # and it works as installed for development
    assert cli(hermes_home, "plugins", "install", "--link", str(work / "summ"), "--enable").returncode == 0
    run = cli(hermes_home, "run", "summ", "First sentence here. Second one.")
    assert run.returncode == 0 and run.stdout.strip(), run.stderr
    assert cli(hermes_home, "plugins", "new", "summ", "--dir", str(work)).returncode == 2  # never overwrites


@pytest.mark.slow
def test_scaffold_rejects_bad_names(hermes_home: Path, tmp_path: Path):
    for name in ("help", "../x", "a b"):
        out = cli(hermes_home, "plugins", "new", name, "--dir", str(tmp_path))
        assert out.returncode == 2 and "Traceback" not in out.stderr, (name, out.stderr)


def _plugin(where: Path, body: str) -> Path:
    where.mkdir(parents=True)
    (where / "plugin.yaml").write_text(f"name: {where.name}\nversion: 0.1.0\n")
    (where / "__init__.py").write_text(body)
    return where


def test_testing_harness_scripts_replies_and_gives_a_real_ctx(tmp_path: Path):
    from plugin_llm.testing import load_plugin

    plugin_dir = _plugin(tmp_path / "echoer", (
        "def register(ctx):\n"
        "    ctx.register_command('ask', lambda raw: ctx.llm.complete([{'role': 'user', 'content': raw}]).text)\n"))
    before = os.environ.get("HERMES_HOME")
    with load_plugin(plugin_dir, replies=["first", "second"]) as plugin:
        assert os.environ["HERMES_HOME"] == str(plugin.home)
        assert plugin.run_command("ask", "a") == "first"
        assert plugin.ctx.llm.complete([{"role": "user", "content": "b"}]).text == "second"
        assert plugin.run_command("ask", "c").startswith("Local model reply to")  # script used up: the rules
        assert [c["plugin_id"] for c in plugin.calls()] == ["echoer"] * 3
        home = plugin.home
    assert os.environ.get("HERMES_HOME") == before and not home.exists()
    with load_plugin(plugin_dir, replies=lambda messages: messages[-1]["content"].upper()) as plugin:
        assert plugin.run_command("ask", "shout") == "SHOUT"


def test_testing_harness_reports_a_load_failure_with_the_plugin_frames(tmp_path: Path):
    from plugin_llm.testing import PluginLoadError, load_plugin

    plugin_dir = _plugin(tmp_path / "broken", "def register(ctx):\n    raise ValueError('bad setup')\n")
    with pytest.raises(PluginLoadError) as info:
        with load_plugin(plugin_dir):
            pass
    assert "bad setup" in str(info.value) and "__init__.py:2 in register" in str(info.value)


def test_package_is_typed_and_ctx_llm_is_annotated():
    import plugin_llm
    from plugin_llm.llm import PluginLlm
    from plugin_llm.plugins.context import PluginContext

    assert (Path(plugin_llm.__file__).parent / "py.typed").is_file()
    hints = typing.get_type_hints(PluginContext.llm.fget, globalns={"PluginLlm": PluginLlm})
    assert hints["return"] is PluginLlm


def test_harness_config_is_merged_not_appended(tmp_path: Path):
    from plugin_llm.errors import PluginLlmQuotaError, PluginLlmTrustError
    from plugin_llm.testing import PluginLoadError, load_plugin

    plugin_dir = _plugin(tmp_path / "picky", (
        "def register(ctx):\n"
        "    ctx.register_command('ask', lambda raw: ctx.llm.complete([{'role': 'user', 'content': raw}],"
        " model=raw or None).text)\n"))
    # a trust block as YAML text: merged with the harness's own plugins.enabled, not appended after it
    trust_yaml = "plugins:\n  entries:\n    picky:\n      llm:\n        allow_model_override: true\n"
    with load_plugin(plugin_dir, config=trust_yaml, replies=["granted"]) as plugin:
        assert plugin.run_command("ask", "local-echo-1") == "granted"
    with load_plugin(plugin_dir, trust={"allow_model_override": True}, replies=["granted"]) as plugin:
        assert plugin.run_command("ask", "local-echo-1") == "granted"
    with load_plugin(plugin_dir) as plugin:  # no trust block: the override is refused
        with pytest.raises(PluginLlmTrustError):
            plugin.run_command("ask", "local-echo-1")
    with load_plugin(plugin_dir, limits={"tokens_per_minute": 1}) as plugin:
        with pytest.raises(PluginLlmQuotaError):
            plugin.run_command("ask", "")
    # a config that drops the plugin from plugins.enabled: the error names the cause
    with pytest.raises(PluginLoadError, match=r"plugins\.enabled.*without 'picky'"):
        with load_plugin(plugin_dir, config={"plugins": {"enabled": ["other"]}}):
            pass
    with pytest.raises(PluginLoadError, match="must be a YAML mapping"):
        with load_plugin(plugin_dir, config="- a list"):
            pass


def _probe(where: Path) -> Path:
    return _plugin(where, (
        "import json\n"
        "TOOLS = [{'type': 'function', 'function': {'name': 'look', 'parameters': {'type': 'object'}}}]\n"
        "def _error(exc):\n"
        "    return {'error': type(exc).__name__, 'status': getattr(exc, 'status', None),\n"
        "            'retryable': getattr(exc, 'retryable', None), 'retry_after': getattr(exc, 'retry_after', None)}\n"
        "def register(ctx):\n"
        "    def ask(raw):\n"
        "        try:\n"
        "            r = ctx.llm.complete([{'role': 'user', 'content': 'x'}], tools=TOOLS if raw else None)\n"
        "        except Exception as exc:\n"
        "            return json.dumps(_error(exc))\n"
        "        return json.dumps({'text': r.text, 'tools': [[c.name, c.arguments] for c in r.tool_calls or []]})\n"
        "    def live(raw):\n"
        "        got = []\n"
        "        try:\n"
        "            with ctx.llm.stream([{'role': 'user', 'content': 'x'}]) as s:\n"
        "                got.extend(s)\n"
        "        except Exception as exc:\n"
        "            return json.dumps({'deltas': got, **_error(exc)})\n"
        "        return json.dumps({'deltas': got})\n"
        "    ctx.register_command('ask', ask)\n"
        "    ctx.register_command('live', live)\n"))


def test_harness_scripts_streams_errors_rate_limits_timeouts_and_tool_calls(tmp_path: Path):
    import json

    from plugin_llm.testing import load_plugin, provider_error, rate_limited, stream, timeout, tool_call

    plugin_dir = _probe(tmp_path / "probe")
    script = [stream("Hel", "lo ", "world"), stream("a", "b", error=provider_error(502)), stream("Late", error=timeout()),
              provider_error(503, retry_after=1), rate_limited(2), timeout(), tool_call("look", {"q": 1}),
              provider_error(400), stream("p", "q")]
    with load_plugin(plugin_dir, config={"llm": {"max_retries": 0}}, replies=script) as plugin:
        def run(command: str, args: str = "") -> dict:
            return json.loads(plugin.run_command(command, args))

        assert run("live") == {"deltas": ["Hel", "lo ", "world"]}  # exactly the scripted chunks
        broken = run("live")
        assert (broken["deltas"], broken["error"], broken["status"]) == (["a", "b"], "PluginLlmProviderError", 502)
        late = run("live")
        assert (late["deltas"], late["error"]) == (["Late"], "PluginLlmTimeoutError")
        assert run("ask") == {"error": "PluginLlmProviderError", "status": 503, "retryable": True, "retry_after": 1.0}
        assert run("ask") == {"error": "PluginLlmProviderError", "status": 429, "retryable": True, "retry_after": 2.0}
        assert run("ask")["error"] == "PluginLlmTimeoutError"
        assert run("ask", "tools") == {"text": "", "tools": [["look", {"q": 1}]]}
        assert run("ask") == {"error": "PluginLlmProviderError", "status": 400, "retryable": False,
                              "retry_after": None}
        assert run("ask") == {"text": "pq", "tools": []}  # a scripted stream read whole
        assert [c["status"] for c in plugin.calls()] == ["ok", "provider_error", "timeout", "provider_error",
                                                          "provider_error", "timeout", "ok", "provider_error", "ok"]
    # with retries (the default): each attempt takes the next scripted turn
    with load_plugin(plugin_dir, replies=[rate_limited(0), provider_error(500, retry_after=0), "third"]) as plugin:
        assert json.loads(plugin.run_command("ask", "")) == {"text": "third", "tools": []}
        [call] = plugin.calls()
        assert call["status"] == "ok" and call["attempts"] == 3
    with pytest.raises(TypeError, match="scripted replies must be strings or"):
        with load_plugin(plugin_dir, replies=[42]):
            pass
