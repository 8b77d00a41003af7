"""One ``ctx.llm`` contract, three carriers: the same scenarios against ``PluginLlm`` in process, an
isolated plugin's ``ctx.llm`` (a real child process) and ``GatewayClient`` over a real service, all
on one real upstream. A method, field or error class missing from one carrier fails here."""

from __future__ import annotations

import inspect
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugin_llm.api import METHODS, CtxLlm, signature_of
from plugin_llm.client import GatewayClient
from plugin_llm.llm import PluginLlm
from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.isolation.worker import RemoteLlm
from tests import llm_scenarios
from tests.bounded import run_bounded
from tests.service_server import ServiceServer

pytestmark = pytest.mark.slow  # starts processes or servers for most of its tests

CARRIERS = ("in_process", "isolated", "http")
PLUGIN = "conf"
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
STREAM_USAGE = {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}

_INIT = '''
import json

from . import scenarios


def register(ctx):
    ctx.register_command("scenario", lambda raw: json.dumps(scenarios.run(raw.strip(), ctx.llm)))
'''


# ------------------------------------------------------------------ the upstream
def _completion(message: dict[str, Any]) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {"id": "chatcmpl-conf", "object": "chat.completion", "created": 1700000000, "model": "conf-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": USAGE}


def _events(pieces: list[str]) -> list[bytes]:
    base = {"id": "chatcmpl-conf", "object": "chat.completion.chunk", "created": 1700000000, "model": "conf-model"}
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    events += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    events.append({**base, "choices": [], "usage": STREAM_USAGE})
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


class _Upstream(BaseHTTPRequestHandler):
    """An OpenAI-compatible upstream answering by the marker in the messages. ``[stream]`` streams five
    pieces (a reader may get several in one delta); a stream asked for with ``[slow]`` stops after the
    first until the test ends (bounded), so a consumer that closes early always closes before the end,
    on every carrier."""

    protocol_version = "HTTP/1.1"
    server: "_UpstreamServer"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the caller gave up (a timeout scenario)
            self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
        text = json.dumps(body.get("messages") if isinstance(body, dict) else None)
        release = self.server.release
        if "[hang]" in text:
            release.wait(20)
            return self._send(200, _completion({"role": "assistant", "content": "late"}))
        if "[fail]" in text:
            return self._send(500, {"error": {"message": "upstream exploded", "type": "server_error"}})
        if "[stream]" in text and body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for n, event in enumerate(_events(["a", "b", "c", "d", "e"])):
                    if n == 2 and "[slow]" in text:
                        release.wait(10)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the consumer went away: what a closed stream does
                pass
            self.close_connection = True
            return None
        if "[task]" in text:  # which route's model the call was sent as
            return self._send(200, _completion({"role": "assistant", "content": f"model={body.get('model')}"}))
        if "[tools]" in text:
            call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
            return self._send(200, _completion({"role": "assistant", "content": None, "tool_calls": [call]}))
        if "[repair]" in text:
            repaired = "is not of type" in text
            return self._send(200, _completion({"role": "assistant", "content": '{"n": 3}' if repaired else '{"n": "x"}'}))
        if "[plain-input]" in text:  # the string arrived as the user's text block
            found = any("[plain-input] some text" in json.dumps(m.get("content")) for m in body["messages"]
                        if m.get("role") == "user")
            return self._send(200, _completion({"role": "assistant", "content": '{"n": 1}' if found else "{}"}))
        if "[bad]" in text:
            return self._send(200, _completion({"role": "assistant", "content": '{"n": "x"}'}))
        return self._send(200, _completion({"role": "assistant", "content": "plain reply"}))


