"""The provider call: the only package that imports litellm, and only for a route that needs it.

``LitellmTransport`` turns one :class:`TransportRequest` into one provider answer on a path chosen
per route, once: the embedded ``local`` model in process (``_local``); OpenAI, ``custom`` and the
OpenAI-like providers of ``_compat`` on the gateway's own client without litellm (``_openai``, priced
from litellm's bundled map read as a file); other OpenAI-compatible providers (:data:`FAST_PROVIDERS`)
on litellm's provider config and the pooled clients (``_fastpath``); every other provider through
``litellm.completion``
(``_fallback``). :func:`fast_path_decision` says whether the fast path applies without importing
litellm (``doctor`` prints it). On every path: retries inside the call's total deadline,
``Retry-After`` honoured, a failing pooled key reported and the retry made with the next, every
failure a ``PluginLlmTimeoutError`` or ``PluginLlmProviderError`` with secrets scrubbed, replies
checked and redacted. Why and how: docs/design.md, "Transport".
"""

from __future__ import annotations

from plugin_llm.transport._deadline import INLINE_PROVIDERS
from plugin_llm.transport._fastpath import FAST_PROVIDERS, TESTED_LITELLM
from plugin_llm.transport._fastpath import decide as fast_path_decision
from plugin_llm.transport._loading import start_background_load
from plugin_llm.transport._transport import LitellmTransport, configured_routes, needs_litellm, start_background_load_for
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
    "start_background_load", "start_background_load_for", "needs_litellm", "configured_routes",
]
