"""plugin-llm-gateway: LLM calls for plugins without credentials.

``from plugin_llm import PluginLlm`` gives plugins' ``ctx.llm``; the value
types and the error hierarchy are exported here too. Heavy modules (the call
pipeline, jsonschema) load on first use so that ``import plugin_llm`` and the
CLI commands that do not call a model stay fast; litellm itself is imported
only by the transport, on the first call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugin_llm.errors import (
    PluginLlmConfigError,
    PluginLlmError,
    PluginLlmProviderError,
    PluginLlmQuotaError,
    PluginLlmSchemaError,
    PluginLlmTimeoutError,
    PluginLlmTrustError,
)
from plugin_llm.types import (
    PluginLlmCompleteResult,
    PluginLlmImageInput,
    PluginLlmStructuredResult,
    PluginLlmToolCall,
    PluginLlmTextInput,
    PluginLlmUsage,
)

if TYPE_CHECKING:
    from plugin_llm.llm import HostLlm, PluginLlm
    from plugin_llm.streaming import PluginLlmAsyncStream, PluginLlmStream

__version__ = "0.1.0"

__all__ = [
    "PluginLlm",
    "HostLlm",
    "PluginLlmStream",
    "PluginLlmAsyncStream",
    "PluginLlmTextInput",
    "PluginLlmImageInput",
    "PluginLlmUsage",
    "PluginLlmCompleteResult",
    "PluginLlmStructuredResult",
    "PluginLlmToolCall",
    "PluginLlmError",
    "PluginLlmTrustError",
    "PluginLlmTimeoutError",
    "PluginLlmProviderError",
    "PluginLlmSchemaError",
    "PluginLlmConfigError",
    "PluginLlmQuotaError",
    "__version__",
]

_LAZY = {"PluginLlm": "plugin_llm.llm", "HostLlm": "plugin_llm.llm", "PluginLlmStream": "plugin_llm.streaming",
         "PluginLlmAsyncStream": "plugin_llm.streaming"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'plugin_llm' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
