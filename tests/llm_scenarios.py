"""The ctx.llm conformance scenarios: each runs against any carrier of the contract and returns what a
plugin can observe, as plain JSON values, so one expectation holds for all of them.

This file is also copied into the isolated conformance plugin and imported there (it needs nothing
but the gateway's public types and errors).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from plugin_llm import errors

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def _user(marker: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"[{marker}] please"}]


def _error(exc: BaseException) -> dict[str, Any]:
    name = next((c.__name__ for c in type(exc).__mro__
                 if getattr(errors, c.__name__, None) is c and c is not errors.PluginLlmLimitError),
                type(exc).__name__)
    out: dict[str, Any] = {"error": name, "message": str(exc)}
    if isinstance(exc, errors.PluginLlmTrustError):
        out["config_key"] = exc.config_key
    if isinstance(exc, errors.PluginLlmQuotaError):
        out.update(limit=exc.limit, config_key=exc.config_key, resets_at=exc.resets_at)
    if isinstance(exc, errors.PluginLlmProviderError):
        out.update(status=exc.status, provider=exc.provider, retryable=exc.retryable)
    if isinstance(exc, errors.PluginLlmSchemaError):
        out.update(errors=list(exc.errors), text=exc.text,
                   usage=None if exc.usage is None else [exc.usage.input_tokens, exc.usage.output_tokens])
    return out


def _result(r: Any) -> dict[str, Any]:
    out = {"class": type(r).__name__, "text": r.text, "provider": r.provider, "model": r.model,
           "usage": [r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens],
           "call_id": r.audit.get("call_id"), "task": r.audit.get("task"),
           "tool_calls": [[c.name, c.arguments, c.raw_arguments] for c in r.tool_calls]}
    if hasattr(r, "parsed"):
        out.update(parsed=r.parsed, content_type=r.content_type)
    return out


def _stream(s: Any, take: int | None = None) -> dict[str, Any]:
    deltas = []
    for delta in s:
        deltas.append(delta)
        if take is not None and len(deltas) == take:
            s.close()
            break
    return {"deltas": deltas, "text": s.text, "finished": s.finished, "call_id": s.call_id,
            "result": None if s.result is None else _result(s.result)}


async def _astream(s: Any, take: int | None = None) -> dict[str, Any]:
    deltas = []
    async for delta in s:
        deltas.append(delta)
        if take is not None and len(deltas) == take:
            await s.aclose()
            break
    return {"deltas": deltas, "text": s.text, "finished": s.finished, "call_id": s.call_id,
            "result": None if s.result is None else _result(s.result)}


def _structured(llm: Any, marker: str) -> Any:
    return llm.complete_structured(instructions="Count it.", input=[{"type": "text", "text": f"[{marker}]"}],
                                   json_schema=SCHEMA, max_tokens=50)


async def _async_twins(llm: Any) -> dict[str, Any]:
    plain = await llm.acomplete(_user("plain"), max_tokens=50, purpose="conformance")
    structured = await llm.acomplete_structured(instructions="Count it.", input=[{"type": "text", "text": "[repair]"}],
                                                json_schema=SCHEMA, max_tokens=50)
    stream = await _astream(llm.astream(_user("stream"), max_tokens=50))
    closed = await _astream(await llm.astream(_user("stream] [slow"), max_tokens=50), take=1)
    try:
        await llm.acomplete(_user("plain"), model="gpt-4o")
        denied: dict[str, Any] = {}
    except Exception as exc:  # noqa: BLE001 - the outcome is the scenario's result
        denied = _error(exc)
    return {"plain": _result(plain), "structured": _result(structured), "stream": stream, "closed": closed,
            "denied": denied}


def _task(llm: Any) -> dict[str, Any]:
    """A built-in task the operator allows (``auxiliary.vision`` is its own route), "auto" (the default
    route), a task nobody registered (refused), and a stream on the task's route."""
    routed = _result(llm.complete(_user("task"), task="vision", max_tokens=50))
    auto = _result(llm.complete(_user("task"), task=" Auto ", max_tokens=50))
    try:
        llm.complete(_user("plain"), task="conf_unknown", max_tokens=50)
        refused: dict[str, Any] = {}
    except Exception as exc:  # noqa: BLE001 - the outcome is the scenario's result
        refused = _error(exc)
    return {"routed": routed, "auto": auto, "refused": refused,
            "stream": _stream(llm.stream(_user("stream"), task="vision", max_tokens=50))}


SCENARIOS: dict[str, Callable[[Any], Any]] = {
    "plain": lambda llm: _result(llm.complete(_user("plain"), max_tokens=50, purpose="conformance")),
    "tools": lambda llm: _result(llm.complete(_user("tools"), tools=TOOLS, max_tokens=50)),
    "structured_repair": lambda llm: _result(_structured(llm, "repair")),
    "schema_error": lambda llm: _result(_structured(llm, "bad")),
    "structured_text_input": lambda llm: _result(llm.complete_structured(
        instructions="Count it.", input="[plain-input] some text", json_schema=SCHEMA, max_tokens=50)),
    "stream": lambda llm: _stream(llm.stream(_user("stream"), max_tokens=50)),
    "stream_closed_early": lambda llm: _stream(llm.stream(_user("stream] [slow"), max_tokens=50), take=1),
    "async_twins": lambda llm: asyncio.run(_async_twins(llm)),
    "trust_denied": lambda llm: _result(llm.complete(_user("plain"), model="gpt-4o")),
    "quota": lambda llm: _result(llm.complete(_user("plain"), max_tokens=1_000_000)),
    "timeout": lambda llm: _result(llm.complete(_user("hang"), timeout=1, max_tokens=50)),
    "provider_error": lambda llm: _result(llm.complete(_user("fail"), max_tokens=50)),
    "bad_argument": lambda llm: _result(llm.complete(_user("plain"), max_tokens=50, temprature=0.5)),
    "task": _task,
}


def run(name: str, llm: Any) -> dict[str, Any]:
    """Scenario ``name`` against ``llm``: its result, or the error it raised."""
    try:
        return {"ok": SCENARIOS[name](llm)}
    except Exception as exc:  # noqa: BLE001 - the outcome is the scenario's result
        return _error(exc)
