"""Nothing before the trust gate waits for litellm: a call refused before it is sent never loads
the provider layer; an allowed call loads it just before its first request, outside its latency,
and only when its route needs litellm's translation (not the local model, not an OpenAI route).

Each case runs in a fresh interpreter, so that ``'litellm' in sys.modules`` says what the call did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply
from tests.test_transport_parity import configure

ROOT = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "hi"}]

#: runs one call in a fresh process; prints what it raised, and whether litellm was imported
_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    from plugin_llm import PluginLlm

    USER = [{"role": "user", "content": "hi"}]
    how, kwargs = sys.argv[1], json.loads(sys.argv[2])
    llm = PluginLlm("p")

    async def astream():
        stream = await llm.astream(USER, **kwargs)
        return "".join([delta async for delta in stream])

    def run():
        if how == "complete":
            return llm.complete(USER, **kwargs).text
        if how == "acomplete":
            return asyncio.run(llm.acomplete(USER, **kwargs)).text
        if how == "stream":
            return "".join(llm.stream(USER, **kwargs))
        if how == "astream":
            return asyncio.run(astream())
        if how == "structured":
            return llm.complete_structured(instructions="say hi", input="hi", **kwargs).text
        if how == "invalid":
            return llm.complete([{"role": "nobody", "content": 3}], **kwargs).text
        raise SystemExit(how)

    try:
        outcome = {"text": run()}
    except Exception as exc:
        outcome = {"error": type(exc).__name__}
    outcome["litellm"] = "litellm" in sys.modules
    outcome["unneeded"] = sorted({"jsonschema"} & set(sys.modules))
    print(json.dumps(outcome))
""")


def _call(how: str, **kwargs: object) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, how, json.dumps(kwargs)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("how", ["complete", "acomplete", "stream", "astream", "structured"])
def test_a_trust_denial_is_audited_without_loading_litellm(hermes_home: Path, how: str) -> None:
    outcome = _call(how, model="local-echo-2")  # a model override the plugin is not allowed
    # nor a schema validator (loaded on first use)
    assert outcome == {"error": "PluginLlmTrustError", "litellm": False, "unneeded": []}
    [line] = audit_lines(hermes_home)
    assert line["status"] == "denied" and line["decision"] == "denied"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["complete", "acomplete", "stream", "astream"])
def test_a_limit_refusal_is_audited_without_loading_litellm(hermes_home: Path, how: str) -> None:
    write_config(hermes_home, "model: {provider: local, model: local-echo-1}\nlimits: {store: local}\n"
                              "plugins:\n  entries:\n    p: {limits: {tokens_per_minute: 1}}\n")
    outcome = _call(how)
    assert outcome["error"] == "PluginLlmLimitError" and outcome["litellm"] is False
    [line] = audit_lines(hermes_home)
    assert line["status"] == "quota"


@pytest.mark.slow
def test_invalid_input_is_refused_without_loading_litellm(hermes_home: Path) -> None:
    outcome = _call("invalid")
    assert outcome["litellm"] is False and "error" in outcome
    assert audit_lines(hermes_home) == []  # bad input is no call: nothing on record


@pytest.mark.slow
@pytest.mark.parametrize("how", ["complete", "acomplete", "stream", "astream"])
def test_a_local_model_call_answers_without_litellm(hermes_home: Path, how: str) -> None:
    outcome = _call(how)
    assert outcome["litellm"] is False and "hi" in outcome["text"]
    [line] = audit_lines(hermes_home)
    assert line["status"] == "ok" and line["latency_ms"] >= line["overhead_ms"] >= 0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["complete", "acomplete", "stream", "astream"])
def test_an_openai_compatible_call_answers_without_litellm(hermes_home: Path, how: str) -> None:
    with FakeServer() as fake:
        fake.default = Reply(content="hi from upstream")
        write_config(hermes_home, f"model: {{provider: custom, model: gpt-4o, base_url: '{fake.base_url}'}}\n")
        outcome = _call(how)
        assert fake.requests[0].json["model"] == "gpt-4o"
    assert outcome == {"text": "hi from upstream", "litellm": False, "unneeded": []}
    [line] = audit_lines(hermes_home)
    assert line["status"] == "ok" and line["cost_usd"] > 0  # priced from litellm's map, read as a file


@pytest.mark.slow
@pytest.mark.parametrize("how", ["complete", "acomplete"])
def test_a_call_that_needs_litellms_translation_loads_it(hermes_home: Path, how: str) -> None:
    """Anthropic's request is litellm's translation: litellm is loaded for it (the endpoint is closed)."""
    with FakeServer() as fake:
        closed = fake.base_url
    configure(hermes_home, closed, provider="anthropic", model="claude-sonnet-4-5")
    outcome = _call(how)
    assert outcome["litellm"] is True and outcome["error"] == "PluginLlmProviderError"


#: the import made slow on the call's clock (a fake clock that the import advances by 1000 s)
_SLOW_LOAD = textwrap.dedent("""
    import asyncio, json, sys
    from plugin_llm import PluginLlm
    from plugin_llm.transport import _loading

    now = [0.0]
    real_import = _loading._import
    def slow_import():
        now[0] += 1000.0
        real_import()
    _loading._import = slow_import
    llm = PluginLlm("p", clock=lambda: now[0])
    how = sys.argv[1]
    if how == "complete":
        llm.complete([{"role": "user", "content": "hi"}])
    elif how == "acomplete":
        asyncio.run(llm.acomplete([{"role": "user", "content": "hi"}]))
    elif how == "structured":
        llm.complete_structured(instructions="hi", input="hi", json_schema={"type": "object"})
    else:
        "".join(llm.stream([{"role": "user", "content": "hi"}]))
    print(json.dumps({"clock": now[0]}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["complete", "acomplete", "stream", "structured"])
def test_the_one_time_import_inside_a_call_is_not_its_latency(hermes_home: Path, how: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLUGIN_LLM_OWN_PATH": "0"}  # the local model through litellm
    done = subprocess.run([sys.executable, "-c", _SLOW_LOAD, how], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"clock": 1000.0}  # the import did happen in the call
    [line] = audit_lines(hermes_home)
    assert line["status"] in ("ok", "schema_error") and line["latency_ms"] == 0.0 and line["overhead_ms"] <= 0.0
