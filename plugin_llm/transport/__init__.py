"""The provider call: the only package that imports litellm (lazily, on the first call).

``LitellmTransport`` turns one :class:`TransportRequest` into one provider answer, on one of two
paths chosen per route, once: **the fast path** (``_fastpath``) for OpenAI and OpenAI-compatible
providers (:data:`FAST_PROVIDERS`, ``custom`` included), sent on the gateway's pooled clients, or
**the fallback** (``_fallback``, ``litellm.completion``) for every other provider, for a litellm
outside :data:`TESTED_LITELLM`, or for all calls with ``PLUGIN_LLM_FAST_PATH=0``.
:func:`fast_path_decision` says which and why without importing litellm (``doctor`` prints it).

On both paths: retries inside the call's total deadline, ``Retry-After`` honoured, a failing pooled
key reported and the retry made with the next, every failure a ``PluginLlmTimeoutError`` or
``PluginLlmProviderError`` with secrets scrubbed. The key is never a local of a frame a plugin can
see, the deadline holds whatever the server does, replies are checked and redacted, error text is
redacted before it is cut. Why and how: docs/design.md, "Transport".
"""

from __future__ import annotations

from plugin_llm.transport._deadline import INLINE_PROVIDERS
from plugin_llm.transport._fastpath import FAST_PROVIDERS, TESTED_LITELLM
from plugin_llm.transport._fastpath import decide as fast_path_decision
from plugin_llm.transport._loading import start_background_load
from plugin_llm.transport._transport import LitellmTransport
from plugin_llm.transport._types import (
    MAX_TOKENS,
    RETRY_AFTER_CAP,
    Credential,
    KeySource,
    TransportRequest,
    TransportResponse,
)

__all__ = [
    "KeySource", "Credential", "TransportRequest", "TransportResponse", "LitellmTransport", "RETRY_AFTER_CAP",
    "MAX_TOKENS", "INLINE_PROVIDERS", "FAST_PROVIDERS", "TESTED_LITELLM", "fast_path_decision",
    "start_background_load",
]
