"""The provider call: the only package that imports litellm (lazily, on the first call).

``LitellmTransport`` turns one :class:`TransportRequest` into one provider
answer, on one of two paths chosen per route, once:

* **the fast path** (``_fastpath``) for OpenAI and OpenAI-compatible
  providers (:data:`FAST_PROVIDERS`, ``custom`` included): litellm's provider
  config class maps the parameters, builds headers, URL and body and reads the
  reply; the gateway sends the request on its own pooled clients (sync
  ``httpx.Client``, async ``aiohttp``) and prices it from litellm's price map;
* **the fallback** (``_fallback``): ``litellm.completion``/``acompletion``
  for every other provider (SDK-auth clouds, the in-process ``local`` model),
  for a litellm outside :data:`TESTED_LITELLM`, or for all calls with
  ``PLUGIN_LLM_FAST_PATH=0``.

:func:`fast_path_decision` says which path a route takes and why, without
importing litellm (``plugin-llm doctor`` prints it).

On both paths (``_transport``): tenacity retries inside the call's total
deadline, ``Retry-After`` honoured, a pooled key that fails reported and the
retry made with the next, every failure mapped to ``PluginLlmTimeoutError``
or ``PluginLlmProviderError`` (through litellm's error classes) with the
secret scrubbed from the message. Hardening (issue 9), on both paths too:

* **The key is never a local variable of a frame a plugin can see.** It is
  revealed only as an argument of the send (``_keys.provider_call``, the fast
  path's ``_request``); the transport's frames hold a ``Key`` whose repr is
  masked. Provider exceptions (whose frames do hold the key) are mapped
  outside their ``except`` block and dropped, so the error a plugin gets has
  no ``__cause__``/``__context__`` leading to them.
* **The total deadline holds on every path**, whatever the server does (see
  ``_deadline``): sync attempts over httpx (the fast path's client, and
  litellm's for :data:`INLINE_PROVIDERS`) run inline with every socket
  operation bounded by the time left; other sync attempts run on a worker
  thread the caller stops waiting for at the deadline; async attempts are
  bounded by ``asyncio.timeout``/``wait_for``.
* **Replies are checked** (``_reply``): a reply without choices or with
  fields of the wrong type is a ``PluginLlmProviderError`` ("sent a malformed
  reply"); token counts are clamped to ``0..MAX_TOKENS`` with the anomaly
  recorded in :attr:`TransportResponse.anomalies`; the key just sent (and
  every loaded secret) is hidden in the reply's text, tool-call arguments and
  model name.
* **Error text is redacted before it is cut** to ``MESSAGE_LIMIT``
  characters, and a key cut off at the end is hidden too.
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
