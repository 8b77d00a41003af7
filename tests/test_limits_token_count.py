"""Input tokens counted exactly under the limits where the model's tokenizer ships with litellm.

The fast tests count with a stand-in encoding (one token per word); the slow ones load the real
o200k_base and cl100k_base files (about a second each per process) and compare with tiktoken's
own count, and run whole calls through ``PluginLlm`` with a scripted transport.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from plugin_llm import PluginLlm, PluginLlmQuotaError, PluginLlmUsage, limits
from plugin_llm.call.steps import Tally
from plugin_llm.limits import input_token_bound, tokens
from plugin_llm.limits.pricing import message_token_bound
from plugin_llm.limits.settings import parse_limit_settings
from plugin_llm.transport import TransportResponse
from tests.conftest import audit_lines, write_config

ROOT = Path(__file__).resolve().parents[1]
#: an English prompt of the kind a summarising plugin sends (about 900 o200k tokens)
REPORT = ("The quarterly report shows that revenue grew by eight percent while operating costs stayed "
          "flat; the board asked for a summary of the risks, the hiring plan and the cash position. ") * 25
PROMPT = [{"role": "system", "content": "You summarise reports in three short bullet points."},
          {"role": "user", "content": REPORT}]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 400}}


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


class Words:
    """A stand-in encoding: one token per whitespace-separated word."""

    name = "words"

    @staticmethod
    def encode_ordinary(text: str) -> list[str]:
        return text.split()


@pytest.fixture
def words(monkeypatch):
    """Every encoding is :class:`Words`, loaded once per name (the loads are counted)."""
    loads: list[str] = []
    monkeypatch.setattr(tokens, "_slots", {})
    monkeypatch.setattr(tokens, "_load", lambda name: loads.append(name) or Words())
    for name in (tokens.O200K, tokens.CL100K):
        assert tokens.wait(name, 10) is not None
    return loads


@pytest.fixture
def gated(monkeypatch):
    """Encodings that load only once ``gate`` is set (the load of a real one takes about a second)."""
    gate = threading.Event()

    def load(name):
        assert gate.wait(30), "the test never opened the gate"
        return Words()

    monkeypatch.setattr(tokens, "_slots", {})
    monkeypatch.setattr(tokens, "_load", load)
    yield gate
    gate.set()


class Scripted:
    """A transport that answers ``ok`` and reports ``input_tokens`` used, without a network."""

    def __init__(self, input_tokens: int = 100) -> None:
        self.input_tokens = input_tokens
        self.requests: list = []

    def complete(self, request):
        self.requests.append(request)
        usage = PluginLlmUsage(input_tokens=self.input_tokens, output_tokens=5, total_tokens=self.input_tokens + 5,
                               cost_usd=None)
        return TransportResponse(text="ok", message={"role": "assistant", "content": "ok"}, model="gpt-4o",
                                 usage=usage, attempts=1, provider_seconds=0.001)

    async def acomplete(self, request):
        return self.complete(request)

    def supports_json_schema(self, route) -> bool:
        return True


def configure(home: Path, block: str, model: str = "provider: openai, model: gpt-4o") -> None:
    """Plugins ``p`` and ``q`` with limits ``block``; a dollar per million tokens, in and out, for gpt-4o."""
    write_config(home, (
        f"model: {{{model}}}\nlimits:\n  store: local\n  prices:\n"
        "    openai/gpt-4o: {input_per_mtok: 1.0, output_per_mtok: 1.0}\n"
        f"plugins:\n  entries:\n    p: {{limits: {block}}}\n    q: {{limits: {block}}}\n"))


def settings_for(block: str):
    settings, issues = parse_limit_settings({"store": "local"}, {"entries": {"p": {"limits": block}}})
    assert not issues, issues
    return settings


def cookbook_count(encoding, messages) -> int:
    """OpenAI's cookbook ``num_tokens_from_messages`` for gpt-4o and gpt-4: what the provider bills."""
    total = 3  # every reply is primed with <|start|>assistant<|message|>
    for message in messages:
        total += 3
        for key, value in message.items():
            total += len(encoding.encode(value))
            if key == "name":
                total += 1
    return total


