"""``ctx.llm(..., task=)``: the task gate, the ``auxiliary:`` slots as routes, and
``ctx.register_auxiliary_task``."""

from __future__ import annotations

import pytest

from plugin_llm.config import parse_config
from plugin_llm.trust import BUILTIN_TASKS, TrustPolicy, decide_task

USER = [{"role": "user", "content": "hi"}]


# ------------------------------------------------------------------ the task gate (pure)
def test_a_task_the_plugin_registered_needs_no_flag():
    decision = decide_task("p", TrustPolicy(), "p_summary", owner="p")
    assert decision.allowed and "registered by the plugin" in decision.reason


def test_a_builtin_task_needs_allow_task_override_or_its_capability():
    refused = decide_task("p", TrustPolicy(), "vision", owner=None)
    assert not refused.allowed and refused.config_key == "plugins.entries.p.llm.allow_task_override"
    assert "llm.task_override" in refused.reason
    assert decide_task("p", TrustPolicy(allow_task_override=True), "vision", None).allowed
    by_capability = decide_task("p", TrustPolicy(granted_capabilities=("llm.task_override",)), "vision", None)
    assert by_capability.allowed and "capability llm.task_override" in by_capability.reason


@pytest.mark.parametrize("owner", [None, "other"])
def test_any_other_task_is_refused_even_with_the_flag(owner):
    decision = decide_task("p", TrustPolicy(allow_task_override=True), "other_summary", owner)
    assert not decision.allowed and decision.config_key is None
    assert "plugin 'p'" in decision.reason and "'other_summary'" in decision.reason
    assert ("registered by plugin 'other'" in decision.reason) == (owner == "other")


def test_the_builtin_tasks_are_hermess():
    assert {"vision", "compression", "web_extract", "title_generation", "curator"} <= BUILTIN_TASKS
    assert len(BUILTIN_TASKS) == 13


def test_allow_task_override_is_a_trust_key_of_config_yaml(tmp_path):
    config = parse_config(tmp_path, "plugins:\n  entries:\n    p: {llm: {allow_task_override: true}}\n"
                                    "    q: {llm: {allow_task_overide: true}}\n")
    assert config.trust_for("p").allow_task_override is True
    assert config.trust_for("p").grants_task() == "allow_task_override"
    assert config.trust_for("q").grants_task() is None
    assert any("allow_task_overide: unknown key" in w and "did you mean 'allow_task_override'" in w
               for w in config.warnings)


# ------------------------------------------------------------------ auxiliary: in config.yaml
CATALOG = ("models:\n"
           "  fast: {provider: openai, model: gpt-4o-mini, fallbacks: [smart]}\n"
           "  smart: {provider: anthropic, model: claude-sonnet-4-5}\n"
           "model: {route: fast}\n")


def test_a_slot_is_a_route_name_a_route_with_fallbacks_or_hermess_inline_shape(tmp_path):
    config = parse_config(tmp_path, CATALOG + (
        "auxiliary:\n"
        "  p_summary: smart\n"
        "  vision: {route: fast, fallbacks: [], timeout: 12}\n"
        "  compression: {route: fast}\n"
        "  web_extract: {provider: custom, model: llama3, base_url: 'http://127.0.0.1:9/v1', timeout: 90,\n"
        "                fallback_chain: [smart, {provider: openai, model: gpt-4o}]}\n"
        "  title_generation: {provider: auto, model: gpt-4.1-nano}\n"
        "  curator: {base_url: 'http://127.0.0.1:9/v1', model: m}\n"
    ))
    assert not config.warnings
    slots = config.auxiliary
    assert slots["p_summary"].route.name == "smart" and slots["p_summary"].fallbacks == ()
    assert slots["vision"].route.name == "fast" and slots["vision"].fallbacks == () and slots["vision"].timeout == 12.0
    assert [r.name for r in slots["compression"].fallbacks] == ["smart"]  # the route's own fallbacks
    web = slots["web_extract"]
    assert (web.route.provider, web.route.model, web.route.name, web.timeout) == ("custom", "llama3", None, 90.0)
    assert [(r.provider, r.model) for r in web.fallbacks] == [("anthropic", "claude-sonnet-4-5"), ("openai", "gpt-4o")]
    title = slots["title_generation"].route  # provider auto: the default route's provider, another model
    assert (title.provider, title.model, title.name) == ("openai", "gpt-4.1-nano", None)
    assert (slots["curator"].route.provider, slots["curator"].route.model) == ("custom", "m")


