"""Hardening, trust: a model override never switches provider, endpoint or key source."""

from __future__ import annotations

import pytest

from plugin_llm import PluginLlm, PluginLlmConfigError
from plugin_llm.config import parse_config
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer

OPENAI_CANARY = "sk-canary-openai-0123456789abcdefghij"
ANTHROPIC_CANARY = "sk-ant-canary-0123456789abcdefghij"
USER = [{"role": "user", "content": "hi"}]
GRANT = "plugins:\n  entries:\n    mover:\n      llm:\n        allow_model_override: true\n"


@pytest.fixture
def host_keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_CANARY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_CANARY)


@pytest.mark.parametrize("override", ["openai/gpt-4o-mini", "anthropic/claude-3-5-haiku-20241022", "gpt-4o-mini"])
def test_model_override_stays_on_a_providerless_endpoint(hermes_home, host_keys, override):
    with FakeServer() as server:
        write_config(hermes_home, f"model:\n  model: llama3\n  base_url: {server.base_url}\n{GRANT}")
        result = PluginLlm("mover").complete(USER, model=override)
        [request] = server.requests
    assert request.json["model"] == override  # the whole name, sent to the operator's endpoint
    auth = {k.lower(): v for k, v in request.headers.items()}.get("authorization", "")
    assert OPENAI_CANARY not in auth and ANTHROPIC_CANARY not in auth
    assert result.provider == "custom"
    [line] = audit_lines(hermes_home)
    assert line["gen_ai.provider.name"] == "custom" and line["status"] == "ok"


def test_model_override_keeps_the_configured_base_url_of_a_named_provider(hermes_home, host_keys):
    with FakeServer() as server:
        write_config(hermes_home, f"model:\n  provider: openai\n  model: gpt-4o\n  base_url: {server.base_url}\n{GRANT}")
        result = PluginLlm("mover").complete(USER, model="anthropic/claude-3-5-haiku-20241022")
        [request] = server.requests
    # still the openai route: its endpoint, its key source (never the anthropic key)
    assert request.json["model"] == "anthropic/claude-3-5-haiku-20241022"
    assert {k.lower(): v for k, v in request.headers.items()}["authorization"] == f"Bearer {OPENAI_CANARY}"
    assert result.provider == "openai"


def test_a_route_whose_provider_config_cannot_tell_is_refused_whatever_the_override(hermes_home, host_keys):
    write_config(hermes_home, f"model:\n  model: llama3\n{GRANT}")
    with pytest.raises(PluginLlmConfigError, match="model.provider"):
        PluginLlm("mover").complete(USER, model="openai/gpt-4o-mini")
    [line] = audit_lines(hermes_home)
    assert line["status"] == "error" and line["error.type"] == "PluginLlmConfigError"


@pytest.mark.parametrize(
    "text, provider, model, base_url",
    [
        ("model:\n  model: llama3\n  base_url: http://127.0.0.1:9/v1\n", "custom", "llama3", "http://127.0.0.1:9/v1"),
        ("model:\n  model: meta-llama/Llama-3-8b\n  base_url: http://127.0.0.1:9/v1\n", "custom", "meta-llama/Llama-3-8b",
         "http://127.0.0.1:9/v1"),
        ("model:\n  model: openai/gpt-4o\n", "openai", "gpt-4o", None),
        ("model: anthropic/claude-3-5-haiku\n", "anthropic", "claude-3-5-haiku", None),
        ("model:\n  model: gpt-4o\n", "openai", "gpt-4o", None),
        ("model:\n  model: llama3\n", None, "llama3", None),
    ],
)
def test_config_decides_the_route_provider_once(tmp_path, text, provider, model, base_url):
    config = parse_config(tmp_path, text)
    assert (config.model.provider, config.model.model, config.model.base_url) == (provider, model, base_url)
