"""Hermes compatibility: the ctx surface of current Hermes, middleware, capability consent, old-key warnings."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from plugin_llm.cli.plugins import terminal
from plugin_llm.cli.main import main
from plugin_llm.config import get_config_source
from plugin_llm.host import Session

from tests.bounded import run_bounded
from tests.conftest import write_config
from tests.test_hermes_plugins import by_key, load, write_plugin  # noqa: F401 (shared helpers)
from tests.test_host_support import ScriptedLlm, reply




def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


TOOL = """
def register(ctx):
    ctx.register_tool("echo", {"name": "echo", "parameters": {"type": "object"}}, lambda args: "echo:" + args.get("x", ""))
"""


# --------------------------------------------------------------------------- middleware


def test_tool_execution_middleware_wraps_in_registration_order(hermes_home):
    write_plugin(hermes_home, "tools", TOOL)
    write_plugin(hermes_home, "a-outer", """
        def mw(tool_name, args, next_call, **kw):
            return "outer(" + next_call({**args, "x": args["x"] + "+outer"}) + ")"
        def register(ctx):
            ctx.register_middleware("tool_execution", mw)
    """)
    write_plugin(hermes_home, "b-inner", """
        def mw(args, next_call, telemetry_schema_version, middleware_schema_version):
            assert middleware_schema_version == "hermes.middleware.v1"
            return "inner(" + next_call({**args, "x": args["x"] + "+inner"}) + ")"
        def register(ctx):
            ctx.register_middleware("tool_execution", mw)
    """)
    write_config(hermes_home, "plugins:\n  enabled: [tools, a-outer, b-inner]\n")  # loaded in key order
    manager = load(hermes_home)
    assert manager.dispatch_tool("echo", {"x": "a"}) == "outer(inner(echo:a+outer+inner))"
    assert by_key(manager)["a-outer"]["middleware"] == ["tool_execution"]


@pytest.mark.slow
def test_a_failing_or_hanging_middleware_is_skipped_within_the_time_limit(hermes_home):
    write_plugin(hermes_home, "tools", TOOL)
    write_plugin(hermes_home, "broken", """
        def mw(args, next_call, **kw):
            raise RuntimeError("middleware bug")
        def register(ctx):
            ctx.register_middleware("tool_execution", mw)
    """)
    write_plugin(hermes_home, "slow", """
        import time
        def mw(args, next_call, **kw):
            while True:
                time.sleep(0.05)
        def register(ctx):
            ctx.register_middleware("tool_execution", mw)
    """)
    write_config(hermes_home, "plugins:\n  enabled: [tools, broken, slow]\n  hook_timeout: 0.3\n")
    manager = load(hermes_home)
    # both skipped (the slow one by the 0.3 s limit), the tool still runs
    assert run_bounded(lambda: manager.dispatch_tool("echo", {"x": "a"}), 30) == "echo:a"
    plugins = by_key(manager)
    assert plugins["broken"]["middleware"] == plugins["slow"]["middleware"] == ["tool_execution"]
    failed = [json.loads(line) for line in (hermes_home / "logs" / "agent.log").read_text().splitlines()
              if '"hook_error"' in line]
    assert {e["plugin_id"] for e in failed} == {"broken", "slow"}


@pytest.mark.slow
def test_the_middleware_time_limit_does_not_count_the_downstream_call(hermes_home):
    write_plugin(hermes_home, "tools", """
        import time
        def slow(args):
            time.sleep(0.8)
            return "done"
        def register(ctx):
            ctx.register_tool("slow_tool", {"name": "slow_tool"}, slow)
    """)
    write_plugin(hermes_home, "wrap", """
        def mw(args, next_call, **kw):
            return "wrapped:" + next_call()
        def register(ctx):
            ctx.register_middleware("tool_execution", mw)
    """)
    write_config(hermes_home, "plugins:\n  enabled: [tools, wrap]\n  hook_timeout: 0.3\n")
    assert load(hermes_home).dispatch_tool("slow_tool", {}) == "wrapped:done"


def test_llm_execution_middleware_wraps_the_sessions_model_requests(hermes_home):
    write_plugin(hermes_home, "llmwrap", """
        SEEN = []
        def mw(request, next_call, **kw):
            SEEN.append(len(request["messages"]))
            request = {**request, "messages": request["messages"] + [{"role": "user", "content": "MW-ADDED"}]}
            return next_call(request)
        def register(ctx):
            ctx.register_middleware("llm_execution", mw)
    """)
    write_config(hermes_home, "plugins:\n  enabled: [llmwrap]\n")
    manager = load(hermes_home)
    llm = ScriptedLlm(reply("hi"))
    with Session(manager, llm=llm) as session:
        assert session.run_turn("hello").text == "hi"
    assert llm.requests[0]["messages"][-1]["content"] == "MW-ADDED"


def test_api_request_error_fires_when_a_model_request_fails(hermes_home):
    write_plugin(hermes_home, "watch", """
        import json, os
        def on_error(error, reason, **kw):
            with open(os.environ["HERMES_HOME"] + "/errors.jsonl", "a") as fh:
                fh.write(json.dumps({"error": error, "reason": reason}) + "\\n")
        def register(ctx):
            ctx.register_hook("api_request_error", on_error)
    """)
    write_config(hermes_home, "plugins:\n  enabled: [watch]\n")

    def boom(messages, tools):
        raise ConnectionError("provider down")

    with Session(load(hermes_home), llm=ScriptedLlm(boom)) as session:
        with pytest.raises(ConnectionError):
            session.run_turn("hello")
    recorded = json.loads((hermes_home / "errors.jsonl").read_text().splitlines()[0])
    assert recorded == {"error": {"type": "ConnectionError", "message": "ConnectionError: provider down"},
                        "reason": "ConnectionError"}


# --------------------------------------------------------------------------- other ctx methods


OVERRIDE = """
def register(ctx):
    ctx.register_tool("echo", {"name": "echo"}, lambda args: "replaced", override=True)