def test_hermess_default_slot_is_the_default_route(tmp_path):
    config = parse_config(tmp_path, CATALOG + (
        "auxiliary:\n"
        "  vision: {provider: auto, model: '', base_url: '', api_key: '', timeout: 60, extra_body: {}}\n"
        "  mcp: {provider: auto, model: ''}\n"
        "  approval: auto\n"
    ))
    assert not config.warnings
    assert config.auxiliary["vision"].route is None and config.auxiliary["vision"].timeout == 60.0
    assert "mcp" not in config.auxiliary and "approval" not in config.auxiliary


def test_a_key_in_a_slot_is_refused_with_a_warning_and_never_kept(tmp_path):
    config = parse_config(tmp_path, CATALOG + (
        "auxiliary:\n"
        "  vision: {provider: openai, model: gpt-4o, api_key: sk-slot-secret-123}\n"
    ))
    [warning] = config.warnings
    assert "auxiliary.vision.api_key: ignored: keys live in auth.json only" in warning
    assert "sk-slot-secret-123" not in warning and "sk-slot-secret-123" not in repr(config.auxiliary)
    assert (config.auxiliary["vision"].route.provider, config.auxiliary["vision"].route.model) == ("openai", "gpt-4o")


def test_slot_mistakes_are_warned_with_the_fix(tmp_path):
    config = parse_config(tmp_path, CATALOG + (
        "auxiliary:\n"
        "  vision: {route: fsat}\n"
        "  mcp: {route: fast, fallbaks: [smart]}\n"
        "  'bad key': fast\n"
        "  compression: {provider: openai, model: gpt-4o, timeout: -1, extra_body: {x: 1}}\n"
        "  curator: [fast]\n"
    ))
    text = "\n".join(config.warnings)
    assert "auxiliary.vision.route 'fsat' is not a route of models: (did you mean 'fast'?)" in text
    assert config.auxiliary["vision"].route.problem is not None  # its calls are refused, with those words
    assert "auxiliary.mcp.'fallbaks': unknown key, ignored (did you mean 'fallbacks'?)" in text
    assert "auxiliary.'bad key': a task is letters, digits and '_'" in text
    assert "auxiliary.compression.timeout: expected seconds" in text
    assert "auxiliary.compression.extra_body: Hermes's request option is not applied here" in text
    assert "auxiliary.curator: expected a route name of models:" in text and "curator" not in config.auxiliary


def test_auxiliary_is_a_host_section_now(tmp_path):
    from plugin_llm.config import HOST_SECTIONS, unknown_sections

    assert "auxiliary" in HOST_SECTIONS
    assert unknown_sections({"auxiliary": {}, "auxilary": {}}) == [("auxilary", "auxiliary")]


def test_a_key_written_twice_in_auxiliary_fails_closed_and_keeps_the_last_good_slots(hermes_home):
    from plugin_llm.config import get_config_source
    from tests.conftest import write_config

    source = get_config_source(hermes_home)
    write_config(hermes_home, CATALOG + "auxiliary:\n  vision: smart\n")
    assert source.current().auxiliary["vision"].route.name == "smart"
    write_config(hermes_home, CATALOG + "auxiliary:\n  vision: smart\n  vision: fast\n")
    broken = source.current()
    assert broken.error is not None and "vision" in broken.error
    assert broken.auxiliary["vision"].route.name == "smart"


# ------------------------------------------------------------------ routing (pure)
def test_a_tasks_slot_and_its_fallbacks_are_the_calls_chain(tmp_path):
    from plugin_llm.routing import resolve_chain

    config = parse_config(tmp_path, CATALOG + (
        "llm: {timeout: 30, max_timeout: 100}\n"
        "auxiliary:\n"
        "  vision: {route: smart, fallbacks: [fast], timeout: 250}\n"
        "  mcp: {provider: auto, timeout: 7}\n"
    ))
    chain = resolve_chain(config, task="vision")
    assert [r.label for r in chain] == ["smart", "fast"]
    assert chain[0].timeout == 100.0  # the slot's timeout, capped by llm.max_timeout
    assert resolve_chain(config, task="vision", timeout=5)[0].timeout == 5.0  # timeout= wins
    # the slot's route wins over a (granted) override: the route's provider and model, as Hermes attributes it
    assert [r.label for r in resolve_chain(config, provider="openai", model="gpt-4o", task="vision")] == ["smart", "fast"]
    # a task without a route in its slot is the call without the task (its timeout aside)
    mcp = resolve_chain(config, task="mcp")
    assert [r.label for r in mcp] == ["fast", "smart"] and mcp[0].timeout == 7.0
    assert [r.label for r in resolve_chain(config, task="p_unconfigured")] == ["fast", "smart"]
    assert [r.model for r in resolve_chain(config, model="gpt-4o", task="p_unconfigured")] == ["gpt-4o"]


