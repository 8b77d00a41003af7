"""``ctx.llm(..., task=)``: the task gate, the ``auxiliary:`` slots as routes, and
``ctx.register_auxiliary_task``."""

from __future__ import annotations

import pytest

from plugin_llm.config import parse_config
from plugin_llm.trust import BUILTIN_TASKS, TrustPolicy, decide_task

USER = [{"role": "user", "content": "hi"}]


# ------------------------------------------------------------------ the task gate (pure)
def test_a_task_the_plugin_registered_needs_no_flag():
    decision = decide_task("p", TrustPolicy(), "p_summary", owner="p")
    assert decision.allowed and "registered by the plugin" in decision.reason


def test_a_builtin_task_needs_allow_task_override_or_its_capability():
    refused = decide_task("p", TrustPolicy(), "vision", owner=None)
    assert not refused.allowed and refused.config_key == "plugins.entries.p.llm.allow_task_override"
    assert "llm.task_override" in refused.reason
    assert decide_task("p", TrustPolicy(allow_task_override=True), "vision", None).allowed
    by_capability = decide_task("p", TrustPolicy(granted_capabilities=("llm.task_override",)), "vision", None)
    assert by_capability.allowed and "capability llm.task_override" in by_capability.reason


@pytest.mark.parametrize("owner", [None, "other"])
def test_any_other_task_is_refused_even_with_the_flag(owner):
    decision = decide_task("p", TrustPolicy(allow_task_override=True), "other_summary", owner)
    assert not decision.allowed and decision.config_key is None
    assert "plugin 'p'" in decision.reason and "'other_summary'" in decision.reason
    assert ("registered by plugin 'other'" in decision.reason) == (owner == "other")


def test_the_builtin_tasks_are_hermess():
    assert {"vision", "compression", "web_extract", "title_generation", "curator"} <= BUILTIN_TASKS
    assert len(BUILTIN_TASKS) == 13


def test_allow_task_override_is_a_trust_key_of_config_yaml(tmp_path):
    config = parse_config(tmp_path, "plugins:\n  entries:\n    p: {llm: {allow_task_override: true}}\n"
                                    "    q: {llm: {allow_task_overide: true}}\n")
    assert config.trust_for("p").allow_task_override is True
    assert config.trust_for("p").grants_task() == "allow_task_override"
    assert config.trust_for("q").grants_task() is None
    assert any("allow_task_overide: unknown key" in w and "did you mean 'allow_task_override'" in w
               for w in config.warnings)