"""


def test_register_tool_override_needs_the_operators_allow_tool_override(hermes_home):
    write_plugin(hermes_home, "tools", TOOL)
    write_plugin(hermes_home, "zover", OVERRIDE)
    write_config(hermes_home, "plugins:\n  enabled: [tools, zover]\n")
    manager = load(hermes_home)
    assert manager.dispatch_tool("echo", {"x": "a"}) == "echo:a"
    warning = by_key(manager)["zover"]["warnings"][0]
    assert "override=True refused" in warning and "plugins.entries.zover.allow_tool_override: true" in warning
    write_config(hermes_home, "plugins:\n  enabled: [tools, zover]\n  entries:\n    zover:\n"
                              "      allow_tool_override: true\n")
    manager.discover_plugins(force=True)
    assert manager.dispatch_tool("echo", {"x": "a"}) == "replaced"
    assert manager.tools["echo"].plugin_key == "zover"


def test_cli_command_description_profile_name_and_lazy_module_helpers(hermes_home, monkeypatch):
    write_plugin(hermes_home, "cli", """
        def register(ctx):
            ctx.register_cli_command("honk", "make noise", lambda p: None, description="Honks loudly")
            ctx.register_command("profile", lambda raw: ctx.profile_name)
    """)
    write_config(hermes_home, "plugins:\n  enabled: [cli]\n")
    (hermes_home / "auth.json").write_text(json.dumps({"default_profile": "work", "profiles": {"work": {}}}))
    (hermes_home / "auth.json").chmod(0o600)
    import plugin_llm.plugins as plugins

    monkeypatch.setattr(plugins, "_MANAGERS", {})
    assert "profile" in plugins.get_plugin_commands()  # discovered on first use, like Hermes
    assert plugins.get_plugin_command_handler("profile")("") == "work"
    manager = plugins.get_plugin_manager()
    assert manager.cli_commands["honk"].description == "Honks loudly"


# --------------------------------------------------------------------------- capability consent


def make_source(tmp_path: Path, capabilities: list[str]) -> Path:
    src = tmp_path / "src" / "capper"
    src.mkdir(parents=True, exist_ok=True)
    (src / "plugin.yaml").write_text(f"name: capper\nversion: '1'\ncapabilities: {json.dumps(capabilities)}\n")
    (src / "__init__.py").write_text(
        "def register(ctx):\n    ctx.register_command('caps', lambda raw: ','.join(\n"
        "        c for c in ('llm.model_override', 'llm.provider_override') if ctx.has_capability(c)))\n")
    return src


def policy(home: Path, key: str = "capper"):
    return get_config_source(home).current().trust_for(key)


def test_a_non_interactive_install_grants_nothing_and_consent_grants(hermes_home, tmp_path, capsys):
    src = make_source(tmp_path, ["llm.model_override"])
    code, out, err = run(capsys, "plugins", "install", str(src), "--enable")
    assert code == 0, err
    assert "Capabilities not granted: llm.model_override" in out and "plugins consent capper" in out
    assert policy(hermes_home).grants("model") is None
    assert load(hermes_home).run_command("caps") == ""
    code, out, err = run(capsys, "plugins", "consent", "capper", "--yes")
    assert code == 0, err and "Granted llm.model_override" in out
    assert policy(hermes_home).grants("model") == "capability llm.model_override"
    assert policy(hermes_home).grants("provider") is None
    assert load(hermes_home).run_command("caps") == "llm.model_override"
    code, out, _ = run(capsys, "trust", "explain", "capper", "--model", "gpt-4o")
    assert "allowed by the granted capability llm.model_override" in out
    code, out, _ = run(capsys, "trust", "show", "capper")
    assert "may override model (by capability llm.model_override)" in out
    assert "capability llm.model_override  granted (consent recorded)" in out


def test_the_trust_gate_allows_an_override_by_flag_or_granted_capability():
    from plugin_llm.trust import Overrides, TrustPolicy, decide

    ask = Overrides(model="gpt-4o")
    assert not decide("p", TrustPolicy(), ask).allowed
    by_capability = decide("p", TrustPolicy(granted_capabilities=("llm.model_override",)), ask)
    assert by_capability.allowed and by_capability.reason == "overrides granted by capability llm.model_override"
    assert decide("p", TrustPolicy(allow_model_override=True), ask).reason == "overrides granted by allow_model_override"
    listed = TrustPolicy(granted_capabilities=("llm.model_override",), allowed_models=("gpt-4o-mini",))
    assert not decide("p", listed, ask).allowed  # the allowlist applies either way
    assert not decide("p", TrustPolicy(granted_capabilities=("llm.model_override",)), Overrides(provider="x")).allowed


def test_install_on_a_terminal_shows_the_capabilities_and_asks(hermes_home, tmp_path, capsys, monkeypatch):
    src = make_source(tmp_path, ["llm.model_override"])
    monkeypatch.setattr(terminal, "interactive", lambda: True)
    answers = iter(["n", "y"])  # enable? / grant?
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    code, out, err = run(capsys, "plugins", "install", str(src))
    assert code == 0, err
    assert "capper requests these capabilities:" in out and "choose the model of its ctx.llm calls" in out
    assert "Granted llm.model_override to capper" in out
    assert policy(hermes_home).grants("model") == "capability llm.model_override"


def test_an_update_requesting_more_needs_consent_again(hermes_home, tmp_path, capsys):
    src = make_source(tmp_path, ["llm.model_override"])
    assert run(capsys, "plugins", "install", str(src), "--enable")[0] == 0
    assert run(capsys, "plugins", "consent", "capper", "--yes")[0] == 0
    make_source(tmp_path, ["llm.model_override", "llm.provider_override"])
    code, out, err = run(capsys, "plugins", "update", "capper")
    assert code == 0, err
    assert "Capabilities not granted: llm.provider_override" in out
    assert policy(hermes_home).grants("model") == "capability llm.model_override"  # kept
    assert policy(hermes_home).grants("provider") is None  # new: not granted until consent
    assert load(hermes_home).run_command("caps") == "llm.model_override"


def test_a_hand_edited_grant_grants_nothing(hermes_home):
    write_plugin(hermes_home, "capper", "def register(ctx): pass\n",
                 "name: capper\ncapabilities: [llm.model_override]\n")
    write_config(hermes_home, "plugins:\n  enabled: [capper]\n  entries:\n    capper:\n"
                              "      granted_capabilities: [llm.model_override]\n      capabilities_sha256: forged\n")
    config = get_config_source(hermes_home).current()
    assert config.trust_for("capper").grants("model") is None
    assert any("does not match" in w and "plugins consent capper" in w for w in config.warnings)


# --------------------------------------------------------------------------- keys named the old way


def test_trust_check_says_did_you_mean_for_an_old_manifest_name_key(hermes_home, capsys):
    write_plugin(hermes_home, "browser/browser_use", "def register(ctx): pass\n", "name: browser-browser-use\n")
    write_config(hermes_home, "plugins:\n  enabled: [browser/browser-browser-use]\n  entries:\n"
                              "    browser/browser-browser-use:\n      llm:\n        allow_model_override: true\n")
    code, out, err = run(capsys, "trust", "check")
    text = out + err
    assert code != 0
    assert "old manifest-name key of 'browser/browser_use' (did you mean 'browser/browser_use'?)" in text
    assert get_config_source(hermes_home).current().trust_for("browser/browser_use").allow_model_override is False
    assert by_key(load(hermes_home))["browser/browser_use"]["status"] == "not enabled"


def test_request_middleware_rewrites_tool_args_before_the_guards_and_model_requests(hermes_home):
    write_plugin(hermes_home, "tools", TOOL)
    write_plugin(hermes_home, "rewrite", """
        SEEN = []
        def tool_req(tool_name, args, original_args, **kw):
            return {"args": {**args, "x": args["x"].upper()}}
        def guard(tool_name, args, **kw):
            SEEN.append(args["x"])
        def broken(args, **kw):
            raise RuntimeError("bug")
        def llm_req(request, **kw):
            return {"request": {**request, "messages": [{"role": "system", "content": "REWRITTEN"}]
                                + request["messages"][1:]}}
        def register(ctx):
            ctx.register_middleware("tool_request", broken)
            ctx.register_middleware("tool_request", tool_req)
            ctx.register_hook("pre_tool_call", guard)
            ctx.register_middleware("llm_request", llm_req)
            ctx.register_command("seen", lambda raw: ",".join(SEEN))
    """)
    write_config(hermes_home, "plugins:\n  enabled: [tools, rewrite]\n")
    manager = load(hermes_home)
    assert manager.dispatch_tool("echo", {"x": "abc"}) == "echo:ABC"
    assert manager.run_command("seen") == "ABC"  # the guard saw the rewritten arguments
    llm = ScriptedLlm(reply("ok"))
    with Session(manager, llm=llm) as session:
        session.run_turn("hello")
    assert llm.requests[0]["messages"][0] == {"role": "system", "content": "REWRITTEN"}


def test_a_hermes_only_registration_fails_with_one_line_naming_the_subsystem(hermes_home):
    write_plugin(hermes_home, "search", "def register(ctx):\n    ctx.register_web_search_provider(object())\n")
    write_config(hermes_home, "plugins:\n  enabled: [search]\n")
    error = by_key(load(hermes_home))["search"]["error"].splitlines()[0]
    assert error == ("register() raised: HermesSubsystemMissing: ctx.register_web_search_provider() registers "
                     "with Hermes's web search, which plugin-llm does not provide")


# --------------------------------------------------------------------------- consent as Hermes writes it

CAPS = """
IDS = ("tools.override", "llm.provider_override", "llm.model_override", "llm.agent_id_override",
       "llm.profile_override", "llm.task_override", "gateway.platform_actions", "gateway.plugin_status",
       "no.such_capability", "")

