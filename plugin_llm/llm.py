"""``ctx.llm``: LLM calls for plugins through the host (SPEC §5).

One pipeline serves the four public methods. It is written as a generator
that *yields* transport requests and *receives* transport responses, so the
sync shell (``complete``) and the async shell (``acomplete``) differ only in
how they perform that one step; gating, routing, structured parsing, repair
and auditing are the same code for both.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator

from plugin_llm import structured
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
from plugin_llm.trust import Decision, Overrides, enforce
from plugin_llm.types import (
    PluginLlmCompleteResult,
    PluginLlmStructuredResult,
    PluginLlmUsage,
)

__all__ = ["PluginLlm", "HostLlm", "HostChatResult", "ToolCall", "HOST_IDENTITY"]

log = logging.getLogger("plugin_llm")

HOST_IDENTITY = "host"
_MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
#: parameters a plugin can never pass: endpoints and keys are the operator's
_FORBIDDEN = frozenset({"api_base", "base_url", "api_key", "api_version", "headers", "extra_headers", "custom_llm_provider"})

_Flow = Generator[TransportRequest, TransportResponse, Any]


@dataclass(frozen=True)
class ToolCall:
    """A tool call requested by the model (host runtime only)."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str


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


@dataclass(frozen=True)
class _Call:
    """Everything known about one call before it reaches the provider."""

    call_id: str
    plugin_id: str
    api: str
    mode: str
    purpose: str | None
    agent_id: str | None
    profile: str | None
    schema_name: str | None
    started: float


def _sha256_json(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts (OpenAI chat format)")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}")
        role = message.get("role")
        if role not in _MESSAGE_ROLES:
            raise ValueError(f"messages[{i}]['role'] must be one of {sorted(_MESSAGE_ROLES)}, got {role!r}")
        if "content" not in message and not message.get("tool_calls"):
            raise ValueError(f"messages[{i}] has no 'content'")
    return [dict(m) for m in messages]