# ------------------------------------------------------------------------- which models count exactly
@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4o-mini", "gpt-4o-2024-08-06", "gpt-4.1", "gpt-4.1-nano", "o1",
                                   "o3-mini", "o4-mini", "gpt-5", "gpt-5-mini", "chatgpt-4o-latest", "gpt-4",
                                   "gpt-4-turbo", "gpt-3.5-turbo", "gpt-3.5-turbo-0125", "text-embedding-3-small"])
def test_openai_models_count_with_the_encoding_tiktoken_names_for_them(model):
    from tiktoken.model import encoding_name_for_model

    assert tokens.encoding_for("openai", model) == encoding_name_for_model(model)
    assert tokens.encoding_for("OpenAI", f"openai/{model.upper()}") == encoding_name_for_model(model)


def test_other_providers_and_models_keep_the_byte_bound():
    assert tokens.encoding_for("openai", "ft:gpt-4.1-mini-2025-04-14:acme::abc123") == tokens.O200K  # its base
    assert tokens.encoding_for("openai", "ft:gpt-3.5-turbo-0125:acme::abc123") == tokens.CL100K
    for provider, model in [("anthropic", "claude-sonnet-4-5"), ("azure", "gpt-4o"), ("custom", "gpt-4o"),
                            ("openrouter", "openai/gpt-4o"), ("local", "local-echo-1"), ("deepseek", "deepseek-chat"),
                            ("openai", "gpt-4o-search-preview"), ("openai", "gpt-4o-audio-preview"),
                            ("openai", "o3-deep-research"), ("openai", "gpt-6"), ("openai", "davinci-002"),
                            ("openai", "gpt-4o" + "x" * 300)]:
        assert tokens.encoding_for(provider, model) is None, (provider, model)


# ------------------------------------------------------------------------- what is counted, and how
def test_text_counts_exactly_with_the_chat_formats_overhead(words):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three", "name": "ann"}]
    assert tokens.count_input(tokens.O200K, messages) == (
        tokens.PER_REQUEST + 2 * tokens.PER_MESSAGE + (1 + 2) + (1 + 3) + (1 + tokens.PER_NAME), True)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}]}]
    assert tokens.count_input(tokens.O200K, parts) == (
        tokens.PER_REQUEST + tokens.PER_MESSAGE + 1 + (2 + tokens.PER_PART) + (1 + tokens.PER_PART), True)


