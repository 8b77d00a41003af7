"""The checks of what a plugin passes to ``ctx.llm``, before anything is sent or audited.

Errors name the path to the problem (``messages[1]['content'][0]['text']``)
and show only type names and short snippets, never the whole value.
"""

from __future__ import annotations

import math
from typing import Any

from plugin_llm import structured
from plugin_llm.call_options import check_temperature
from plugin_llm.structured import _snippet

__all__ = ["MAX_NESTING", "MAX_VALUES", "MAX_NAME", "INT_LIMIT", "check_messages", "check_tools",
           "check_optional_str", "check_params", "check_purpose", "check_system_prompt", "check_task"]

#: bounds of what a plugin passes (``messages``, ``tools``): nesting deeper than
#: this, or more values in one request, is no real chat request; unbounded it
#: would exhaust the stack (RecursionError) or the CPU of the host
MAX_NESTING = 32
MAX_VALUES = 1_000_000
#: the longest identifier a plugin may pass (purpose, agent_id, profile, provider, model)
MAX_NAME = 256
INT_LIMIT = 2**63  # JSON numbers beyond int64 are refused by providers (and by json.dumps past 4300 digits)

_MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_ROLES_TEXT = ", ".join(repr(r) for r in sorted(_MESSAGE_ROLES))
_PART_EXAMPLE = "{'type': 'text', 'text': '...'}"
_TOOL_CALL_EXAMPLE = "{'id': 'call_1', 'type': 'function', 'function': {'name': 'f', 'arguments': '{}'}}"
_TOOL_EXAMPLE = "{'type': 'function', 'function': {'name': 'f', 'parameters': {...}}}"


class _Invalid(Exception):
    """A problem deep inside a plugin's value; the path to it is collected while unwinding."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []

    def at(self, segment: str) -> "_Invalid":
        self.path.append(segment)
        return self

    def message(self, root: str) -> str:
        path = self.path[::-1]
        if len(path) > 8:  # 32 levels of a hostile value make an unreadable (but bounded) path: elide the middle
            path = path[:6] + ["..."] + path[-1:]
        return f"{root}{''.join(path)} {self.problem}"


def _key(key: str) -> str:
    return f"[{_snippet(key)}]"


class _Budget:
    """Values still allowed in one request (one walk of the plugin's input)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_VALUES

    def take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _Invalid(f"takes the request past {MAX_VALUES:,} values; no real chat request is that large")


def _check_text(text: str) -> None:
    """Raise :class:`_Invalid` if ``text`` cannot be sent (:func:`structured.text_problem`: a lone
    surrogate). Callers test ``isascii()`` first, which is all an ASCII str costs."""
    problem = structured.text_problem(text)
    if problem is not None:
        raise _Invalid(problem)


def _check_key(key: str) -> None:
    """:func:`_check_text` for a dict key that is not ASCII (the caller tests ``isascii()``)."""
    problem = structured.text_problem(key)
    if problem is not None:
        raise _Invalid(f"has a key that {problem}")


def _check_json(value: Any, depth: int, budget: _Budget) -> None:
    """Raise :class:`_Invalid` unless ``value`` is plain JSON, ``depth`` levels in, within the bounds."""
    budget.take()
    if isinstance(value, str):
        if not value.isascii():
            _check_text(value)
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -INT_LIMIT <= value < INT_LIMIT:
            raise _Invalid("is an integer beyond 64 bits; no provider takes it")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Invalid(f"is {float.__repr__(value)}; JSON has no NaN or infinity")
        return
    if depth >= MAX_NESTING:
        raise _Invalid(f"is nested more than {MAX_NESTING} levels deep (or contains itself); flatten it")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Invalid(f"has a key of type {type(key).__name__}; JSON object keys must be strings")
            if not key.isascii():
                _check_key(key)
            try:
                _check_json(item, depth + 1, budget)
            except _Invalid as bad:
                raise bad.at(_key(key))
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            try:
                _check_json(item, depth + 1, budget)
            except _Invalid as bad:
                raise bad.at(f"[{index}]")
        return
    raise _Invalid(f"must be plain JSON (str, number, bool, None, list or dict), got {type(value).__name__}")


def _need_str(container: dict, key: str, what: str) -> None:
    value = container.get(key)
    if not isinstance(value, str):
        raise _Invalid(f"must be a str ({what}), got {type(value).__name__}").at(_key(key))


def _check_part(part: Any, budget: _Budget) -> None:
    """One OpenAI content part: a dict with a str ``type`` and that type's field."""
    if not isinstance(part, dict):
        raise _Invalid(f"must be a content part such as {_PART_EXAMPLE}, got {type(part).__name__}")
    kind = part.get("type")
    if not isinstance(kind, str):
        raise _Invalid(f"must be a str such as 'text' or 'image_url', got {_snippet(kind)}").at("['type']")
    if kind == "text":
        _need_str(part, "text", f"the text of a {{'type': 'text'}} part")
    elif kind == "image_url":
        image = part.get("image_url")
        if isinstance(image, dict):
            try:
                _need_str(image, "url", "an https:// or data: URL")
                if "detail" in image and not isinstance(image["detail"], str):
                    raise _Invalid("must be a str ('auto', 'low' or 'high')").at("['detail']")
            except _Invalid as bad:
                raise bad.at("['image_url']")
        elif not isinstance(image, str):
            raise _Invalid(f"must be {{'url': 'https://...'}} or a URL str, got {type(image).__name__}").at("['image_url']")
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict):
            raise _Invalid(f"must be {{'data': '<base64>', 'format': 'wav'}}, got {type(audio).__name__}").at("['input_audio']")
        try:
            _need_str(audio, "data", "base64 audio")
        except _Invalid as bad:
            raise bad.at("['input_audio']")
    elif kind == "refusal":
        _need_str(part, "refusal", "the refusal text")
    elif kind == "file" and not isinstance(part.get("file"), dict):
        raise _Invalid(f"must be a dict such as {{'file_id': '...'}}, got {type(part.get('file')).__name__}").at("['file']")
    _check_json(part, 3, budget)  # the rest (and the fields just checked) as plain, bounded JSON