def test_a_slot_naming_no_route_refuses_its_calls(tmp_path):
    from plugin_llm.errors import PluginLlmConfigError
    from plugin_llm.routing import resolve_chain

    config = parse_config(tmp_path, CATALOG + "auxiliary:\n  vision: {route: fsat}\n")
    with pytest.raises(PluginLlmConfigError, match="auxiliary.vision.route 'fsat' is not a route of models"):
        resolve_chain(config, task="vision")


# ------------------------------------------------------------------ ctx.llm(task=) in process
def _slots(home, main, aux, other, *, plugins: str = "", extra: str = "") -> None:
    from tests.conftest import write_config

    write_config(home, (
        "models:\n"
        f"  main: {{provider: custom, model: m-main, base_url: {main.base_url}}}\n"
        f"  aux: {{provider: custom, model: m-aux, base_url: {aux.base_url}}}\n"
        f"  other: {{provider: custom, model: m-other, base_url: {other.base_url}}}\n"
        "model: {route: main}\n"
        "llm: {max_retries: 0, breaker: false}\n"
        "auxiliary:\n"
        "  p_summary: aux\n"
        "  vision: {route: aux}\n"
        f"{extra}"
        f"{plugins}"
    ))


@pytest.fixture
def servers():
    from tests.servers import FakeServer

    with FakeServer() as main, FakeServer() as aux, FakeServer() as other:
        yield main, aux, other


def _owner(key: str) -> str | None:
    return {"p_summary": "p", "q_notes": "q"}.get(key)


@pytest.mark.slow
def test_a_registered_task_goes_to_its_slot_and_its_record_says_so(hermes_home, servers):
    from plugin_llm import PluginLlm
    from tests.conftest import audit_lines

    main, aux, other = servers
    _slots(hermes_home, main, aux, other)
    result = PluginLlm("p", task_owner=_owner).complete(USER, task="p_summary")
    assert len(aux.requests) == 1 and not main.requests and aux.requests[0].json["model"] == "m-aux"
    assert result.audit["task"] == "p_summary" and result.provider == "custom"
    [record] = audit_lines(hermes_home)
    assert (record["task"], record["route"], record["gen_ai.request.model"]) == ("p_summary", "aux", "m-aux")
    assert "task 'p_summary' registered by the plugin" in record["decision_reason"]


@pytest.mark.slow
@pytest.mark.parametrize("task", [None, "", "auto", "  AUTO ", "Auto"])
def test_no_task_or_auto_is_the_default_route(hermes_home, servers, task):
    from plugin_llm import PluginLlm
    from tests.conftest import audit_lines

    main, aux, other = servers
    _slots(hermes_home, main, aux, other)
    result = PluginLlm("p", task_owner=_owner).complete(USER, task=task)
    assert len(main.requests) == 1 and not aux.requests
    assert result.audit["task"] == ""
    assert "task" not in audit_lines(hermes_home)[0]


@pytest.mark.slow
def test_a_builtin_task_is_refused_without_allow_task_override_and_taken_with_it(hermes_home, servers):
    from plugin_llm import PluginLlm, PluginLlmTrustError
    from tests.conftest import audit_lines

    main, aux, other = servers
    _slots(hermes_home, main, aux, other)
    with pytest.raises(PluginLlmTrustError) as caught:
        PluginLlm("p").complete(USER, task="vision")
    assert caught.value.config_key == "plugins.entries.p.llm.allow_task_override"
    assert not main.requests and not aux.requests
    [denied] = audit_lines(hermes_home)
    assert (denied["status"], denied["task"], denied["decision_key"]) == \
        ("denied", "vision", "plugins.entries.p.llm.allow_task_override")
    _slots(hermes_home, main, aux, other, plugins="plugins:\n  entries:\n    p: {llm: {allow_task_override: true}}\n")
    assert PluginLlm("p").complete(USER, task="vision").audit["task"] == "vision"
    assert len(aux.requests) == 1 and not main.requests


