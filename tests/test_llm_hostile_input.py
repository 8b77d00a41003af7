"""Hardening: the call pipeline: hostile input, hostile transports, a log that breaks, absurd usage.

- every call outcome has exactly one audit record, whatever the transport raises or returns;
- bad ``messages`` / ``tools`` / structured input never reach the transport, and the errors are bounded;
- with ``audit.required`` the attempt is on record before the provider sees the request;
- provider-reported usage is clamped at the pipeline boundary, and ``audit stats`` survives old absurd values.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from audit import AuditLog, AuditSettings, verify
from plugin_llm import PluginLlm, PluginLlmConfigError, PluginLlmError, PluginLlmProviderError
from plugin_llm.llm import HostLlm
from plugin_llm.transport import TransportResponse
from plugin_llm.types import PluginLlmUsage
from tests.conftest import audit_lines, write_config
from tests.leaks import strings_reachable

ROOT = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "hello"}]
MODES = ["sync", "async"]


def ok_response(text: str = "fine", usage: PluginLlmUsage | None = None, **kw) -> TransportResponse:
    return TransportResponse(text, {"role": "assistant", "content": text}, "m-1",
                             usage or PluginLlmUsage(3, 2, 5, cost_usd=0.001), 1, 0.0, **kw)


class Fake:
    """A transport that answers with ``behaviour(request)`` (return a value or raise) and counts requests."""

    def __init__(self, behaviour=None):
        self.behaviour = behaviour or (lambda request: ok_response())
        self.requests = []

    def supports_json_schema(self, route):
        return True

    def complete(self, request):
        self.requests.append(request)
        return self.behaviour(request)

    async def acomplete(self, request):
        self.requests.append(request)
        return self.behaviour(request)


def call(llm, mode, *args, api="complete", **kwargs):
    """Run one public method in the given mode (the sync and async shells must behave alike)."""
    if api == "structured":
        return llm.complete_structured(**kwargs) if mode == "sync" else asyncio.run(llm.acomplete_structured(**kwargs))
    if api == "chat":
        return llm.chat(*args, **kwargs) if mode == "sync" else asyncio.run(llm.achat(*args, **kwargs))
    return llm.complete(*args, **kwargs) if mode == "sync" else asyncio.run(llm.acomplete(*args, **kwargs))


def raiser(exc):
    def behaviour(request):
        raise exc
    return behaviour


# -- every outcome audited once --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", ["complete", "structured"])
@pytest.mark.parametrize("behaviour, status, cause", [
    (raiser(IndexError("list index out of range")), "error", "IndexError"),  # `choices: []`
    (raiser(KeyError("choices")), "error", "KeyError"),
    (raiser(RuntimeError("transport bug")), "error", "RuntimeError"),
    (lambda request: object(), "provider_error", None),
    (lambda request: None, "provider_error", None),
    (lambda request: TransportResponse(5, {"role": "assistant"}, "m", PluginLlmUsage(), 1, 0.0), "provider_error", None),
    (lambda request: TransportResponse("x", None, "m", PluginLlmUsage(), 1, 0.0), "provider_error", None),
], ids=["IndexError", "KeyError", "RuntimeError", "object", "None", "text-int", "message-None"])
def test_every_transport_outcome_has_exactly_one_audit_record(hermes_home, mode, api, behaviour, status, cause):
    transport = Fake(behaviour)
    llm = PluginLlm("p", transport=transport)
    kwargs = dict(instructions="do", input=["x"]) if api == "structured" else {}
    args = () if api == "structured" else (USER,)
    with pytest.raises(PluginLlmProviderError) as info:
        call(llm, mode, *args, api=api, **kwargs)
    assert len(transport.requests) == 1
    [record] = audit_lines(hermes_home)
    assert record["status"] == status and record["error.type"] == "PluginLlmProviderError"
    assert record.get("error.cause") == cause and record["mode"] == mode
    assert record["api"] == ("structured" if api == "structured" else "complete")
    assert info.value.__context__ is None and info.value.__cause__ is None  # no transport frames ride along
    assert len(str(info.value)) < 600
    assert verify(hermes_home).ok


@pytest.mark.parametrize("mode", MODES)
def test_a_failure_after_the_reply_is_audited_once_as_an_error(hermes_home, mode):
    class BrokenSchemaProbe(Fake):
        def supports_json_schema(self, route):
            raise RuntimeError("probe exploded")

    transport = BrokenSchemaProbe()
    with pytest.raises(PluginLlmError) as info:
        call(PluginLlm("p", transport=transport), mode, api="structured", instructions="do", input=["x"],
             json_schema={"type": "object"})
    assert "RuntimeError: probe exploded" in str(info.value)
    [record] = audit_lines(hermes_home)
    assert record["status"] == "error" and record["error.cause"] == "RuntimeError"
    assert record["call_id"] in str(info.value)


@pytest.mark.parametrize("mode", MODES)
def test_malformed_tool_calls_in_a_reply_are_one_provider_error_record(hermes_home, mode):
    reply = TransportResponse(None, {"role": "assistant", "content": None, "tool_calls": [{"function": {}}]},
                              "m", PluginLlmUsage(1, 1, 2), 1, 0.0)
    with pytest.raises(PluginLlmProviderError, match=r"tool_calls\[0\]"):
        call(HostLlm(transport=Fake(lambda r: reply)), mode, USER, api="chat")
    [record] = audit_lines(hermes_home)
    assert record["status"] == "provider_error"  # not "ok" first and an error after


def test_a_cancelled_async_call_is_audited_and_stays_cancelled(hermes_home):
    class Hangs(Fake):
        async def acomplete(self, request):
            self.requests.append(request)
            await asyncio.sleep(3600)

    async def main():
        task = asyncio.ensure_future(PluginLlm("p", transport=Hangs()).acomplete(USER))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)

    asyncio.run(main())
    [record] = audit_lines(hermes_home)
    assert record["status"] == "error" and record["error.type"] == "CancelledError"


def test_an_unexpected_transport_exception_does_not_leak_a_secret(hermes_home):
    from auth import register_secret

    secret = "sk-live-HARDENPIPE-0123456789abcdef"
    register_secret(secret)
    with pytest.raises(PluginLlmProviderError) as info:
        PluginLlm("p", transport=Fake(raiser(RuntimeError(f"connect failed with key {secret}")))).complete(USER)
    assert secret not in str(info.value) and "RuntimeError" in str(info.value)
    assert not any(secret in s for s in strings_reachable(info.value))
    assert secret not in (hermes_home / "logs" / "agent.log").read_text()


def test_a_reply_with_a_lone_surrogate_is_hashed_and_audited(hermes_home):
    result = PluginLlm("p", transport=Fake(lambda r: ok_response("bad \ud800 text"))).complete(USER)
    assert result.text == "bad \ud800 text"
    [record] = audit_lines(hermes_home)
    assert record["status"] == "ok" and len(record["response_sha256"]) == 64


def test_a_sink_that_raises_anything_never_breaks_a_call_when_not_required(hermes_home):
    class Hostile:
        def write(self, record):
            raise ZeroDivisionError("sink bug")

    assert PluginLlm("p", transport=Fake(), audit_log=Hostile()).complete(USER).text == "fine"


# -- input validated before anything is sent -----------------------------------------------------


def _deep(levels: int):
    value = "x"
    for _ in range(levels):
        value = {"nested": value}
    return value


_cyclic: list = []
_cyclic.append(_cyclic)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("messages, where", [
    ([{"role": "user", "content": "x", 1: 2}], "messages[0] has a key of type int"),
    ([{"role": "user", "content": 5}], "messages[0]['content'] must be a str or a list"),
    ([{"role": "user", "content": None}], "messages[0]['content'] is None"),
    ([{"role": "user", "content": []}], "messages[0]['content'] is an empty list"),
    ([{"role": "user", "content": [{"text": "no type"}]}], "messages[0]['content'][0]['type'] must be a str"),
    ([{"role": "user", "content": [{"type": "text", "text": 7}]}], "messages[0]['content'][0]['text'] must be a str"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 1}}]}],
     "messages[0]['content'][0]['image_url']['url'] must be a str"),
    ([USER[0], {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": 3}}]}],
     "messages[1]['tool_calls'][0]['function']['name'] must be a str"),
    ([{"role": "tool", "content": "x", "tool_call_id": ["1"]}], "messages[0]['tool_call_id'] must be a str"),
    ([{"role": "user", "content": "x", "cache_control": {"ttl": float("nan")}}], "['cache_control']['ttl'] is nan"),
    ([{"role": "user", "content": "x", "extra": 10**400}], "['extra'] is an integer beyond 64 bits"),
    ([{"role": "user", "content": "x", "extra": b"bytes"}], "['extra'] must be plain JSON"),
    ([{"role": "user", "content": "x", "extra": _deep(1000)}], "is nested more than 32 levels"),
    ([{"role": "user", "content": "x", "extra": _cyclic}], "is nested more than 32 levels"),
    ([{"role": "x" * 100_000, "content": "x"}], "messages[0]['role'] must be one of"),
    ([{"role": "user"}], "messages[0] has no 'content'"),
], ids=["int-key", "content-int", "user-None", "empty-parts", "part-no-type", "text-int", "url-int", "tool-name",
        "tool-call-id", "nan", "huge-int", "bytes", "deep", "cycle", "huge-role", "no-content"])
def test_bad_messages_never_reach_the_transport(hermes_home, mode, messages, where):
    transport = Fake()
    with pytest.raises(ValueError) as info:
        call(PluginLlm("p", transport=transport), mode, messages)
    message = str(info.value)
    assert where in message
    assert len(message) < 600  # never the repr of the whole value
    assert transport.requests == [] and audit_lines(hermes_home) == []


def test_a_very_large_messages_payload_is_refused(hermes_home):
    transport = Fake()
    parts = [{"type": "text", "text": "x"}] * 600_000  # 1.2 million values
    with pytest.raises(ValueError, match="1,000,000 values"):
        PluginLlm("p", transport=transport).complete([{"role": "user", "content": parts}])
    assert transport.requests == []


def test_valid_rich_messages_pass_unchanged(hermes_home):
    transport = Fake()
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}],
         "cache_control": {"type": "ephemeral"}},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"},
    ]
    PluginLlm("p", transport=transport).complete(messages)
    assert transport.requests[0].messages == messages


@pytest.mark.parametrize("kwargs, where", [
    (dict(temperature="hot"), "temperature must be a number"),
    (dict(temperature=float("nan")), "temperature must be a number"),
    (dict(max_tokens=True), "max_tokens must be a whole number"),
    (dict(timeout=float("nan")), "timeout must be a positive number"),
    (dict(purpose="p" * 10_000), "purpose must be a short label"),
    (dict(agent_id="a" * 100_000), "agent_id must be at most 256 characters"),
])
def test_bad_call_parameters_never_reach_the_transport(hermes_home, kwargs, where):
    transport = Fake()
    with pytest.raises(ValueError, match=where) as info:
        PluginLlm("p", transport=transport).complete(USER, **kwargs)
    assert len(str(info.value)) < 300 and transport.requests == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kwargs, where", [
    (dict(input=[{"type": "x" * 100_000}]), "input[0]: unknown block type"),
    (dict(input=[{"type": "text", "text": "a", "k" * 100_000: 1}]), "input[0]: unknown key"),
    (dict(input=[{"q" * 100_000: 1}]), "input[0]: cannot tell the block type"),
    (dict(input=[{"type": "image", "data": b"x", "mime_type": "m" * 100_000}]), "image 'mime_type' must be"),
    (dict(input=[{"type": "image", "url": "file://" + "u" * 100_000}]), "image 'url' must start with"),
    (dict(input=["x"], system_prompt=5), "system_prompt must be a str"),
])
def test_structured_input_errors_are_bounded_and_nothing_is_sent(hermes_home, mode, kwargs, where):
    transport = Fake()
    args = dict(instructions="do", **kwargs)
    with pytest.raises(ValueError) as info:
        call(PluginLlm("p", transport=transport), mode, api="structured", **args)
    assert where in str(info.value) and len(str(info.value)) < 600
    assert transport.requests == [] and audit_lines(hermes_home) == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tools, where", [
    ({"type": "function"}, "tools must be a list"),
    ([{"type": "function", "function": {"name": 1}}], "tools[0]['function']['name'] must be a str"),
    ([{"type": "function", "function": {"name": "f", "parameters": _deep(200)}}], "is nested more than 32 levels"),
    ([{"type": "function", "function": {"name": "f"}, 2: 3}], "tools[0] has a key of type int"),
])
def test_host_chat_tools_are_validated_before_sending(hermes_home, mode, tools, where):
    transport = Fake()
    with pytest.raises(ValueError) as info:
        call(HostLlm(transport=transport), mode, USER, api="chat", tools=tools)
    assert where in str(info.value) and len(str(info.value)) < 600
    assert transport.requests == []


# -- audit.required covers the write itself --------------------------------------------------------


class CheckPassesWriteFails:
    """A sink whose pre-check passes but whose writes fail (the log broke in between)."""

    def __init__(self, path: Path, fail_from: int = 0):
        self.path, self.fail_from, self.writes = path, fail_from, []

    def check_writable(self):
        pass

    def write(self, record):
        if len(self.writes) >= self.fail_from:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
        self.writes.append(dict(record))
        return record


@pytest.mark.parametrize("mode", MODES)
def test_required_audit_refuses_the_call_when_the_write_itself_fails(hermes_home, mode):
    write_config(hermes_home, "audit:\n  required: true\n")
    transport = Fake()
    sink = CheckPassesWriteFails(hermes_home / "logs" / "agent.log")
    with pytest.raises(PluginLlmConfigError) as info:
        call(PluginLlm("p", transport=transport, audit_log=sink), mode, USER)
    message = str(info.value)
    assert str(sink.path) in message and "audit.required" in message and "not sent to the provider" in message
    assert transport.requests == []


@pytest.mark.parametrize("mode", MODES)
def test_required_audit_with_a_real_log_whose_writes_fail(hermes_home, mode, tmp_path):
    write_config(hermes_home, "audit:\n  required: true\n")

    def full_disk(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    log = AuditLog(tmp_path / "agent.log", AuditSettings(required=True), write_fn=full_disk)
    log.check_writable()  # the pre-check alone is satisfied
    transport = Fake()
    with pytest.raises(PluginLlmConfigError, match="audit.required"):
        call(PluginLlm("p", transport=transport, audit_log=log), mode, USER)
    assert transport.requests == []


def test_required_audit_withholds_the_reply_when_the_outcome_cannot_be_written(hermes_home):
    write_config(hermes_home, "audit:\n  required: true\n")
    transport = Fake()
    sink = CheckPassesWriteFails(hermes_home / "logs" / "agent.log", fail_from=1)  # the begin record gets through
    with pytest.raises(PluginLlmConfigError, match="its result is withheld"):
        PluginLlm("p", transport=transport, audit_log=sink).complete(USER)
    [begin] = sink.writes
    assert begin["event"] == "llm.call.begin" and begin["kind"] == "event" and len(transport.requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_required_audit_writes_a_begin_event_then_the_one_outcome(hermes_home, mode):
    write_config(hermes_home, "audit:\n  required: true\n")
    result = call(PluginLlm("p", transport=Fake()), mode, USER)
    lines = [json.loads(x) for x in (hermes_home / "logs" / "agent.log").read_text().splitlines()]
    begins = [r for r in lines if r["event"] == "llm.call.begin"]
    [outcome] = audit_lines(hermes_home)
    assert [b["call_id"] for b in begins] == [outcome["call_id"]] == [result.audit["call_id"]]
    assert begins[0]["kind"] == "event" and lines.index(begins[0]) < lines.index(outcome)
    from audit.records import EVENT_LLM_CALL_BEGIN
    from plugin_llm.llm import EVENT_CALL_BEGIN

    assert EVENT_CALL_BEGIN == EVENT_LLM_CALL_BEGIN == "llm.call.begin"
    assert verify(hermes_home).ok


def test_required_audit_with_a_file_size_limit_hit_after_the_pre_check(hermes_home):
    """RLIMIT_FSIZE in a child: the log can't grow, check_writable still passes, nothing reaches the transport."""
    script = textwrap.dedent("""
        import json, os, resource, signal, sys
        from plugin_llm import PluginLlm, PluginLlmConfigError
        from plugin_llm.transport import TransportResponse
        from plugin_llm.types import PluginLlmUsage
        sent = []
        class T:
            def complete(self, request):
                sent.append(1)
                return TransportResponse("ok", {"role": "assistant"}, "m", PluginLlmUsage(1, 1, 2), 1, 0.0)
        llm = PluginLlm("p", transport=T())
        llm.complete([{"role": "user", "content": "first"}])
        log = os.path.join(os.environ["HERMES_HOME"], "logs", "agent.log")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        size = os.path.getsize(log)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 16, resource.RLIM_INFINITY))
        try:
            llm.complete([{"role": "user", "content": "second"}])
            outcome = "returned"
        except PluginLlmConfigError as exc:
            outcome = str(exc)
        print(json.dumps({"sent": len(sent), "outcome": outcome, "grew": os.path.getsize(log) - size}))
    """)
    write_config(hermes_home, "audit:\n  required: true\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sent"] == 1  # only the first call reached the transport
    assert "audit.required" in result["outcome"] and "agent.log" in result["outcome"]
    assert "not sent to the provider" in result["outcome"]


