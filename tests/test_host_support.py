"""Helpers for the host runtime tests (no tests here): plugins written into a temporary home, a scripted HostLlm."""

from __future__ import annotations

import copy
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any, Callable

from plugin_llm.llm import HostChatResult, ToolCall
from plugin_llm.types import PluginLlmUsage

from tests.conftest import write_config

EXAMPLES = Path(__file__).resolve().parents[1] / "config_examples"

#: A plugin that records every hook it sees into $HERMES_HOME/events.jsonl.
RECORDER = '''
import json, os
from pathlib import Path
from plugin_llm.plugins import VALID_HOOKS

def register(ctx):
    path = Path(os.environ["HERMES_HOME"]) / "events.jsonl"

    def make(name):
        def record(**kwargs):
            item = {"hook": name, "keys": sorted(kwargs)}
            for key in ("tool_name", "user_message", "assistant_response", "reason", "completed",
                        "api_call_count", "result", "response_text", "session_id"):
                if key in kwargs and isinstance(kwargs[key], (str, int, bool)):
                    item[key] = kwargs[key]
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(item) + "\\n")
        return record

    for name in sorted(VALID_HOOKS):
        ctx.register_hook(name, make(name))
'''


def add_plugin(home: Path, key: str, code: str, *, manifest: str = "") -> Path:
    """Write ``<home>/plugins/<key>/`` with a manifest and ``__init__.py``."""
    directory = home / "plugins" / key
    directory.mkdir(parents=True, exist_ok=True)
    name = key.rsplit("/", 1)[-1]
    (directory / "plugin.yaml").write_text(manifest or f"name: {name}\nversion: '0.1'\n", encoding="utf-8")
    (directory / "__init__.py").write_text(textwrap.dedent(code), encoding="utf-8")
    return directory


def copy_example(home: Path, key: str) -> None:
    shutil.copytree(EXAMPLES / "plugins" / key, home / "plugins" / key,
                    ignore=shutil.ignore_patterns("__pycache__"))


def enable(home: Path, *keys: str, extra: str = "") -> None:
    items = "".join(f"    - {k}\n" for k in keys)
    write_config(home, f"plugins:\n  enabled:\n{items}{extra}")


def events(home: Path) -> list[dict[str, Any]]:
    path = home / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def reply(text: str) -> HostChatResult:
    return HostChatResult(text=text, tool_calls=(), message={"role": "assistant", "content": text},
                          usage=PluginLlmUsage(1, 1, 2), provider="fake", model="fake-1", audit={})


def tool_request(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> HostChatResult:
    raw = json.dumps(arguments)
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}]}
    return HostChatResult(text=None, tool_calls=(ToolCall(call_id, name, arguments, raw),), message=message,
                          usage=PluginLlmUsage(1, 1, 2), provider="fake", model="fake-1", audit={})


class ScriptedLlm:
    """A HostLlm stand-in: returns scripted results in order (the last one repeats) and
    records a deep copy of every request it received."""

    def __init__(self, *script: HostChatResult | Callable[[list, list | None], HostChatResult]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []

    def _next(self, messages: list, tools: list | None) -> HostChatResult:
        self.requests.append({"messages": copy.deepcopy(messages), "tools": copy.deepcopy(tools)})
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return step(messages, tools) if callable(step) else step

    def chat(self, messages, *, tools=None, purpose=None, timeout=None):
        return self._next(messages, tools)

    async def achat(self, messages, *, tools=None, purpose=None, timeout=None):
        return self._next(messages, tools)