def register(ctx):
    ctx.register_command("caps", lambda raw: ",".join(c for c in IDS if ctx.has_capability(c)))
"""
HERMES_GRANT = """plugins:
  enabled: [capper]
  entries:
    capper:
      granted_capabilities: [llm.model_override, tools.override, 7, unknown.capability]
      capabilities_consent:
        hash: 3b1d9c1f0a4f6f2b8e3c7d1a9e5b2c4d6f8a0b1c3d5e7f9a1b3c5d7e9f0a2b4c
        granted_at: '2026-09-20T10:00:00+00:00'
"""


def test_a_grant_as_hermes_writes_it_is_honoured_and_consent_binds_it(hermes_home, capsys):
    write_plugin(hermes_home, "capper", CAPS, "name: capper\ncapabilities: [llm.model_override, tools.override]\n")
    write_config(hermes_home, HERMES_GRANT)
    config = get_config_source(hermes_home).current()
    assert config.trust_for("capper").grants("model") == "capability llm.model_override"
    assert config.trust_for("capper").grants("provider") is None  # only what the operator granted
    assert not any("does not match" in w for w in config.warnings)
    assert load(hermes_home).run_command("caps") == "tools.override,llm.model_override"
    code, out, err = run(capsys, "trust", "show", "capper")
    assert "granted (as Hermes records it, not bound: plugin-llm plugins consent capper binds it)" in out
    assert "capabilities_consent" not in out + err  # a key Hermes writes is not reported as unknown

    code, out, err = run(capsys, "plugins", "consent", "capper", "--json")  # nobody to ask: not bound
    assert code == 0, err
    assert json.loads(out) == {"key": "capper", "requested": ["llm.model_override", "tools.override"],
                               "granted": ["llm.model_override", "tools.override"], "pending": [], "bound": False}
    code, out, err = run(capsys, "plugins", "consent", "capper", "--yes")
    assert code == 0, err
    assert "granted as Hermes records it" in out and "Granted llm.model_override, tools.override to capper" in out
    assert "consent recorded" in run(capsys, "trust", "show", "capper")[1]
    assert "as Hermes records it" not in run(capsys, "trust", "check")[1]  # bound: nothing to offer
    import hashlib
    import yaml

    entry = yaml.safe_load((hermes_home / "config.yaml").read_text())["plugins"]["entries"]["capper"]
    seen = hashlib.sha256(b"llm.model_override\ntools.override").hexdigest()  # Hermes's hash of what was asked
    assert entry["capabilities_consent"]["hash"] == seen and entry["capabilities_consent"]["granted_at"]
    assert load(hermes_home).run_command("caps") == "tools.override,llm.model_override"
    # bound now: an edit of the list after the consent grants nothing
    text = (hermes_home / "config.yaml").read_text()
    assert "granted_capabilities: [llm.model_override, tools.override]" in text
    (hermes_home / "config.yaml").write_text(text.replace("[llm.model_override,", "[llm.provider_override,"))
    assert get_config_source(hermes_home).current().trust_for("capper").grants("provider") is None
    assert load(hermes_home).run_command("caps") == ""


def test_has_capability_counts_the_older_allow_keys_as_hermes_does(hermes_home):
    write_plugin(hermes_home, "capper", CAPS, "name: capper\n")  # requests nothing
    write_config(hermes_home, "plugins:\n  enabled: [capper]\n  entries:\n    capper:\n"
                              "      allow_tool_override: true\n      allow_platform_actions: true\n"
                              "      llm:\n        allow_provider_override: true\n")
    assert load(hermes_home).run_command("caps") == "tools.override,llm.provider_override,gateway.platform_actions"
    write_config(hermes_home, "plugins:\n  enabled: [capper]\n  entries:\n    capper:\n"
                              "      allow_tool_override: 'yes'\n      allow_plugin_status: 1\n")
    assert load(hermes_home).run_command("caps") == ""  # only true is true (fail closed)


def test_a_granted_tools_override_lets_a_plugin_replace_a_tool(hermes_home):
    write_plugin(hermes_home, "tools", TOOL)
    write_plugin(hermes_home, "zover", OVERRIDE, "name: zover\ncapabilities: [tools.override]\n")
    write_config(hermes_home, "plugins:\n  enabled: [tools, zover]\n  entries:\n    zover:\n"
                              "      granted_capabilities: [tools.override]\n")
    manager = load(hermes_home)
    assert manager.dispatch_tool("echo", {"x": "a"}) == "replaced"
    assert manager.tools["echo"].plugin_key == "zover"


def test_a_config_hermes_wrote_for_a_full_consent_passes_trust_check(hermes_home, capsys):
    write_plugin(hermes_home, "capper", CAPS, "name: capper\ncapabilities: [llm.task_override, tools.override]\n")
    # Hermes's record_consent: the grant, its record, and each grant mirrored into its older key
    write_config(hermes_home, "plugins:\n  enabled: [capper]\n  entries:\n    capper:\n"
                              "      granted_capabilities: [gateway.plugin_status, llm.task_override, tools.override]\n"
                              "      capabilities_consent: {hash: abc, granted_at: '2026-09-20T10:00:00+00:00'}\n"
                              "      allow_tool_override: true\n      allow_plugin_status: true\n"
                              "      llm:\n        allow_task_override: true\n")
    code, out, err = run(capsys, "trust", "check")
    assert code == 0, out + err
    assert "allow_model_override" not in out + err  # never "did you mean" a wider flag
    assert "as Hermes records it (no capabilities_sha256): honoured" in out  # a warning offering to bind
    assert "bind it: plugin-llm plugins consent capper --yes" in out
    assert not get_config_source(hermes_home).current().warnings
    assert load(hermes_home).run_command("caps") == "tools.override,llm.task_override,gateway.plugin_status"
