"""``ctx.llm``: LLM calls for plugins through the host (SPEC §5).

One pipeline serves the four public methods. It is written as a generator
that *yields* transport requests (and admission steps under the plugin's
limits) and *receives* their outcomes, so the sync shell (``complete``) and
the async shell (``acomplete``) differ only in how they perform those steps;
gating, limits, routing, structured parsing, repair and auditing are the same
code for both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn

from audit import records
from plugin_llm import limits, structured
from plugin_llm.call.protocols import AuditSink, ChecksWritable, Transport
from plugin_llm.call.shells import Shell
from plugin_llm.call.steps import (
    Admitted,
    Call,
    Emit,
    Flow,
    LimitStep,
    RepairRefused,
    StreamOpen,
    StreamProgress,
    StreamRead,
    Tally,
)
from plugin_llm.call.validate import (
    MAX_NAME,
    MAX_NESTING,
    MAX_VALUES,
    check_messages,
    check_optional_str,
    check_params,
    check_purpose,
    check_system_prompt,
    check_tools,
)
from plugin_llm.call_options import FORBIDDEN, check_options
from plugin_llm.safe_json import loads_bounded
from plugin_llm.auditing import host_audit_log, watch_config
from plugin_llm.config import ConfigSource, HostConfig, get_config_source
from plugin_llm.credentials import key_source
from plugin_llm.errors import (
    PluginLlmConfigError,
    PluginLlmError,
    PluginLlmProviderError,
    PluginLlmQuotaError,
    PluginLlmSchemaError,
    PluginLlmTimeoutError,
    PluginLlmTrustError,
)
from plugin_llm.routing import Route, resolve_route
from plugin_llm.transport import TransportRequest, TransportResponse
from plugin_llm.trust import Overrides, enforce
from plugin_llm.structured import _snippet
from plugin_llm.streaming import PluginLlmAsyncStream, PluginLlmStream, _Driver
from plugin_llm.types import (
    PluginLlmCompleteResult,
    PluginLlmStructuredResult,
    PluginLlmToolCall,
    PluginLlmUsage,
    checked_usage,
)

__all__ = ["PluginLlm", "HostLlm", "HostChatResult", "ToolCall", "HOST_IDENTITY", "MAX_NESTING", "MAX_VALUES",
           "EVENT_CALL_BEGIN"]

log = logging.getLogger("plugin_llm")

HOST_IDENTITY = "host"

#: a tool call requested by the model (the name the host runtime has always used)
ToolCall = PluginLlmToolCall


@dataclass(frozen=True)
class HostChatResult:
    """Result of :meth:`HostLlm.chat`: text and/or tool calls, plus the message to keep."""

    text: str | None
    tool_calls: tuple[ToolCall, ...]
    message: dict[str, Any]
    usage: PluginLlmUsage
    provider: str
    model: str
    audit: dict[str, Any]


#: written before the provider call when ``audit.required`` is true (``PluginLlm._write_begin``)
EVENT_CALL_BEGIN = records.EVENT_LLM_CALL_BEGIN
_MAX_DETAIL = 160  # characters of an unexpected exception's text shown in a message
_MAX_ATTEMPTS = 1000

_HASH_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _sha256_json(value: Any) -> str:
    # surrogatepass: a lone surrogate (valid in a Python str, not in UTF-8) must not make hashing fail
    return hashlib.sha256(_HASH_ENCODER.encode(value).encode("utf-8", "surrogatepass")).hexdigest()


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _detail(exc: BaseException) -> str:
    """A short, redacted, one-line text of an unexpected exception (it may carry anything)."""
    try:
        text = str(exc)[: 20 * _MAX_DETAIL]
        from auth import redact

        text = redact(text)  # before truncating: a cut secret would no longer match
    except Exception:  # noqa: BLE001 - describing a failure must not fail
        return type(exc).__name__
    text = " ".join(text.split())[:_MAX_DETAIL]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _whole(value: Any, default: int) -> int:
    return value if type(value) is int and 0 <= value <= _MAX_ATTEMPTS else default


def _seconds(value: Any) -> float:
    return float(value) if type(value) in (int, float) and math.isfinite(value) and 0 <= value < 1e7 else 0.0


def _forbidden_error(plugin_id: str, options: dict[str, Any]) -> PluginLlmTrustError | None:
    forbidden = sorted(set(options) & FORBIDDEN)
    if not forbidden:
        return None
    return PluginLlmTrustError(
        f"plugin '{plugin_id}' passed {', '.join(forbidden)}: plugins can never choose an endpoint or a key; "
        "the operator sets them in config.yaml (model.base_url) and auth.json",
        plugin_id=plugin_id,
        config_key="",
    )


class PluginLlm:
    """LLM access for one plugin, bound to its identity (``ctx.llm``).

    The plugin never sees a key, an endpoint or the host's config: it asks,
    the operator's trust policy decides, the host calls the provider and
    writes the audit line. Collaborators can be injected for tests and
    embedding hosts; the defaults are the production ones.
    """

    def __init__(
        self,
        plugin_id: str,
        *,
        home: Path | str | None = None,
        config_source: ConfigSource | None = None,
        transport: Transport | None = None,
        audit_log: AuditSink | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(plugin_id, str) or not plugin_id.strip():
            raise ValueError("plugin_id must be a non-empty string (the plugin's manifest key)")
        self._plugin_id = plugin_id.strip()
        self._config = config_source or get_config_source(Path(home) if home is not None else None)
        if audit_log is None:
            watch_config(self._config)
        self._transport = transport
        self._shell_cache: Shell | None = None
        self._audit_log = audit_log
        self._sink_cache: tuple[HostConfig, Any] | None = None
        self._clock = clock

    @property
    def plugin_id(self) -> str:
        return self._plugin_id

    def __repr__(self) -> str:
        return f"PluginLlm(plugin_id={self._plugin_id!r})"

    # ------------------------------------------------------------- public API
    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        provider: str | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        agent_id: str | None = None,
        profile: str | None = None,
        purpose: str | None = None,
        **options: Any,
    ) -> PluginLlmCompleteResult:
        """Chat completion; returns text, attribution, usage and the audit ids."""
        flow = self._complete_flow("sync", messages, provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, options)
        return self._run_sync(flow)

    async def acomplete(
        self,
        messages: list[dict[str, Any]],
        *,
        provider: str | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        agent_id: str | None = None,
        profile: str | None = None,
        purpose: str | None = None,
        **options: Any,
    ) -> PluginLlmCompleteResult:
        """Async twin of :meth:`complete`; never blocks the event loop on the provider."""
        flow = self._complete_flow("async", messages, provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, options)
        return await self._run_async(flow)

    def complete_structured(
        self,
        *,
        instructions: str,
        input: str | list[Any],
        json_schema: dict[str, Any] | None = None,
        json_mode: bool = False,
        schema_name: str | None = None,
        system_prompt: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        agent_id: str | None = None,
        profile: str | None = None,
        purpose: str | None = None,
        **options: Any,
    ) -> PluginLlmStructuredResult:
        """Typed JSON from text and image blocks, validated against ``json_schema``."""
        flow = self._structured_flow(
            "sync", instructions, input, json_schema, json_mode, schema_name, system_prompt,
            provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, options,
        )
        return self._run_sync(flow)

    async def acomplete_structured(
        self,
        *,
        instructions: str,
        input: str | list[Any],
        json_schema: dict[str, Any] | None = None,
        json_mode: bool = False,
        schema_name: str | None = None,
        system_prompt: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        agent_id: str | None = None,
        profile: str | None = None,
        purpose: str | None = None,
        **options: Any,
    ) -> PluginLlmStructuredResult:
        """Async twin of :meth:`complete_structured`."""
        flow = self._structured_flow(
            "async", instructions, input, json_schema, json_mode, schema_name, system_prompt,
            provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, options,
        )
        return await self._run_async(flow)

    def stream(
        self,
        messages: list[dict[str, Any]],
        *,
        provider: str | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        agent_id: str | None = None,
        profile: str | None = None,
        purpose: str | None = None,
        **options: Any,
    ) -> PluginLlmStream:
        """Chat completion streamed as text deltas: ``for delta in llm.stream(messages): ...``.

        The parameters are :meth:`complete`'s (``tools=`` excepted: a tool call
        is only usable whole - use ``complete`` for it). The trust gate, the
        limits and the provider's first answer are checked before this returns,
        so a denial raises here. ``timeout`` is the deadline of the whole
        stream. Once it has ended, ``.result`` is the ``PluginLlmCompleteResult``
        (full text, usage, cost, audit ids); closing it early (``close()``, a
        ``with`` block, ``break`` then dropping it) records it as abandoned.
        """
        progress = StreamProgress()
        flow = self._stream_flow("sync", messages, provider, model, temperature, max_tokens, timeout, agent_id,
                                 profile, purpose, options, progress)
        shell = self._shell()
        shell.ready()
        driver = _Driver(flow, shell.stream_step, progress)
        first = driver.next_sync()
        return PluginLlmStream(driver, first)

    def astream(
        self,
        messages: list[dict[str, Any]],
        *,
        provider: str | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        agent_id: str | None = None,
        profile: str | None = None,
        purpose: str | None = None,
        **options: Any,
    ) -> PluginLlmAsyncStream:
        """Async twin of :meth:`stream`: ``async for delta in llm.astream(messages)``, ``async with``,
        or ``stream = await llm.astream(messages)`` (which opens it: denials raise there)."""
        progress = StreamProgress()
        flow = self._stream_flow("async", messages, provider, model, temperature, max_tokens, timeout, agent_id,
                                 profile, purpose, options, progress)
        shell = self._shell()
        return PluginLlmAsyncStream(_Driver(flow, shell.astream_step, progress, shell.aready))

    # ------------------------------------------------------------- shells
    def _shell(self) -> Shell:
        shell = self._shell_cache
        if shell is None:
            transport = self._transport
            if transport is None:
                from plugin_llm.transport import LitellmTransport

                transport = self._transport = LitellmTransport()
            shell = self._shell_cache = Shell(transport)
        return shell

    def _run_sync(self, flow: Flow) -> Any:
        return self._shell().run_sync(flow)

    async def _run_async(self, flow: Flow) -> Any:
        return await self._shell().run_async(flow)

    # ------------------------------------------------------------- pipeline
    # A flow = argument checks (nothing audited: no call yet) -> admission (audits
    # its own denials and route errors) -> the guarded steps. From admission on,
    # every outcome gets exactly one record: the steps audit what they know how
    # to describe, and ``_guarded`` audits anything else once, as an error.
    def _complete_flow(self, mode, messages, provider, model, temperature, max_tokens, timeout, agent_id, profile,
                       purpose, options, *, tools=None, finish=None) -> Flow:
        call = self._new_call("complete", mode, purpose, agent_id, profile, None)
        self._refuse_forbidden(call, options)
        messages = check_messages(messages)
        extra = check_options("complete", options, tools_check=check_tools) if options else {}
        tools = check_tools(tools)
        check_params(temperature, max_tokens, timeout)
        params: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens, **extra}
        if tools:
            params["tools"] = tools
        admitted = self._admit(call, provider, model, timeout)
        tally = Tally()
        steps = self._complete_steps(call, admitted, tally, messages, params, finish or self._result)
        return (yield from self._guarded(call, admitted, tally, messages, steps))

    def _complete_steps(self, call, admitted, tally, messages, params, finish) -> Flow:
        response = yield from self._provider_call(call, admitted, messages, params, tally)
        tally.add(response)
        result = finish(call, admitted.route, response, tally.usage)  # before the record: a failure here is the outcome
        self._audit_outcome(call, admitted, "ok", messages=messages, response=response, tally=tally)
        return result

    def _stream_flow(self, mode, messages, provider, model, temperature, max_tokens, timeout, agent_id, profile,
                     purpose, options, progress: StreamProgress) -> Flow:
        """``complete``'s flow, streamed: the same checks and admission, then :meth:`_stream_steps`."""
        call = self._new_call("complete", mode, purpose, agent_id, profile, None)
        progress.call_id = call.call_id
        self._refuse_forbidden(call, options)
        messages = check_messages(messages)
        if options and (options.get("tools") is not None or options.get("tool_choice") is not None):
            raise ValueError("stream()/astream() take no tools= or tool_choice=: a tool call arrives in fragments "
                             "that are usable only once whole. Call complete(..., tools=[...]) for tool calls and "
                             "stream() for text")
        extra = check_options("complete", options) if options else {}
        check_params(temperature, max_tokens, timeout)
        params: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens, **extra}
        admitted = self._admit(call, provider, model, timeout)
        progress.deadline = admitted.deadline
        tally = Tally()
        tally.stream = progress
        steps = self._stream_steps(call, admitted, tally, messages, params, progress)
        return (yield from self._guarded(call, admitted, tally, messages, steps))

    def _stream_steps(self, call, admitted, tally, messages, params, progress: StreamProgress) -> Flow:
        """Admit, open the provider stream, hand out each delta, settle and audit at the end.

        Whatever the stream ends in gets the call's one record: ``ok`` at the
        end, the error's status when it fails (partial, with the characters
        delivered), ``abandoned`` when the consumer closes or drops it (the
        flow is closed at the delta it was waiting at: ``GeneratorExit``).
        """
        ticket = self._limits_in_memory(call, admitted, messages, messages, params, tally)
        if ticket is None:
            ticket = yield from self._limits_store_step(call, admitted, messages, messages, params, tally)
        request = _transport_request(admitted, messages, _bounded_output(call, admitted, params, tally))
        failure: BaseException | None = None
        try:
            progress.stream = yield StreamOpen(request)
            while True:
                text = yield StreamRead(progress.stream)
                if text is None:
                    break
                progress.delivered += len(text)
                yield Emit(text)
            response = self._checked_response(progress.stream.final(), admitted.route, tally)
        except GeneratorExit:  # the consumer abandoned the stream
            self._stream_abandoned(call, admitted, tally, messages, ticket, progress)
            raise
        except BaseException as exc:  # noqa: BLE001 - every transport outcome is audited, then raised
            failure = exc
        if failure is not None:
            _settle_failed(ticket, failure, replied=progress.stream is not None)
            if progress.stream is not None:
                progress.stream.close()
            error = self._request_failed(call, admitted, tally, messages, failure)
            failure = None
            raise error
        progress.partial = False
        if not response.priced and admitted.config.limits.prices:
            response = _operator_priced(admitted, response)
        # a stream whose provider sent no usage has it estimated from the text, which can fall short
        # (hidden reasoning tokens, another tokenizer): the limits charge the reservation instead
        ticket.settle(None if response.usage.estimated else response.usage)
        tally.add(response)
        result = self._result(call, admitted.route, response, tally.usage)
        self._audit_outcome(call, admitted, "ok", messages=messages, response=response, tally=tally)
        return result

    def _stream_abandoned(self, call, admitted, tally, messages, ticket, progress: StreamProgress) -> None:
        """The record of a stream its consumer closed or dropped before its end (charged its
        reservation once the provider began to answer: what it billed is unknown)."""
        stream = progress.stream
        if stream is None:
            ticket.release()
        else:
            ticket.settle()
            stream.close()
            tally.attempts += _whole(getattr(stream, "attempts", 1), 1)
            tally.provider_seconds += _seconds(getattr(stream, "provider_seconds", 0.0))
        self._audit_outcome(call, admitted, "abandoned", messages=messages, response=None, tally=tally)

    def _structured_flow(self, mode, instructions, input, json_schema, json_mode, schema_name, system_prompt,
                         provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, options) -> Flow:
        schema_name = check_optional_str("schema_name", schema_name)
        call = self._new_call("structured", mode, purpose, agent_id, profile, schema_name)
        self._refuse_forbidden(call, options)
        extra = check_options("structured", options) if options else {}
        instructions = structured.check_instructions(instructions)
        blocks = structured.normalise_input(input)
        schema = structured.check_schema(json_schema)
        check_system_prompt(system_prompt)
        check_params(temperature, max_tokens, timeout)
        admitted = self._admit(call, provider, model, timeout)
        tally = Tally(schema=schema)
        steps = self._structured_steps(call, admitted, tally, instructions, blocks, schema, schema_name, system_prompt,
                                       bool(json_mode), temperature, max_tokens, extra)
        return (yield from self._guarded(call, admitted, tally, None, steps))

    def _structured_steps(self, call, admitted, tally, instructions, blocks, schema, schema_name, system_prompt,
                          json_mode, temperature, max_tokens, extra) -> Flow:
        native = schema is not None and bool(self._shell().transport.supports_json_schema(admitted.route))
        messages = first_messages = tally.audit_messages = structured.build_messages(
            instructions=instructions, blocks=blocks, json_schema=schema, schema_name=schema_name,
            system_prompt=system_prompt, native_schema=native,
        )
        params = {
            "temperature": temperature,
            "max_tokens": max_tokens,
            **extra,
            "response_format": structured.response_format(
                json_schema=schema, schema_name=schema_name, json_mode=json_mode, native_schema=native
            ),
        }
        max_repairs = admitted.config.llm.structured_repair_attempts
        refused: limits.PluginLlmLimitError | None = None
        for repair in range(max_repairs + 1):
            if repair:  # a repair is a request of its own: admitted under the limits as they are now
                admitted = _with_current_limits(admitted, self._config.current())
            tally.repairing = bool(repair)
            try:
                response = yield from self._provider_call(call, admitted, first_messages, params, tally, messages=messages)
            except RepairRefused as exc:  # no repair can be sent: the last reply is the outcome
                refused = exc.failure
                tally.add_limits({records.LIMITS_REPAIR_REFUSED: refused.denial.limit,
                                  records.LIMITS_REPAIR_REFUSED_KEY: refused.denial.config_key})
                break
            finally:
                tally.repairing = False
            tally.repairs += bool(repair)
            tally.add(response)
            reply = structured.parse_reply(response.text or "", schema)
            if reply.content_type != "json" or reply.valid or repair == max_repairs:
                break
            messages = structured.repair_messages(messages, reply)
        tally.validation = "none" if schema is None else ("passed" if reply.valid else "failed")
        if reply.content_type == "json" and not reply.valid:
            route = admitted.route
            why = "" if refused is None else f"; no further repair was sent: {refused}"
            error = PluginLlmSchemaError(
                f"the reply of {route.provider}/{response.model or route.model} does not match the schema"
                f"{f' {schema_name!r}' if schema_name else ''} after {tally.repairs} repair attempt(s): "
                + "; ".join(reply.errors[:5]) + why,
                text=reply.text, errors=list(reply.errors), usage=tally.usage,
            )
            self._audit_outcome(call, admitted, "schema_error", messages=first_messages, response=response, tally=tally, error=error)
            raise error
        base = self._result(call, admitted.route, response, tally.usage)
        result = PluginLlmStructuredResult(
            **vars(base), parsed=reply.parsed if reply.content_type == "json" else None, content_type=reply.content_type
        )
        self._audit_outcome(call, admitted, "ok", messages=first_messages, response=response, tally=tally)
        return result

    def _guarded(self, call: Call, admitted: Admitted, tally: "Tally", messages, steps: Flow) -> Flow:
        """Run ``steps``; whatever escapes them unaudited is audited once as an error and raised as a PluginLlmError."""
        failure: BaseException | None = None
        try:
            return (yield from steps)
        except BaseException as exc:  # noqa: BLE001 - the one place an unexpected failure becomes an outcome
            if tally.audited:
                raise
            failure = exc
        audit_messages = messages if messages is not None else tally.audit_messages
        if isinstance(failure, GeneratorExit):  # closed before it got far (a stream's consumer left during its
            failure = None  # admission): the stream's own record of that
            self._audit_outcome(call, admitted, "abandoned", messages=audit_messages, response=None, tally=tally)
            raise GeneratorExit
        if isinstance(failure, PluginLlmError) or not isinstance(failure, Exception):
            error, cause = failure, None  # a gateway error (or a cancellation): audited with its own status
        else:
            route = admitted.route
            error = PluginLlmError(
                f"the gateway failed during the call to {route.provider}/{route.model} ({_detail(failure)}); "
                f"this is a bug in the host, not in the plugin. The call is in the audit log as {call.call_id}."
            )
            cause = type(failure).__name__
        failure = None
        self._audit_outcome(call, admitted, _status_for(error), messages=audit_messages, response=None, tally=tally,
                            error=error, cause=cause)
        raise error

    def _result(self, call: Call, route: Route, response: TransportResponse, usage: PluginLlmUsage) -> PluginLlmCompleteResult:
        return PluginLlmCompleteResult(
            text=response.text or "",
            provider=route.provider,
            model=response.model or route.model,
            agent_id=call.agent_id,
            usage=usage,
            tool_calls=_tool_calls(route, response.message) if response.message.get("tool_calls") else (),
            audit={
                "plugin_id": call.plugin_id,
                "purpose": call.purpose,
                "profile": call.profile,
                "schema_name": call.schema_name,
                "call_id": call.call_id,
            },
        )

    # -- pipeline steps
    def _refuse_forbidden(self, call: Call, options: dict[str, Any]) -> None:
        """An endpoint or key argument is a trust denial: audited as one, before anything else."""
        error = _forbidden_error(self._plugin_id, options) if options else None
        if error is None:
            return
        config = self._config.current()
        record = records.denial_record(call, provider=config.model.provider or None, request_model=config.model.model,
                                       latency_ms=self._elapsed_ms(call), reason=str(error), key=None,
                                       error_type=type(error).__name__,
                                       denied_arguments=sorted(set(options) & FORBIDDEN))
        self._write_audit(call, config, record)
        raise error

    def _new_call(self, api, mode, purpose, agent_id, profile, schema_name) -> Call:
        check_purpose(purpose)
        return Call(
            call_id=records.new_call_id(),
            plugin_id=self._plugin_id,
            api=api,
            mode=mode,
            purpose=purpose,
            agent_id=check_optional_str("agent_id", agent_id),
            profile=check_optional_str("profile", profile),
            schema_name=schema_name,
            started=self._clock(),
        )

    def _admit(self, call: Call, provider: str | None, model: str | None, timeout: float | None) -> Admitted:
        """Trust gate, route, deadline and - with ``audit.required`` - the begin record, before any provider call."""
        config = self._config.current()
        provider = check_optional_str("provider", provider)
        model = check_optional_str("model", model)
        active = (provider or config.model.provider or "").lower() or None
        overrides = Overrides(provider=provider, model=model, agent_id=call.agent_id, profile=call.profile, active_provider=active)
        try:
            decision = enforce(self._plugin_id, config.trust_for(self._plugin_id), overrides)
        except PluginLlmTrustError as exc:
            if config.closed_reason is not None:  # the flag may well be set: say what really refused it
                asked = ", ".join(f"{name} {value!r}" for name, value in overrides.requested().items())
                exc = PluginLlmTrustError(f"plugin '{self._plugin_id}' may not override {asked}: {config.closed_reason}",
                                          plugin_id=self._plugin_id, config_key=exc.config_key)
            self._write_audit(call, config, self._denial_record(call, config, overrides, exc))
            raise exc from None
        try:
            route = resolve_route(config, provider=provider, model=model, profile=call.profile, timeout=timeout)
            admitted = Admitted(config, route, decision, time.monotonic() + route.timeout)
        except PluginLlmError as exc:
            record = records.error_record(call, provider=config.model.provider or None,
                                          request_model=model or config.model.model,
                                          latency_ms=self._elapsed_ms(call), status="error",
                                          error_type=type(exc).__name__, decision_reason=decision.reason,
                                          error_message=str(exc))
            self._write_audit(call, config, record)
            raise
        if config.audit.required:
            self._write_begin(call, admitted)
        return admitted

    def _write_begin(self, call: Call, admitted: Admitted) -> None:
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
            sink = self._audit_sink(config)
            if isinstance(sink, ChecksWritable):
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
            })
        except Exception as exc:  # noqa: BLE001 - any failure to record the attempt refuses the call
            reason = _detail(exc)
        else:
            return
        raise PluginLlmConfigError(self._required_message(config, reason, sent=False))

    def _limits_in_memory(self, call: Call, admitted: Admitted, audit_messages, messages, params,
                          tally: "Tally") -> "limits.Ticket | None":
        """Admission under the plugin's limits without a store step (issue: budgets and rate limits):
        the ticket of an unlimited plugin (one dict lookup) or of a call this process's lease admits
        in memory (nearly every call of a busy plugin), else None: the store must decide
        (:meth:`_limits_store_step`). A refusal is the call's outcome (status ``quota``, with the
        deciding limit), audited, before anything is sent. Not a generator: nothing to yield."""
        settings = admitted.config.limits
        if settings.for_plugin(call.plugin_id).empty:
            return limits.UNLIMITED
        route = admitted.route
        failure: limits.PluginLlmLimitError | None = None
        try:
            ticket = limits.admit_in_memory(settings, admitted.config.home, call.plugin_id, messages, route.provider,
                                            route.model, params.get("max_tokens"), admitted.deadline,
                                            (params.get("tools"), params.get("response_format")))
        except limits.PluginLlmLimitError as exc:
            failure = exc
        if failure is not None:  # audited outside the except block: nothing chained
            self._limits_refused(call, admitted, audit_messages, tally, failure)
        if ticket is not None:
            tally.add_limits(ticket.audit_fields())
        return ticket

    def _limits_store_step(self, call: Call, admitted: Admitted, audit_messages, messages, params, tally: "Tally"):
        """Admission with a store step, through the shell (``limits.admit``, or ``aadmit`` off the event loop)."""
        route = admitted.route
        failure: limits.PluginLlmLimitError | None = None
        try:
            ticket = yield LimitStep(admitted.config.limits, admitted.config.home, call.plugin_id, {
                "messages": messages, "provider": route.provider, "model": route.model,
                "max_tokens": params.get("max_tokens"), "deadline": admitted.deadline,
                "extra": (params.get("tools"), params.get("response_format")),
            })
        except limits.PluginLlmLimitError as exc:
            failure = exc
        if failure is not None:
            self._limits_refused(call, admitted, audit_messages, tally, failure)
        tally.add_limits(ticket.audit_fields())
        return ticket

    def _limits_refused(self, call: Call, admitted: Admitted, audit_messages, tally: "Tally",
                        failure: "limits.PluginLlmLimitError") -> NoReturn:
        """Audit a refusal under the limits (status ``quota``, the deciding limit and key) and raise it;
        a structured call's repair is not audited here: the call's outcome is its schema mismatch."""
        if tally.repairing:  # (not a denial of the call: recorded as the repair's, see _structured_steps)
            raise RepairRefused(failure)
        tally.add_limits(failure.denial.audit_fields())  # decision "denied", the deciding limit and key
        if tally.schema is not None:
            tally.validation = "none"
        self._audit_outcome(call, admitted, "quota", messages=audit_messages, response=None, tally=tally, error=failure)
        raise failure

    def _provider_call(self, call: Call, admitted: Admitted, audit_messages, params, tally: "Tally", *, messages=None):
        """Admit under the limits, yield one transport request, settle; audit and raise whatever it
        ends in other than a usable response."""
        messages = messages if messages is not None else audit_messages
        ticket = self._limits_in_memory(call, admitted, audit_messages, messages, params, tally)
        if ticket is None:
            ticket = yield from self._limits_store_step(call, admitted, audit_messages, messages, params, tally)
        request = _transport_request(admitted, messages, _bounded_output(call, admitted, params, tally))
        failure: BaseException | None = None
        response = None
        try:
            response = yield request
            response = self._checked_response(response, admitted.route, tally)
        except BaseException as exc:  # noqa: BLE001 - every transport outcome is audited, then raised
            failure = exc
        if failure is None:
            if not response.priced and admitted.config.limits.prices:
                response = _operator_priced(admitted, response)
            ticket.settle(response.usage)  # queued: no store round trip on the caller's path
            return response
        _settle_failed(ticket, failure, replied=response is not None)
        error = self._request_failed(call, admitted, tally, audit_messages, failure)
        failure = None  # not kept in this frame: the transport's exception may hold a key in its frames
        raise error

    def _request_failed(self, call: Call, admitted: Admitted, tally: "Tally", audit_messages,
                        failure: BaseException) -> BaseException:
        """Audit the failure of a transport request (the reservation is already released); the error to raise."""
        cause = None
        if isinstance(failure, PluginLlmError) or not isinstance(failure, Exception):
            error = failure  # the transport's own error, or a cancellation/interrupt: raised as it is
        else:  # IndexError, KeyError, ... from a transport that let a malformed reply through
            route = admitted.route
            error = PluginLlmProviderError(
                f"the call to {route.provider}/{route.model} failed: the transport raised {_detail(failure)} "
                f"(a malformed provider reply or a transport bug). The call is in the audit log as {call.call_id}.",
                provider=route.provider,
            )
            cause = type(failure).__name__
        failure = None
        tally.attempts += _whole(getattr(error, "attempts", 1), 1)
        tally.provider_seconds += _seconds(getattr(error, "provider_seconds", 0.0))
        if tally.schema is not None:
            tally.validation = "none"
        status = "error" if cause is not None else _status_for(error)
        self._audit_outcome(call, admitted, status, messages=audit_messages, response=None, tally=tally,
                            error=error, cause=cause)
        return error

    @staticmethod
    def _checked_response(response: Any, route: Route, tally: "Tally") -> TransportResponse:
        """The transport's response, made safe to use and to record (one pass, no copy when sane).

        Structural problems (not a TransportResponse, text not a str, message
        not a dict) are a malformed reply: ``PluginLlmProviderError``. Numbers
        (usage, attempts, seconds) are clamped and the fix is recorded as an
        anomaly in the call's audit record.
        """
        if not isinstance(response, TransportResponse):
            raise _malformed(route, f"the transport returned {type(response).__name__}, not a TransportResponse")
        if response.text is not None and not isinstance(response.text, str):
            raise _malformed(route, f"its text is a {type(response.text).__name__}, not a str")
        if not isinstance(response.message, dict):
            raise _malformed(route, f"its message is a {type(response.message).__name__}, not a dict")
        usage, anomalies = checked_usage(response.usage)
        changes: dict[str, Any] = {}
        if anomalies:
            changes["usage"] = usage
            tally.note(anomalies)
        reported = getattr(response, "anomalies", ())  # the transport's own findings (clamped provider numbers)
        if reported:
            tally.note(reported if isinstance(reported, (list, tuple)) else (reported,))
        model = response.model
        if not isinstance(model, str) or not model or len(model) > MAX_NAME:
            changes["model"] = model[:MAX_NAME] if isinstance(model, str) and model else route.model
        attempts = response.attempts
        if type(attempts) is not int or not 1 <= attempts <= _MAX_ATTEMPTS:
            changes["attempts"] = fixed = _whole(attempts, 1) or 1
            tally.note((f"attempts: reported {_snippet(attempts)}, recorded as {fixed}",))
        seconds = response.provider_seconds
        if _seconds(seconds) != seconds:
            changes["provider_seconds"] = 0.0
            tally.note((f"provider_seconds: reported {_snippet(seconds)}, recorded as 0",))
        return dataclasses.replace(response, **changes) if changes else response

    # -- audit
    def _audit_sink(self, config: HostConfig):
        if self._audit_log is not None:
            return self._audit_log
        cached = self._sink_cache
        if cached is not None and cached[0] is config:
            return cached[1]
        sink = host_audit_log(config.home, config.audit)
        self._sink_cache = (config, sink)
        return sink

    def _required_message(self, config: HostConfig, reason: str, *, sent: bool) -> str:
        log_path = getattr(self._audit_log, "path", None) or Path(config.home) / "logs" / "agent.log"
        what = ("the call reached the provider, but its outcome could not be recorded, so its result is withheld"
                if sent else "the call was not sent to the provider")
        return (
            f"the audit log {log_path} could not be written ({reason}) and audit.required is true in "
            f"{config.path}: {what}. Fix the log (free disk space, permissions, file-size limits) or set "
            "audit.required: false to log best-effort."
        )

    def _write_audit(self, call: Call, config: HostConfig, record: dict[str, Any], *, sent: bool = False) -> None:
        """Append ``record``; never raises, except PluginLlmConfigError when audit.required is true.

        ``sent``: whether the provider has seen the request (for the error message).
        """
        try:
            self._audit_sink(config).write(record)
        except Exception as exc:  # noqa: BLE001 - an audit problem must not break a call unless required
            reason = _detail(exc)
        else:
            return
        if config.audit.required:
            raise PluginLlmConfigError(self._required_message(config, reason, sent=sent))
        try:
            log.error("audit record for call %s was not written: %s", call.call_id, reason)
        except Exception:  # noqa: BLE001 - a broken logging setup neither
            pass

    def _elapsed_ms(self, call: Call) -> float:
        return (self._clock() - call.started) * 1000.0

    def _denial_record(self, call: Call, config: HostConfig, overrides: Overrides, exc: PluginLlmTrustError) -> dict[str, Any]:
        return records.denial_record(call, provider=overrides.provider or config.model.provider,
                                     request_model=overrides.model or config.model.model,
                                     latency_ms=self._elapsed_ms(call), reason=str(exc), key=exc.config_key or None,
                                     error_type=type(exc).__name__, config_error=config.error)

    def _audit_outcome(self, call: Call, admitted: Admitted, status: str, *, messages, response, tally: "Tally",
                       error: BaseException | None = None, cause: str | None = None) -> None:
        """Write the call's one outcome record (``tally.audited`` keeps ``_guarded`` from writing a second)."""
        config = admitted.config
        try:
            record = self._outcome_record(call, admitted, status, messages, response, tally, error)
        except Exception as exc:  # noqa: BLE001 - defence in depth: every input was checked already
            if status == "ok":
                raise  # not written yet: _guarded records the failure as the outcome
            record = records.error_record(call, provider=admitted.route.provider, request_model=admitted.route.model,
                                          latency_ms=self._elapsed_ms(call), status=status,
                                          error_type=type(error).__name__ if error else None,
                                          decision_reason=admitted.decision.reason, attempts=tally.attempts,
                                          record_error=type(exc).__name__)
        if cause is not None:
            record[records.ERROR_CAUSE] = cause
        if tally.stream is not None:
            record.update(tally.stream.fields())
        tally.audited = True
        self._write_audit(call, config, record, sent=response is not None or tally.attempts > 0)

    def _outcome_record(self, call, admitted, status, messages, response, tally, error) -> dict[str, Any]:
        config, usage = admitted.config, tally.usage
        latency_ms = self._elapsed_ms(call)
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
            content=(messages, response.text if response else None) if config.audit.log_content else None)
        if tally.limit_fields:
            record.update(tally.limit_fields)
        return record


