"""What a CLI command waits for, said on its terminal: one line on stderr when the provider
layer's one-time import (litellm) takes over about a second; nothing when stderr is not a terminal."""

from __future__ import annotations

import contextlib
import sys
from typing import ContextManager, TextIO

from plugin_llm.transport._loading import notice_slow_load

__all__ = ["LOADING_LINE", "provider_layer_notice"]

LOADING_LINE = "plugin-llm: loading the provider layer (litellm)..."


def provider_layer_notice(stream: TextIO | None = None) -> ContextManager[None]:
    """Context for a command's model call: a slow litellm import inside it is announced on a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError, OSError):
        terminal = False
    if not terminal:
        return contextlib.nullcontext()

    def say() -> None:
        stream.write(LOADING_LINE + "\n")
        stream.flush()

    return notice_slow_load(say)
