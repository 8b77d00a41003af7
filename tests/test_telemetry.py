"""Live OpenTelemetry spans and metrics made from each call's audit record (the SDK's in-memory exporter)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from plugin_llm import (PluginLlm, PluginLlmConfigError, PluginLlmProviderError, PluginLlmQuotaError,
                        PluginLlmTrustError, telemetry)
from plugin_llm.auditing import host_audit_log
from plugin_llm.config import parse_config
from plugin_llm.config.telemetry import TelemetrySettings
from tests.conftest import audit_lines, write_config
from plugin_llm.transport import LitellmTransport
from tests.servers import FakeServer, Reply

ROOT = Path(__file__).resolve().parent.parent
USER = [{"role": "user", "content": "hi"}]
#: the transport's three paths to an OpenAI-compatible route: its own, litellm's fast path, litellm.completion
PATHS = {"own": {}, "fast": {"own_path": False}, "fallback": {"own_path": False, "fast_path": False}}


class Captured:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.metrics = InMemoryMetricReader()

    def finished(self) -> list:
        for _, installed, _ in list(telemetry._installed.values()):
            if installed is not None:
                installed.tracer_provider.force_flush()
        return list(self.spans.get_finished_spans())

    def metric_points(self) -> dict[str, list]:
        out: dict[str, list] = {}
        data = self.metrics.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out

    def exported_text(self) -> str:
        data = self.metrics.get_metrics_data()
        return "\n".join([s.to_json() for s in self.finished()] + ([data.to_json()] if data else []))


@pytest.fixture
def captured(monkeypatch):
    box = Captured()
    monkeypatch.setattr(telemetry, "_exporters", lambda settings: (box.spans, box.metrics))
    yield box
    telemetry._reset_for_tests()


def canary() -> str:
    return f"cnry{secrets.token_hex(16)}"


def configure(home: Path, base_url: str, *, secret: str, extra: str = "") -> None:
    auth = home / "auth.json"
    auth.write_text(json.dumps({"providers": {"custom": {"api_key": secret}}}), encoding="utf-8")
    os.chmod(auth, 0o600)
    write_config(home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {base_url}\n"
                       "telemetry:\n  otlp_endpoint: http://127.0.0.1:9\n  service_name: gw-test\n" + extra)


def one_span(captured: Captured):
    spans = captured.finished()
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def test_an_allowed_call_is_one_client_span_with_the_genai_and_gateway_attributes(hermes_home, captured):
    secret, content = canary(), canary()
    with FakeServer() as upstream:
        configure(hermes_home, upstream.base_url, secret=secret)
        result = PluginLlm("p1").complete([{"role": "user", "content": content}], max_tokens=50)
        assert secret in json.dumps(upstream.requests[0].headers)  # the canary really was used
    span = one_span(captured)
    record = audit_lines(hermes_home)[-1]
    attrs = dict(span.attributes)
    assert span.name == "chat gpt-4o" and span.kind is SpanKind.CLIENT
    assert span.status.status_code is StatusCode.UNSET
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "custom"
    assert attrs["gen_ai.request.model"] == "gpt-4o" and attrs["gen_ai.response.model"] == "fake-model-2024-01-01"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (7, 3)
    assert attrs["gen_ai.request.stream"] is False and "error.type" not in attrs
    assert attrs["plugin_llm.plugin_id"] == "p1" and attrs["plugin_llm.trust.decision"] == "allowed"
    assert attrs["plugin_llm.route"] == "custom/gpt-4o" and attrs["plugin_llm.attempts"] == 1
    # the span links to its evidence: the audit record's call id, hash and seq
    assert attrs["plugin_llm.audit.call_id"] == record["call_id"] == result.audit["call_id"]
    assert attrs["plugin_llm.audit.hash"] == record["hash"] and attrs["plugin_llm.audit.seq"] == record["seq"]
    assert (span.end_time - span.start_time) == pytest.approx(record["latency_ms"] * 1e6, abs=1000)
    assert span.resource.attributes["service.name"] == "gw-test"
    points = captured.metric_points()
    (duration,) = points["gen_ai.client.operation.duration"]
    assert duration.count == 1 and duration.attributes["plugin_llm.plugin_id"] == "p1"
    assert duration.attributes["plugin_llm.route"] == "custom/gpt-4o"
    assert duration.explicit_bounds[:2] == (0.01, 0.02)
    usage = {p.attributes["gen_ai.token.type"]: p.sum for p in points["gen_ai.client.token.usage"]}
    assert usage == {"input": 7, "output": 3}
    exported = captured.exported_text()
    assert secret not in exported and content not in exported


def test_a_denied_call_is_a_span_too_with_the_deciding_config_key_and_no_provider_call(hermes_home, captured):
    with FakeServer() as upstream:
        configure(hermes_home, upstream.base_url, secret=canary())
        with pytest.raises(PluginLlmTrustError):
            PluginLlm("p1").complete([{"role": "user", "content": "hi"}], model="other-model")
        assert upstream.requests == []
    span = one_span(captured)
    record = audit_lines(hermes_home)[-1]
    attrs = dict(span.attributes)
    assert span.status.status_code is StatusCode.ERROR and span.kind is SpanKind.CLIENT
    assert attrs["error.type"] == "PluginLlmTrustError" and attrs["plugin_llm.trust.decision"] == "denied"
    assert attrs["plugin_llm.trust.config_key"] == record["decision_key"] and record["decision_key"]
    assert attrs["plugin_llm.audit.hash"] == record["hash"] and attrs["gen_ai.request.stream"] is False


def test_a_failed_call_is_an_error_span(hermes_home, captured):
    with FakeServer(default=Reply.error(400, "no such model")) as upstream:
        configure(hermes_home, upstream.base_url, secret=canary())
        with pytest.raises(PluginLlmProviderError):
            PluginLlm("p1").complete([{"role": "user", "content": "hi"}])
    span = one_span(captured)
    attrs = dict(span.attributes)
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "provider_error"
    assert attrs["error.type"] == "PluginLlmProviderError" and attrs["plugin_llm.status"] == "provider_error"
    assert captured.metric_points()["gen_ai.client.operation.duration"][0].attributes["error.type"] == \
        "PluginLlmProviderError"


def test_a_limits_refusal_names_the_deciding_limit(hermes_home, captured):
    with FakeServer() as upstream:
        configure(hermes_home, upstream.base_url, secret=canary(), extra=(
            "limits:\n  store: local\nplugins:\n  entries:\n    capped:\n      limits:\n"
            "        requests_per_minute: 1\n"))
        llm = PluginLlm("capped")
        llm.complete([{"role": "user", "content": "hi"}])
        with pytest.raises(PluginLlmQuotaError):
            llm.complete([{"role": "user", "content": "hi"}])
    spans = captured.finished()
    assert len(spans) == 2
    refused = dict(spans[1].attributes)
    assert refused["plugin_llm.limits.outcome"] == "refused"
    assert refused["plugin_llm.limits.limit"] == audit_lines(hermes_home)[-1]["limits.limit"]
    assert refused["plugin_llm.limits.config_key"].endswith("requests_per_minute")
    assert refused["plugin_llm.trust.decision"] == "allowed"
    assert refused["error.type"] == audit_lines(hermes_home)[-1]["error.type"] == "PluginLlmLimitError"


def test_a_streamed_call_is_one_span_marked_stream(hermes_home, captured):
    secret, content = canary(), canary()
    with FakeServer(default=Reply(content="streamed words")) as upstream:
        configure(hermes_home, upstream.base_url, secret=secret)
        with PluginLlm("p1").stream([{"role": "user", "content": content}]) as stream:
            text = "".join(stream)
    assert text == "streamed words"
    span = one_span(captured)
    assert span.attributes["gen_ai.request.stream"] is True and span.name == "chat gpt-4o"
    assert "streamed words" not in captured.exported_text() and content not in captured.exported_text()


def by_call_id(captured: Captured) -> dict:
    return {span.attributes["plugin_llm.audit.call_id"]: span for span in captured.finished()}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_providers_response_id_reaches_the_record_and_the_span_on_every_path(hermes_home, captured, path):
    with FakeServer() as upstream:
        configure(hermes_home, upstream.base_url, secret=canary())
        llm = PluginLlm("p1", transport=LitellmTransport(**PATHS[path]))
        llm.complete(USER)
        completed = upstream.last_reply_id()
        with llm.stream(USER) as stream:  # the id every chunk carries: the first one's is kept
            "".join(stream)
        streamed = upstream.last_reply_id()
    plain, chunked = audit_lines(hermes_home)
    spans = by_call_id(captured)
    assert completed != streamed and plain["gen_ai.response.id"] == completed and chunked["gen_ai.response.id"] == streamed
    assert spans[plain["call_id"]].attributes["gen_ai.response.id"] == completed
    assert spans[chunked["call_id"]].attributes["gen_ai.response.id"] == streamed


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_reply_without_an_id_has_none_on_record_on_every_path(hermes_home, captured, path):
    """litellm makes an id up for a reply without one: never recorded as the provider's."""
    body = {"object": "chat.completion", "created": 1700000000, "model": "m-1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "no id"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    with FakeServer(default=Reply(body=body)) as upstream:
        configure(hermes_home, upstream.base_url, secret=canary())
        assert PluginLlm("p1", transport=LitellmTransport(**PATHS[path])).complete(USER).text == "no id"
    (record,) = audit_lines(hermes_home)
    assert record["status"] == "ok" and "gen_ai.response.id" not in record
    assert "gen_ai.response.id" not in one_span(captured).attributes


def test_denied_and_unroutable_calls_say_whether_they_were_streams(hermes_home, captured):
    with FakeServer() as upstream:
        configure(hermes_home, upstream.base_url, secret=canary(), extra=(
            "auxiliary:\n  vision: no_such_route\n"
            "plugins:\n  entries:\n    p1:\n      llm:\n        allow_task_override: true\n"))
        llm = PluginLlm("p1")
        with pytest.raises(PluginLlmTrustError):
            llm.complete(USER, model="other-model")
        with pytest.raises(PluginLlmTrustError):
            llm.stream(USER, model="other-model")
        with pytest.raises(PluginLlmConfigError, match="no_such_route"):
            llm.complete(USER, task="vision")
        with pytest.raises(PluginLlmConfigError, match="no_such_route"):
            llm.stream(USER, task="vision")
        assert upstream.requests == []
    records = audit_lines(hermes_home)
    assert [(r["status"], r.get("stream")) for r in records] == [
        ("denied", None), ("denied", True), ("error", None), ("error", True)]
    spans = by_call_id(captured)
    assert [spans[r["call_id"]].attributes["gen_ai.request.stream"] for r in records] == [False, True, False, True]


def test_a_call_with_a_task_says_so_on_its_span_allowed_or_denied(hermes_home, captured):
    with FakeServer() as upstream:
        configure(hermes_home, upstream.base_url, secret=canary(), extra=(
            "plugins:\n  entries:\n    p1:\n      llm:\n        allow_task_override: true\n"))
        PluginLlm("p1").complete(USER, task="vision")
        PluginLlm("p1").complete(USER)
        with pytest.raises(PluginLlmTrustError):
            PluginLlm("p2").complete(USER, task="compression")
    records = audit_lines(hermes_home)
    assert [(r["status"], r.get("task")) for r in records] == [("ok", "vision"), ("ok", None), ("denied", "compression")]
    spans = by_call_id(captured)
    assert [spans[r["call_id"]].attributes.get("plugin_llm.task") for r in records] == ["vision", None, "compression"]


def test_the_request_parameters_finish_reason_and_first_chunk_time_reach_the_span(hermes_home, captured):
    with FakeServer(default=Reply(content="streamed words", finish_reason="length")) as upstream:
        configure(hermes_home, upstream.base_url, secret=canary())
        llm = PluginLlm("p1")
        llm.complete([{"role": "user", "content": "hi"}], max_tokens=50, temperature=0.3, top_p=0.9)
        with llm.stream([{"role": "user", "content": "hi"}], max_tokens=40) as stream:
            "".join(stream)
    plain, streamed = sorted(captured.finished(), key=lambda s: s.start_time)
    attrs = dict(plain.attributes)
    assert (attrs["gen_ai.request.max_tokens"], attrs["gen_ai.request.temperature"],
            attrs["gen_ai.request.top_p"]) == (50, 0.3, 0.9)
    assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("length",)
    first = streamed.attributes["gen_ai.response.time_to_first_chunk"]
    record = audit_lines(hermes_home)[-1]
    assert record["gen_ai.response.time_to_first_chunk"] == first and 0 <= first <= record["latency_ms"] / 1000
    assert streamed.attributes["gen_ai.request.max_tokens"] == 40


def test_logged_content_and_error_messages_never_reach_the_export(hermes_home, captured):
    secret, content = canary(), canary()
    with FakeServer([Reply(content=f"reply {content}"), Reply.error(400, f"bad {content}")]) as upstream:
        configure(hermes_home, upstream.base_url, secret=secret, extra="audit:\n  log_content: true\n")
        llm = PluginLlm("p1")
        llm.complete([{"role": "user", "content": content}])
        with pytest.raises(PluginLlmProviderError):
            llm.complete([{"role": "user", "content": content}])
    assert content in (hermes_home / "logs" / "agent.log").read_text()  # it is in the record...
    assert len(captured.finished()) == 2
    exported = captured.exported_text()
    assert content not in exported and secret not in exported  # ...never in the telemetry


def test_a_config_without_telemetry_installs_nothing(hermes_home, captured):
    with FakeServer() as upstream:
        write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {upstream.base_url}\n")
        PluginLlm("p1").complete([{"role": "user", "content": "hi"}])
    assert captured.finished() == [] and not telemetry.active()


def test_turning_telemetry_off_in_config_stops_the_export(hermes_home, captured):
    with FakeServer() as upstream:
        configure(hermes_home, upstream.base_url, secret=canary())
        llm = PluginLlm("p1")
        llm.complete([{"role": "user", "content": "hi"}])
        assert telemetry.active() and len(captured.finished()) == 1
        write_config(hermes_home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {upstream.base_url}\n")
        llm.complete([{"role": "user", "content": "hi"}])
        assert len(audit_lines(hermes_home)) == 2
    assert not telemetry.active() and telemetry._installed == {}
    assert host_audit_log(hermes_home)._observer is None
    assert len(captured.spans.get_finished_spans()) == 1  # the second call's record has no observer


# -- config ---------------------------------------------------------------------------------------------
def test_the_telemetry_section_parses_with_defaults(tmp_path):
    config = parse_config(tmp_path, "telemetry:\n  otlp_endpoint: https://otel.example:4318/\n  protocol: grpc\n"
                                    "  headers_from_env: {X-Api-Key: OTLP_KEY}\n  sample_ratio: 0.25\n")
    assert config.telemetry == TelemetrySettings("https://otel.example:4318", "grpc", (("x-api-key", "OTLP_KEY"),),
                                                 "plugin-llm", 0.25)
    assert config.telemetry.enabled and not parse_config(tmp_path, "").telemetry.enabled
    assert config.warnings == ()


@pytest.mark.parametrize("section, fragment", [
    ("  otlp_endpoint: http://127.0.0.1:4318\n  sample_rate: 1\n", "telemetry.sample_rate: unknown key, ignored (did you mean 'sample_ratio'?)"),
    ("  otlp_endpoint: ftp://host\n", "telemetry.otlp_endpoint: expected an http:// or https:// URL"),
    ("  otlp_endpoint: http://127.0.0.1:4318\n  protocol: http/json\n", "telemetry.protocol: expected one of http/protobuf, grpc"),
    ("  otlp_endpoint: http://127.0.0.1:4318\n  sample_ratio: 2\n", "telemetry.sample_ratio: expected a number from 0 to 1"),
    ("  otlp_endpoint: http://127.0.0.1:4318\n  headers_from_env: {x-key: 'not a name'}\n", "expected the NAME of an environment variable"),
])
def test_telemetry_config_problems_are_specific_warnings(tmp_path, section, fragment):
    config = parse_config(tmp_path, "telemetry:\n" + section)
    assert any(fragment in w for w in config.warnings), config.warnings


def test_an_endpoint_with_a_password_is_refused_without_echoing_it(tmp_path):
    secret = canary()
    config = parse_config(tmp_path, f"telemetry:\n  otlp_endpoint: https://user:{secret}@otel.example\n")
    assert not config.telemetry.enabled
    assert "send credentials with headers_from_env" in " ".join(config.warnings) and secret not in repr(config.warnings)


@pytest.mark.slow
def test_telemetry_off_imports_no_opentelemetry(hermes_home):
    """Starts a Python process (the import check needs a clean interpreter)."""
    write_config(hermes_home, "model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:9\n")
    code = ("import sys, plugin_llm\nfrom plugin_llm.service.app import create_app\nfrom plugin_llm.llm import PluginLlm\n"
            f"create_app({str(hermes_home)!r}, warm=False)\nPluginLlm('p', home={str(hermes_home)!r})\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HERMES_HOME": str(hermes_home)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- doctor ---------------------------------------------------------------------------------------------
def test_doctor_says_how_to_install_the_sdk_when_telemetry_is_configured_without_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from plugin_llm.cli.doctor_cmd import WARN, _telemetry

    monkeypatch.delenv("OTLP_KEY", raising=False)
    view = SimpleNamespace(config=parse_config(tmp_path, "telemetry:\n  otlp_endpoint: http://127.0.0.1:4318\n"
                                                         "  headers_from_env: {x-key: OTLP_KEY}\n"))
    (check,) = _telemetry(view, find_spec=lambda name: None)
    assert check.status == WARN and "pip install 'plugin-llm-gateway[telemetry]'" in check.fix
    installed = _telemetry(view)
    assert installed[0].status == "OK" and "http://127.0.0.1:4318" in installed[0].message
    assert installed[1].status == WARN and "$OTLP_KEY is not set" in installed[1].message
    assert _telemetry(SimpleNamespace(config=parse_config(tmp_path, ""))) == []


@pytest.mark.parametrize("traceparent, continued", [
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", True),
    ("00-zzz-not-a-traceparent", False),
    ("00-" + "0" * 32 + "-b7ad6b7169203331-01", False),  # an all-zero trace id is invalid
])
def test_a_callers_traceparent_is_continued_and_a_malformed_one_is_a_root(hermes_home, captured, traceparent,
                                                                          continued):
    with FakeServer() as upstream:
        configure(hermes_home, upstream.base_url, secret=canary())
        llm = PluginLlm("p1")
        llm.complete([{"role": "user", "content": "hi"}])  # telemetry starts with the first load
        token = telemetry.continue_trace([(b"traceparent", traceparent.encode()), (b"x-other", b"1")])
        try:
            llm.complete([{"role": "user", "content": "hi"}])
        finally:
            telemetry.end_trace(token)
    span = captured.finished()[-1]
    if continued:
        assert format(span.context.trace_id, "032x") == traceparent.split("-")[1]
        assert format(span.parent.span_id, "016x") == traceparent.split("-")[2]
    else:
        assert span.parent is None


def test_a_call_that_fell_back_names_the_answering_route_and_each_attempt(hermes_home, captured):
    with FakeServer([Reply.error(503, "down")]) as first, FakeServer() as second:
        write_config(hermes_home, (
            "models:\n"
            f"  first: {{provider: custom, model: ma, base_url: {first.base_url}}}\n"
            f"  second: {{provider: custom, model: mb, base_url: {second.base_url}}}\n"
            "model: {route: first, fallbacks: [second]}\n"
            "llm: {max_retries: 0, breaker: false}\n"
            "telemetry:\n  otlp_endpoint: http://127.0.0.1:9\n"
        ))
        PluginLlm("p1").complete([{"role": "user", "content": "hi"}])
    attrs = dict(one_span(captured).attributes)
    assert attrs["plugin_llm.route"] == "second" and attrs["gen_ai.request.model"] == "mb"
    assert list(attrs["plugin_llm.route.attempts"]) == ["first:provider_error:503", "second:ok"]
    assert len(attrs["plugin_llm.route.attempt_latency_ms"]) == 2
    (duration,) = captured.metric_points()["gen_ai.client.operation.duration"]
    assert duration.attributes["plugin_llm.route"] == "second"
