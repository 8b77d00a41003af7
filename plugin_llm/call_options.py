"""Chat parameters a plugin may pass besides the ones ``PluginLlm`` names (pure).

Everything that involves no credential and no routing is allowed:
the sampling parameters of a chat API on every method, and on ``complete``
also ``n=1``, ``response_format``, ``tools`` and ``tool_choice``. Each value is
checked here, before anything is sent, with a message that names the
parameter and the accepted form; an unknown name is a ``TypeError`` with a
"did you mean", and endpoint or key parameters are refused by the caller as a
trust error (they are never "unknown": they are forbidden).
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable, Mapping

from plugin_llm.structured import _snippet, check_schema, check_text

__all__ = ["FORBIDDEN", "SAMPLING", "COMPLETE_ONLY", "check_options", "check_temperature"]

#: parameters a plugin can never pass: endpoints and keys are the operator's
FORBIDDEN = frozenset({"api_base", "base_url", "api_key", "api_version", "headers", "extra_headers",
                       "custom_llm_provider", "organization", "extra_body", "client"})
#: allowed on every method
SAMPLING = ("top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "user")
#: allowed on ``complete``/``acomplete`` only (a structured call sets its own response_format and wants one reply)
COMPLETE_ONLY = ("n", "response_format", "tools", "tool_choice")

_INT64 = 2**63
_MAX_STOP = 4  # OpenAI's limit
_MAX_STOP_CHARS = 256
_MAX_LOGIT_BIAS = 1024
_MAX_USER = 256


def _number(name: str, low: float, high: float, example: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not low <= value <= high:
            raise ValueError(f"{name} must be a number from {low:g} to {high:g} such as {example}, got {_snippet(value)}")
        return value
    return check


def _stop(value: Any) -> str | list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not 1 <= len(items) <= _MAX_STOP or not all(
            type(item) is str and 0 < len(item) <= _MAX_STOP_CHARS for item in items):
        raise ValueError(f"stop must be a string or a list of 1 to {_MAX_STOP} non-empty strings of at most "
                         f"{_MAX_STOP_CHARS} characters such as ['\\n\\n'], got {_snippet(value)}")
    for item in items:
        check_text("stop", item)
    return value if isinstance(value, str) else list(items)


def _seed(value: Any) -> int:
    if type(value) is not int or not -_INT64 <= value < _INT64:
        raise ValueError(f"seed must be a whole number such as 42, got {_snippet(value)}")
    return value


def _logit_bias(value: Any) -> dict[str, float]:
    example = "{'50256': -100}"
    if type(value) is not dict or len(value) > _MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias must be a dict of at most {_MAX_LOGIT_BIAS} token ids to biases from -100 "
                         f"to 100 such as {example}, got {_snippet(value)}")
    checked: dict[str, float] = {}
    for token, bias in value.items():
        token_text = str(token) if type(token) is int else token
        if type(token_text) is not str or not token_text.isdigit() or len(token_text) > 12:
            raise ValueError(f"logit_bias keys must be token ids (digits) such as {example}, got {_snippet(token)}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise ValueError(f"logit_bias[{token_text}] must be a number from -100 to 100, got {_snippet(bias)}")
        checked[token_text] = bias
    return checked


def _user(value: Any) -> str:
    if type(value) is not str or not value.strip() or len(value) > _MAX_USER:
        raise ValueError(f"user must be a non-empty end-user id of at most {_MAX_USER} characters, got {_snippet(value)}")
    return check_text("user", value)


def _n(value: Any) -> int:
    if type(value) is not int or value != 1:
        raise ValueError(f"n must be 1: the gateway returns one completion per call (make several calls for more), "
                         f"got {_snippet(value)}")
    return value


def _response_format(value: Any) -> dict[str, Any]:
    forms = ("{'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'json_schema': "
             "{'name': 'reply', 'schema': {...}}}")
    kind = value.get("type") if type(value) is dict else None
    if kind in ("text", "json_object") and set(value) == {"type"}:
        return {"type": kind}
    if kind == "json_schema" and set(value) == {"type", "json_schema"} and type(value["json_schema"]) is dict:
        spec = value["json_schema"]
        unknown = set(spec) - {"name", "schema", "strict", "description"}
        name = spec.get("name")
        if unknown or type(name) is not str or not name.strip() or len(name) > 64:
            raise ValueError(f"response_format['json_schema'] needs a 'name' (a short str) and a 'schema', with only "
                             f"'strict' and 'description' besides; got keys {sorted(map(str, spec))[:8]}")
        if "strict" in spec and type(spec["strict"]) is not bool:
            raise ValueError(f"response_format['json_schema']['strict'] must be true or false, got {_snippet(spec['strict'])}")
        try:
            check_schema(spec.get("schema"))
        except ValueError as exc:
            raise ValueError(f"response_format['json_schema']['schema']: {exc}") from None
        if spec.get("schema") is None:
            raise ValueError("response_format['json_schema'] needs a 'schema' (a JSON Schema dict)")
        check_text("response_format['json_schema']['name']", name)
        if isinstance(spec.get("description"), str):
            check_text("response_format['json_schema']['description']", spec["description"])
        return dict(value)
    raise ValueError(f"response_format must be {forms}, got {_snippet(value)}")


def _tool_choice(value: Any) -> str | dict[str, Any]:
    if value in ("auto", "none", "required"):
        return value
    function = value.get("function") if type(value) is dict else None
    if type(value) is dict and value.get("type") == "function" and set(value) == {"type", "function"} \
            and type(function) is dict and set(function) == {"name"} and type(function["name"]) is str \
            and 0 < len(function["name"]) <= 64:
        return {"type": "function", "function": {"name": check_text("tool_choice's function name", function["name"])}}
    raise ValueError("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
                     f"{{'name': '<tool>'}}}}, got {_snippet(value)}")


#: the named ``temperature=``: OpenAI's documented range (a provider with a narrower one refuses the rest itself)
check_temperature = _number("temperature", 0, 2, "0.2")

_CHECKS: dict[str, Callable[[Any], Any]] = {
    "top_p": _number("top_p", 0, 1, "0.9"),
    "stop": _stop,
    "seed": _seed,
    "presence_penalty": _number("presence_penalty", -2, 2, "0.5"),
    "frequency_penalty": _number("frequency_penalty", -2, 2, "0.5"),
    "logit_bias": _logit_bias,
    "user": _user,
    "n": _n,
    "response_format": _response_format,
    "tool_choice": _tool_choice,
}


def check_options(api: str, options: Mapping[str, Any], *, tools_check: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """The checked, non-None ``options`` of a ``complete`` (``api="complete"``) or structured call.

    Raises ``TypeError`` for a name the method does not take (with a "did you
    mean") and ``ValueError`` for a bad value. ``FORBIDDEN`` names must have
    been refused by the caller before. ``tools`` is checked by ``tools_check``.
    """
    allowed = SAMPLING + COMPLETE_ONLY if api == "complete" else SAMPLING
    checked: dict[str, Any] = {}
    for name, value in options.items():
        if name not in allowed:
            if name in COMPLETE_ONLY:
                raise TypeError(f"{name}= is taken by complete()/acomplete() only: a structured call sets its own "
                                "response format and returns one parsed reply")
            close = difflib.get_close_matches(str(name), allowed + ("temperature", "max_tokens", "timeout"), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"unexpected keyword argument {_snippet(name)}{hint}; besides the named parameters the "
                            f"call takes {', '.join(allowed)}")
        if value is None:
            continue
        checked[name] = tools_check(value) if name == "tools" and tools_check is not None else _CHECKS[name](value)
    if "tool_choice" in checked and not checked.get("tools"):
        raise ValueError("tool_choice needs tools=[...] in the same call")
    return checked
