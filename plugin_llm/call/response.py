"""The transport's answer, checked, priced at the operator's price, and made the plugin's result."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from plugin_llm import limits
from plugin_llm.call.steps import Admitted, Call, Tally
from plugin_llm.call.validate import MAX_NAME
from plugin_llm.errors import PluginLlmProviderError
from plugin_llm.routing import Route
from plugin_llm.hardened.safe_json import loads_bounded
from plugin_llm.structured import _snippet
from plugin_llm.transport import TransportResponse
from plugin_llm.types import PluginLlmCompleteResult, PluginLlmToolCall, PluginLlmUsage, checked_usage

__all__ = ["checked_response", "complete_result", "operator_priced", "malformed", "whole", "seconds"]

_MAX_ATTEMPTS = 1000


def whole(value: Any, default: int) -> int:
    """``value`` if it is a plausible count of attempts, else ``default``."""
    return value if type(value) is int and 0 <= value <= _MAX_ATTEMPTS else default


def seconds(value: Any) -> float:
    """``value`` if it is a plausible number of seconds, else 0."""
    return float(value) if type(value) in (int, float) and math.isfinite(value) and 0 <= value < 1e7 else 0.0


def malformed(route: Route, problem: str) -> PluginLlmProviderError:
    return PluginLlmProviderError(
        f"the reply of {route.provider}/{route.model} is malformed: {problem}", provider=route.provider,
    )


def checked_response(response: Any, route: Route, tally: Tally) -> TransportResponse:
    """The transport's response, made safe to use and to record (one pass, no copy when sane).

    Structural problems (not a TransportResponse, text not a str, message
    not a dict) are a malformed reply: ``PluginLlmProviderError``. Numbers
    (usage, attempts, seconds) are clamped and the fix is recorded as an
    anomaly in the call's audit record.
    """
    if not isinstance(response, TransportResponse):
        raise malformed(route, f"the transport returned {type(response).__name__}, not a TransportResponse")
    if response.text is not None and not isinstance(response.text, str):
        raise malformed(route, f"its text is a {type(response.text).__name__}, not a str")
    if not isinstance(response.message, dict):
        raise malformed(route, f"its message is a {type(response.message).__name__}, not a dict")
    usage, anomalies = checked_usage(response.usage)
    changes: dict[str, Any] = {}
    if anomalies:
        changes["usage"] = usage
        tally.note(anomalies)
    reported = getattr(response, "anomalies", ())  # the transport's own findings (clamped provider numbers)
    if reported:
        tally.note(reported if isinstance(reported, (list, tuple)) else (reported,))
    model = response.model
    if not isinstance(model, str) or not model or len(model) > MAX_NAME:
        changes["model"] = model[:MAX_NAME] if isinstance(model, str) and model else route.model
    attempts = response.attempts
    if type(attempts) is not int or not 1 <= attempts <= _MAX_ATTEMPTS:
        changes["attempts"] = fixed = whole(attempts, 1) or 1
        tally.note((f"attempts: reported {_snippet(attempts)}, recorded as {fixed}",))
    provider_seconds = response.provider_seconds
    if seconds(provider_seconds) != provider_seconds:
        changes["provider_seconds"] = 0.0
        tally.note((f"provider_seconds: reported {_snippet(provider_seconds)}, recorded as 0",))
    return dataclasses.replace(response, **changes) if changes else response


def operator_priced(admitted: Admitted, response: TransportResponse) -> TransportResponse:
    """The response with its cost at the operator's price (``limits.prices``) when one is set for
    the route's model: it wins over litellm's price map, for the result, the audit and the budget.
    (For a transport that did not apply ``TransportRequest.cost`` itself: ``priced`` is False.)"""
    route = admitted.route
    price = limits.find_price(route.provider, route.model, admitted.config.limits.prices)
    if price is None or not price.operator:
        return response
    usage = response.usage
    cost = limits.actual_cost_nano(price, None, usage.input_tokens, usage.output_tokens) / limits.NANO
    if usage.cost_usd == cost and type(usage.cost_usd) is float:
        return response
    return _with_field(response, "usage", _with_field(usage, "cost_usd", cost))


def _with_field(obj: Any, name: str, value: Any) -> Any:
    """``dataclasses.replace(obj, name=value)`` for the gateway's own frozen response and usage
    types, as a copy of the instance dict (replace re-runs ``__init__`` over every field: the two
    per limited call cost more than the rest of its pricing); anything else goes through replace."""
    kind = type(obj)
    if kind is not TransportResponse and kind is not PluginLlmUsage:
        return dataclasses.replace(obj, **{name: value})
    new = object.__new__(kind)
    fields = new.__dict__
    fields.update(obj.__dict__)
    fields[name] = value
    return new


def complete_result(call: Call, route: Route, response: TransportResponse,
                    usage: PluginLlmUsage) -> PluginLlmCompleteResult:
    """What ``complete`` returns (a structured call's result extends it)."""
    return PluginLlmCompleteResult(
        text=response.text or "",
        provider=route.provider,
        model=response.model or route.model,
        agent_id=call.agent_id,
        usage=usage,
        tool_calls=_tool_calls(route, response.message) if response.message.get("tool_calls") else (),
        audit={
            "plugin_id": call.plugin_id,
            "purpose": call.purpose,
            "profile": call.profile,
            "schema_name": call.schema_name,
            "call_id": call.call_id,
            "task": call.task,
        },
    )


def _tool_calls(route: Route, message: dict[str, Any]) -> tuple[PluginLlmToolCall, ...]:
    """The tool calls of a reply message, checked (a malformed one is a provider error)."""
    raw_calls = message.get("tool_calls") or ()
    if not isinstance(raw_calls, (list, tuple)):
        raise malformed(route, f"its tool_calls is a {type(raw_calls).__name__}, not a list")
    calls = []
    for index, raw in enumerate(raw_calls):
        function = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(function, dict) or not isinstance(raw.get("id"), str) or not isinstance(function.get("name"), str):
            raise malformed(route, f"tool_calls[{index}] needs a str 'id' and a 'function' with a str 'name'")
        arguments_text = function.get("arguments") or "{}"
        if not isinstance(arguments_text, str):
            raise malformed(route, f"tool_calls[{index}]['function']['arguments'] is a "
                                   f"{type(arguments_text).__name__}, not a JSON string")
        try:
            arguments = loads_bounded(arguments_text)
        except (ValueError, RecursionError):
            arguments = {}
        calls.append(PluginLlmToolCall(raw["id"], function["name"], arguments if isinstance(arguments, dict) else {},
                                       arguments_text))
    return tuple(calls)