def _with_current_limits(admitted: Admitted, config: HostConfig) -> Admitted:
    """``admitted`` with the limits of ``config`` (a reload since the call began may have lowered a
    cap); its trust decision and route stay the call's."""
    if config.limits is admitted.config.limits:
        return admitted
    return dataclasses.replace(admitted, config=dataclasses.replace(admitted.config, limits=config.limits))


def _settle_failed(ticket: "limits.Ticket", failure: BaseException, *, replied: bool) -> None:
    """A request that ended in no usable reply: released when the provider refused it (an error
    reply, no connection: nothing billed), else charged its reservation, the worst case -- a reply
    came but was unusable, or a stream was cut short, or the request timed out or was cancelled
    while out: the provider may have billed it, and how much is unknown."""
    if replied or isinstance(failure, PluginLlmTimeoutError) or not isinstance(failure, Exception):
        ticket.settle()
    else:
        ticket.release()


def _bounded_output(call: Call, admitted: Admitted, params: dict, tally: "Tally") -> dict:
    """``params`` with ``max_tokens`` set to the output bound the limits reserved when they count
    output and the plugin set none (or a larger one): the reservation is then a ceiling the
    provider keeps (litellm names it per provider: max_completion_tokens, max_output_tokens ...)."""
    settings = admitted.config.limits
    if settings.for_plugin(call.plugin_id).empty:
        return params
    route = admitted.route
    bound = limits.output_bound(settings, admitted.config.home, call.plugin_id, route.provider, route.model,
                                params.get("max_tokens"))
    if bound is None:
        return params
    tally.add_limits({records.LIMITS_MAX_TOKENS_SENT: bound})
    return {**params, "max_tokens": bound}