class _UpstreamServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Upstream)
        self.release = threading.Event()
        self.base_url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        threading.Thread(target=self.serve_forever, name="contract-upstream", daemon=True).start()

    def stop(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


# ------------------------------------------------------------------ the carriers
class _Isolated:
    """The scenario runs inside the isolated plugin's process, against its own ctx.llm."""

    def __init__(self, manager: PluginManager) -> None:
        self.manager = manager


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    home = tmp_path_factory.mktemp("contract") / "hermes"
    plugin = home / "plugins" / PLUGIN
    plugin.mkdir(parents=True)
    (plugin / "plugin.yaml").write_text(f"name: {PLUGIN}\nversion: '1.0'\n", encoding="utf-8")
    (plugin / "__init__.py").write_text(_INIT, encoding="utf-8")
    shutil.copy(Path(llm_scenarios.__file__), plugin / "scenarios.py")
    upstream = _UpstreamServer()
    config = {
        "model": {"provider": "custom", "model": "conf-model", "base_url": upstream.base_url},
        "llm": {"max_retries": 0, "timeout": 30},
        "auxiliary": {"vision": {"provider": "custom", "model": "conf-vision", "base_url": upstream.base_url}},
        "plugins": {"enabled": [PLUGIN], "entries": {PLUGIN: {
            "isolation": "process", "limits": {"tokens_per_minute": 200_000}, "llm": {"allow_task_override": True}}}},
    }
    (home / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    manager = PluginManager(home)
    manager.discover_plugins()
    assert manager.get_plugin_command_handler("scenario") is not None, manager.list_plugins()
    service = ServiceServer(home).start()
    client = GatewayClient(service.url, service.token(PLUGIN))
    carriers = {"in_process": PluginLlm(plugin_id=PLUGIN, home=home), "isolated": _Isolated(manager),
                "http": client}
    yield {"home": home, "carriers": carriers, "outcomes": {}}
    client.close()
    service.stop()
    manager.shutdown()
    upstream.stop()


def _run(world: dict, name: str, carrier: str) -> dict[str, Any]:
    key = (name, carrier)
    if key not in world["outcomes"]:
        llm = world["carriers"][carrier]
        if isinstance(llm, _Isolated):
            text = run_bounded(lambda: llm.manager.run_command("scenario", name), 60)
            outcome = json.loads(text)
        else:
            outcome = run_bounded(lambda: llm_scenarios.run(name, llm), 60)
        world["outcomes"][key] = json.loads(json.dumps(outcome))  # as plain JSON values, like the isolated one
    return world["outcomes"][key]


def _records(home: Path, call_id: str) -> list[dict]:
    log = home / "logs" / "agent.log"
    lines = log.read_text(encoding="utf-8").split("\n") if log.exists() else []
    return [r for r in (json.loads(line) for line in lines if line.strip())
            if r.get("event") == "llm.call" and r.get("call_id") == call_id]


def _one_record(home: Path, call_id: str | None, status: str) -> dict:
    from tests.stream_server import wait_for

    assert call_id, "the outcome has no call id"
    # a stream closed over HTTP is recorded once the service has seen the client go: wait for it (bounded)
    wait_for(lambda: _records(home, call_id), 20)
    records = _records(home, call_id)
    assert [r["status"] for r in records] == [status]
    assert records[0]["plugin_id"] == PLUGIN
    return records[0]


# ------------------------------------------------------------------ what each scenario must show
def _plain(ok: dict) -> None:
    assert ok["class"] == "PluginLlmCompleteResult"
    assert (ok["text"], ok["provider"], ok["model"], ok["usage"]) == ("plain reply", "custom", "conf-model", [7, 3, 10])


def _stream_done(out: dict) -> None:
    assert "".join(out["deltas"]) == "abcde" and out["text"] == "abcde" and out["finished"]
    assert out["result"]["text"] == "abcde" and out["result"]["usage"] == [9, 5, 14]
    assert out["result"]["call_id"] == out["call_id"]


def _stream_closed(out: dict, home: Path) -> None:
    assert out["deltas"] == ["a"] and out["text"] == "a" and out["finished"] and out["result"] is None
    record = _one_record(home, out["call_id"], "abandoned")
    assert record["stream.delivered_chars"] == 1


def check(name: str, out: dict, home: Path) -> None:
    if name == "plain":
        _plain(out["ok"])
        _one_record(home, out["ok"]["call_id"], "ok")
    elif name == "tools":
        assert out["ok"]["tool_calls"] == [["lookup", {"q": "x"}, '{"q": "x"}']]
    elif name == "structured_repair":
        ok = out["ok"]
        assert (ok["class"], ok["parsed"], ok["content_type"], ok["usage"]) == \
            ("PluginLlmStructuredResult", {"n": 3}, "json", [14, 6, 20])
        assert _one_record(home, ok["call_id"], "ok")["repairs"] == 1
    elif name == "schema_error":
        assert out["error"] == "PluginLlmSchemaError"
        assert out["text"] == '{"n": "x"}' and out["usage"] == [14, 6]
        assert any("is not of type 'integer'" in e for e in out["errors"])
    elif name == "structured_text_input":
        assert (out["ok"]["class"], out["ok"]["parsed"]) == ("PluginLlmStructuredResult", {"n": 1})
        _one_record(home, out["ok"]["call_id"], "ok")
    elif name == "stream":
        _stream_done(out["ok"])
        _one_record(home, out["ok"]["call_id"], "ok")
    elif name == "stream_closed_early":
        _stream_closed(out["ok"], home)
    elif name == "async_twins":
        twins = out["ok"]
        _plain(twins["plain"])
        assert twins["structured"]["parsed"] == {"n": 3}
        _stream_done(twins["stream"])
        _stream_closed(twins["closed"], home)
        assert twins["denied"]["error"] == "PluginLlmTrustError"
    elif name == "trust_denied":
        assert out["error"] == "PluginLlmTrustError"
        assert out["config_key"] == f"plugins.entries.{PLUGIN}.llm.allow_model_override"
    elif name == "quota":
        assert out["error"] == "PluginLlmQuotaError"
        assert (out["limit"], out["config_key"], out["resets_at"]) == \
            ("tokens_per_minute", f"plugins.entries.{PLUGIN}.limits.tokens_per_minute", None)
    elif name == "timeout":
        assert out["error"] == "PluginLlmTimeoutError"
    elif name == "provider_error":
        assert out["error"] == "PluginLlmProviderError"
        assert (out["status"], out["provider"], out["retryable"]) == (500, "custom", True)
    elif name == "task":
        ok = out["ok"]
        assert (ok["routed"]["text"], ok["routed"]["task"]) == ("model=conf-vision", "vision")
        assert _one_record(home, ok["routed"]["call_id"], "ok")["task"] == "vision"
        assert (ok["auto"]["text"], ok["auto"]["task"]) == ("model=conf-model", "")
        assert "task" not in _one_record(home, ok["auto"]["call_id"], "ok")
        assert ok["refused"]["error"] == "PluginLlmTrustError" and ok["refused"]["config_key"] == ""
        assert f"plugin '{PLUGIN}' may not use task 'conf_unknown'" in ok["refused"]["message"]
        _stream_done(ok["stream"])
        assert ok["stream"]["result"]["task"] == "vision"
        record = _one_record(home, ok["stream"]["call_id"], "ok")
        assert (record["task"], record["gen_ai.request.model"]) == ("vision", "conf-vision")
    elif name == "bad_argument":
        assert out["error"] == "TypeError" and "temprature" in out["message"] and "temperature" in out["message"]
    else:  # pragma: no cover - a scenario without its expectation
        raise AssertionError(f"no expectation for scenario {name}")


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("name", list(llm_scenarios.SCENARIOS))
def test_scenario(world, name, carrier):
    check(name, _run(world, name, carrier), world["home"])


@pytest.mark.parametrize("name", ["trust_denied", "quota", "bad_argument", "provider_error", "schema_error"])
def test_errors_say_the_same_on_every_carrier(world, name):
    messages = {carrier: _run(world, name, carrier)["message"] for carrier in CARRIERS}
    assert len(set(messages.values())) == 1, messages


def test_a_refused_task_says_the_same_on_every_carrier(world):
    messages = {carrier: _run(world, "task", carrier)["ok"]["refused"]["message"] for carrier in CARRIERS}
    assert len(set(messages.values())) == 1, messages


@pytest.mark.parametrize("name", ["timeout", "provider_error"])
def test_a_remote_caller_is_told_the_same_of_a_host_failure_and_no_host_detail(world, name):
    remote = {carrier: _run(world, name, carrier)["message"] for carrier in ("isolated", "http")}
    assert len(set(remote.values())) == 1, remote
    assert str(world["home"]) not in remote["http"] and "127.0.0.1" not in remote["http"]


# ------------------------------------------------------------------ the contract's shape
@pytest.mark.parametrize("cls", [PluginLlm, RemoteLlm, GatewayClient], ids=lambda c: c.__name__)
def test_every_carrier_has_the_contracts_methods_and_signatures(cls):
    for method in METHODS:
        assert hasattr(cls, method), f"{cls.__name__} has no {method}"
        mine = inspect.signature(getattr(cls, method)).replace(return_annotation=inspect.Signature.empty)
        theirs = signature_of(method).replace(return_annotation=inspect.Signature.empty)
        assert [(p.name, p.kind, p.default) for p in mine.parameters.values()] == \
            [(p.name, p.kind, p.default) for p in theirs.parameters.values()], (cls.__name__, method)
        assert inspect.iscoroutinefunction(getattr(cls, method)) == (method in ("acomplete", "acomplete_structured"))


def test_the_carriers_are_ctx_llms(world):
    assert isinstance(world["carriers"]["in_process"], CtxLlm)
    assert isinstance(world["carriers"]["http"], CtxLlm)


# ------------------------------------------------------------------ an isolated plugin's open streams
def test_an_isolated_stream_nobody_reads_is_abandoned_at_its_deadline(world, monkeypatch):
    from plugin_llm.errors import PluginLlmTimeoutError
    from plugin_llm.plugins.isolation import host_llm
    from tests.stream_server import wait_for

    monkeypatch.setattr(host_llm, "STREAM_GRACE", 0.0)
    streams = host_llm._OpenStreams(PLUGIN)
    llm = world["carriers"]["in_process"]
    opened = streams.request(llm, "open", None, {"messages": llm_scenarios._user("stream] [slow"), "timeout": 0.5,
                                                 "max_tokens": 50})
    assert wait_for(lambda: _records(world["home"], opened["call_id"]), 20)  # the host ended it, unread
    assert _one_record(world["home"], opened["call_id"], "abandoned")
    with pytest.raises(PluginLlmTimeoutError, match="stopped reading"):
        streams.request(llm, "next", opened["h"], {})


def test_an_isolated_plugins_streams_are_bounded_and_end_with_its_process(world, monkeypatch):
    from plugin_llm.plugins.isolation import host_llm

    monkeypatch.setattr(host_llm, "MAX_OPEN_STREAMS", 2)
    streams = host_llm._OpenStreams(PLUGIN)
    llm = world["carriers"]["in_process"]
    kw = {"messages": llm_scenarios._user("stream] [slow"), "max_tokens": 50}
    opened = [streams.request(llm, "open", None, dict(kw)) for _ in range(2)]
    with pytest.raises(ValueError, match="2 ctx.llm streams open"):
        streams.request(llm, "open", None, dict(kw))
    streams.abandon_all()  # what the host does when the plugin's process stops
    for stream in opened:
        assert _one_record(world["home"], stream["call_id"], "abandoned")


# ------------------------------------------------------------------ the records those calls left
def test_every_key_of_every_call_record_is_declared_and_documented(world):
    from audit import records

    for name in llm_scenarios.SCENARIOS:  # every outcome, from every carrier
        for carrier in CARRIERS:
            _run(world, name, carrier)
    lines = (world["home"] / "logs" / "agent.log").read_text(encoding="utf-8").split("\n")
    calls = [json.loads(line) for line in lines if line.strip() and json.loads(line).get("event") == "llm.call"]
    assert {r["status"] for r in calls} >= {"ok", "denied", "quota", "timeout", "provider_error", "schema_error",
                                            "abandoned"}
    envelope = {records.SCHEMA, records.SEQ, records.PREV_HASH, records.HASH}
    declared = set(records.CALL_FIELDS) | set(records.OPTIONAL_CALL_FIELDS) | envelope
    emitted = {key for record in calls for key in record}
    assert emitted <= declared, f"keys written but not declared in audit.records: {sorted(emitted - declared)}"
    doc = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "audit-schema.md").read_text("utf-8")
    rows = [line for line in doc.splitlines() if line.startswith("| `")]

    def documented(key: str) -> bool:
        if any(f"`{key}`" in row for row in rows):
            return True
        prefix, _, leaf = key.partition(".")
        return any(f"`{prefix}.*`" in row.split("|")[1] and f"`{leaf}`" in row for row in rows)

    assert not [k for k in sorted(declared - envelope - {records.KIND}) if not documented(k)], \
        [k for k in sorted(declared - envelope - {records.KIND}) if not documented(k)]
