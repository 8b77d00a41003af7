"""What a CLI command waits for: the provider layer's one-time import (litellm) started early, only
when the configured routes need it; said on its terminal (one line on stderr) when it takes over about
a second; nothing when stderr is not a terminal."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import ContextManager, TextIO

from plugin_llm.config import get_config_source
from plugin_llm.transport import start_background_load_for
from plugin_llm.transport._loading import notice_slow_load

__all__ = ["LOADING_LINE", "provider_layer_notice", "preload_provider_layer"]

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


def preload_provider_layer(home: Path) -> bool:
    """Start litellm's import on a background thread when a route ``home``'s config.yaml selects needs
    it (a route on the own path and the ``local`` model do not); whether it was started."""
    return start_background_load_for(get_config_source(home).current())
