"""``ctx.llm``: LLM calls for plugins through the host - the facade.

Each public method builds its :class:`~plugin_llm.call.request.CallRequest`
once and hands it to the call pipeline (``plugin_llm.call.pipeline``), a
generator of steps that a shell performs: sync, async, or one step at a time
for a stream. Gating, limits, routing, structured parsing, repair and
auditing are the same code for all of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from plugin_llm.auditing import watch_config
from plugin_llm.call.audit import EVENT_CALL_BEGIN, CallAudit
from plugin_llm.call.pipeline import Pipeline
from plugin_llm.call.protocols import AuditSink, Transport
from plugin_llm.call.request import CallRequest, StructuredSpec
from plugin_llm.call.response import _with_field, complete_result  # noqa: F401 - _with_field: re-exported
from plugin_llm.call.steps import Call, StreamProgress
from plugin_llm.call.validate import MAX_NESTING, MAX_VALUES
from plugin_llm.config import ConfigSource, get_config_source
from plugin_llm.routing import Route
from plugin_llm.streaming import PluginLlmAsyncStream, PluginLlmStream, _Driver
from plugin_llm.transport import TransportResponse
from plugin_llm.types import PluginLlmCompleteResult, PluginLlmStructuredResult, PluginLlmToolCall, PluginLlmUsage

__all__ = ["PluginLlm", "HostLlm", "HostChatResult", "ToolCall", "HOST_IDENTITY", "MAX_NESTING", "MAX_VALUES",
           "EVENT_CALL_BEGIN"]

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


class PluginLlm:
    """LLM access for one plugin, bound to its identity (``ctx.llm``).

    The plugin never sees a key, an endpoint or the host's config: it asks,
    the operator's trust policy decides, the host calls the provider and
    writes the audit line. Collaborators can be injected for tests and
    embedding hosts; the defaults are the production ones. ``task_owner(key)``
    says which plugin registered an auxiliary task (the plugin manager's
    registry); without it, ``task=`` reaches only the built-in tasks.
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
        task_owner: Callable[[str], str | None] | None = None,
    ) -> None:
        if not isinstance(plugin_id, str) or not plugin_id.strip():
            raise ValueError("plugin_id must be a non-empty string (the plugin's manifest key)")
        self._plugin_id = plugin_id.strip()
        self._config = config_source or get_config_source(Path(home) if home is not None else None)
        if audit_log is None:
            watch_config(self._config)
        self._pipeline = Pipeline(self._plugin_id, self._config, transport, CallAudit(audit_log, clock), task_owner)

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
        task: str | None = None,
        **options: Any,
    ) -> PluginLlmCompleteResult:
        """Chat completion; returns text, attribution, usage and the audit ids.

        ``task=`` routes the call as an auxiliary task (``auxiliary.<task>`` of config.yaml): a task
        this plugin registered (``ctx.register_auxiliary_task``), or a built-in one the operator allows
        (``allow_task_override``); None, "" or "auto" is the default route."""
        request = CallRequest(mode="sync", messages=messages, provider=provider, model=model, agent_id=agent_id,
                              profile=profile, temperature=temperature, max_tokens=max_tokens, timeout=timeout,
                              purpose=purpose, task=task, options=options)
        pipeline = self._pipeline
        return pipeline.shell().run_sync(pipeline.complete_flow(request))

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
        task: str | None = None,
        **options: Any,
    ) -> PluginLlmCompleteResult:
        """Async twin of :meth:`complete`; never blocks the event loop on the provider."""
        request = CallRequest(mode="async", messages=messages, provider=provider, model=model, agent_id=agent_id,
                              profile=profile, temperature=temperature, max_tokens=max_tokens, timeout=timeout,
                              purpose=purpose, task=task, options=options)
        pipeline = self._pipeline
        return await pipeline.shell().run_async(pipeline.complete_flow(request))

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
        task: str | None = None,
        **options: Any,
    ) -> PluginLlmStructuredResult:
        """Typed JSON from text and image blocks, validated against ``json_schema``."""
        spec = StructuredSpec(instructions=instructions, input=input, json_schema=json_schema, json_mode=json_mode,
                              schema_name=schema_name, system_prompt=system_prompt)
        request = CallRequest(mode="sync", provider=provider, model=model, agent_id=agent_id, profile=profile,
                              temperature=temperature, max_tokens=max_tokens, timeout=timeout, purpose=purpose,
                              task=task, options=options, structured=spec)
        pipeline = self._pipeline
        return pipeline.shell().run_sync(pipeline.structured_flow(request))

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
        task: str | None = None,
        **options: Any,
    ) -> PluginLlmStructuredResult:
        """Async twin of :meth:`complete_structured`."""
        spec = StructuredSpec(instructions=instructions, input=input, json_schema=json_schema, json_mode=json_mode,
                              schema_name=schema_name, system_prompt=system_prompt)
        request = CallRequest(mode="async", provider=provider, model=model, agent_id=agent_id, profile=profile,
                              temperature=temperature, max_tokens=max_tokens, timeout=timeout, purpose=purpose,
                              task=task, options=options, structured=spec)
        pipeline = self._pipeline
        return await pipeline.shell().run_async(pipeline.structured_flow(request))

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
        task: str | None = None,
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
        request = CallRequest(mode="sync", messages=messages, provider=provider, model=model, agent_id=agent_id,
                              profile=profile, temperature=temperature, max_tokens=max_tokens, timeout=timeout,
                              purpose=purpose, task=task, options=options)
        progress = StreamProgress()
        flow = self._pipeline.stream_flow(request, progress)
        driver = _Driver(flow, self._pipeline.shell().stream_step, progress)
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
        task: str | None = None,
        **options: Any,
    ) -> PluginLlmAsyncStream:
        """Async twin of :meth:`stream`: ``async for delta in llm.astream(messages)``, ``async with``,
        or ``stream = await llm.astream(messages)`` (which opens it: denials raise there)."""
        request = CallRequest(mode="async", messages=messages, provider=provider, model=model, agent_id=agent_id,
                              profile=profile, temperature=temperature, max_tokens=max_tokens, timeout=timeout,
                              purpose=purpose, task=task, options=options)
        progress = StreamProgress()
        flow = self._pipeline.stream_flow(request, progress)
        shell = self._pipeline.shell()
        return PluginLlmAsyncStream(_Driver(flow, shell.astream_step, progress))


