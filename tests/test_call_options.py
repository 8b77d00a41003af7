"""Chat parameters besides the named ones: forwarded when they involve no credential or routing."""

from __future__ import annotations

import asyncio

import pytest

from plugin_llm import PluginLlm, PluginLlmTextInput, PluginLlmToolCall, PluginLlmTrustError
from tests.conftest import audit_lines
from tests.paths import transport_path  # noqa: F401  (every test on both paths)
from tests.servers import FakeServer, Reply

USER = [{"role": "user", "content": "hi"}]
SAMPLING = {"top_p": 0.5, "stop": ["\n\n", "END"], "seed": 42, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "logit_bias": {"50256": -100}, "user": "end-user-7"}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
def server(custom_route):
    with FakeServer() as fake:
        custom_route(fake.base_url)
        yield fake


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sampling_parameters_reach_the_provider(server, mode):
    llm = PluginLlm("sampler")
    if mode == "sync":
        llm.complete(USER, n=1, response_format={"type": "json_object"}, **SAMPLING)
    else:
        asyncio.run(llm.acomplete(USER, n=1, response_format={"type": "json_object"}, **SAMPLING))
    [request] = server.requests
    for name, value in SAMPLING.items():
        assert request.json[name] == value, name
    assert request.json["response_format"] == {"type": "json_object"}


def test_structured_calls_take_the_sampling_parameters_too(server):
    server.push(Reply(content='{"a": 1}'))
    result = PluginLlm("sampler").complete_structured(instructions="extract", input=[PluginLlmTextInput("a: 1")],
                                                      json_mode=True, seed=7, top_p=0.9)
    assert result.parsed == {"a": 1}
    assert server.requests[0].json["seed"] == 7 and server.requests[0].json["top_p"] == 0.9


def test_tools_and_tool_choice_are_forwarded_and_tool_calls_returned(server):
    server.push(Reply.tool_call("weather", {"city": "Oslo"}, call_id="call_9"))
    result = PluginLlm("tooler").complete(USER, tools=[WEATHER], tool_choice="auto")
    [request] = server.requests
    assert request.json["tools"] == [WEATHER] and request.json["tool_choice"] == "auto"
    assert result.tool_calls == (PluginLlmToolCall("call_9", "weather", {"city": "Oslo"}, '{"city": "Oslo"}'),)
    plain = PluginLlm("tooler").complete(USER)
    assert plain.tool_calls == ()


@pytest.mark.parametrize("options, message", [
    ({"top_p": 1.5}, "top_p must be a number from 0 to 1"),
    ({"temperature": 5}, "temperature must be a number from 0 to 2"),
    ({"temperature": 2.01}, "temperature must be a number from 0 to 2"),
    ({"temperature": -1}, "temperature must be a number from 0 to 2"),
    ({"temperature": float("inf")}, "temperature must be a number from 0 to 2"),
    ({"top_p": True}, "top_p must be a number"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop must be a string or a list of 1 to 4"),
    ({"seed": 1.5}, "seed must be a whole number"),
    ({"presence_penalty": 3}, "presence_penalty must be a number from -2 to 2"),
    ({"logit_bias": {"abc": 1}}, "logit_bias keys must be token ids"),
    ({"logit_bias": {"1": 500}}, r"logit_bias\[1\] must be a number from -100 to 100"),
    ({"user": ""}, "user must be a non-empty end-user id"),
    ({"n": 2}, "n must be 1"),
    ({"response_format": {"type": "xml"}}, "response_format must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "bogus"}}}},
     r"response_format\['json_schema'\]\['schema'\]"),
    ({"tool_choice": "auto"}, "tool_choice needs tools"),
    ({"tools": [{"type": "function", "function": {}}]}, r"tools\[0\]\['function'\]"),
])
def test_bad_values_are_refused_before_anything_is_sent(server, hermes_home, options, message):
    with pytest.raises(ValueError, match=message):
        PluginLlm("sampler").complete(USER, **options)
    assert server.requests == [] and audit_lines(hermes_home) == []


def test_the_ends_of_the_temperature_range_are_forwarded(server):
    for temperature in (0, 2):
        PluginLlm("sampler").complete(USER, temperature=temperature)
    assert [r.json["temperature"] for r in server.requests] == [0, 2]


def test_unknown_and_complete_only_names_are_type_errors_with_a_hint(server):
    with pytest.raises(TypeError, match=r"'top_k'.*did you mean 'top_p'"):
        PluginLlm("sampler").complete(USER, top_k=3)
    with pytest.raises(TypeError, match="complete\\(\\)/acomplete\\(\\) only"):
        PluginLlm("sampler").complete_structured(instructions="x", input=["y"], tools=[WEATHER])
    assert server.requests == []


@pytest.mark.parametrize("name", ["api_key", "base_url", "extra_headers"])
def test_an_endpoint_or_key_argument_is_an_audited_denial(server, hermes_home, name):
    with pytest.raises(PluginLlmTrustError, match="never choose an endpoint or a key"):
        PluginLlm("sneaky").complete(USER, **{name: "sk-canary-123456789012345678"})
    assert server.requests == []
    [line] = audit_lines(hermes_home)
    assert line["status"] == "denied" and line["decision"] == "denied" and line["plugin_id"] == "sneaky"
    assert line["denied_arguments"] == [name]
    assert "sk-canary" not in (hermes_home / "logs" / "agent.log").read_text()