@pytest.mark.slow
@pytest.mark.parametrize("task", ["q_notes", "p_unknown", "VISION"])
def test_any_other_task_is_refused_and_audited_with_its_key_before_anything_is_sent(hermes_home, servers, task):
    from plugin_llm import PluginLlm, PluginLlmTrustError
    from tests.conftest import audit_lines

    main, aux, other = servers
    _slots(hermes_home, main, aux, other, plugins="plugins:\n  entries:\n    p: {llm: {allow_task_override: true}}\n")
    with pytest.raises(PluginLlmTrustError, match=f"plugin 'p' may not use task '{task}'"):
        PluginLlm("p", task_owner=_owner).complete(USER, task=task)
    assert not main.requests and not aux.requests and not other.requests
    [record] = audit_lines(hermes_home)
    assert (record["status"], record["decision"], record["task"], record["attempts"]) == ("denied", "denied", task, 0)


@pytest.mark.slow
def test_the_task_gate_runs_before_the_override_gates(hermes_home, servers):
    from plugin_llm import PluginLlm, PluginLlmTrustError

    main, aux, other = servers
    _slots(hermes_home, main, aux, other)
    with pytest.raises(PluginLlmTrustError, match="may not use task 'p_unknown'"):
        PluginLlm("p", task_owner=_owner).complete(USER, task="p_unknown", model="other")  # no model grant either
    with pytest.raises(PluginLlmTrustError, match="may not override model"):  # a good task: the next gate decides
        PluginLlm("p", task_owner=_owner).complete(USER, task="p_summary", model="other")
    assert not main.requests and not aux.requests and not other.requests


@pytest.mark.slow
def test_a_granted_override_does_not_move_a_task_off_its_slot_but_does_without_a_slot(hermes_home, servers):
    from plugin_llm import PluginLlm

    main, aux, other = servers
    grant = "plugins:\n  entries:\n    p: {llm: {allow_model_override: true, allowed_models: [other]}}\n"
    _slots(hermes_home, main, aux, other, plugins=grant)
    llm = PluginLlm("p", task_owner=lambda key: "p")
    assert llm.complete(USER, task="p_summary", model="other").audit["task"] == "p_summary"
    assert len(aux.requests) == 1 and not other.requests  # route provider > override
    llm.complete(USER, task="p_no_slot", model="other")
    assert len(other.requests) == 1  # no slot: the override applies as without a task


@pytest.mark.slow
def test_the_slots_fallback_answers_when_its_route_fails(hermes_home, servers):
    from plugin_llm import PluginLlm
    from tests.conftest import audit_lines
    from tests.servers import Reply

    main, aux, other = servers
    aux.push(Reply.error(503, "overloaded"))
    _slots(hermes_home, main, aux, other, extra="  p_report: {route: aux, fallbacks: [other]}\n")
    result = PluginLlm("p", task_owner=lambda key: "p").complete(USER, task="p_report")
    assert result.text == "ok" and len(aux.requests) == 1 and len(other.requests) == 1 and not main.requests
    [record] = audit_lines(hermes_home)
    assert record["route"] == "other" and [a["route"] for a in record["route.attempts"]] == ["aux", "other"]


def test_task_must_be_a_short_string():
    from plugin_llm.call.validate import check_task

    assert [check_task(t) for t in (None, "", " auto ", "AUTO", " p_summary ")] == ["", "", "", "", "p_summary"]
    with pytest.raises(TypeError, match="task must be a string"):
        check_task(3)
    with pytest.raises(ValueError, match="task must be at most 256 characters"):
        check_task("x" * 300)
    with pytest.raises(ValueError, match="task has a lone surrogate"):
        check_task("p\ud800x")


@pytest.mark.slow
def test_structured_calls_and_streams_take_the_task_too(hermes_home, servers):
    import asyncio

    from plugin_llm import PluginLlm
    from tests.conftest import audit_lines
    from tests.servers import Reply

    main, aux, other = servers
    aux.push(Reply(content='{"n": 1}'), Reply(content="streamed"), Reply(content='{"n": 2}'))
    _slots(hermes_home, main, aux, other)
    llm = PluginLlm("p", task_owner=_owner)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert llm.complete_structured(instructions="n?", input="x", json_schema=schema, task="p_summary").parsed == {"n": 1}
    stream = llm.stream(USER, task="p_summary")
    assert "".join(stream) == "streamed" and stream.result.audit["task"] == "p_summary"
    result = asyncio.run(llm.acomplete_structured(instructions="n?", input="x", json_schema=schema, task="p_summary"))
    assert result.parsed == {"n": 2} and len(aux.requests) == 3 and not main.requests
    assert [r["task"] for r in audit_lines(hermes_home)] == ["p_summary"] * 3


