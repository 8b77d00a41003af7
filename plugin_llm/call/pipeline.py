"""The call pipeline: one generator per call that yields steps and receives their outcomes.

A flow = the checks of the request (nothing audited: no call yet) ->
admission (the trust gate and the route; it audits its own denials and route
errors) -> the guarded steps. From admission on, every outcome gets exactly
one record: the steps audit what they know how to describe, and
:meth:`Pipeline._guarded` audits anything else once, as an error. The shells
(``call.shells``) perform the steps, so gating, limits, routing, structured
parsing, repair and auditing are the same code for sync, async and streams.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NoReturn

from audit import records
from plugin_llm import limits, structured
from plugin_llm.call.audit import CallAudit, detail
from plugin_llm.call.fallback import (
    NextRoute,
    another_route_can_fix,
    attempt_outcome,
    route_available,
    route_tried,
    status_for,
)
from plugin_llm.call.provider_request import bounded_output, settle_failed, transport_request, with_current_limits
from plugin_llm.call.protocols import Transport
from plugin_llm.call.request import CallRequest, StructuredSpec
from plugin_llm.call.response import checked_response, complete_result, operator_priced, seconds, whole
from plugin_llm.call.shells import Shell
from plugin_llm.call.steps import (
    Admitted,
    Call,
    Emit,
    Flow,
    LimitStep,
    Ready,
    RepairRefused,
    Run,
    StreamOpen,
    StreamProgress,
    StreamRead,
    Tally,
)
from plugin_llm.call.validate import (
    check_messages,
    check_optional_str,
    check_params,
    check_purpose,
    check_system_prompt,
    check_task,
    check_tools,
)
from plugin_llm.call_options import FORBIDDEN, check_options
from plugin_llm.config import ConfigSource, HostConfig
from plugin_llm.errors import PluginLlmError, PluginLlmProviderError, PluginLlmSchemaError, PluginLlmTrustError
from plugin_llm.routing import Route, requested_overrides, resolve_chain
from plugin_llm.transport import TransportRequest, TransportResponse
from plugin_llm.trust import Decision, Overrides, decide_task, enforce
from plugin_llm.types import PluginLlmStructuredResult, PluginLlmUsage

__all__ = ["Pipeline", "Finish"]

#: what a completed call returns, from its facts, route, checked response and total usage
Finish = Callable[[Call, Route, TransportResponse, PluginLlmUsage], Any]
#: who registered an auxiliary task (``ctx.register_auxiliary_task``): task key -> plugin id, or None
TaskOwner = Callable[[str], "str | None"]


class Pipeline:
    """The flows of one plugin's calls, over its config, transport, audit (its sink and clock) and
    ``task_owner``: who registered an auxiliary task."""

    def __init__(self, plugin_id: str, config: ConfigSource, transport: Transport | None, audit: CallAudit,
                 task_owner: TaskOwner | None = None) -> None:
        self._plugin_id = plugin_id
        self._task_owner = task_owner
        self._config = config
        self._transport = transport
        self._shell: Shell | None = None
        self._audit = audit
        self._clock = audit.clock

    def shell(self) -> Shell:
        """The shell over the transport (``LitellmTransport`` unless one was given), made once."""
        shell = self._shell
        if shell is None:
            transport = self._transport
            if transport is None:
                from plugin_llm.transport import LitellmTransport

                transport = self._transport = LitellmTransport()
            shell = self._shell = Shell(transport)
        return shell

    # ------------------------------------------------------------- flows
    def complete_flow(self, request: CallRequest, finish: Finish = complete_result) -> Flow:
        """``complete`` (and the host's ``chat``, whose ``finish`` makes its own result)."""
        call = self._new_call(request, None)
        options = request.options
        self._refuse_forbidden(call, options)
        messages = check_messages(request.messages)
        extra = check_options("complete", options, tools_check=check_tools) if options else {}
        tools = check_tools(request.tools)
        check_params(request.temperature, request.max_tokens, request.timeout)
        params: dict[str, Any] = {"temperature": request.temperature, "max_tokens": request.max_tokens, **extra}
        if tools:
            params["tools"] = tools
        run = Run(call, self._admit(call, request), Tally())
        run.tally.audit_messages, run.tally.params = messages, params
        return (yield from self._guarded(run, self._complete_steps(run, messages, params, finish)))

    def _complete_steps(self, run: Run, messages: list, params: dict, finish: Finish) -> Flow:
        response = yield from self._provider_call(run, messages, params)
        tally = run.tally.add(response)
        result = finish(run.call, run.admitted.route, response, tally.usage)  # a failure here is the outcome
        self._audit.outcome(run, "ok", response)
        return result

    def stream_flow(self, request: CallRequest, progress: StreamProgress) -> Flow:
        """``complete``'s flow, streamed: the same checks and admission, then :meth:`_stream_steps`."""
        call = self._new_call(request, None, stream=True)
        progress.call_id = call.call_id
        options = request.options
        self._refuse_forbidden(call, options)
        messages = check_messages(request.messages)
        if options and (options.get("tools") is not None or options.get("tool_choice") is not None):
            raise ValueError("stream()/astream() take no tools= or tool_choice=: a tool call arrives in fragments "
                             "that are usable only once whole. Call complete(..., tools=[...]) for tool calls and "
                             "stream() for text")
        extra = check_options("complete", options) if options else {}
        check_params(request.temperature, request.max_tokens, request.timeout)
        params: dict[str, Any] = {"temperature": request.temperature, "max_tokens": request.max_tokens, **extra}
        run = Run(call, self._admit(call, request), Tally())
        progress.deadline = run.admitted.deadline
        run.tally.stream = progress
        run.tally.audit_messages, run.tally.params = messages, params
        return (yield from self._guarded(run, self._stream_steps(run, messages, params)))

    def _stream_steps(self, run: Run, messages: list, params: dict) -> Flow:
        """Admit, open the provider stream, hand out each delta, settle and audit at the end.

        Whatever the stream ends in gets the call's one record: ``ok`` at the
        end, the error's status when it fails (partial, with the characters
        delivered), ``abandoned`` when the consumer closes or drops it (the
        flow is closed at the delta it was waiting at: ``GeneratorExit``).
        """
        tally = run.tally
        progress = tally.stream
        if run.admitted.chain:
            ticket, request = yield from self._chained_open(run, messages, params)
        else:
            ticket, request = yield from self._admitted_request(run, messages, params)
        admitted = run.admitted
        progress.deadline = admitted.deadline
        failure: BaseException | None = None
        try:
            if progress.stream is None:
                progress.stream = yield StreamOpen(request)
            while True:
                text = yield StreamRead(progress.stream)
                if text is None:
                    break
                if not progress.delivered:
                    progress.first_chunk_seconds = self._audit.elapsed_ms(run.call) / 1000.0
                progress.delivered += len(text)
                yield Emit(text)
            response = checked_response(progress.stream.final(), admitted.route, tally)
        except GeneratorExit:  # the consumer abandoned the stream
            self._stream_abandoned(run, ticket)
            raise
        except BaseException as exc:  # noqa: BLE001 - every transport outcome is audited, then raised
            failure = exc
        if failure is not None:
            settle_failed(ticket, failure, replied=progress.stream is not None)
            if progress.stream is not None:
                progress.stream.close()
            error = self._request_failed(run, failure)
            failure = None
            raise error
        progress.partial = False
        if not response.priced and admitted.config.limits.prices:
            response = operator_priced(admitted, response)
        # a stream whose provider sent no usage has it estimated from the text, which can fall short
        # (hidden reasoning tokens, another tokenizer): the limits charge the reservation instead
        ticket.settle(None if response.usage.estimated else response.usage)
        tally.add(response)
        result = complete_result(run.call, admitted.route, response, tally.usage)
        self._audit.outcome(run, "ok", response)
        return result

    def _chained_open(self, run: Run, messages: list, params: dict) -> Flow:
        """A stream's route and fallbacks: each route in order opens its stream (nothing has reached
        the consumer yet); the first that opens is the call's, and a failure another route can fix
        moves on to the next. Its limits ticket and request; ``progress.stream`` is the open stream."""
        chain, progress = run.admitted.chain, run.tally.stream
        for index, route in enumerate(chain):
            more = index + 1 < len(chain)
            run.admitted = dataclasses.replace(run.admitted, route=route)
            if more and not (yield from route_available(run)):
                continue
            ticket, request = yield from self._admitted_request(run, messages, params)
            started = time.monotonic()
            failure: BaseException | None = None
            try:
                progress.stream = yield StreamOpen(request)
            except GeneratorExit:  # the consumer left while the stream was being opened
                self._stream_abandoned(run, ticket)
                raise
            except BaseException as exc:  # noqa: BLE001 - audited here or passed to the next route
                failure = exc
            if failure is None:
                yield from route_tried(run, started, "ok", True)
                return ticket, request
            fixable = another_route_can_fix(failure, run.admitted.deadline)
            yield from route_tried(run, started, attempt_outcome(failure), False if fixable else None)
            settle_failed(ticket, failure, replied=False)
            if not (more and fixable):  # the call's outcome, as a lone route's failure to open would be
                error = self._request_failed(run, failure)
                failure = None
                raise error
            failure = None
        raise AssertionError("a chain's last route is always tried")  # pragma: no cover

    def _stream_abandoned(self, run: Run, ticket: limits.Ticket) -> None:
        """The record of a stream its consumer closed or dropped before its end (charged its reservation
        once the provider answered), written before the slot is given back (see docs/design.md)."""
        tally = run.tally
        stream = tally.stream.stream
        try:
            if stream is not None:
                stream.close()
                tally.attempts += whole(getattr(stream, "attempts", 1), 1)
                tally.provider_seconds += seconds(getattr(stream, "provider_seconds", 0.0))
            self._audit.outcome(run, "abandoned", None)
        finally:
            if stream is None:
                ticket.release()
            else:
                ticket.settle()

    def structured_flow(self, request: CallRequest) -> Flow:
        """``complete_structured``: typed JSON, validated against the schema, repaired if it does not match."""
        spec = request.structured
        schema_name = check_optional_str("schema_name", spec.schema_name)
        call = self._new_call(request, schema_name)
        options = request.options
        self._refuse_forbidden(call, options)
        extra = check_options("structured", options) if options else {}
        checked = StructuredSpec(
            instructions=structured.check_instructions(spec.instructions),
            input=structured.normalise_input(spec.input),
            json_schema=structured.check_schema(spec.json_schema),
            json_mode=bool(spec.json_mode),
            schema_name=schema_name,
            system_prompt=spec.system_prompt,
        )
        check_system_prompt(spec.system_prompt)
        check_params(request.temperature, request.max_tokens, request.timeout)
        params: dict[str, Any] = {"temperature": request.temperature, "max_tokens": request.max_tokens, **extra}
        run = Run(call, self._admit(call, request), Tally(schema=checked.json_schema))
        run.tally.params = params
        return (yield from self._guarded(run, self._structured_steps(run, checked, params)))

    def _structured_steps(self, run: Run, spec: StructuredSpec, params: dict) -> Flow:
        tally, schema, schema_name = run.tally, spec.json_schema, spec.schema_name
        if schema is not None:  # whether the route takes the schema natively: litellm knows (past the gate)
            yield from self._ready(run, None, None)
        native = schema is not None and bool(self.shell().transport.supports_json_schema(run.admitted.route))
        messages = tally.audit_messages = structured.build_messages(
            instructions=spec.instructions, blocks=spec.input, json_schema=schema, schema_name=schema_name,
            system_prompt=spec.system_prompt, native_schema=native,
        )
        params["response_format"] = structured.response_format(
            json_schema=schema, schema_name=schema_name, json_mode=spec.json_mode, native_schema=native
        )
        max_repairs = run.admitted.config.llm.structured_repair_attempts
        refused: limits.PluginLlmLimitError | None = None
        for repair in range(max_repairs + 1):
            if repair:  # a repair is a request of its own: admitted under the limits as they are now
                run.admitted = with_current_limits(run.admitted, self._config.current())
            tally.repairing = bool(repair)
            try:
                response = yield from self._provider_call(run, messages, params)
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
        route = run.admitted.route
        if reply.content_type == "json" and not reply.valid:
            why = "" if refused is None else f"; no further repair was sent: {refused}"
            error = PluginLlmSchemaError(
                f"the reply of {route.provider}/{response.model or route.model} does not match the schema"
                f"{f' {schema_name!r}' if schema_name else ''} after {tally.repairs} repair attempt(s): "
                + "; ".join(reply.errors[:5]) + why,
                text=reply.text, errors=list(reply.errors), usage=tally.usage,
            )
            self._audit.outcome(run, "schema_error", response, error)
            raise error
        base = complete_result(run.call, route, response, tally.usage)
        result = PluginLlmStructuredResult(
            **vars(base), parsed=reply.parsed if reply.content_type == "json" else None, content_type=reply.content_type
        )
        self._audit.outcome(run, "ok", response)
        return result

    def _guarded(self, run: Run, steps: Flow) -> Flow:
        """Run ``steps``; whatever escapes them unaudited is audited once as an error and raised as a PluginLlmError."""
        failure: BaseException | None = None
        try:
            return (yield from steps)
        except BaseException as exc:  # noqa: BLE001 - the one place an unexpected failure becomes an outcome
            if run.tally.audited:
                raise
            failure = exc
        if isinstance(failure, GeneratorExit):  # closed before it got far (a stream's consumer left during its
            failure = None  # admission): the stream's own record of that
            self._audit.outcome(run, "abandoned", None)
            raise GeneratorExit
        if isinstance(failure, PluginLlmError) or not isinstance(failure, Exception):
            error, cause = failure, None  # a gateway error (or a cancellation): audited with its own status
        else:
            route = run.admitted.route
            error = PluginLlmError(
                f"the gateway failed during the call to {route.provider}/{route.model} ({detail(failure)}); "
                f"this is a bug in the host, not in the plugin. The call is in the audit log as {run.call.call_id}."
            )
            cause = type(failure).__name__
        failure = None
        self._audit.outcome(run, status_for(error), None, error, cause)
        raise error

    # ------------------------------------------------------------- admission
    def _new_call(self, request: CallRequest, schema_name: str | None, *, stream: bool = False) -> Call:
        check_purpose(request.purpose)
        return Call(
            call_id=records.new_call_id(),
            plugin_id=self._plugin_id,
            api=request.api,
            mode=request.mode,
            purpose=request.purpose,
            agent_id=check_optional_str("agent_id", request.agent_id),
            profile=check_optional_str("profile", request.profile),
            schema_name=schema_name,
            task=check_task(request.task),
            stream=stream,
            started=self._clock(),
        )

    def _refuse_forbidden(self, call: Call, options: dict[str, Any] | None) -> None:
        """An endpoint or key argument is a trust denial: audited as one, before anything else."""
        forbidden = sorted(set(options) & FORBIDDEN) if options else None
        if not forbidden:
            return
        error = PluginLlmTrustError(
            f"plugin '{self._plugin_id}' passed {', '.join(forbidden)}: plugins can never choose an endpoint or a "
            "key; the operator sets them in config.yaml (model.base_url) and auth.json",
            plugin_id=self._plugin_id,
            config_key="",
        )
        config = self._config.current()
        record = records.denial_record(call, provider=config.model.provider or None, request_model=config.model.model,
                                       latency_ms=self._audit.elapsed_ms(call), reason=str(error), key=None,
                                       error_type=type(error).__name__, denied_arguments=forbidden)
        self._audit.write(call, config, record)
        raise error

    def _admit(self, call: Call, request: CallRequest) -> Admitted:
        """Trust gate, route, deadline and - with ``audit.required`` - the begin record, before any provider call."""
        config = self._config.current()
        provider = check_optional_str("provider", request.provider)
        model = check_optional_str("model", request.model)
        overrides = requested_overrides(config, provider=provider, model=model, agent_id=call.agent_id,
                                        profile=call.profile)
        model = overrides.model
        policy = config.trust_for(self._plugin_id)
        task_decision = None
        if call.task:  # the task gate first: a task the plugin may not use refuses the call whatever else it asks
            owner = self._task_owner(call.task) if self._task_owner is not None else None
            task_decision = decide_task(self._plugin_id, policy, call.task, owner)
            if not task_decision.allowed:
                reason = task_decision.reason
                if config.closed_reason is not None and task_decision.config_key:
                    reason = f"plugin '{self._plugin_id}' may not use the built-in task {call.task!r}: {config.closed_reason}"
                self._denied(call, config, overrides, PluginLlmTrustError(
                    reason, plugin_id=self._plugin_id, config_key=task_decision.config_key or ""))
        try:
            decision = enforce(self._plugin_id, policy, overrides)
        except PluginLlmTrustError as exc:
            if config.closed_reason is not None:  # the flag may well be set: say what really refused it
                asked = ", ".join(f"{name} {value!r}" for name, value in overrides.requested().items())
                exc = PluginLlmTrustError(f"plugin '{self._plugin_id}' may not override {asked}: {config.closed_reason}",
                                          plugin_id=self._plugin_id, config_key=exc.config_key)
            self._denied(call, config, overrides, exc)
        if task_decision is not None:
            decision = Decision(True, f"{task_decision.reason}; {decision.reason}", override=decision.override)
        try:
            chain = resolve_chain(config, provider=provider, model=model, profile=call.profile, timeout=request.timeout,
                                  task=call.task)
            route = chain[0]
            admitted = Admitted(config, route, decision, time.monotonic() + route.timeout,
                                chain if len(chain) > 1 else ())
        except PluginLlmError as exc:
            record = records.error_record(call, provider=config.model.provider or None,
                                          request_model=model or config.model.model,
                                          latency_ms=self._audit.elapsed_ms(call), status="error",
                                          error_type=type(exc).__name__, decision_reason=decision.reason,
                                          error_message=str(exc))
            self._audit.write(call, config, record)
            raise
        if config.audit.required:
            self._audit.begin(call, admitted)
        return admitted

    def _denied(self, call: Call, config: HostConfig, overrides: Overrides, exc: PluginLlmTrustError) -> NoReturn:
        """Audit a denial of the trust gate (nothing was sent) and raise it."""
        record = records.denial_record(call, provider=overrides.provider or config.model.provider,
                                       request_model=overrides.model or config.model.model,
                                       latency_ms=self._audit.elapsed_ms(call), reason=str(exc),
                                       key=exc.config_key or None, error_type=type(exc).__name__,
                                       config_error=config.error)
        self._audit.write(call, config, record)
        raise exc from None

    # ------------------------------------------------------------- one provider request
    def _limits_in_memory(self, run: Run, messages: list, params: dict) -> limits.Ticket | None:
        """Admission under the plugin's limits without a store step: the ticket of an unlimited
        plugin (one dict lookup) or of a call this process's lease admits in memory (nearly every
        call of a busy plugin), else None: the store must decide (:meth:`_limits_store_step`). A
        refusal is the call's outcome (status ``quota``, with the deciding limit), audited, before
        anything is sent. Not a generator: nothing to yield."""
        admitted, plugin_id = run.admitted, run.call.plugin_id
        settings = admitted.config.limits
        if settings.for_plugin(plugin_id).empty:
            return limits.UNLIMITED
        route = admitted.route
        failure: limits.PluginLlmLimitError | None = None
        try:
            ticket = limits.admit_in_memory(settings, admitted.config.home, plugin_id, messages, route.provider,
                                            route.model, params.get("max_tokens"), admitted.deadline,
                                            (params.get("tools"), params.get("response_format")))
        except limits.PluginLlmLimitError as exc:
            failure = exc
        if failure is not None:  # audited outside the except block: nothing chained
            self._limits_refused(run, failure)
        if ticket is not None:
            run.tally.add_limits(ticket.audit_fields())
        return ticket

    def _limits_store_step(self, run: Run, messages: list, params: dict) -> Flow:
        """Admission with a store step, through the shell (``limits.admit``, or ``aadmit`` off the event loop)."""
        admitted = run.admitted
        route = admitted.route
        failure: limits.PluginLlmLimitError | None = None
        try:
            ticket = yield LimitStep(admitted.config.limits, admitted.config.home, run.call.plugin_id, {
                "messages": messages, "provider": route.provider, "model": route.model,
                "max_tokens": params.get("max_tokens"), "deadline": admitted.deadline,
                "extra": (params.get("tools"), params.get("response_format")),
            })
        except limits.PluginLlmLimitError as exc:
            failure = exc
        if failure is not None:
            self._limits_refused(run, failure)
        run.tally.add_limits(ticket.audit_fields())
        return ticket

    def _limits_refused(self, run: Run, failure: limits.PluginLlmLimitError) -> NoReturn:
        """Audit a refusal under the limits (status ``quota``, the deciding limit and key) and raise it;
        a structured call's repair is not audited here: the call's outcome is its schema mismatch."""
        tally = run.tally
        if tally.repairing:  # (not a denial of the call: recorded as the repair's, see _structured_steps)
            raise RepairRefused(failure)
        tally.add_limits(failure.denial.audit_fields())  # decision "denied", the deciding limit and key
        if tally.schema is not None:
            tally.validation = "none"
        self._audit.outcome(run, "quota", None, failure)
        raise failure

    def _admitted_request(self, run: Run, messages: list, params: dict) -> Flow:
        """Admit one request under the limits, bound its output as they reserved it, make the transport
        ready (litellm's import, after the gate): its limits ticket and the transport request."""
        ticket = self._limits_in_memory(run, messages, params)
        if ticket is None:
            ticket = yield from self._limits_store_step(run, messages, params)
        params = bounded_output(run, params)
        request = transport_request(run.admitted, messages, params)
        if (yield from self._ready(run, ticket, request)):  # the call's deadline moved on by the set-up
            request = transport_request(run.admitted, messages, params)
        return ticket, request

    def _provider_call(self, run: Run, messages: list, params: dict) -> Flow:
        """Admit under the limits, yield one transport request, settle; audit and raise whatever it
        ends in other than a usable response. A route with fallbacks: :meth:`_chained_call`."""
        if not run.admitted.chain:
            return (yield from self._one_request(run, messages, params, False))
        return (yield from self._chained_call(run, messages, params))

    def _one_request(self, run: Run, messages: list, params: dict, more: bool) -> Flow:
        """One provider request on ``run.admitted.route``. ``more``: a route of the chain follows,
        so a failure another route can fix is raised as :class:`NextRoute` (not audited: the
        chain goes on)."""
        ticket, request = yield from self._admitted_request(run, messages, params)
        admitted = run.admitted
        started = time.monotonic()
        failure: BaseException | None = None
        response = None
        try:
            response = yield request
            response = checked_response(response, admitted.route, run.tally)
        except BaseException as exc:  # noqa: BLE001 - every transport outcome is audited, then raised
            failure = exc
        if failure is None:
            if not response.priced and admitted.config.limits.prices:
                response = operator_priced(admitted, response)
            ticket.settle(response.usage)  # queued: no store round trip on the caller's path
            if admitted.chain:
                yield from route_tried(run, started, "ok", True)
            return response
        settle_failed(ticket, failure, replied=response is not None)
        if admitted.chain:
            fixable = another_route_can_fix(failure, admitted.deadline)
            yield from route_tried(run, started, attempt_outcome(failure), False if fixable else None)
            if more and fixable:
                failure = None
                raise NextRoute()
        error = self._request_failed(run, failure)
        failure = None  # not kept in this frame: the transport's exception may hold a key in its frames
        raise error

    def _chained_call(self, run: Run, messages: list, params: dict) -> Flow:
        """The route, then each fallback in order, within the call's one deadline: a route whose circuit
        breaker is open is skipped (the last one is always tried); a failure another route can fix
        moves on to the next route."""
        chain = run.admitted.chain
        for index, route in enumerate(chain):
            more = index + 1 < len(chain)
            run.admitted = dataclasses.replace(run.admitted, route=route)
            if more and not (yield from route_available(run)):
                continue
            try:
                return (yield from self._one_request(run, messages, params, more))
            except NextRoute:
                continue
        raise AssertionError("a chain's last route is always tried")  # pragma: no cover

    def _ready(self, run: Run, ticket: limits.Ticket | None, request: TransportRequest | None) -> Flow:
        """The transport's one-time set-up (litellm's import, for a route that needs it), only now that
        the call will be sent: a call refused before never loads the provider layer. Its time is not
        the call's: the call's clock and deadline move on by it (then this returns True). A set-up
        that fails frees the reservation (nothing was sent)."""
        clock, monotonic = self._clock(), time.monotonic()
        try:
            loaded = yield Ready(run.admitted.route, request)
        except BaseException:
            if ticket is not None:
                ticket.release()
            raise
        if loaded:
            admitted = run.admitted
            run.call = dataclasses.replace(run.call, started=run.call.started + self._clock() - clock)
            run.admitted = dataclasses.replace(admitted, deadline=admitted.deadline + time.monotonic() - monotonic)
        return bool(loaded)

    def _request_failed(self, run: Run, failure: BaseException) -> BaseException:
        """Audit the failure of a transport request (the reservation is already released); the error to raise."""
        cause = None
        if isinstance(failure, PluginLlmError) or not isinstance(failure, Exception):
            error = failure  # the transport's own error, or a cancellation/interrupt: raised as it is
        else:  # IndexError, KeyError, ... from a transport that let a malformed reply through
            route = run.admitted.route
            error = PluginLlmProviderError(
                f"the call to {route.provider}/{route.model} failed: the transport raised {detail(failure)} "
                f"(a malformed provider reply or a transport bug). The call is in the audit log as "
                f"{run.call.call_id}.",
                provider=route.provider,
            )
            cause = type(failure).__name__
        failure = None
        tally = run.tally
        tally.attempts += whole(getattr(error, "attempts", 1), 1)
        tally.provider_seconds += seconds(getattr(error, "provider_seconds", 0.0))
        if tally.schema is not None:
            tally.validation = "none"
        status = "error" if cause is not None else status_for(error)
        self._audit.outcome(run, status, None, error, cause)
        return error
