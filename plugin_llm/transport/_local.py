"""The embedded ``local`` model called in process, without litellm.

litellm reaches it through its custom-provider hook (``_loading._register_local_provider``); this
module calls :func:`plugin_llm.local.model.generate` the way that hook does (the same parameters:
the request's, less ``user``, which litellm drops for a custom provider) and hands the transport
the same reply: the completion as a dict, or its stream as chunk dicts (text pieces, the finish
reason, then the usage). tests/test_transport_own.py compares both paths call by call.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from plugin_llm.routing import Route

__all__ = ["complete", "chunks", "LOCAL_PARAMS_DROPPED", "LOCAL"]

#: the marker of the in-process ``local`` model's path (``LitellmTransport._own``)
LOCAL = "local"
#: parameters litellm does not pass to a custom provider
LOCAL_PARAMS_DROPPED = frozenset({"user"})


def _generate(route: Route, messages: list, params: dict) -> dict:
    from plugin_llm.local.model import generate

    optional = {k: v for k, v in params.items() if v is not None and k not in LOCAL_PARAMS_DROPPED}
    return generate(messages, model=route.model, **optional, max_retries=0)


def complete(route: Route, messages: list, params: dict) -> dict:
    """The local model's whole reply (a failing scripted stream raises its error, as through litellm)."""
    from plugin_llm.local.model import SCRIPTED_STREAM

    completion = _generate(route, messages, params)
    stream = completion.pop(SCRIPTED_STREAM, None)
    if stream is not None and stream["error"] is not None:
        raise stream["error"]
    return completion


def chunks(route: Route, messages: list, params: dict) -> Callable[[], Any]:
    """The local model's reply as a stream: a source giving the next chunk dict, None at the end."""
    iterator = _chunks(route, messages, params)

    def source() -> Any:
        return next(iterator, None)

    return source


def _chunks(route: Route, messages: list, params: dict) -> Iterator[dict]:
    from plugin_llm.local.messages import stream_pieces
    from plugin_llm.local.model import SCRIPTED_STREAM

    completion = _generate(route, messages, params)
    stream = completion.pop(SCRIPTED_STREAM, None)
    choice = completion["choices"][0]
    model = completion.get("model")
    if stream is None:
        pieces = stream_pieces(choice["message"].get("content") or "")
        error = None
    else:
        pieces, error = list(stream["pieces"]), stream["error"]
    for piece in pieces:
        if piece:
            yield {"model": model, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
    if error is not None:
        raise error
    yield {"model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
    yield {"model": model, "choices": [], "usage": completion["usage"]}