# ------------------------------------------------------------------ ctx.register_auxiliary_task
ASKER = '''
import json

STOLEN = None


def register(ctx):
    global STOLEN
    ctx.register_auxiliary_task("{own}", display_name="Own task", description="the plugin's own",
                                defaults={{"provider": "openai", "model": "gpt-4o", "api_key": "sk-dflt-123"}})
    try:
        ctx.register_auxiliary_task("{steal}", display_name="Not mine", description="another plugin's")
    except ValueError as exc:
        STOLEN = str(exc)
    ctx.register_command("{name}-ask", lambda raw: ask(ctx, raw.strip()))
    ctx.register_command("{name}-stolen", lambda raw: STOLEN or "")


def ask(ctx, task):
    try:
        result = ctx.llm.complete([{{"role": "user", "content": "hi"}}], task=task or None)
    except Exception as exc:
        return json.dumps({{"error": type(exc).__name__, "message": str(exc)}})
    return json.dumps({{"task": result.audit["task"], "model": result.model}})
'''


def _two_plugins(home, main, aux, other, isolation: str | None):
    import yaml

    from tests.conftest import write_config
    from tests.plugin_fixtures import write_plugin

    write_plugin(home / "plugins", "p", ASKER.format(own="p_summary", steal="p_summary", name="p"))  # its own again
    write_plugin(home / "plugins", "q", ASKER.format(own="q_notes", steal="p_summary", name="q"))
    entries = {key: {"isolation": isolation} for key in ("p", "q")} if isolation else {}
    write_config(home, yaml.safe_dump({
        "models": {"main": {"provider": "custom", "model": "m-main", "base_url": main.base_url},
                   "aux": {"provider": "custom", "model": "m-aux", "base_url": aux.base_url},
                   "other": {"provider": "custom", "model": "m-other", "base_url": other.base_url}},
        "model": {"route": "main"},
        "llm": {"max_retries": 0, "breaker": False},
        "auxiliary": {"p_summary": "aux", "q_notes": "other"},
        "plugins": {"enabled": ["p", "q"], "entries": entries},
    }))


@pytest.mark.slow
@pytest.mark.parametrize("isolation", [None, "process"])
def test_a_plugins_own_task_routes_to_its_slot_in_process_and_isolated(hermes_home, servers, isolation):
    import json

    from plugin_llm.plugins import PluginManager
    from tests.bounded import run_bounded
    from tests.conftest import audit_lines

    main, aux, other = servers
    _two_plugins(hermes_home, main, aux, other, isolation)
    manager = PluginManager(hermes_home)
    try:
        manager.discover_plugins()
        listed = {p["key"]: p for p in manager.list_plugins()}
        assert [listed[k]["status"] for k in "pq"] == ["enabled", "enabled"], listed
        assert listed["p"]["auxiliary_tasks"] == ["p_summary"] and listed["q"]["auxiliary_tasks"] == ["q_notes"]

        def ask(plugin: str, task: str) -> dict:
            return json.loads(run_bounded(lambda: manager.run_command(f"{plugin}-ask", task), 60))

        assert ask("p", "p_summary") == {"task": "p_summary", "model": "fake-model-2024-01-01"}
        assert len(aux.requests) == 1 and aux.requests[0].json["model"] == "m-aux"
        assert ask("q", "q_notes")["task"] == "q_notes" and len(other.requests) == 1
        refused = ask("p", "q_notes")  # q's task: never p's, never the default route
        assert refused["error"] == "PluginLlmTrustError"
        assert "may not use task 'q_notes': it is registered by plugin 'q'" in refused["message"]
        assert ask("p", "auto") == {"task": "", "model": "fake-model-2024-01-01"} and len(main.requests) == 1
        assert len(aux.requests) == 1 and len(other.requests) == 1
        # the second plugin to claim a key is refused at register time (the first keeps it)
        assert "already registered by plugin 'p'" in manager.run_command("q-stolen", "")
        assert manager.run_command("p-stolen", "") == ""  # a plugin's own key again: replaced, no error
        records = audit_lines(hermes_home)
        assert [(r["plugin_id"], r.get("task"), r["status"]) for r in records] == [
            ("p", "p_summary", "ok"), ("q", "q_notes", "ok"), ("p", "q_notes", "denied"), ("p", None, "ok")]
        assert manager.auxiliary_tasks["q_notes"].defaults == {"provider": "openai", "model": "gpt-4o"}  # no key kept
    finally:
        manager.shutdown()