def _check_content(role: str, content: Any, budget: _Budget) -> None:
    if isinstance(content, str):
        budget.take()
        if not content.isascii():
            _check_text(content)
        return
    if content is None:
        if role == "assistant":
            return
        raise _Invalid("is None; only an assistant message (with 'tool_calls') may have no content. Pass a str")
    if isinstance(content, (list, tuple)):
        if not content:
            raise _Invalid(f"is an empty list; pass a str or at least one content part such as {_PART_EXAMPLE}")
        budget.take()
        for index, part in enumerate(content):
            try:
                _check_part(part, budget)
            except _Invalid as bad:
                raise bad.at(f"[{index}]")
        return
    raise _Invalid(f"must be a str or a list of content parts such as {_PART_EXAMPLE}, got {type(content).__name__}")


def _check_tool_calls(value: Any, budget: _Budget) -> None:
    if not isinstance(value, (list, tuple)):
        raise _Invalid(f"must be a list of tool calls such as {_TOOL_CALL_EXAMPLE}, got {type(value).__name__}")
    budget.take()
    for index, call in enumerate(value):
        try:
            if not isinstance(call, dict):
                raise _Invalid(f"must be a tool call such as {_TOOL_CALL_EXAMPLE}, got {type(call).__name__}")
            _check_json(call, 3, budget)
            if "id" in call:
                _need_str(call, "id", "the tool call id")
            function = call.get("function")
            if not isinstance(function, dict):
                raise _Invalid(f"must be {{'name': ..., 'arguments': '<json>'}}, got {type(function).__name__}").at("['function']")
            try:
                _need_str(function, "name", "the tool name")
                if "arguments" in function:
                    _need_str(function, "arguments", "the arguments as a JSON string, e.g. json.dumps(args)")
            except _Invalid as bad:
                raise bad.at("['function']")
        except _Invalid as bad:
            raise bad.at(f"[{index}]")


