"""The call pipeline's shape (plugin_llm/call/): small modules, flows that take a request object rather
than long parameter lists, and the transport's optional capabilities declared as protocols."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from plugin_llm import PluginLlm, PluginLlmConfigError
from plugin_llm.call.protocols import AsyncReadies, AsyncStreams, ChecksWritable, Readies, Streams
from plugin_llm.transport import LitellmTransport, TransportResponse
from plugin_llm.types import PluginLlmUsage
from tests.conftest import audit_lines

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = sorted((ROOT / "plugin_llm" / "call").glob("*.py"))
USER = [{"role": "user", "content": "hi"}]
MAX_LINES = 600
MAX_PARAMETERS = 5


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [name for name in names if name not in ("self", "cls")]


@pytest.mark.parametrize("path", [ROOT / "plugin_llm" / "llm.py", ROOT / "plugin_llm" / "streaming.py", *PIPELINE],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_module_of_the_call_pipeline_is_over_600_lines(path):
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_LINES


def test_no_function_of_the_call_pipeline_takes_more_than_five_parameters():
    assert {p.name for p in PIPELINE} >= {"pipeline.py", "request.py", "steps.py", "validate.py", "protocols.py"}
    long = []
    for path in PIPELINE:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = _parameters(node)
                if len(names) > MAX_PARAMETERS:
                    long.append(f"{path.name}:{node.lineno} {node.name}({', '.join(names)})")
    assert long == []


def test_the_default_transport_has_every_optional_capability_the_pipeline_asks_for():
    transport = LitellmTransport()
    assert all(isinstance(transport, cap) for cap in (Readies, AsyncReadies, Streams, AsyncStreams))


def test_the_host_audit_log_can_say_whether_it_is_writable(hermes_home):
    from plugin_llm.auditing import host_audit_log

    assert isinstance(host_audit_log(hermes_home), ChecksWritable)


class _CompleteOnly:
    """A transport with only what every transport must have: no set-up, no streaming."""

    def supports_json_schema(self, route):
        return False

    def complete(self, request):
        return TransportResponse("ok", {"role": "assistant", "content": "ok"}, "m", PluginLlmUsage(1, 1, 0.0), 1, 0.0)

    async def acomplete(self, request):
        return self.complete(request)


def test_a_transport_without_the_optional_capabilities_completes_and_cannot_stream(hermes_home):
    llm = PluginLlm("plain", transport=_CompleteOnly())
    assert llm.complete(USER).text == "ok"
    assert asyncio.run(llm.acomplete(USER)).text == "ok"
    with pytest.raises(PluginLlmConfigError, match=r"cannot stream: it has no open_stream\(\)"):
        llm.stream(USER)

    async def astream() -> None:
        async for _ in llm.astream(USER):
            pass

    with pytest.raises(PluginLlmConfigError, match=r"cannot stream: it has no aopen_stream\(\)"):
        asyncio.run(astream())
    assert [line["status"] for line in audit_lines(hermes_home)] == ["ok", "ok", "error", "error"]
