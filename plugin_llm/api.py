"""The ``ctx.llm`` contract: the six methods every carrier of it implements, with one signature each.

``PluginLlm`` (in process), the isolated plugin's proxy and ``GatewayClient`` (HTTP) implement
:class:`CtxLlm`; the conformance tests hold them to it, and the isolated proxy takes its signatures
from here, so a parameter added to the contract reaches every carrier.
"""

from __future__ import annotations

import inspect
from typing import Any, AsyncIterator, Iterator, Protocol, runtime_checkable

from plugin_llm.types import PluginLlmCompleteResult, PluginLlmStructuredResult

__all__ = ["CtxLlm", "LlmStream", "METHODS", "signature_of"]

#: the contract's methods, in the order the docs list them
METHODS = ("complete", "complete_structured", "stream", "acomplete", "acomplete_structured", "astream")


@runtime_checkable
class LlmStream(Protocol):
    """What ``stream()`` returns (``astream()``'s is the async twin): text deltas, then ``result``."""

    @property
    def result(self) -> PluginLlmCompleteResult | None: ...

    @property
    def text(self) -> str: ...

    @property
    def call_id(self) -> str | None: ...

    @property
    def model(self) -> str | None: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def finished(self) -> bool: ...

    def close(self) -> None: ...


@runtime_checkable
class CtxLlm(Protocol):
    """``ctx.llm``: LLM calls through the host, as the plugin the host bound it to."""

    def complete(self, messages: list[dict[str, Any]], *, provider: str | None = None, model: str | None = None,
                 temperature: float | None = None, max_tokens: int | None = None, timeout: float | None = None,
                 agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
                 task: str | None = None, **options: Any) -> PluginLlmCompleteResult: ...

    def complete_structured(self, *, instructions: str, input: str | list[Any], json_schema: dict[str, Any] | None = None,
                            json_mode: bool = False, schema_name: str | None = None,
                            system_prompt: str | None = None, provider: str | None = None,
                            model: str | None = None, temperature: float | None = None,
                            max_tokens: int | None = None, timeout: float | None = None,
                            agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
                            task: str | None = None, **options: Any) -> PluginLlmStructuredResult: ...

    def stream(self, messages: list[dict[str, Any]], *, provider: str | None = None, model: str | None = None,
               temperature: float | None = None, max_tokens: int | None = None, timeout: float | None = None,
               agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
               task: str | None = None, **options: Any) -> Iterator[str]: ...

    async def acomplete(self, messages: list[dict[str, Any]], *, provider: str | None = None,
                        model: str | None = None, temperature: float | None = None, max_tokens: int | None = None,
                        timeout: float | None = None, agent_id: str | None = None, profile: str | None = None,
                        purpose: str | None = None, task: str | None = None,
                        **options: Any) -> PluginLlmCompleteResult: ...

    async def acomplete_structured(self, *, instructions: str, input: str | list[Any],
                                   json_schema: dict[str, Any] | None = None, json_mode: bool = False,
                                   schema_name: str | None = None, system_prompt: str | None = None,
                                   provider: str | None = None, model: str | None = None,
                                   temperature: float | None = None, max_tokens: int | None = None,
                                   timeout: float | None = None, agent_id: str | None = None,
                                   profile: str | None = None, purpose: str | None = None,
                                   task: str | None = None, **options: Any) -> PluginLlmStructuredResult: ...

    def astream(self, messages: list[dict[str, Any]], *, provider: str | None = None, model: str | None = None,
                temperature: float | None = None, max_tokens: int | None = None, timeout: float | None = None,
                agent_id: str | None = None, profile: str | None = None, purpose: str | None = None,
                task: str | None = None, **options: Any) -> AsyncIterator[str]: ...


def signature_of(method: str) -> inspect.Signature:
    """The contract's signature of ``method`` (``self`` included)."""
    return inspect.signature(getattr(CtxLlm, method))
