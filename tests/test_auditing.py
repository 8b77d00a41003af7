"""The host's audit wiring: config (re)load events, redaction of call records, verify after real calls."""

from __future__ import annotations

import json

import pytest

from audit import verify
from plugin_llm import PluginLlm
from plugin_llm.transport import TransportResponse
from plugin_llm.types import PluginLlmUsage
from tests.conftest import write_config

USER = [{"role": "user", "content": "hi"}]


def events(home):
    lines = (home / "logs" / "agent.log").read_text(encoding="utf-8").split("\n")
    return [r for r in map(json.loads, filter(None, lines)) if r.get("event", "").startswith("config_")]


@pytest.mark.slow
def test_config_load_reload_and_error_are_audited_with_the_policy_hash(hermes_home):
    write_config(hermes_home, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: false\n")
    llm = PluginLlm("p")
    llm.complete(USER)
    llm.complete(USER)  # no change: no new event
    write_config(hermes_home, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: true\n")
    llm.complete(USER)
    write_config(hermes_home, "plugins: [\n")
    llm.complete(USER)
    loaded, reloaded, broken = events(hermes_home)
    assert loaded["event"] == "config_loaded" and reloaded["event"] == "config_reloaded"
    assert loaded["trust_policy_sha256"] != reloaded["trust_policy_sha256"]
    assert "p" in json.dumps(reloaded["changed_entries"])
    assert broken["event"] == "config_error" and "config.yaml:" in broken["config_error"]
    assert verify(hermes_home).ok


def test_call_records_are_redacted(hermes_home):
    from auth import register_secret

    secret = "sk-live-AUDITREDACT-0123456789abcdef"
    register_secret(secret)

    class Echo:
        def complete(self, request):
            from plugin_llm.errors import PluginLlmProviderError

            raise PluginLlmProviderError(f"upstream said: bad key {secret}", status=401, provider="custom")

    try:
        PluginLlm("p", transport=Echo()).complete(USER)
    except Exception:
        pass
    text = (hermes_home / "logs" / "agent.log").read_text()
    assert secret not in text and "upstream said: bad key" in text
    assert verify(hermes_home).ok


def test_log_content_is_opt_in(hermes_home):
    class Fixed:
        def complete(self, request):
            return TransportResponse("the reply", {"role": "assistant"}, "m", PluginLlmUsage(1, 1, 2), 1, 0.0)

    PluginLlm("p", transport=Fixed()).complete([{"role": "user", "content": "private words"}])
    assert "private words" not in (hermes_home / "logs" / "agent.log").read_text()
    write_config(hermes_home, "audit:\n  log_content: true\n")
    PluginLlm("p", transport=Fixed()).complete([{"role": "user", "content": "private words"}])
    last = json.loads((hermes_home / "logs" / "agent.log").read_text().strip().split("\n")[-1])
    assert last["gen_ai.input.messages"] == [{"role": "user", "content": "private words"}]
    assert last["gen_ai.output.text"] == "the reply"


def test_required_audit_fails_closed_before_the_provider(hermes_home):
    write_config(hermes_home, "audit:\n  required: true\n")
    (hermes_home / "logs").write_text("not a directory")  # the log cannot be created

    class Boom:
        def complete(self, request):
            raise AssertionError("the provider must not be reached")

    from plugin_llm.errors import PluginLlmConfigError
    import pytest

    with pytest.raises(PluginLlmConfigError, match="audit"):
        PluginLlm("p", transport=Boom()).complete(USER)


def test_unwritable_log_never_breaks_a_call_when_not_required(hermes_home):
    (hermes_home / "logs").write_text("not a directory")

    class Fixed:
        def complete(self, request):
            return TransportResponse("fine", {"role": "assistant"}, "m", PluginLlmUsage(1, 1, 2), 1, 0.0)

    assert PluginLlm("p", transport=Fixed()).complete(USER).text == "fine"