class HostLlm(PluginLlm):
    """The host's own model calls (the session loop): tools allowed, audited as ``host``."""

    def __init__(self, home: Path | str | None = None, *, identity: str = HOST_IDENTITY, **kwargs: Any) -> None:
        super().__init__(identity, home=home, **kwargs)

    def chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
             purpose: str | None = None, timeout: float | None = None) -> HostChatResult:
        """One model request of a session turn; ``tools`` in OpenAI function-calling form."""
        request = CallRequest(mode="sync", messages=messages, timeout=timeout, purpose=purpose, options={}, tools=tools)
        pipeline = self._pipeline
        return pipeline.shell().run_sync(pipeline.complete_flow(request, _chat_result))

    async def achat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                    purpose: str | None = None, timeout: float | None = None) -> HostChatResult:
        """Async twin of :meth:`chat`."""
        request = CallRequest(mode="async", messages=messages, timeout=timeout, purpose=purpose, options={}, tools=tools)
        pipeline = self._pipeline
        return await pipeline.shell().run_async(pipeline.complete_flow(request, _chat_result))


def _chat_result(call: Call, route: Route, response: TransportResponse, usage: PluginLlmUsage) -> HostChatResult:
    base = complete_result(call, route, response, usage)
    return HostChatResult(
        text=response.text, tool_calls=base.tool_calls, message=dict(response.message), usage=usage,
        provider=base.provider, model=base.model, audit=base.audit,
    )
