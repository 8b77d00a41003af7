"""Live OpenTelemetry traces and metrics of gateway calls, made from their audit records (``telemetry:``).

Each call's one audit record, as written (redacted, with its ``hash``), becomes one CLIENT span
(GenAI semantic conventions, plus ``plugin_llm.*`` attributes) and two histogram points; message
content and keys never: only allowlisted fields are read. The OpenTelemetry SDK is imported only
when a home turns telemetry on; off, the audit writer checks one attribute per record.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from auth.redaction import install_log_redaction, redact_field, register_secret
from plugin_llm.config.telemetry import TelemetrySettings

__all__ = ["configure", "active", "continue_trace", "end_trace", "span_attributes", "SDK_MISSING_FIX"]

log = logging.getLogger("plugin_llm.telemetry")

#: how to install what telemetry needs (doctor and the error log say it)
SDK_MISSING_FIX = "pip install 'plugin-llm-gateway[telemetry]' (the OpenTelemetry SDK and its OTLP exporters)"
#: this gateway's own span and metric attributes
NS = "plugin_llm."
#: explicit bucket boundaries the GenAI conventions advise for the two client histograms
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)

# gen_ai.* fields copied from a record when present
_GEN_AI_NUMBERS = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
                   "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_creation.input_tokens",
                   "gen_ai.request.max_tokens", "gen_ai.request.temperature", "gen_ai.request.top_p",
                   "gen_ai.response.time_to_first_chunk")
_GEN_AI_STRINGS = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model",
                   "gen_ai.response.id")
_MAX_TEXT = 256

_lock = threading.Lock()
#: audit log path -> (settings, its telemetry or None when it could not start, the log)
_installed: dict[str, tuple[TelemetrySettings, "_Telemetry | None", Any]] = {}
_active = False
_warned: set[str] = set()


def active() -> bool:
    """Whether any home in this process exports telemetry (the service continues callers' traces then)."""
    return _active


def configure(sink: Any, settings: TelemetrySettings) -> None:
    """Make ``sink`` (a home's :class:`audit.AuditLog`) export its call records as ``settings`` say;
    idempotent, and safe to call on every config (re)load. Never raises."""
    global _active
    key = str(getattr(sink, "path", id(sink)))
    with _lock:
        current = _installed.get(key)
        if current is not None and current[0] == settings:
            return
        if current is None and not settings.enabled:
            return
        old = current[1] if current is not None else None
        telemetry = _start(settings) if settings.enabled else None
        sink.set_observer(telemetry.observe if telemetry is not None else None)
        if settings.enabled:
            _installed[key] = (settings, telemetry, sink)
        else:
            _installed.pop(key, None)
        _active = any(t is not None for _, t, _ in _installed.values())
    if old is not None:  # its last export may wait on a slow collector: never in a call's thread
        threading.Thread(target=old.shutdown, name="plugin-llm-telemetry-shutdown", daemon=True).start()


def _start(settings: TelemetrySettings) -> "_Telemetry | None":
    try:
        return _Telemetry(settings, *_exporters(settings))
    except ImportError as exc:
        _warn_once("sdk", "telemetry is configured but the OpenTelemetry SDK cannot be imported (%s): no traces or "
                   "metrics are exported; %s", type(exc).__name__, SDK_MISSING_FIX)
    except Exception as exc:  # noqa: BLE001 - observability never breaks calls
        _warn_once(f"start:{type(exc).__name__}", "telemetry could not start (%s): no traces or metrics are exported",
                   type(exc).__name__)
    return None


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.error(message, *args)


def _headers(settings: TelemetrySettings) -> dict[str, str]:
    """The OTLP headers; each value is taught to the redactor (a collector's error reply may echo it into
    the exporter's log lines, which pass the same redaction as litellm's)."""
    import os

    install_log_redaction(("opentelemetry",))
    headers = {}
    for name, env in settings.headers_from_env:
        value = os.environ.get(env)
        if value:
            register_secret(value)
            headers[name] = value
        else:  # the variable's name only, never a value
            _warn_once(f"env:{env}", "telemetry.headers_from_env: $%s is not set; header %s is not sent", env, name)
    return headers


def _exporters(settings: TelemetrySettings) -> tuple[Any, Any]:
    """(span exporter, metric reader) for ``settings`` (a seam: tests put in-memory ones here)."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    headers = _headers(settings)
    endpoint = settings.otlp_endpoint or ""
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = endpoint.startswith("http://")
        spans = OTLPSpanExporter(endpoint=endpoint, insecure=insecure, headers=headers or None)
        metrics = OTLPMetricExporter(endpoint=endpoint, insecure=insecure, headers=headers or None)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        spans = OTLPSpanExporter(endpoint=endpoint + "/v1/traces", headers=headers or None)
        metrics = OTLPMetricExporter(endpoint=endpoint + "/v1/metrics", headers=headers or None)
    return spans, PeriodicExportingMetricReader(metrics)


class _Telemetry:
    """One home's tracer and meter providers (the SDK's BatchSpanProcessor, a periodic metric reader)."""

    def __init__(self, settings: TelemetrySettings, span_exporter: Any, metric_reader: Any) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind, Status, StatusCode

        resource = Resource.create({"service.name": settings.service_name})
        self.tracer_provider = TracerProvider(resource=resource,
                                              sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
        self.tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[metric_reader])
        self.tracer = self.tracer_provider.get_tracer("plugin_llm")
        meter = self.meter_provider.get_meter("plugin_llm")
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS))
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS))
        self._client, self._error = SpanKind.CLIENT, lambda text: Status(StatusCode.ERROR, text)

    def observe(self, record: Any) -> None:
        """The audit writer's observer: one span and its metric points per call record."""
        if not isinstance(record, dict) or record.get("kind") != "call":
            return
        end = time.time_ns()
        latency_ms = record.get("latency_ms")
        duration_s = latency_ms / 1000.0 if _number(latency_ms) and latency_ms >= 0 else 0.0
        if "hash" not in record:  # lost (not written, so not rendered): redact here as the writer would have
            record = _redacted(record)
        attributes = span_attributes(record)
        operation = attributes.get("gen_ai.operation.name", "chat")
        model = attributes.get("gen_ai.request.model")
        span = self.tracer.start_span(f"{operation} {model}" if model else str(operation), kind=self._client,
                                      start_time=end - int(duration_s * 1e9), attributes=attributes)
        if "error.type" in attributes:
            span.set_status(self._error(str(record.get("status") or "error")))
        span.end(end_time=end)
        self._record_metrics(attributes, duration_s)

    def _record_metrics(self, attributes: dict[str, Any], duration_s: float) -> None:
        common = {k: attributes[k] for k in ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
                                             "gen_ai.response.model", NS + "plugin_id", NS + "route")
                  if k in attributes}
        errored = dict(common)
        if "error.type" in attributes:
            errored["error.type"] = attributes["error.type"]
        self.duration.record(duration_s, errored)
        for kind, field in (("input", "gen_ai.usage.input_tokens"), ("output", "gen_ai.usage.output_tokens")):
            count = attributes.get(field)
            if count is not None:
                self.tokens.record(count, {**common, "gen_ai.token.type": kind})

    def shutdown(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            try:
                provider.shutdown()
            except Exception:  # noqa: BLE001 - a collector gone away does not stop a reload
                pass


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _redacted(record: dict[str, Any]) -> dict[str, Any]:
    return {k: redact_field(v) if isinstance(v, str) else v for k, v in record.items()}


def _text(value: Any) -> str | None:
    return value[:_MAX_TEXT] if isinstance(value, str) and value else None


def span_attributes(record: dict[str, Any]) -> dict[str, Any]:
    """A call record's span attributes: allowlisted fields only (never content, never a free-text message)."""
    out: dict[str, Any] = {}
    for name in _GEN_AI_STRINGS:
        text = _text(record.get(name))
        if text is not None:
            out[name] = text
    for name in _GEN_AI_NUMBERS:
        value = record.get(name)
        if _number(value):
            out[name] = value
    reasons = record.get("gen_ai.response.finish_reasons")
    if isinstance(reasons, list) and reasons and all(isinstance(r, str) for r in reasons):
        out["gen_ai.response.finish_reasons"] = [r[:64] for r in reasons[:16]]
    if "gen_ai.request.max_tokens" not in out and _number(record.get("limits.max_tokens_sent")):
        out["gen_ai.request.max_tokens"] = record["limits.max_tokens_sent"]  # the bound the limits sent
    status = record.get("status")
    # every record of a stream says stream: true (a denial's and a failed admission's too); the others omit it
    stream = record.get("gen_ai.request.stream", record.get("stream"))
    out["gen_ai.request.stream"] = stream if isinstance(stream, bool) else False
    if status != "ok":
        out["error.type"] = _text(record.get("error.type")) or (_text(status) or "_OTHER")
    out.update(_gateway_attributes(record, status))
    return out


def _gateway_attributes(record: dict[str, Any], status: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in (("plugin_id", "plugin_id"), ("api", "api"), ("mode", "mode"), ("status", "status"),
                        ("audit.call_id", "call_id"), ("audit.hash", "hash"), ("limits.limit", "limits.limit"),
                        ("stream.abandoned_by", "stream.abandoned_by"), ("task", "task")):
        text = _text(record.get(field))
        if text is not None:
            out[NS + name] = text
    for name, field in (("audit.seq", "seq"), ("cost_usd", "cost_usd"), ("attempts", "attempts")):
        if _number(record.get(field)):
            out[NS + name] = record[field]
    out[NS + "trust.decision"] = "denied" if status == "denied" else "allowed"
    key = _text(record.get("decision_key"))
    if key is not None:
        out[NS + ("trust.config_key" if status == "denied" else "limits.config_key")] = key
    if status == "quota":
        out[NS + "limits.outcome"] = "refused"
    elif record.get("limits.store_error"):
        out[NS + "limits.outcome"] = "store_error"
    elif "limits.reserved_usd" in record or "limits.reserved_tokens" in record:
        out[NS + "limits.outcome"] = "admitted"
    provider, model = _text(record.get("gen_ai.provider.name")), _text(record.get("gen_ai.request.model"))
    route = _text(record.get("route"))
    if route:
        out[NS + "route"] = route  # the catalog route that answered
    elif provider and model:
        out[NS + "route"] = f"{provider}/{model}"
    attempts = record.get("route.attempts")
    if isinstance(attempts, list) and attempts:  # a chain: each route tried, in order
        tried = [a for a in attempts[:16] if isinstance(a, dict)]
        out[NS + "route.attempts"] = [f"{_text(a.get('route')) or '?'}:{_text(a.get('outcome')) or '?'}" for a in tried]
        out[NS + "route.attempt_latency_ms"] = [float(a["latency_ms"]) if _number(a.get("latency_ms")) else 0.0
                                               for a in tried]
    return out


# -- the service: a caller's W3C traceparent ---------------------------------------------------------
def continue_trace(headers: Any) -> Any:
    """Make the trace context of ASGI ``headers`` (``traceparent``/``tracestate``) current; a token for
    :func:`end_trace`, or None (no traceparent, or telemetry off)."""
    carrier = {}
    for name, value in headers or ():
        if name in (b"traceparent", b"tracestate") and len(value) <= 512:
            carrier[name.decode("latin-1")] = value.decode("latin-1")
    if "traceparent" not in carrier:
        return None
    try:
        from opentelemetry import context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        return context.attach(TraceContextTextMapPropagator().extract(carrier))
    except Exception:  # noqa: BLE001 - no SDK, or a bad header: the call is a root span
        return None


def end_trace(token: Any) -> None:
    if token is not None:
        from opentelemetry import context

        context.detach(token)


def _reset_for_tests() -> None:
    global _active
    with _lock:
        items = list(_installed.values())
        _installed.clear()
        _active = False
    for _, telemetry, sink in items:
        sink.set_observer(None)
        if telemetry is not None:
            telemetry.shutdown()