def _transport_request(admitted: Admitted, messages: list, params: dict) -> TransportRequest:
    """The transport request of one provider request, with the operator's price of the route when
    ``limits.prices`` has one (the transport then reports that cost: ``TransportResponse.priced``)."""
    route, config = admitted.route, admitted.config
    prices = config.limits.prices
    return TransportRequest(
        route=route,
        messages=messages,
        keys=key_source(config.home, route.provider, route.profile),
        deadline=admitted.deadline,
        params=params,
        cost=limits.operator_cost(route.provider, route.model, prices) if prices else None,
    )


def _operator_priced(admitted: Admitted, response: TransportResponse) -> TransportResponse:
    """The response with its cost at the operator's price (``limits.prices``) when one is set for
    the route's model: it wins over litellm's price map, for the result, the audit and the budget.
    (For a transport that did not apply ``TransportRequest.cost`` itself: ``priced`` is False.)"""
    route = admitted.route
    price = limits.find_price(route.provider, route.model, admitted.config.limits.prices)
    if price is None or not price.operator:
        return response
    usage = response.usage
    cost = limits.actual_cost_nano(price, None, usage.input_tokens, usage.output_tokens) / limits.NANO
    if usage.cost_usd == cost and type(usage.cost_usd) is float:
        return response
    return _with_field(response, "usage", _with_field(usage, "cost_usd", cost))


