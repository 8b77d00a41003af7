"""config.yaml: model forms, llm settings, hot reload, fail-closed on bad YAML."""

from __future__ import annotations

import logging
import os
import re
import sys

import pytest

from plugin_llm.config import ConfigSource, get_config_source, hermes_home, parse_config
from tests.conftest import write_config


def test_home_defaults_to_dot_hermes(monkeypatch, tmp_path):
    monkeypatch.delenv("HERMES_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hermes_home() == tmp_path / ".hermes"
    assert hermes_home({"HERMES_HOME": "/x/y"}).as_posix() == "/x/y"


def test_no_config_means_local_model(hermes_home):
    config = ConfigSource(hermes_home).current()
    assert (config.model.provider, config.model.model) == ("local", "local-echo-1")
    assert config.error is None and dict(config.trust) == {}


@pytest.mark.parametrize(
    "text, provider, model",
    [
        ("model:\n  provider: openai\n  model: gpt-4o-mini\n", "openai", "gpt-4o-mini"),
        ("model:\n  provider: anthropic\n  default: claude-3-5-haiku\n", "anthropic", "claude-3-5-haiku"),
        ("model: gpt-4o-mini\n", "openai", "gpt-4o-mini"),
        ("model: claude-3-5-sonnet\n", "anthropic", "claude-3-5-sonnet"),
        ("model: openrouter/anthropic/claude-3.5\n", "openrouter", "anthropic/claude-3.5"),
        ("model:\n  provider: OpenRouter\n  model: ' x/y '\n", "openrouter", "x/y"),
        ("model:\n  provider: local\n", "local", "local-echo-1"),
    ],
)
def test_model_forms(tmp_path, text, provider, model):
    config = parse_config(tmp_path, text)
    assert (config.model.provider, config.model.model) == (provider, model)


def test_custom_provider_base_url(tmp_path):
    config = parse_config(tmp_path, "model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:9/v1\n")
    assert config.model.base_url == "http://127.0.0.1:9/v1"
    assert not parse_config(tmp_path, "model:\n  provider: custom\n  model: m\n").model.base_url
    assert any("base_url" in w for w in parse_config(tmp_path, "model:\n  provider: custom\n  model: m\n").warnings)


def test_llm_settings_and_defaults(tmp_path):
    config = parse_config(tmp_path, "")
    assert (config.llm.timeout, config.llm.max_timeout, config.llm.max_retries, config.llm.structured_repair_attempts) == (30.0, 300.0, 2, 1)
    config = parse_config(tmp_path, "llm:\n  timeout: 5\n  max_timeout: 10\n  max_retries: 0\n  structured_repair_attempts: 3\n")
    assert (config.llm.timeout, config.llm.max_timeout, config.llm.max_retries, config.llm.structured_repair_attempts) == (5, 10, 0, 3)


def test_bad_llm_values_fall_back_with_warnings(tmp_path):
    config = parse_config(tmp_path, "llm:\n  timeout: soon\n  max_retries: -1\n  timeuot: 3\n")
    assert config.llm.timeout == 30.0 and config.llm.max_retries == 2
    text = "\n".join(config.warnings)
    assert "llm.timeout" in text and "llm.max_retries" in text and "did you mean 'timeout'" in text


def test_hot_reload_applies_trust_edit_without_restart(hermes_home):
    source = ConfigSource(hermes_home)
    write_config(hermes_home, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: false\n")
    assert not source.current().trust_for("p").allow_model_override
    write_config(hermes_home, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: true\n")
    assert source.current().trust_for("p").allow_model_override


def test_parsed_once_per_change(hermes_home, monkeypatch):
    import plugin_llm.config as config_module

    write_config(hermes_home, "model: gpt-4o\n")
    calls = []
    real = config_module.parse_config
    monkeypatch.setattr(config_module, "parse_config", lambda *a: calls.append(1) or real(*a))
    source = ConfigSource(hermes_home)
    for _ in range(100):
        source.current()
    assert len(calls) == 1
    write_config(hermes_home, "model: gpt-4o-mini\n")
    assert source.current().model.model == "gpt-4o-mini"
    assert len(calls) == 2


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_check_interval_looks_at_the_file_once_per_interval_and_a_change_takes_effect(hermes_home, monkeypatch):
    import plugin_llm.config as config_module

    write_config(hermes_home, "model: gpt-4o\n")
    clock = _Clock()
    source = ConfigSource(hermes_home, check_interval=0.25, clock=clock)
    stats = []
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if sys._getframe(1).f_code is ConfigSource.current.__code__:  # the source's look at the file
            stats.append(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(config_module.os, "stat", stat)
    assert source.current().model.model == "gpt-4o"
    for _ in range(50):
        source.current()
    assert len(stats) == 1  # one look for 51 calls within the interval
    write_config(hermes_home, "model: gpt-4o-mini\n")
    clock.now += 0.125
    assert source.current().model.model == "gpt-4o"  # within the interval: the snapshot it has
    clock.now += 0.125
    assert source.current().model.model == "gpt-4o-mini"  # the interval is over: the change takes effect
    assert len(stats) == 2
    (hermes_home / "config.yaml").unlink()
    clock.now += 0.25
    assert source.current().model.model == "local-echo-1"  # a removed file too


def test_the_service_sets_the_check_interval_of_its_home(hermes_home):
    from auth import get_store
    from plugin_llm.service.app import FILE_CHECK_SECONDS, create_app

    app = create_app(hermes_home, warm=False)
    assert app.state.service.config is get_config_source(hermes_home)
    assert get_config_source(hermes_home).check_interval == FILE_CHECK_SECONDS == get_store(hermes_home).check_interval
    assert 0.1 <= FILE_CHECK_SECONDS <= 0.25


def test_invalid_yaml_fails_closed_and_keeps_last_good_route(hermes_home, caplog):
    source = ConfigSource(hermes_home)
    write_config(hermes_home, "model:\n  provider: openai\n  model: gpt-4o\nplugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: true\n")
    assert source.current().trust_for("p").allow_model_override
    write_config(hermes_home, "model:\n  provider: openai\n  model: [unclosed\n")
    with caplog.at_level(logging.ERROR, logger="plugin_llm.config"):
        broken = source.current()
        for _ in range(5):
            source.current()
    assert re.search(r"config\.yaml:4:1: ", broken.error), broken.error
    assert not broken.trust_for("p").allow_model_override
    assert (broken.model.provider, broken.model.model) == ("openai", "gpt-4o")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "every plugin override is refused" in errors[0].getMessage()
    write_config(hermes_home, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: true\n")
    assert source.current().error is None and source.current().trust_for("p").allow_model_override


def test_non_mapping_top_level_fails_closed(hermes_home):
    write_config(hermes_home, "- just\n- a list\n")
    config = ConfigSource(hermes_home).current()
    assert config.error and "mapping" in config.error
    assert dict(config.trust) == {}


def test_one_source_per_home(hermes_home, tmp_path):
    assert get_config_source(hermes_home) is get_config_source(hermes_home)
    assert get_config_source(tmp_path) is not get_config_source(hermes_home)


def test_trust_hash_changes_with_policy(tmp_path):
    a = parse_config(tmp_path, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: true\n")
    b = parse_config(tmp_path, "plugins:\n  entries:\n    p:\n      llm:\n        allow_model_override: false\n")
    assert a.trust_sha256() != b.trust_sha256() and len(a.trust_sha256()) == 64


def test_audit_section_parsed(tmp_path):
    config = parse_config(tmp_path, "audit:\n  log_content: 'true'\n  required: true\n  max_bytes: 1000\n")
    assert config.audit.log_content and config.audit.required and config.audit.max_bytes == 1000
