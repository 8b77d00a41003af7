"""A call's audit: the begin record (``audit.required``), the one outcome record, and how a
write that fails is handled. The records themselves are built by ``audit.records``."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Callable

from audit import records
from plugin_llm import structured
from plugin_llm.auditing import host_audit_log
from plugin_llm.call.protocols import AuditSink, ChecksWritable
from plugin_llm.call.steps import Admitted, Call, Run
from plugin_llm.config import HostConfig
from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.transport import TransportResponse

__all__ = ["CallAudit", "EVENT_CALL_BEGIN", "detail"]

log = logging.getLogger("plugin_llm")

#: written before the provider call when ``audit.required`` is true (:meth:`CallAudit.begin`)
EVENT_CALL_BEGIN = records.EVENT_LLM_CALL_BEGIN
_MAX_DETAIL = 160  # characters of an unexpected exception's text shown in a message
_HASH_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _sha256_json(value: Any) -> str:
    # surrogatepass: a lone surrogate (valid in a Python str, not in UTF-8) must not make hashing fail
    return hashlib.sha256(_HASH_ENCODER.encode(value).encode("utf-8", "surrogatepass")).hexdigest()


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def detail(exc: BaseException) -> str:
    """A short, redacted, one-line text of an unexpected exception (it may carry anything)."""
    try:
        text = str(exc)[: 20 * _MAX_DETAIL]
        from auth import redact

        text = redact(text)  # before truncating: a cut secret would no longer match
    except Exception:  # noqa: BLE001 - describing a failure must not fail
        return type(exc).__name__
    text = " ".join(text.split())[:_MAX_DETAIL]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class CallAudit:
    """Writes the records of one plugin's calls: to ``audit_log`` when one is given (tests,
    embedding hosts), else to the host's log of the config's home."""

    __slots__ = ("_audit_log", "_clock", "_sink_cache", "_checks")

    def __init__(self, audit_log: AuditSink | None, clock: Callable[[], float]) -> None:
        self._audit_log = audit_log
        self._clock = clock
        self._sink_cache: tuple[HostConfig, AuditSink] | None = None
        self._checks: tuple[AuditSink, bool] | None = None  # whether the last sink is ChecksWritable

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def elapsed_ms(self, call: Call) -> float:
        return (self._clock() - call.started) * 1000.0

    def sink(self, config: HostConfig) -> AuditSink:
        if self._audit_log is not None:
            return self._audit_log
        cached = self._sink_cache
        if cached is not None and cached[0] is config:
            return cached[1]
        sink = host_audit_log(config.home, config.audit)
        self._sink_cache = (config, sink)
        return sink

    def write(self, call: Call, config: HostConfig, record: dict[str, Any], *, sent: bool = False) -> None:
        """Append ``record``; never raises, except PluginLlmConfigError when audit.required is true.

        ``sent``: whether the provider has seen the request (for the error message).
        """
        try:
            self.sink(config).write(record)
        except Exception as exc:  # noqa: BLE001 - an audit problem must not break a call unless required
            reason = detail(exc)
        else:
            return
        if config.audit.required:
            raise PluginLlmConfigError(self._required_message(config, reason, sent=sent))
        try:
            log.error("audit record for call %s was not written: %s", call.call_id, reason)
        except Exception:  # noqa: BLE001 - a broken logging setup neither
            pass

    def begin(self, call: Call, admitted: Admitted) -> None:
        """With ``audit.required``: put the attempt on record before the provider sees the request.

        A pre-check alone (``check_writable``) cannot promise that the write
        will succeed - the log can become unwritable between the check and the
        write (file-size limit, quota, a full disk) - so the proof is a real
        write: an ``llm.call.begin`` event (``kind: "event"``, so summaries and
        queries of call records do not count it twice). If it fails the call
        fails closed with nothing sent. The outcome record follows as usual;
        a begin without an outcome means the host died, or the log broke,
        while the provider was working on the call.
        """
        config = admitted.config
        route = admitted.route
        try:
            sink = self.sink(config)
            checks = self._checks
            if checks is None or checks[0] is not sink:  # a protocol check costs microseconds: once per sink
                checks = self._checks = (sink, isinstance(sink, ChecksWritable))
            if checks[1]:
                sink.check_writable()  # also refuses a nearly full disk, which one small record would not notice
            sink.write({
                "event": EVENT_CALL_BEGIN,
                "kind": "event",
                "call_id": call.call_id,
                "plugin_id": call.plugin_id,
                "purpose": call.purpose,
                "api": call.api,
                "mode": call.mode,
                "gen_ai.provider.name": route.provider,
                "gen_ai.request.model": route.model,
                "agent_id": call.agent_id,
                "profile": call.profile,
                "schema_name": call.schema_name,
                **({records.TASK: call.task} if call.task else {}),
            })
        except Exception as exc:  # noqa: BLE001 - any failure to record the attempt refuses the call
            reason = detail(exc)
        else:
            return
        raise PluginLlmConfigError(self._required_message(config, reason, sent=False))

    def outcome(self, run: Run, status: str, response: TransportResponse | None,
                error: BaseException | None = None, cause: str | None = None) -> None:
        """Write the call's one outcome record (``tally.audited`` keeps the flow's guard from writing a second)."""
        call, admitted, tally = run.call, run.admitted, run.tally
        try:
            record = self._outcome_record(run, status, response, error)
        except Exception as exc:  # noqa: BLE001 - defence in depth: every input was checked already
            if status == "ok":
                raise  # not written yet: the flow's guard records the failure as the outcome
            record = records.error_record(call, provider=admitted.route.provider, request_model=admitted.route.model,
                                          latency_ms=self.elapsed_ms(call), status=status,
                                          error_type=type(error).__name__ if error else None,
                                          decision_reason=admitted.decision.reason, attempts=tally.attempts,
                                          record_error=type(exc).__name__)
        if cause is not None:
            record[records.ERROR_CAUSE] = cause
        if tally.stream is not None:
            record.update(tally.stream.fields())
        tally.audited = True
        self.write(call, admitted.config, record, sent=response is not None or tally.attempts > 0)

    def _outcome_record(self, run: Run, status: str, response: TransportResponse | None,
                        error: BaseException | None) -> dict[str, Any]:
        call, admitted, tally = run.call, run.admitted, run.tally
        messages = tally.audit_messages
        usage = tally.usage
        latency_ms = self.elapsed_ms(call)
        record = records.outcome_record(
            call, provider=admitted.route.provider, request_model=admitted.route.model, latency_ms=latency_ms,
            decision_reason=admitted.decision.reason, status=status, error=error,
            response_model=response.model if response else None,
            usage=(usage.input_tokens, usage.output_tokens, usage.cost_usd), attempts=tally.attempts,
            overhead_ms=latency_ms - tally.provider_seconds * 1000.0,
            prompt_sha256=_sha256_json(messages) if messages is not None else None,
            response_sha256=_sha256_text(response.text or "") if response else None,
            anomalies=tally.anomalies or None,
            structured=((structured.schema_sha256(tally.schema), tally.validation, tally.repairs)
                        if call.api == "structured" else None),
            content=(messages, response.text if response else None) if admitted.config.audit.log_content else None,
            details=_details(tally.params, response, usage), route=admitted.route.name,
            route_attempts=tally.route_attempts)
        if tally.limit_fields:
            record.update(tally.limit_fields)
        return record

    def _required_message(self, config: HostConfig, reason: str, *, sent: bool) -> str:
        log_path = getattr(self._audit_log, "path", None) or Path(config.home) / "logs" / "agent.log"
        what = ("the call reached the provider, but its outcome could not be recorded, so its result is withheld"
                if sent else "the call was not sent to the provider")
        return (
            f"the audit log {log_path} could not be written ({reason}) and audit.required is true in "
            f"{config.path}: {what}. Fix the log (free disk space, permissions, file-size limits) or set "
            "audit.required: false to log best-effort."
        )


def _response_id(response: TransportResponse | None) -> str | None:
    reply_id = response.response_id if response is not None else None
    return reply_id[:200] if isinstance(reply_id, str) and reply_id else None


def _details(params: dict[str, Any] | None, response: TransportResponse | None, usage: Any) -> dict[str, Any]:
    """The request's sampling parameters as the plugin passed them, how the reply ended, its cache tokens."""
    params = params or {}
    return {
        records.REQUEST_MAX_TOKENS: params.get("max_tokens"),
        records.REQUEST_TEMPERATURE: params.get("temperature"),
        records.REQUEST_TOP_P: params.get("top_p"),
        records.FINISH_REASONS: [response.finish_reason] if response is not None and response.finish_reason else None,
        records.RESPONSE_ID: _response_id(response),
        records.CACHE_READ_TOKENS: usage.cache_read_tokens or None,
        records.CACHE_CREATION_TOKENS: usage.cache_write_tokens or None,
    }
