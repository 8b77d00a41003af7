"""End to end: the real service exports over OTLP/HTTP to a receiver on 127.0.0.1 that decodes the protobuf."""

from __future__ import annotations

import gzip
import json
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from plugin_llm import telemetry
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply
from tests.service_server import ServiceServer

pytestmark = pytest.mark.slow

_MAX_BODY = 8 << 20


class OtlpReceiver:
    """A minimal OTLP/HTTP collector: keeps every decoded export request and its headers and raw bytes."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        self.raw: list[bytes] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, _MAX_BODY))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.raw.append(body)
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path == "/v1/traces":
                    receiver.traces.append(ExportTraceServiceRequest.FromString(body))
                elif self.path == "/v1/metrics":
                    receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="otlp-receiver")

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[Span]:
        return [span for request in self.traces for rs in request.resource_spans for ss in rs.scope_spans
                for span in ss.spans]

    def metric_names(self) -> set[str]:
        return {m.name for request in self.metrics for rm in request.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics}


def attrs(span: Span) -> dict:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def flush() -> None:
    for _, installed, _ in list(telemetry._installed.values()):
        if installed is not None:
            installed.tracer_provider.force_flush(30_000)
            installed.meter_provider.force_flush(30_000)


def wait_for(condition, what: str) -> None:
    from tests.stream_server import wait_for as poll

    if not poll(condition, 60):  # a hang guard: the receiver gets the export, or the test ends
        pytest.fail(f"the OTLP receiver never got {what}")


@pytest.fixture(autouse=True)
def _reset():
    yield
    telemetry._reset_for_tests()


def test_the_service_exports_spans_over_otlp_http_continuing_the_callers_trace(hermes_home, monkeypatch):
    secret, content, header_secret = (f"cnry{secrets.token_hex(16)}" for _ in range(3))
    monkeypatch.setenv("OTLP_TEST_TOKEN", header_secret)
    auth = hermes_home / "auth.json"
    auth.write_text(json.dumps({"providers": {"custom": {"api_key": secret}}}), encoding="utf-8")
    os.chmod(auth, 0o600)
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with OtlpReceiver() as receiver, FakeServer(default=Reply(content=f"echo {content}")) as upstream:
        write_config(hermes_home, (
            f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {upstream.base_url}\n"
            f"telemetry:\n  otlp_endpoint: {receiver.url}\n  protocol: http/protobuf\n  service_name: gw-e2e\n"
            "  headers_from_env:\n    x-otlp-token: OTLP_TEST_TOKEN\n"))
        with ServiceServer(hermes_home) as service:
            headers = {**service.auth(service.token("web")), "traceparent": f"00-{trace_id}-{parent_id}-01"}
            user = [{"role": "user", "content": content}]
            answer = httpx.post(service.url + "/v1/plugin-llm/complete", headers=headers,
                                json={"messages": user}, timeout=60)
            assert answer.status_code == 200, answer.text
            denied = httpx.post(service.url + "/v1/plugin-llm/complete", headers=service.auth(service.token("web")),
                                json={"messages": user, "model": "not-allowed"}, timeout=60)
            assert denied.status_code == 403
            with httpx.stream("POST", service.url + "/v1/chat/completions", headers=headers, timeout=60,
                              json={"messages": user, "model": "default", "stream": True}) as streamed:
                assert streamed.status_code == 200 and "data:" in streamed.read().decode()
            assert secret in json.dumps([r.headers for r in upstream.requests])  # the canary key was really sent
            flush()
            wait_for(lambda: len(receiver.spans()) >= 3, "three spans")
    spans = receiver.spans()
    assert len(spans) == 3
    records = audit_lines(hermes_home)
    by_call = {attrs(s)["plugin_llm.audit.call_id"]: s for s in spans}
    assert set(by_call) == {r["call_id"] for r in records}
    allowed, refused, stream = (by_call[r["call_id"]] for r in records)
    # the caller's traceparent: same trace, the caller's span is the parent (a stream's too)
    for span in (allowed, stream):
        assert span.trace_id.hex() == trace_id and span.parent_span_id.hex() == parent_id
    assert refused.trace_id.hex() != trace_id and not refused.parent_span_id  # no traceparent sent: a root
    assert allowed.kind == Span.SPAN_KIND_CLIENT and allowed.name == "chat gpt-4o"
    assert attrs(allowed)["plugin_llm.audit.hash"] == records[0]["hash"]
    assert attrs(allowed)["plugin_llm.plugin_id"] == "web" and attrs(allowed)["gen_ai.usage.input_tokens"] == 7
    assert attrs(refused)["plugin_llm.trust.decision"] == "denied" and attrs(refused)["error.type"]
    assert attrs(stream)["gen_ai.request.stream"] is True
    resource = {kv.key: kv.value.string_value for kv in receiver.traces[0].resource_spans[0].resource.attributes}
    assert resource["service.name"] == "gw-e2e"
    assert receiver.headers[0]["x-otlp-token"] == header_secret  # headers_from_env reached the collector
    assert {"gen_ai.client.operation.duration", "gen_ai.client.token.usage"} <= receiver.metric_names()
    everything = b"".join(receiver.raw)
    assert secret.encode() not in everything and content.encode() not in everything
    log_text = (hermes_home / "logs" / "agent.log").read_text()
    assert header_secret not in log_text


def test_grpc_protocol_exports_to_a_real_grpc_receiver_with_the_headers(hermes_home, monkeypatch):
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    from plugin_llm import PluginLlm

    received: list = []
    metadata: list = []

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 - the service's method name
            received.append(request)
            metadata.append(dict(context.invocation_metadata()))
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    header_secret = f"cnry{secrets.token_hex(16)}"
    monkeypatch.setenv("OTLP_GRPC_TOKEN", header_secret)
    try:
        with FakeServer() as upstream:
            write_config(hermes_home, (
                f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {upstream.base_url}\n"
                f"telemetry:\n  otlp_endpoint: http://127.0.0.1:{port}\n  protocol: grpc\n"
                "  headers_from_env: {x-otlp-token: OTLP_GRPC_TOKEN}\n"))
            result = PluginLlm("p1").complete([{"role": "user", "content": "hi"}])
        flush()
        wait_for(lambda: received, "a gRPC export")
    finally:
        server.stop(None)
    spans = [s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == 1 and attrs(spans[0])["plugin_llm.audit.call_id"] == result.audit["call_id"]
    assert metadata[0]["x-otlp-token"] == header_secret


def test_a_collector_echoing_the_header_value_never_puts_it_in_a_log_line(hermes_home, monkeypatch, caplog):
    from plugin_llm import PluginLlm

    header_secret = f"cnry{secrets.token_hex(16)}"
    monkeypatch.setenv("OTLP_ECHO_TOKEN", header_secret)

    class Echo(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(min(int(self.headers.get("Content-Length") or 0), _MAX_BODY))
            self.send_response(401, f"bad key {self.headers.get('x-otlp-token')}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    collector = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        with FakeServer() as upstream, caplog.at_level("DEBUG"):
            write_config(hermes_home, (
                f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {upstream.base_url}\n"
                f"telemetry:\n  otlp_endpoint: http://127.0.0.1:{collector.server_address[1]}\n"
                "  headers_from_env: {x-otlp-token: OTLP_ECHO_TOKEN}\n"))
            PluginLlm("p1").complete([{"role": "user", "content": "hi"}])
            flush()
            wait_for(lambda: any("Failed to export" in r.getMessage() for r in caplog.records), "the export error")
    finally:
        collector.shutdown()
        collector.server_close()
    failures = [r.getMessage() for r in caplog.records if "Failed to export" in r.getMessage()]
    assert failures and "bad key" in failures[0]  # the echo was logged...
    assert all(header_secret not in r.getMessage() for r in caplog.records)  # ...redacted