def test_tools_tool_calls_and_response_format_count_as_json_with_a_margin(words):
    tools = [{"type": "function", "function": {"name": "lookup", "description": "find a word in the index",
                                                "parameters": {"type": "object"}}}]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    base, exact = tokens.count_input(tokens.O200K, [{"role": "user", "content": "hi"}])
    counted, exact = tokens.count_input(tokens.O200K, [{"role": "user", "content": "hi"}], (tools, None, fmt))
    words_of = [len(json.dumps(v, separators=(",", ":")).split()) for v in (tools, fmt)]
    assert exact and counted == base + sum(n + n // 4 + tokens.JSON_OVERHEAD + tokens.JSON_PER_ITEM for n in words_of)
    calls = [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "x"}'}}]
    counted, exact = tokens.count_input(tokens.O200K, [{"role": "assistant", "content": None, "tool_calls": calls},
                                                       {"role": "tool", "tool_call_id": "c1", "content": "found"}])
    assert exact and counted > tokens.PER_REQUEST + 2 * tokens.PER_MESSAGE + tokens.JSON_OVERHEAD


@pytest.mark.parametrize("message", [
    {"role": "user", "content": ["see", IMAGE]},
    {"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]},
    {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]},
    {"role": "user", "content": "hi", "audio": {"id": "a1"}},  # a key the chat format may bill otherwise
    {"role": "user", "content": "a lone surrogate \ud800"},
    {"role": "user", "content": "x " * (tokens.MAX_EXACT_BYTES // 2 + 1)},  # past what is counted exactly
], ids=["image", "text and image", "audio", "unknown key", "surrogate", "too long"])
def test_what_is_not_plain_text_counts_by_the_byte_bound(words, message):
    plain = {"role": "system", "content": "be brief"}
    counted, exact = tokens.count_input(tokens.O200K, [plain, message])
    assert not exact
    assert counted == tokens.count_input(tokens.O200K, [plain])[0] + message_token_bound(message)


def test_without_a_tokenizer_the_count_is_the_byte_bound(words):
    assert tokens.count_input(None, PROMPT) == (input_token_bound(PROMPT), False)


def test_an_encoding_loads_once_however_many_threads_ask(monkeypatch):
    loads = []
    gate = threading.Event()
    monkeypatch.setattr(tokens, "_slots", {})
    monkeypatch.setattr(tokens, "_load", lambda name: gate.wait(30) and (loads.append(name) or Words()))
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(tokens.wait(tokens.O200K, 30))) for _ in range(8)]
    for thread in threads:
        thread.start()
    assert tokens.count_input(tokens.O200K, PROMPT)[1] is False  # still loading: the bound, at once
    gate.set()
    for thread in threads:
        thread.join()
    assert loads == [tokens.O200K] and all(isinstance(e, Words) for e in seen)
    assert tokens.load_seconds(tokens.O200K) is not None


def test_a_file_that_is_not_the_published_one_is_refused_and_the_bound_used(monkeypatch, tmp_path, caplog):
    bundled = tokens._BUNDLED[tokens.CL100K]
    (tmp_path / bundled.file).write_bytes(b"IQ== 0\nIg== 1\n")  # well-formed, but not cl100k_base
    monkeypatch.setattr(tokens, "_slots", {})
    monkeypatch.setattr(tokens, "_tokenizers_dir", lambda: tmp_path)
    with caplog.at_level(logging.WARNING, logger="plugin_llm.limits"):
        assert tokens.wait(tokens.CL100K, 30) is None
    assert tokens.count_input(tokens.CL100K, PROMPT) == (input_token_bound(PROMPT), False)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "cl100k_base" in warning and str(tmp_path / bundled.file) in warning and "SHA-256" in warning
    assert "byte bound" in warning and "reinstalling litellm" in warning
    assert tokens.wait(tokens.CL100K, 30) is None and len(caplog.records) == 1  # said once, not tried again


# ------------------------------------------------------------------------- admission and the record
def test_the_ticket_says_how_its_input_was_counted(words, hermes_home):
    settings = settings_for({"tokens_per_minute": 100000})
    deadline = time.monotonic() + 10
    exact = limits.admit(settings, hermes_home, "p", messages=PROMPT, provider="openai", model="gpt-4o",
                         max_tokens=50, deadline=deadline)
    fields = exact.audit_fields()
    expected = tokens.count_input(tokens.O200K, PROMPT)[0]
    assert fields["limits.input_count"] == "exact" and fields["limits.reserved_input_tokens"] == expected
    assert fields["limits.reserved_tokens"] == expected + 50
    bound = limits.admit(settings, hermes_home, "p", messages=PROMPT, provider="anthropic", model="claude-x",
                         max_tokens=50, deadline=deadline)
    assert bound.audit_fields()["limits.input_count"] == "bound"
    assert bound.audit_fields()["limits.reserved_input_tokens"] == input_token_bound(PROMPT)
    exact.release()
    bound.release()


def test_a_limit_on_requests_only_never_counts_exactly(words, hermes_home):
    settings = settings_for({"requests_per_minute": 100})
    ticket = limits.admit(settings, hermes_home, "p", messages=PROMPT, provider="openai", model="gpt-4o",
                          max_tokens=50, deadline=time.monotonic() + 10)
    assert ticket.audit_fields()["limits.input_count"] == "bound"
    ticket.release()


def test_a_call_does_not_wait_for_the_tokenizer_when_the_bound_is_admitted(gated, hermes_home):
    settings = settings_for({"tokens_per_minute": 1000000})
    ticket = limits.admit(settings, hermes_home, "p", messages=PROMPT, provider="openai", model="gpt-4o",
                          max_tokens=50, deadline=time.monotonic() + 30)  # the gate is shut: a wait would hang
    assert ticket.audit_fields()["limits.input_count"] == "bound" and tokens.pending(tokens.O200K)
    ticket.release()


def test_a_refusal_by_the_bound_waits_for_the_tokenizer_and_asks_again(gated, hermes_home):
    """Which count decides must not depend on how far the first load got: the call the bound refuses
    waits for the load (here opened by another thread) and is admitted on its exact count."""
    exact = tokens.PER_REQUEST + 2 * tokens.PER_MESSAGE + sum(len(m["content"].split()) + 1 for m in PROMPT)
    settings = settings_for({"tokens_per_minute": exact + 50 + 10})
    assert input_token_bound(PROMPT) + 50 > exact + 60  # what the bound reserves would not fit
    threading.Timer(0.05, gated.set).start()
    ticket = limits.admit(settings, hermes_home, "p", messages=PROMPT, provider="openai", model="gpt-4o",
                          max_tokens=50, deadline=time.monotonic() + 30)
    assert ticket.audit_fields()["limits.input_count"] == "exact"
    assert ticket.audit_fields()["limits.reserved_input_tokens"] == exact
    ticket.release()


def test_a_refusal_the_exact_count_does_not_undo_stands(words, hermes_home):
    settings = settings_for({"tokens_per_minute": 100})
    with pytest.raises(limits.PluginLlmLimitError) as refused:
        limits.admit(settings, hermes_home, "p", messages=PROMPT, provider="openai", model="gpt-4o", max_tokens=50,
                     deadline=time.monotonic() + 10)
    assert refused.value.denial.limit == "tokens_per_minute"


def test_an_async_call_waits_for_the_tokenizer_off_the_event_loop(gated, hermes_home, monkeypatch):
    """The gate is opened by a task on the same loop: were the wait on the loop, the load would never end
    and the call would be refused on its bound."""
    monkeypatch.setattr(tokens, "LOAD_WAIT", 20.0)
    exact = tokens.PER_REQUEST + 2 * tokens.PER_MESSAGE + sum(len(m["content"].split()) + 1 for m in PROMPT)
    configure(hermes_home, f"{{tokens_per_minute: {exact + 60}}}")
    transport = Scripted()

    async def main():
        async def open_gate():
            while not tokens.pending(tokens.O200K):
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)
            gated.set()

        opener = asyncio.create_task(open_gate())
        result = await PluginLlm("p", transport=transport).acomplete(PROMPT, max_tokens=50)
        await opener
        return result

    assert asyncio.run(main()).text == "ok"
    [line] = audit_lines(hermes_home)
    assert line["limits.input_count"] == "exact" and line["limits.reserved_input_tokens"] == exact