# -- usage clamped at the boundary, stats robust ---------------------------------------------------


@dataclass(frozen=True)
class ResponseWithAnomalies(TransportResponse):
    anomalies: tuple = ()


@pytest.mark.parametrize("mode", MODES)
def test_absurd_usage_is_clamped_and_the_anomaly_recorded(hermes_home, mode, capsys):
    absurd = PluginLlmUsage(int("9" * 401), -5, True, "many", 2.5, cost_usd=float("nan"))
    transport = Fake(lambda r: ok_response(usage=absurd))
    result = call(PluginLlm("p", transport=transport), mode, USER)
    assert result.usage == PluginLlmUsage(10**9, 0, 0, 0, 2, cost_usd=None)
    [record] = audit_lines(hermes_home)
    assert record["status"] == "ok"
    assert record["gen_ai.usage.input_tokens"] == 10**9 and record["gen_ai.usage.output_tokens"] == 0
    assert record["cost_usd"] is None
    anomalies = record["usage_anomaly"]
    assert any(a.startswith("input_tokens: reported an int of 401 digits") for a in anomalies)
    assert "output_tokens: reported -5, recorded as 0" in anomalies
    assert any(a.startswith("cost_usd: reported nan") for a in anomalies)
    assert all(len(a) < 200 for a in anomalies)

    from plugin_llm.cli.main import main

    assert main(["audit", "stats", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["by_plugin"]
    assert row["input_tokens"] == 10**9


def test_infinite_cost_and_the_transports_own_anomalies_are_recorded(hermes_home):
    reply = ResponseWithAnomalies("x", {"role": "assistant"}, "m", PluginLlmUsage(1, 1, 2, cost_usd=math.inf), 1, 0.0,
                                  anomalies=("prompt_tokens: clamped by the transport",))
    result = PluginLlm("p", transport=Fake(lambda r: reply)).complete(USER)
    assert result.usage.cost_usd is None
    [record] = audit_lines(hermes_home)
    assert "prompt_tokens: clamped by the transport" in record["usage_anomaly"]
    assert any(a.startswith("cost_usd: reported inf") for a in record["usage_anomaly"])


def test_sane_usage_records_no_anomaly(hermes_home):
    PluginLlm("p", transport=Fake()).complete(USER)
    [record] = audit_lines(hermes_home)
    assert "usage_anomaly" not in record and record["gen_ai.usage.input_tokens"] == 3


def test_audit_stats_survives_absurd_values_already_in_the_log(hermes_home, capsys):
    from plugin_llm.cli.main import main

    PluginLlm("p", transport=Fake()).complete(USER)  # one sane record (3 in, 2 out, $0.001)
    log = hermes_home / "logs" / "agent.log"
    absurd = {"event": "llm.call", "kind": "call", "plugin_id": "p", "status": "ok",
              "gen_ai.usage.input_tokens": int("9" * 401), "gen_ai.usage.output_tokens": -7,
              "cost_usd": "lots", "latency_ms": int("9" * 401)}
    with log.open("a", encoding="utf-8") as out:
        out.write(json.dumps(absurd) + "\n")

    assert main(["audit", "stats"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "left out of the sums" in captured.err
    row = next(line for line in captured.out.splitlines() if line.startswith("p "))
    assert row.split()[1:6] == ["2", "0", "0", "3", "2"]
    assert main(["audit", "stats", "--json"]) == 0
    [plugin_row] = json.loads(capsys.readouterr().out)["by_plugin"]
    assert (plugin_row["input_tokens"], plugin_row["output_tokens"], plugin_row["ignored_values"]) == (3, 2, 4)
    assert plugin_row["cost_usd"] == pytest.approx(0.001)