def _check_optional_str(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string when given, got {value!r}")
    return value.strip()


def _check_forbidden(plugin_id: str, extra: dict[str, Any]) -> None:
    if not extra:
        return
    forbidden = sorted(set(extra) & _FORBIDDEN)
    if forbidden:
        raise PluginLlmTrustError(
            f"plugin '{plugin_id}' passed {', '.join(forbidden)}: plugins can never choose an endpoint or a key; "
            "the operator sets them in config.yaml (model.base_url) and auth.json",
            plugin_id=plugin_id,
            config_key="",
        )
    raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(extra))}")


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
        transport: Any = None,
        audit_log: Any = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(plugin_id, str) or not plugin_id.strip():
            raise ValueError("plugin_id must be a non-empty string (the plugin's manifest key)")
        self._plugin_id = plugin_id.strip()
        self._config = config_source or get_config_source(Path(home) if home is not None else None)
        if audit_log is None:
            watch_config(self._config)
        self._transport = transport
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
        **forbidden: Any,
    ) -> PluginLlmCompleteResult:
        """Chat completion; returns text, attribution, usage and the audit ids."""
        flow = self._complete_flow("sync", messages, provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, forbidden)
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
        **forbidden: Any,
    ) -> PluginLlmCompleteResult:
        """Async twin of :meth:`complete`; never blocks the event loop on the provider."""
        flow = self._complete_flow("async", messages, provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, forbidden)
        return await self._run_async(flow)

    def complete_structured(
        self,
        *,
        instructions: str,
        input: list[Any],
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
        **forbidden: Any,
    ) -> PluginLlmStructuredResult:
        """Typed JSON from text and image blocks, validated against ``json_schema``."""
        flow = self._structured_flow(
            "sync", instructions, input, json_schema, json_mode, schema_name, system_prompt,
            provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, forbidden,
        )
        return self._run_sync(flow)

    async def acomplete_structured(
        self,
        *,
        instructions: str,
        input: list[Any],
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
        **forbidden: Any,
    ) -> PluginLlmStructuredResult:
        """Async twin of :meth:`complete_structured`."""
        flow = self._structured_flow(
            "async", instructions, input, json_schema, json_mode, schema_name, system_prompt,
            provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, forbidden,
        )
        return await self._run_async(flow)

    # ------------------------------------------------------------- shells
    def _transport_impl(self):
        if self._transport is None:
            from plugin_llm.transport import LitellmTransport

            self._transport = LitellmTransport()
        return self._transport

    def _run_sync(self, flow: _Flow) -> Any:
        transport = self._transport_impl()
        if hasattr(transport, "ready"):  # one-time litellm import: not part of any call's latency
            transport.ready()
        try:
            request = next(flow)
            while True:
                try:
                    response = transport.complete(request)
                except PluginLlmError as exc:
                    request = flow.throw(exc)
                else:
                    request = flow.send(response)
        except StopIteration as done:
            return done.value

    async def _run_async(self, flow: _Flow) -> Any:
        transport = self._transport_impl()
        if hasattr(transport, "aready"):
            await transport.aready()
        try:
            request = next(flow)
            while True:
                try:
                    response = await transport.acomplete(request)
                except PluginLlmError as exc:
                    request = flow.throw(exc)
                else:
                    request = flow.send(response)
        except StopIteration as done:
            return done.value

    # ------------------------------------------------------------- pipeline
    def _complete_flow(self, mode, messages, provider, model, temperature, max_tokens, timeout, agent_id, profile,
                       purpose, forbidden, *, tools=None, finish=None) -> _Flow:
        _check_forbidden(self._plugin_id, forbidden)
        messages = _check_messages(messages)
        params: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
        if tools:
            params["tools"] = tools
        call = self._new_call("complete", mode, purpose, agent_id, profile, None)
        admitted = self._admit(call, provider, model, timeout)
        response = yield from self._provider_call(call, admitted, messages, params, _Tally())
        self._audit_outcome(call, admitted, "ok", messages=messages, response=response, tally=_Tally().add(response))
        return (finish or self._result)(call, admitted.route, response, response.usage)

    def _structured_flow(self, mode, instructions, input, json_schema, json_mode, schema_name, system_prompt,
                         provider, model, temperature, max_tokens, timeout, agent_id, profile, purpose, forbidden) -> _Flow:
        _check_forbidden(self._plugin_id, forbidden)
        instructions = structured.check_instructions(instructions)
        blocks = structured.normalise_input(input)
        schema = structured.check_schema(json_schema)
        schema_name = _check_optional_str("schema_name", schema_name)
        call = self._new_call("structured", mode, purpose, agent_id, profile, schema_name)
        admitted = self._admit(call, provider, model, timeout)
        native = schema is not None and bool(self._transport_impl().supports_json_schema(admitted.route))
        messages = first_messages = structured.build_messages(
            instructions=instructions, blocks=blocks, json_schema=schema, schema_name=schema_name,
            system_prompt=None if system_prompt is None else str(system_prompt), native_schema=native,
        )
        params = {
            "temperature": temperature,
            "max_tokens": max_tokens,
            "response_format": structured.response_format(
                json_schema=schema, schema_name=schema_name, json_mode=bool(json_mode), native_schema=native
            ),
        }
        tally = _Tally(schema=schema)
        max_repairs = admitted.config.llm.structured_repair_attempts
        for repair in range(max_repairs + 1):
            response = yield from self._provider_call(call, admitted, first_messages, params, tally, messages=messages)
            tally.add(response)
            reply = structured.parse_reply(response.text or "", schema)
            if reply.content_type != "json" or reply.valid or repair == max_repairs:
                break
            tally.repairs += 1
            messages = structured.repair_messages(messages, reply)
        tally.validation = "none" if schema is None else ("passed" if reply.valid else "failed")
        if reply.content_type == "json" and not reply.valid:
            route = admitted.route
            error = PluginLlmSchemaError(
                f"the reply of {route.provider}/{response.model or route.model} does not match the schema"
                f"{f' {schema_name!r}' if schema_name else ''} after {tally.repairs} repair attempt(s): "
                + "; ".join(reply.errors[:5]),
                text=reply.text, errors=list(reply.errors), usage=tally.usage,
            )
            self._audit_outcome(call, admitted, "schema_error", messages=first_messages, response=response, tally=tally, error=error)
            raise error
        self._audit_outcome(call, admitted, "ok", messages=first_messages, response=response, tally=tally)
        base = self._result(call, admitted.route, response, tally.usage)
        return PluginLlmStructuredResult(
            **vars(base), parsed=reply.parsed if reply.content_type == "json" else None, content_type=reply.content_type
        )

    def _result(self, call: _Call, route: Route, response: TransportResponse, usage: PluginLlmUsage) -> PluginLlmCompleteResult:
        return PluginLlmCompleteResult(
            text=response.text or "",
            provider=route.provider,
            model=response.model or route.model,
            agent_id=call.agent_id,
            usage=usage,
            audit={
                "plugin_id": call.plugin_id,
                "purpose": call.purpose,
                "profile": call.profile,
                "schema_name": call.schema_name,
                "call_id": call.call_id,
            },
        )

    # -- pipeline steps
    def _new_call(self, api, mode, purpose, agent_id, profile, schema_name) -> _Call:
        if purpose is not None and not isinstance(purpose, str):
            raise ValueError(f"purpose must be a string, got {type(purpose).__name__}")
        return _Call(
            call_id=uuid.uuid4().hex,
            plugin_id=self._plugin_id,
            api=api,
            mode=mode,
            purpose=purpose,
            agent_id=_check_optional_str("agent_id", agent_id),
            profile=_check_optional_str("profile", profile),
            schema_name=schema_name,
            started=self._clock(),
        )

    def _admit(self, call: _Call, provider: str | None, model: str | None, timeout: float | None) -> _Admitted:
        """Trust gate, route, deadline and the audit pre-flight, before any provider call."""
        config = self._config.current()
        provider = _check_optional_str("provider", provider)
        model = _check_optional_str("model", model)
        active = (provider or config.model.provider or "").lower() or None
        overrides = Overrides(provider=provider, model=model, agent_id=call.agent_id, profile=call.profile, active_provider=active)
        try:
            decision = enforce(self._plugin_id, config.trust_for(self._plugin_id), overrides)
        except PluginLlmTrustError as exc:
            self._write_audit(call, config, self._denial_record(call, config, overrides, exc))
            raise
        try:
            route = resolve_route(config, provider=provider, model=model, profile=call.profile, timeout=timeout)
            admitted = _Admitted(config, route, decision, time.monotonic() + route.timeout)
        except PluginLlmError as exc:
            record = self._base_record(call, config, None)
            record.update({"status": "error", "error.type": type(exc).__name__, "error.message": str(exc),
                           "gen_ai.request.model": model or config.model.model, "decision_reason": decision.reason})
            self._write_audit(call, config, record)
            raise
        if config.audit.required:  # fail closed before the provider when the log can't take the record
            try:
                self._audit_sink(config).check_writable()
            except Exception as exc:
                raise PluginLlmConfigError(str(exc)) from None
        return admitted

    def _provider_call(self, call: _Call, admitted: _Admitted, audit_messages, params, tally: "_Tally", *, messages=None):
        """Yield one transport request; audit and re-raise a transport failure."""
        request = TransportRequest(
            route=admitted.route,
            messages=messages if messages is not None else audit_messages,
            keys=key_source(admitted.config.home, admitted.route.provider, admitted.route.profile),
            deadline=admitted.deadline,
            params=params,
        )
        try:
            response = yield request
        except PluginLlmError as exc:
            tally.attempts += int(getattr(exc, "attempts", 1) or 1)
            tally.provider_seconds += float(getattr(exc, "provider_seconds", 0.0) or 0.0)
            if tally.schema is not None:
                tally.validation = "none"
            self._audit_outcome(call, admitted, _status_for(exc), messages=audit_messages, response=None, tally=tally, error=exc)
            raise
        return response

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

    def _write_audit(self, call: _Call, config: HostConfig, record: dict[str, Any]) -> None:
        try:
            self._audit_sink(config).write(record)
        except Exception as exc:
            if config.audit.required:
                raise PluginLlmConfigError(
                    f"the audit log could not be written and audit.required is true in {config.path}: {exc}"
                ) from None
            log.error("audit record for call %s was not written: %s", call.call_id, exc)

    def _base_record(self, call: _Call, config: HostConfig, route: Route | None) -> dict[str, Any]:
        elapsed_ms = (self._clock() - call.started) * 1000.0
        return {
            "event": "llm.call",
            "call_id": call.call_id,
            "plugin_id": call.plugin_id,
            "purpose": call.purpose,
            "api": call.api,
            "mode": call.mode,
            "decision": "allowed",
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": route.provider if route else (config.model.provider or None),
            "gen_ai.request.model": route.model if route else None,
            "agent_id": call.agent_id,
            "profile": call.profile,
            "schema_name": call.schema_name,
            "latency_ms": round(elapsed_ms, 3),
        }

    def _denial_record(self, call: _Call, config: HostConfig, overrides: Overrides, exc: PluginLlmTrustError) -> dict[str, Any]:
        record = self._base_record(call, config, None)
        record.update({
            "decision": "denied",
            "decision_reason": str(exc),
            "decision_key": exc.config_key or None,
            "status": "denied",
            "error.type": type(exc).__name__,
            "gen_ai.request.model": overrides.model or config.model.model,
            "gen_ai.provider.name": overrides.provider or config.model.provider,
            "attempts": 0,
            "config_error": config.error,
        })
        return record

    def _audit_outcome(self, call: _Call, admitted: _Admitted, status: str, *, messages, response, tally: "_Tally",
                       error: BaseException | None = None) -> None:
        config = admitted.config
        record = self._base_record(call, config, admitted.route)
        latency_ms = record["latency_ms"]
        record.update({
            "decision_reason": admitted.decision.reason,
            "status": status,
            "error.type": type(error).__name__ if error else None,
            "error.message": str(error) if error else None,
            "gen_ai.response.model": response.model if response else None,
            "gen_ai.usage.input_tokens": tally.usage.input_tokens,
            "gen_ai.usage.output_tokens": tally.usage.output_tokens,
            "cost_usd": tally.usage.cost_usd,
            "attempts": tally.attempts,
            "overhead_ms": round(max(0.0, latency_ms - tally.provider_seconds * 1000.0), 3),
            "prompt_sha256": _sha256_json(messages),
            "response_sha256": hashlib.sha256((response.text or "").encode("utf-8")).hexdigest() if response else None,
        })
        if call.api == "structured":
            record["schema_sha256"] = structured.schema_sha256(tally.schema)
            record["validation"] = tally.validation
            record["repairs"] = tally.repairs
        if config.audit.log_content:
            record["gen_ai.input.messages"] = messages
            record["gen_ai.output.text"] = response.text if response else None
        self._write_audit(call, config, record)