def _with_field(obj: Any, name: str, value: Any) -> Any:
    """``dataclasses.replace(obj, name=value)`` for the gateway's own frozen response and usage
    types, as a copy of the instance dict (replace re-runs ``__init__`` over every field: the two
    per limited call cost more than the rest of its pricing); anything else goes through replace."""
    kind = type(obj)
    if kind is not TransportResponse and kind is not PluginLlmUsage:
        return dataclasses.replace(obj, **{name: value})
    new = object.__new__(kind)
    fields = new.__dict__
    fields.update(obj.__dict__)
    fields[name] = value
    return new


def _malformed(route: Route, problem: str) -> PluginLlmProviderError:
    return PluginLlmProviderError(
        f"the reply of {route.provider}/{route.model} is malformed: {problem}", provider=route.provider,
    )


def _status_for(exc: BaseException) -> str:
    if isinstance(exc, PluginLlmTimeoutError):
        return "timeout"
    if isinstance(exc, PluginLlmQuotaError):
        return "quota"
    if isinstance(exc, PluginLlmProviderError):
        return "provider_error"
    if isinstance(exc, PluginLlmSchemaError):
        return "schema_error"
    return "error"


class HostLlm(PluginLlm):
    """The host's own model calls (the session loop): tools allowed, audited as ``host``."""

    def __init__(self, home: Path | str | None = None, *, identity: str = HOST_IDENTITY, **kwargs: Any) -> None:
        super().__init__(identity, home=home, **kwargs)

    def chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
             purpose: str | None = None, timeout: float | None = None) -> HostChatResult:
        """One model request of a session turn; ``tools`` in OpenAI function-calling form."""
        return self._run_sync(self._chat_flow("sync", messages, tools, purpose, timeout))

    async def achat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                    purpose: str | None = None, timeout: float | None = None) -> HostChatResult:
        """Async twin of :meth:`chat`."""
        return await self._run_async(self._chat_flow("async", messages, tools, purpose, timeout))

    def _chat_flow(self, mode, messages, tools, purpose, timeout) -> Flow:
        return self._complete_flow(mode, messages, None, None, None, None, timeout, None, None, purpose, {},
                                   tools=tools, finish=self._chat_result)

    def _chat_result(self, call: Call, route: Route, response: TransportResponse, usage: PluginLlmUsage) -> HostChatResult:
        base = self._result(call, route, response, usage)
        return HostChatResult(
            text=response.text, tool_calls=base.tool_calls, message=dict(response.message), usage=usage,
            provider=base.provider, model=base.model, audit=base.audit,
        )


def _tool_calls(route: Route, message: dict[str, Any]) -> tuple[PluginLlmToolCall, ...]:
    """The tool calls of a reply message, checked (a malformed one is a provider error)."""
    raw_calls = message.get("tool_calls") or ()
    if not isinstance(raw_calls, (list, tuple)):
        raise _malformed(route, f"its tool_calls is a {type(raw_calls).__name__}, not a list")
    calls = []
    for index, raw in enumerate(raw_calls):
        function = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(function, dict) or not isinstance(raw.get("id"), str) or not isinstance(function.get("name"), str):
            raise _malformed(route, f"tool_calls[{index}] needs a str 'id' and a 'function' with a str 'name'")
        arguments_text = function.get("arguments") or "{}"
        if not isinstance(arguments_text, str):
            raise _malformed(route, f"tool_calls[{index}]['function']['arguments'] is a "
                                    f"{type(arguments_text).__name__}, not a JSON string")
        try:
            arguments = loads_bounded(arguments_text)
        except (ValueError, RecursionError):
            arguments = {}
        calls.append(PluginLlmToolCall(raw["id"], function["name"], arguments if isinstance(arguments, dict) else {},
                                       arguments_text))
    return tuple(calls)