def _check_message(message: dict, budget: _Budget) -> None:
    budget.take()
    role = message.get("role")
    if not isinstance(role, str) or role not in _MESSAGE_ROLES:
        raise _Invalid(f"must be one of {_ROLES_TEXT}, got {_snippet(role)}").at("['role']")
    for key, value in message.items():
        if not isinstance(key, str):
            raise _Invalid(f"has a key of type {type(key).__name__}; message keys are strings such as "
                           "'role', 'content', 'name', 'tool_calls' and 'tool_call_id'")
        if key == "role":
            continue
        if not key.isascii():
            _check_key(key)
        try:
            if key == "content":
                _check_content(role, value, budget)
            elif key in ("name", "tool_call_id"):
                if not isinstance(value, str):
                    raise _Invalid(f"must be a str, got {type(value).__name__}")
                budget.take()
                if not value.isascii():
                    _check_text(value)
            elif key == "tool_calls":
                _check_tool_calls(value, budget)
            else:  # provider-specific keys (cache_control, ...) pass through as plain JSON
                _check_json(value, 2, budget)
        except _Invalid as bad:
            raise bad.at(_key(key))
    if "content" not in message and not message.get("tool_calls") and not message.get("function_call"):
        raise _Invalid("has no 'content'; add 'content': '<text>' (only an assistant message with 'tool_calls' may omit it)")


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate ``messages`` (OpenAI chat format) in one walk; return shallow copies.

    Everything the request carries is checked before anything is sent: str
    keys, known roles, content as a str, a list of content parts (each with a
    str ``type`` and its field) or - assistant only - None, tool calls, plain
    JSON values, at most :data:`MAX_NESTING` levels and :data:`MAX_VALUES`
    values. Errors name the path (``messages[1]['content'][0]['text']``) and
    show only type names and short snippets, never the whole value.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts (OpenAI chat format)")
    budget = _Budget()
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}")
        try:
            _check_message(message, budget)
        except _Invalid as bad:
            problem = bad.message(f"messages[{i}]")
        else:
            checked.append(dict(message))
            continue
        raise ValueError(problem)
    return checked


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Validate ``tools`` (OpenAI function-calling form) like messages: plain JSON, bounded, named functions."""
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise ValueError(f"tools must be a list such as [{_TOOL_EXAMPLE}], got {type(tools).__name__}")
    budget = _Budget()
    problem = None
    for index, tool in enumerate(tools):
        try:
            if not isinstance(tool, dict):
                raise _Invalid(f"must be a tool such as {_TOOL_EXAMPLE}, got {type(tool).__name__}")
            _check_json(tool, 1, budget)
            kind = tool.get("type")
            if not isinstance(kind, str):
                raise _Invalid(f"must be a str such as 'function', got {_snippet(kind)}").at("['type']")
            if kind == "function":
                function = tool.get("function")
                if not isinstance(function, dict):
                    raise _Invalid(f"must be {{'name': ..., 'parameters': {{...}}}}, got {type(function).__name__}").at("['function']")
                try:
                    _need_str(function, "name", "the tool name")
                    if "parameters" in function and not isinstance(function["parameters"], dict):
                        raise _Invalid("must be a JSON Schema dict").at("['parameters']")
                except _Invalid as bad:
                    raise bad.at("['function']")
        except _Invalid as bad:
            problem = bad.message(f"tools[{index}]")
            break
    if problem is not None:
        raise ValueError(problem)
    return list(tools) or None


def check_optional_str(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string when given, got {_snippet(value)}")
    value = value.strip()
    if len(value) > MAX_NAME:
        raise ValueError(f"{name} must be at most {MAX_NAME} characters, got {len(value):,} ({_snippet(value)})")
    return structured.check_text(name, value)


def check_task(task: Any) -> str:
    """``task=`` as the key the gate decides on: "" for the default route (None, "" or "auto" in any
    case); otherwise the stripped text (what it names is the trust gate's to decide)."""
    if task is None:
        return ""
    if not isinstance(task, str):
        raise TypeError(f"task must be a string (an auxiliary task's key) or None, got {type(task).__name__}")
    task = task.strip()
    if task.lower() in ("", "auto"):
        return ""
    if len(task) > MAX_NAME:
        raise ValueError(f"task must be at most {MAX_NAME} characters, got {len(task):,} ({_snippet(task)})")
    return structured.check_text("task", task)


def check_params(temperature: Any, max_tokens: Any, timeout: Any) -> None:
    """The numeric call parameters, before anything is sent."""
    if temperature is not None:
        check_temperature(temperature)
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens < INT_LIMIT
    ):
        raise ValueError(f"max_tokens must be a whole number >= 1 such as 512, got {_snippet(max_tokens)}")
    if isinstance(timeout, float) and math.isnan(timeout) or (
        isinstance(timeout, int) and not isinstance(timeout, bool) and timeout >= INT_LIMIT
    ):
        raise ValueError(f"timeout must be a positive number of seconds such as 30, got {_snippet(timeout)}")


def check_purpose(purpose: Any) -> None:
    """``purpose``: None or a short str label (kept as given)."""
    if purpose is not None:
        if not isinstance(purpose, str):
            raise ValueError(f"purpose must be a string, got {type(purpose).__name__}")
        if len(purpose) > MAX_NAME:
            raise ValueError(f"purpose must be a short label of at most {MAX_NAME} characters, got {len(purpose):,}")


def check_system_prompt(system_prompt: Any) -> None:
    """A structured call's ``system_prompt``: None or a str that can be sent."""
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError(f"system_prompt must be a str or None, got {type(system_prompt).__name__}")
    if system_prompt is not None:
        structured.check_text("system_prompt", system_prompt)