def test_repairs_add_their_input_and_one_bound_makes_the_call_bound():
    tally = Tally.__new__(Tally)
    tally.limit_fields = None
    tally.add_limits({"limits.reserved_tokens": 10, "limits.reserved_input_tokens": 6, "limits.input_count": "exact"})
    tally.add_limits({"limits.reserved_tokens": 20, "limits.reserved_input_tokens": 16, "limits.input_count": "bound"})
    tally.add_limits({"limits.reserved_tokens": 5, "limits.reserved_input_tokens": 1, "limits.input_count": "exact"})
    assert tally.limit_fields == {"limits.reserved_tokens": 35, "limits.reserved_input_tokens": 23,
                                  "limits.input_count": "bound"}


def test_a_model_without_a_tokenizer_is_recorded_as_bound(hermes_home):
    configure(hermes_home, "{tokens_per_minute: 100000}", model="provider: anthropic, model: claude-sonnet-4-5")
    assert PluginLlm("p", transport=Scripted()).complete(PROMPT, max_tokens=50).text == "ok"
    [line] = audit_lines(hermes_home)
    assert line["limits.input_count"] == "bound" and line["limits.reserved_input_tokens"] == input_token_bound(PROMPT)


# ------------------------------------------------------------------------- the real tokenizers
@pytest.fixture(scope="module")
def real():
    """Both encodings, loaded from litellm's files by this module, and tiktoken's own from the same files."""
    import tiktoken

    loaded = {name: tokens.wait(name, 120) for name in (tokens.O200K, tokens.CL100K)}
    assert all(loaded.values()), "litellm's bundled tokenizer files did not load"
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tokens._tokenizers_dir())  # tiktoken's own loader reads them there
    try:
        own = {name: tiktoken.get_encoding(name) for name in loaded}
    finally:
        if previous is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous
    return loaded, own


