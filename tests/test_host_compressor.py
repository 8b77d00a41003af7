"""The built-in ContextCompressor: trims oldest turns, keeps system + last turn, never splits tool groups."""

from __future__ import annotations

import copy

from plugin_llm.host.compressor import ContextCompressor, estimate_message_tokens, estimate_tokens
from plugin_llm.plugins.engines import ContextEngine


def _turn(i: int, size: int = 400) -> list[dict]:
    return [
        {"role": "user", "content": f"question {i} " + "x" * size},
        {"role": "assistant", "content": f"answer {i} " + "y" * size},
    ]


def _tool_turn(i: int, size: int = 400) -> list[dict]:
    return [
        {"role": "user", "content": f"tool question {i} " + "x" * size},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}a", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
            {"id": f"c{i}b", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": f"c{i}a", "name": "lookup", "content": "r" * size},
        {"role": "tool", "tool_call_id": f"c{i}b", "name": "lookup", "content": "s" * size},
        {"role": "assistant", "content": f"tool answer {i}"},
    ]


SYSTEM = {"role": "system", "content": "You are a test."}


def test_is_a_context_engine_named_compressor():
    assert isinstance(ContextCompressor(), ContextEngine)
    assert ContextCompressor.name == "compressor"


def test_under_budget_returns_equal_copy_and_never_mutates_input():
    messages = [SYSTEM] + _turn(1) + [{"role": "user", "content": "now"}]
    before = copy.deepcopy(messages)
    out = ContextCompressor().compress(messages, budget_tokens=100_000)
    assert out == messages and out is not messages
    assert messages == before


def test_drops_oldest_turns_first_and_keeps_system_and_last_turn():
    messages = [SYSTEM] + _turn(1) + _turn(2) + _turn(3) + [{"role": "user", "content": "latest question"}]
    budget = estimate_tokens([SYSTEM] + _turn(3) + [{"role": "user", "content": "latest question"}]) + 60
    out = ContextCompressor().compress(messages, budget_tokens=budget)
    contents = [m["content"] for m in out]
    assert out[0] == SYSTEM
    assert out[-1]["content"] == "latest question"
    assert not any(c.startswith("question 1") for c in contents)
    assert not any(c.startswith("question 2") for c in contents)
    assert any(c.startswith("question 3") for c in contents)  # the newest older turn that fits stays
    note = out[1]
    assert note["role"] == "system" and "4 earlier messages were omitted" in note["content"]
    assert estimate_tokens(out) <= budget


def test_last_turn_kept_even_when_it_alone_exceeds_the_budget():
    last = [{"role": "user", "content": "z" * 5000}]
    messages = [SYSTEM] + _turn(1) + last
    out = ContextCompressor(note=False).compress(messages, budget_tokens=50)
    assert out == [SYSTEM] + last


def test_tool_call_and_its_results_are_never_split():
    messages = [SYSTEM] + _tool_turn(1) + _tool_turn(2) + _tool_turn(3)
    for budget in range(50, estimate_tokens(messages), 37):
        out = ContextCompressor().compress(messages, budget_tokens=budget)
        for i, msg in enumerate(out):
            if msg.get("tool_calls"):
                ids = [c["id"] for c in msg["tool_calls"]]
                following = [m.get("tool_call_id") for m in out[i + 1 : i + 1 + len(ids)]]
                assert following == ids, (budget, out)
            if msg["role"] == "tool":
                prev = out[i - 1]
                assert prev["role"] == "tool" or prev.get("tool_calls"), (budget, out)
        assert out[-5:] == _tool_turn(3)


def test_orphan_tool_results_at_the_start_are_dropped():
    messages = [SYSTEM, {"role": "tool", "tool_call_id": "gone", "content": "x" * 800}] + _turn(1) + _turn(2)
    out = ContextCompressor(note=False).compress(messages, budget_tokens=estimate_tokens(messages) - 1)
    assert all(m["role"] != "tool" for m in out)
    assert out[0] == SYSTEM and out[-2:] == _turn(2)


def test_estimates_count_tool_call_arguments_and_images():
    plain = {"role": "assistant", "content": None}
    with_call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "a" * 400}}]}
    assert estimate_message_tokens(with_call) >= estimate_message_tokens(plain) + 100
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:..."}}]}
    assert estimate_message_tokens(image) > 300