@pytest.mark.slow
def test_register_auxiliary_task_checks_its_key_and_arguments(hermes_home):
    from plugin_llm.plugins import PluginManager
    from tests.plugin_fixtures import configure, write_plugin

    write_plugin(hermes_home / "plugins", "p", "CTX = None\n\ndef register(ctx):\n    global CTX\n    CTX = ctx\n")
    configure(hermes_home, enabled=["p"])
    manager = PluginManager(hermes_home)
    manager.discover_plugins()
    import sys

    ctx = sys.modules[manager.get_plugin("p")["module"]].CTX
    for key in ("vision", "curator"):
        with pytest.raises(ValueError, match=f"'{key}' is reserved for a built-in task; pick a key of the plugin's own "
                                             f"\\(e.g. 'p_{key}'\\)"):
            ctx.register_auxiliary_task(key, display_name="x", description="y")
    for key in ("bad-key", "", "a" * 65, "sp ace"):
        with pytest.raises(ValueError, match="letters, digits or '_'"):
            ctx.register_auxiliary_task(key, display_name="x", description="y")
    with pytest.raises(TypeError, match="display_name"):
        ctx.register_auxiliary_task("p_x", display_name=None, description="y")
    with pytest.raises(TypeError):  # keyword-only, as in Hermes
        ctx.register_auxiliary_task("p_x", "x", "y")
    with pytest.raises(TypeError, match="defaults must be a mapping"):
        ctx.register_auxiliary_task("p_x", display_name="x", description="y", defaults=["no"])
    handle = ctx.register_auxiliary_task("p_x", display_name="X", description="y")
    assert handle.key == "p_x" and handle.active and manager.auxiliary_task_owner("p_x") == "p"
    again = ctx.register_auxiliary_task("p_x", display_name="X2", description="y")  # its own key: replaced
    assert manager.auxiliary_tasks["p_x"] is again and not handle.active
    again.dispose()
    assert manager.auxiliary_task_owner("p_x") is None and not again.active
    ctx.register_auxiliary_task("p_y", display_name="Y", description="y")
    manager.unload("p")
    assert manager.auxiliary_task_owner("p_y") is None  # unloading removes its tasks


@pytest.mark.slow
def test_a_disposed_task_is_refused_again(hermes_home, servers):
    import sys

    from plugin_llm import PluginLlmTrustError
    from plugin_llm.plugins import PluginManager
    from tests.plugin_fixtures import write_plugin

    main, aux, other = servers
    write_plugin(hermes_home / "plugins", "p", "CTX = None\n\ndef register(ctx):\n    global CTX\n    CTX = ctx\n")
    _slots(hermes_home, main, aux, other, plugins="plugins:\n  enabled: [p]\n")
    manager = PluginManager(hermes_home)
    manager.discover_plugins()
    ctx = sys.modules[manager.get_plugin("p")["module"]].CTX
    handle = ctx.register_auxiliary_task("p_summary", display_name="S", description="d")
    assert ctx.llm.complete(USER, task="p_summary").audit["task"] == "p_summary" and len(aux.requests) == 1
    handle.dispose()
    with pytest.raises(PluginLlmTrustError, match="no plugin registered it"):
        ctx.llm.complete(USER, task="p_summary")
    assert len(aux.requests) == 1 and not main.requests


def test_the_services_bodies_take_task_on_every_endpoint():
    from plugin_llm.service import requests as req

    assert req.complete_kwargs({"messages": USER, "task": "vision"})[1] == {"task": "vision"}
    assert req.structured_kwargs({"instructions": "i", "input": "x", "task": "vision"})["task"] == "vision"
    assert req.chat_kwargs({"messages": USER, "task": "vision", "stream": True})[1] == {"task": "vision"}
    with pytest.raises(TypeError, match="did you mean 'task'"):
        req.complete_kwargs({"messages": USER, "tsk": "vision"})