TEXTS = ["hello world", REPORT, "héllo wörld 你好 🙂 " * 20, "def f(x):\n    return x ** 2  # square\n" * 10,
         "<|endoftext|> is text here", "   spaced   out\n\n\ttabs", "1234567890" * 30, ""]


@pytest.mark.slow
@pytest.mark.parametrize("name", [tokens.O200K, tokens.CL100K])
def test_the_counts_are_tiktokens_own(real, name):
    loaded, own = real
    for text in TEXTS:
        assert len(loaded[name].encode_ordinary(text)) == len(own[name].encode_ordinary(text)), text[:40]
        counted, exact = tokens.count_input(name, [{"role": "user", "content": text}])
        assert exact and counted == (tokens.PER_REQUEST + tokens.PER_MESSAGE + 1
                                     + len(own[name].encode_ordinary(text)))


@pytest.mark.slow
@pytest.mark.parametrize("name", [tokens.O200K, tokens.CL100K])
def test_the_roles_counted_as_one_token_are_one_token(real, name):
    _, own = real
    assert {role: len(own[name].encode_ordinary(role)) for role in tokens._ONE_TOKEN_ROLES} == dict.fromkeys(
        tokens._ONE_TOKEN_ROLES, 1)


@pytest.mark.slow
def test_tools_count_above_openais_own_estimate_of_them(real):
    _, own = real
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a given city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. San Francisco."},
            "unit": {"type": "string", "description": "The unit.", "enum": ["celsius", "fahrenheit"]}}}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    encoding = own[tokens.O200K]
    # OpenAI's cookbook, num_tokens_for_tools for gpt-4o (the functions' share)
    function = tools[0]["function"]
    estimate = 7 + len(encoding.encode(function["name"] + ":" + function["description"].rstrip("."))) + 3
    for key, spec in function["parameters"]["properties"].items():
        estimate += 3 + len(encoding.encode(f"{key}:{spec['type']}:{spec['description'].rstrip('.')}"))
        if "enum" in spec:
            estimate += -3 + sum(3 + len(encoding.encode(item)) for item in spec["enum"])
    estimate += 12
    counted, exact = tokens.count_input(tokens.O200K, messages, (tools,))
    assert exact and counted >= cookbook_count(encoding, messages) + estimate


@pytest.mark.slow
@pytest.mark.parametrize("name", [tokens.O200K, tokens.CL100K])
def test_an_english_prompts_reservation_is_its_real_count_within_a_few_percent(real, name):
    _, own = real
    real_count = cookbook_count(own[name], PROMPT)
    counted, exact = tokens.count_input(name, PROMPT)
    assert exact and real_count <= counted <= real_count * 1.03
    assert input_token_bound(PROMPT) > 4 * real_count  # what the byte bound reserved


@pytest.mark.slow
def test_a_small_budget_admits_the_call_its_exact_count_fits_and_the_bound_refused(real, hermes_home, monkeypatch):
    _, own = real
    real_count = cookbook_count(own[tokens.O200K], PROMPT)
    # a dollar per million tokens: the call's worst case is (input + 100) micro-dollars
    budget = (real_count + 100 + 40) / 1e6
    assert (input_token_bound(PROMPT) + 100) / 1e6 > 4 * budget
    configure(hermes_home, f"{{budget_usd: {{day: {budget}}}}}")
    transport = Scripted(input_tokens=real_count)
    assert PluginLlm("p", transport=transport).complete(PROMPT, max_tokens=100).text == "ok"
    [line] = audit_lines(hermes_home)
    assert line["status"] == "ok" and line["limits.input_count"] == "exact"
    assert real_count <= line["limits.reserved_input_tokens"] <= real_count + 20
    # the same call of a plugin with the same budget, counted by the byte bound (the tokenizer could not
    # load): refused before it is sent
    failed = tokens._Slot()
    failed.error = "test: not loaded"
    failed.ready.set()
    monkeypatch.setitem(tokens._slots, tokens.O200K, failed)
    with pytest.raises(PluginLlmQuotaError, match="budget_usd.day"):
        PluginLlm("q", transport=transport).complete(PROMPT, max_tokens=100)
    assert len(transport.requests) == 1
    assert audit_lines(hermes_home)[-1]["status"] == "quota"


