"""Loading litellm: once, offline, quiet, with the local provider registered.

litellm's import takes about two seconds. :func:`load_litellm` runs it (on
the first call that is sent, just before its first request, outside the call's
clock); :func:`start_background_load` starts it on a daemon thread for hosts
that will call a model soon (``chat``, ``run``, ``demo``, a ``Session``), so
that the first call finds it loaded. Either way the import happens once,
under one lock: a call that arrives while the background import runs waits
for it instead of importing a second time.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["load_litellm", "loaded_litellm", "start_background_load", "notice_slow_load", "GC_FREEZE"]

_LOAD_LOCK = threading.Lock()
_litellm: Any = None
_background: threading.Thread | None = None
#: an import that takes longer than this calls the active notices (a CLI tells its terminal what it waits for)
NOTICE_AFTER = 1.0
_notices: list[Callable[[], None]] = []
#: the notices already given (one line per command, however many threads waited)
_said: list[Callable[[], None]] = []
_LOAD_LOCK_SAID = threading.Lock()

#: ``gc.freeze()`` once litellm is loaded: its ~370,000 long-lived objects leave the
#: collector's generations, so that the full collections that call garbage
#: triggers stop re-scanning them (benchmarks/bench_gateway.py measures it). No
#: ``gc.collect()`` first: after litellm's import it finds nothing to free and
#: costs ~300 ms of start-up. ``PLUGIN_LLM_GC_FREEZE=0`` turns it off.
GC_FREEZE = os.environ.get("PLUGIN_LLM_GC_FREEZE", "1").strip().lower() not in ("0", "off", "false", "no")


def loaded_litellm() -> Any:
    """litellm if it is loaded, else None (never imports it)."""
    return _litellm


def load_litellm() -> Any:
    """Import litellm once, offline, quiet, with the local provider registered."""
    if _litellm is not None:
        return _litellm
    timer = _notice_timer()  # this caller's wait: its own import, or another thread's (a background load)
    try:
        with _LOAD_LOCK:
            if _litellm is None:
                _import()
    finally:
        if timer is not None:
            timer.cancel()
    return _litellm


@contextmanager
def notice_slow_load(say: Callable[[], None]) -> Iterator[None]:
    """While active, an import of litellm that takes over :data:`NOTICE_AFTER` seconds calls ``say`` once."""
    _notices.append(say)
    try:
        yield
    finally:
        _notices.remove(say)
        with _LOAD_LOCK_SAID:
            if say in _said:
                _said.remove(say)


def _notice_timer() -> threading.Timer | None:
    if not _notices:
        return None
    timer = threading.Timer(NOTICE_AFTER, _say_all, (list(_notices),))
    timer.daemon = True
    timer.start()
    return timer


def _say_all(notices: list[Callable[[], None]]) -> None:
    for say in notices:
        with _LOAD_LOCK_SAID:
            if say in _said:  # the caller and a background load both waited: said once
                continue
            _said.append(say)
        try:
            say()
        except Exception:  # noqa: BLE001 - a notice must never break the import it reports
            pass


def _import() -> None:
    global _litellm
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    from plugin_llm.transport._deadline import bound_httpcore_io

    litellm.suppress_debug_info = True
    litellm.drop_params = True  # a provider without response_format still gets the JSON directive
    if hasattr(litellm, "telemetry"):
        litellm.telemetry = False
    _register_local_provider(litellm)
    bound_httpcore_io()
    try:
        from auth import install_log_redaction
    except ImportError:  # pragma: no cover - auth is part of the distribution
        pass
    else:
        install_log_redaction()
    if GC_FREEZE:
        gc.freeze()
    _litellm = litellm


def start_background_load() -> None:
    """Start importing litellm on a daemon thread (no-op when loaded or already loading)."""
    global _background
    if _litellm is not None or _background is not None:
        return
    _background = threading.Thread(target=_background_load, name="plugin-llm-load-litellm", daemon=True)
    _background.start()


def _background_load() -> None:
    try:
        load_litellm()
    except Exception:  # the first call imports it again and reports what is wrong
        pass


def _register_local_provider(litellm: Any) -> None:
    from litellm import CustomLLM, ModelResponse

    from plugin_llm.local.model import SCRIPTED_STREAM, generate

    def answer(model: Any, messages: Any, optional_params: Any) -> ModelResponse:
        completion = generate(messages, model=model, **(optional_params or {}))
        stream = completion.pop(SCRIPTED_STREAM, None)
        if stream is not None and stream["error"] is not None:  # a scripted stream that fails: no whole reply
            raise stream["error"]
        return ModelResponse(**completion)

    def chunks(model: Any, messages: Any, optional_params: Any) -> Iterator[dict]:
        completion = generate(messages, model=model, **(optional_params or {}))
        stream = completion.pop(SCRIPTED_STREAM, None)
        if stream is None:
            yield from _local_chunks(completion)
            return
        pieces = _local_chunks(completion, stream["pieces"])
        if stream["error"] is not None:  # the scripted chunks, then the failure mid-stream
            yield from pieces[:-1]
            raise stream["error"]
        yield from pieces

    class LocalModelHandler(CustomLLM):
        """litellm custom provider ``local``: the embedded offline model, in-process."""

        def completion(self, model, messages, *args, optional_params=None, **kwargs):  # noqa: D102
            return answer(model, messages, optional_params)

        async def acompletion(self, model, messages, *args, optional_params=None, **kwargs):  # noqa: D102
            return answer(model, messages, optional_params)

        def streaming(self, model, messages, *args, optional_params=None, **kwargs):  # noqa: D102
            return chunks(model, messages, optional_params)

        async def astreaming(self, model, messages, *args, optional_params=None, **kwargs):  # noqa: D102
            for chunk in chunks(model, messages, optional_params):
                yield chunk

    entries = [e for e in litellm.custom_provider_map if e.get("provider") != "local"]
    litellm.custom_provider_map = entries + [{"provider": "local", "custom_handler": LocalModelHandler()}]


def _local_chunks(completion: dict, pieces: list[str] | None = None) -> list[dict]:
    """The local model's reply as litellm ``GenericStreamingChunk`` dicts: its text in
    :func:`~plugin_llm.local.model.stream_pieces` (or the scripted ``pieces``), usage on the last chunk."""
    from plugin_llm.local.model import stream_pieces

    choice = completion["choices"][0]
    if pieces is None:
        pieces = stream_pieces(choice["message"].get("content") or "") or [""]
    else:
        pieces = [*pieces, ""]  # the scripted chunks as given; the end (finish reason, usage) on its own chunk
    last = len(pieces) - 1
    return [{"text": piece, "tool_use": None, "index": 0, "is_finished": i == last,
             "finish_reason": choice["finish_reason"] if i == last else "",
             "usage": completion["usage"] if i == last else None} for i, piece in enumerate(pieces)]