@dataclass(frozen=True)
class _Admitted:
    config: HostConfig
    route: Route
    decision: Decision
    deadline: float


class _Tally:
    """Running totals of one call across transport requests (repairs)."""

    __slots__ = ("usage", "attempts", "provider_seconds", "repairs", "schema", "validation")

    def __init__(self, schema: dict | None = None) -> None:
        self.usage = PluginLlmUsage()
        self.attempts = 0
        self.provider_seconds = 0.0
        self.repairs = 0
        self.schema = schema
        self.validation = "none"

    def add(self, response: TransportResponse) -> "_Tally":
        self.usage = self.usage + response.usage
        self.attempts += response.attempts
        self.provider_seconds += response.provider_seconds
        return self


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

    def _chat_flow(self, mode, messages, tools, purpose, timeout) -> _Flow:
        return self._complete_flow(mode, messages, None, None, None, None, timeout, None, None, purpose, {},
                                   tools=tools, finish=self._chat_result)

    def _chat_result(self, call: _Call, route: Route, response: TransportResponse, usage: PluginLlmUsage) -> HostChatResult:
        base = self._result(call, route, response, usage)
        calls = []
        for raw in response.message.get("tool_calls") or ():
            arguments_text = raw["function"].get("arguments") or "{}"
            try:
                arguments = json.loads(arguments_text)
            except ValueError:
                arguments = {}
            calls.append(ToolCall(raw["id"], raw["function"]["name"], arguments if isinstance(arguments, dict) else {}, arguments_text))
        return HostChatResult(
            text=response.text, tool_calls=tuple(calls), message=dict(response.message), usage=usage,
            provider=base.provider, model=base.model, audit=base.audit,
        )