@pytest.mark.slow
def test_an_image_makes_the_record_bound(real, hermes_home):
    configure(hermes_home, "{tokens_per_minute: 1000000}")
    messages = [PROMPT[0], {"role": "user", "content": [{"type": "text", "text": "what is this?"}, IMAGE]}]
    PluginLlm("p", transport=Scripted()).complete(messages, max_tokens=50)
    PluginLlm("p", transport=Scripted()).complete(PROMPT, max_tokens=50)
    first, second = audit_lines(hermes_home)
    assert first["limits.input_count"] == "bound" and second["limits.input_count"] == "exact"
    assert first["limits.reserved_input_tokens"] >= 2000  # the image's worst case


# ------------------------------------------------------------------------- offline, and only when needed
_OFFLINE = textwrap.dedent("""
    import json, socket, sys
    attempts = []
    def refuse(self, *args, **kwargs):
        attempts.append(repr(args)[:80])
        raise OSError("network access in a test that must stay offline")
    socket.socket.connect = socket.socket.connect_ex = refuse
    socket.create_connection = lambda *a, **k: refuse(None, *a)
    socket.getaddrinfo = lambda *a, **k: refuse(None, *a)

    from plugin_llm import PluginLlm, PluginLlmUsage
    from plugin_llm.limits import tokens
    from plugin_llm.transport import TransportResponse

    class Scripted:
        def complete(self, request):
            usage = PluginLlmUsage(input_tokens=10, output_tokens=1, total_tokens=11, cost_usd=None)
            return TransportResponse(text="ok", message={"role": "assistant", "content": "ok"}, model="m",
                                     usage=usage, attempts=1, provider_seconds=0.0)
        async def acomplete(self, request):
            return self.complete(request)
        def supports_json_schema(self, route):
            return True

    how = sys.argv[1]
    outcome = {}
    if how == "allowed":
        loaded = tokens.wait("o200k_base", 120) is not None
        text = PluginLlm("p", transport=Scripted()).complete([{"role": "user", "content": "hi"}], max_tokens=5).text
        outcome = {"loaded": loaded, "text": text}
    else:
        try:
            PluginLlm("p", transport=Scripted()).complete([{"role": "user", "content": "hi"}], model="gpt-4.1")
        except Exception as exc:
            outcome = {"error": type(exc).__name__}
    outcome.update(attempts=attempts, litellm="litellm" in sys.modules, tiktoken="tiktoken" in sys.modules)
    print(json.dumps(outcome))
""")


def _offline(hermes_home: Path, tmp_path: Path, how: str) -> dict:
    cache = tmp_path / "empty-tiktoken-cache"
    cache.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIKTOKEN_CACHE_DIR": str(cache), "HERMES_HOME": str(hermes_home)}
    done = subprocess.run([sys.executable, "-c", _OFFLINE, how], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(cache.iterdir()) == []  # tiktoken's cache was never written: nothing fetched
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_tokenizer_loads_offline_without_litellm(hermes_home, tmp_path):
    configure(hermes_home, "{tokens_per_minute: 100000}")
    outcome = _offline(hermes_home, tmp_path, "allowed")
    assert outcome == {"loaded": True, "text": "ok", "attempts": [], "litellm": False, "tiktoken": True}
    [line] = audit_lines(hermes_home)
    assert line["limits.input_count"] == "exact"


@pytest.mark.slow
def test_a_denied_call_of_a_limited_plugin_loads_neither_litellm_nor_tiktoken(hermes_home, tmp_path):
    configure(hermes_home, "{budget_usd: {day: 5}, tokens_per_minute: 100000}")
    outcome = _offline(hermes_home, tmp_path, "denied")  # a model override the plugin is not allowed
    assert outcome == {"error": "PluginLlmTrustError", "attempts": [], "litellm": False, "tiktoken": False}
    [line] = audit_lines(hermes_home)
    assert line["status"] == "denied"
