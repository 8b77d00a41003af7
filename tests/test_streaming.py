"""``PluginLlm.stream`` / ``astream``: real SSE from a real server on 127.0.0.1, on both transport paths.

Every test runs on the fast path and on the litellm fallback (tests/paths.py);
the server records the User-Agent, so each test also checks which path sent it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import secrets

import pytest

from plugin_llm import (
    PluginLlm,
    PluginLlmProviderError,
    PluginLlmQuotaError,
    PluginLlmTimeoutError,
    PluginLlmTrustError,
)
from plugin_llm import limits
from plugin_llm.streaming import PluginLlmAsyncStream, PluginLlmStream
from plugin_llm.transport._stream import SseError, SseParser, StreamRedactor
from tests.bounded import run_bounded
from tests.conftest import audit_lines, write_config
from tests.leaks import strings_reachable
from tests.paths import transport_path  # noqa: F401 - every test on both paths
from tests.stream_server import Stream, StreamServer, wait_for

USER = [{"role": "user", "content": "tell me"}]


@pytest.fixture(autouse=True)
def _fresh_stores():
    yield
    limits.close_stores()


@pytest.fixture
def server(custom_route):
    with StreamServer() as fake:
        custom_route(fake.base_url)
        yield fake


def sent_by(server: StreamServer, path: str) -> None:
    """Every request came from the path under test (the fast path's own client, or the openai SDK)."""
    agents = [headers.get("user-agent", "") for headers, _ in server.requests]
    want = ("plugin-llm-gateway",) if path == "fast" else ("OpenAI/Python", "AsyncOpenAI/Python")
    assert agents and all(agent.startswith(want) for agent in agents), agents


def in_order(deltas: list[str], pieces: list[str]) -> bool:
    """The deltas are the pieces in order, perhaps cut elsewhere: a delta that ends in what may be the
    start of a secret (any registered one, other tests register many) holds those characters back for the next."""
    return "".join(deltas) == "".join(pieces) and all(deltas) and len(deltas) >= len(pieces) - 1


def astream_all(stream: PluginLlmAsyncStream) -> list[str]:
    async def run() -> list[str]:
        return [delta async for delta in stream]
    return asyncio.run(run())


# ----------------------------------------------------------------------------- the happy path
@pytest.mark.slow
def test_deltas_arrive_in_order_and_the_result_matches_the_one_audit_line(server, hermes_home, transport_path):
    server.default = Stream(pieces=["Quick", " brown", " fox"])
    stream = PluginLlm("writer").stream(USER, purpose="draft", max_tokens=50)
    assert isinstance(stream, PluginLlmStream) and stream.result is None
    deltas = list(stream)
    assert in_order(deltas, ["Quick", " brown", " fox"])
    result = stream.result
    assert result.text == "Quick brown fox" == stream.text
    assert (result.usage.input_tokens, result.usage.output_tokens) == (9, 3) and not result.usage.estimated
    assert result.usage.cost_usd and result.usage.cost_usd > 0  # gpt-4o is in litellm's price map
    [line] = audit_lines(hermes_home)
    assert line["call_id"] == result.audit["call_id"] == stream.call_id
    assert line["status"] == "ok" and line["stream"] is True and line["stream.partial"] is False
    assert line["stream.delivered_chars"] == len("Quick brown fox") and line["purpose"] == "draft"
    assert line["gen_ai.usage.input_tokens"] == 9 and line["gen_ai.usage.output_tokens"] == 3
    assert line["cost_usd"] == pytest.approx(result.usage.cost_usd) and line["mode"] == "sync"
    _, body = server.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 50
    sent_by(server, transport_path)


def test_astream_gives_the_same_deltas_and_record(server, hermes_home, transport_path):
    server.default = Stream(pieces=["Lazy", " dog"])
    stream = PluginLlm("writer").astream(USER)
    assert in_order(astream_all(stream), ["Lazy", " dog"])
    assert stream.result.text == "Lazy dog"
    [line] = audit_lines(hermes_home)
    assert line["mode"] == "async" and line["status"] == "ok" and line["call_id"] == stream.result.audit["call_id"]
    sent_by(server, transport_path)


def test_await_astream_opens_it_and_async_with_closes_it(server, hermes_home):
    server.default = Stream(pieces=["one", " two", " three"])

    async def run():
        llm = PluginLlm("writer")
        opened = await llm.astream(USER)
        whole = [d async for d in opened]
        async with llm.astream(USER) as early:
            first = await early.__anext__()
        return whole, first, early

    whole, first, early = asyncio.run(run())
    assert in_order(whole, ["one", " two", " three"]) and "one".startswith(first)
    assert early.finished and early.result is None
    assert [line["status"] for line in audit_lines(hermes_home)] == ["ok", "abandoned"]


def test_usage_is_estimated_when_the_provider_sends_none(server, hermes_home, transport_path):
    server.default = Stream(pieces=["no", " usage", " here"], usage=None)
    stream = PluginLlm("writer").stream(USER)
    assert "".join(stream) == "no usage here"
    usage = stream.result.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    # the fallback's stream wrapper (litellm) fills in its own count, unmarked; the fast path marks its estimate
    assert usage.estimated is (transport_path == "fast")
    [line] = audit_lines(hermes_home)
    assert line["gen_ai.usage.output_tokens"] == usage.output_tokens


@pytest.mark.slow
def test_a_retryable_status_before_the_first_delta_is_retried(server, hermes_home):
    server._script.extend([Stream(status=503, message="busy"), Stream(pieces=["second", " try"])])
    stream = PluginLlm("writer").stream(USER)
    assert "".join(stream) == "second try"
    [line] = audit_lines(hermes_home)
    assert line["attempts"] == 2 and line["status"] == "ok"


def test_the_local_model_streams_in_process(hermes_home):
    llm = PluginLlm("writer")  # no config: the embedded local model
    messages = [{"role": "user", "content": "stream this sentence of several words please, in pieces"}]
    stream = llm.stream(messages)
    deltas = list(stream)
    assert len(deltas) > 2
    assert "".join(deltas) == llm.complete(messages).text == stream.result.text
    lines = audit_lines(hermes_home)
    assert [line["status"] for line in lines] == ["ok", "ok"] and lines[0]["stream"] is True
    assert lines[0]["gen_ai.usage.output_tokens"] == lines[1]["gen_ai.usage.output_tokens"] > 0


# ----------------------------------------------------------------------------- abandoned streams
@pytest.mark.parametrize("how", ["close", "with", "gc"])
def test_an_abandoned_stream_gets_exactly_one_record(server, hermes_home, how):
    server.default = Stream(pieces=["alpha", " beta", " gamma", " delta"])
    llm = PluginLlm("writer")
    if how == "close":
        stream = llm.stream(USER)
        first = next(stream)
        stream.close()
        stream.close()  # idempotent
        assert list(stream) == []
    elif how == "with":
        with llm.stream(USER) as stream:
            for first in stream:
                break
    else:
        stream = llm.stream(USER)
        first = next(stream)
        del stream
        gc.collect()
    assert wait_for(lambda: len(audit_lines(hermes_home)) >= 1)
    [line] = audit_lines(hermes_home)
    assert line["status"] == "abandoned" and line["stream.partial"] is True
    assert "alpha".startswith(first) and line["stream.delivered_chars"] == len(first) and line["attempts"] == 1


@pytest.mark.slow
def test_aclose_and_a_cancelled_consumer_are_abandoned(server, hermes_home):
    server.default = Stream(pieces=["first", " second"], stall_after=1)

    async def run():
        llm = PluginLlm("writer")
        stream = await llm.astream(USER)
        firsts = [await stream.__anext__()]
        await stream.aclose()
        stalled = await llm.astream(USER, timeout=30)
        firsts.append(await stalled.__anext__())
        task = asyncio.ensure_future(stalled.__anext__())  # waits on the stalled provider
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return firsts

    firsts = run_bounded(lambda: asyncio.run(run()), 60)
    lines = audit_lines(hermes_home)
    assert [line["status"] for line in lines] == ["abandoned", "abandoned"]
    assert [line["stream.delivered_chars"] for line in lines] == [len(first) for first in firsts]


# ----------------------------------------------------------------------------- failures
def test_a_provider_failing_mid_stream_is_one_record_and_a_clear_error(server, hermes_home, transport_path):
    server.default = Stream(pieces=["partial", " answer", " never"], cut_after=2)
    stream = PluginLlm("writer").stream(USER, timeout=20)
    got = []
    with pytest.raises((PluginLlmProviderError, PluginLlmTimeoutError)) as caught:
        for delta in stream:
            got.append(delta)
    assert "partial answer".startswith("".join(got)) and len("".join(got)) >= len("partial")
    assert f"after {len(''.join(got))} characters had been delivered" in str(caught.value)
    assert stream.finished and stream.result is None
    [line] = audit_lines(hermes_home)
    assert line["status"] in ("provider_error", "timeout") and line["stream.partial"] is True
    assert line["stream.delivered_chars"] == len("".join(got)) and line["error.type"] == type(caught.value).__name__
    assert len(server.requests) == 1 and line["attempts"] == 1  # no retry once a delta was delivered
    sent_by(server, transport_path)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stall", "trickle"])
def test_the_deadline_holds_for_a_stalled_or_trickling_provider(server, hermes_home, fault, transport_path):
    server.default = Stream(pieces=["slow", " never"], stall_after=1 if fault == "stall" else None,
                            trickle=fault == "trickle")

    got: list[str] = []

    def consume():
        for delta in PluginLlm("writer").stream(USER, timeout=1.5):
            got.append(delta)

    with pytest.raises(PluginLlmTimeoutError) as caught:
        run_bounded(consume, 30)
    assert "deadline" in str(caught.value) or "in time" in str(caught.value)
    [line] = audit_lines(hermes_home)
    assert line["status"] == "timeout" and line["stream.delivered_chars"] == len("".join(got)) <= 4
    sent_by(server, transport_path)


@pytest.mark.slow
def test_the_deadline_holds_for_astream_too(server, hermes_home):
    server.default = Stream(pieces=["slow", " never"], trickle=True)

    def consume():
        return astream_all(PluginLlm("writer").astream(USER, timeout=1.5))

    with pytest.raises(PluginLlmTimeoutError):
        run_bounded(consume, 30)
    [line] = audit_lines(hermes_home)
    assert line["status"] == "timeout" and line["mode"] == "async"


@pytest.mark.parametrize("transport_path", ["fast"], indirect=True)  # the fallback reads SSE with the openai SDK
@pytest.mark.parametrize("raw, problem", [
    (b"data: {not json\n\n", "event 1 is not JSON"),
    (b"data: " + b"x" * (1024 * 1024 + 10) + b"\n\n", "an event line is over 1,048,576 bytes"),
    (b"hello: world\n\n", "a line is not server-sent events"),
    (b'data: {"error": {"message": "model overloaded"}}\n\n', "error event in the stream"),
    (b"data: [1, 2]\n\n", "is a JSON list, not an object"),
])
def test_a_malformed_stream_is_a_provider_error_on_record(server, hermes_home, raw, problem, transport_path):
    server.default = Stream(raw=raw)
    with pytest.raises(PluginLlmProviderError) as caught:
        list(PluginLlm("writer").stream(USER))
    assert problem in str(caught.value)
    [line] = audit_lines(hermes_home)
    assert line["status"] == "provider_error" and line["stream.delivered_chars"] == 0


def test_a_stream_of_garbage_is_a_provider_error_on_both_paths(server, hermes_home, transport_path):
    server.default = Stream(raw=b"data: {not json\n\n")
    with pytest.raises(PluginLlmProviderError):
        list(PluginLlm("writer").stream(USER))
    [line] = audit_lines(hermes_home)
    assert line["status"] == "provider_error"


# ----------------------------------------------------------------------------- refused before anything is sent
def test_a_trust_denial_raises_before_anything_is_sent(server, hermes_home):
    with pytest.raises(PluginLlmTrustError) as caught:
        PluginLlm("writer").stream(USER, model="gpt-4o-mini")
    assert "allow_model_override" in str(caught.value)
    assert server.requests == []
    [line] = audit_lines(hermes_home)
    assert line["status"] == "denied"


def test_a_quota_denial_raises_before_anything_is_sent(hermes_home):
    with StreamServer() as fake:
        write_config(hermes_home, (
            f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
            "limits:\n  store: local\n"
            "plugins:\n  entries:\n    writer:\n      limits:\n        requests_per_minute: 1\n"))
        llm = PluginLlm("writer")
        assert "".join(llm.stream(USER)) == "Hello, world"
        with pytest.raises(PluginLlmQuotaError):
            llm.stream(USER)
        assert len(fake.requests) == 1
    assert [line["status"] for line in audit_lines(hermes_home)] == ["ok", "quota"]


def test_an_abandoned_stream_frees_its_slot(hermes_home):
    with StreamServer(default=Stream(pieces=["a1", " b2", " c3"])) as fake:
        write_config(hermes_home, (
            f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
            "limits:\n  store: local\n"
            "plugins:\n  entries:\n    writer:\n      limits:\n        max_concurrent: 1\n"))
        llm = PluginLlm("writer")
        for _ in range(3):  # with max_concurrent 1, a leaked reservation would refuse the next stream
            with llm.stream(USER) as stream:
                next(stream)
    assert [line["status"] for line in audit_lines(hermes_home)] == ["abandoned"] * 3


@pytest.mark.slow
def test_close_from_another_thread_ends_the_stream_once_whatever_the_reader_is_doing(hermes_home):
    """A "stop" button on another thread: close() may come while the reader's thread runs the
    pipeline. It waits for the pipeline's next step and closes it there: no error for either
    thread, one record per stream, and (max_concurrent 1) the slot is free for the next stream."""
    import random
    import sys
    import threading

    with StreamServer(default=Stream(pieces=["x"] * 2000)) as fake:
        write_config(hermes_home, (
            f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {fake.base_url}\n"
            "plugins:\n  entries:\n    writer:\n      limits:\n        max_concurrent: 1\n"))
        llm = PluginLlm("writer")
        rng = random.Random(7)
        errors: list[str] = []
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)  # switch threads often: the close lands inside the pipeline's code
        try:
            for _ in range(25):
                stream = llm.stream(USER, max_tokens=4000)
                delay = rng.random() * 0.01

                def stop(stream=stream, delay=delay) -> None:
                    threading.Event().wait(delay)
                    try:
                        stream.close()
                    except Exception as exc:  # noqa: BLE001 - what the test looks for
                        errors.append(f"close: {type(exc).__name__}: {exc}")

                closer = threading.Thread(target=stop)
                closer.start()
                try:
                    for _delta in stream:
                        pass
                except Exception as exc:  # noqa: BLE001 - what the test looks for
                    errors.append(f"reader: {type(exc).__name__}: {exc}")
                closer.join(10)
                assert stream.finished
        finally:
            sys.setswitchinterval(interval)
    assert errors == []
    records = audit_lines(hermes_home)
    assert len(records) == 25 and len({r["call_id"] for r in records}) == 25
    assert {r["status"] for r in records} <= {"abandoned", "ok"}


def test_tools_are_refused_for_streams(server):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(ValueError, match="complete\\(..., tools="):
        PluginLlm("writer").stream(USER, tools=[tool])
    assert server.requests == []


# ----------------------------------------------------------------------------- the key
def write_auth(home, doc: dict) -> None:
    path = home / "auth.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    os.chmod(path, 0o600)


def test_a_key_straddling_two_chunks_never_reaches_the_plugin(server, hermes_home, transport_path):
    key = f"cnry{secrets.token_hex(16)}"
    write_auth(hermes_home, {"providers": {"custom": {"api_key": key}}})
    cut = len(key) // 2
    server.default = Stream(pieces=["your header was ", key[:cut], key[cut:] + " (echoed)", " and ", key[:12]])
    stream = PluginLlm("writer").stream(USER)
    deltas = list(stream)
    text = "".join(deltas)
    assert text.startswith("your header was [REDACTED") and text.endswith(" (echoed) and [REDACTED]")
    for delta in deltas:
        assert key[:8] not in delta and key[cut:] not in delta
    log = (hermes_home / "logs" / "agent.log").read_text(encoding="utf-8")
    for haystack in (text, log, repr(stream), *strings_reachable(stream.result)):
        assert key not in haystack and key[:12] not in haystack
    sent_by(server, transport_path)


def test_stream_redactor_holds_back_only_a_possible_key_start():
    from plugin_llm.transport._keys import Key

    key = f"\u03b6{secrets.token_hex(16)}"  # starts with a letter no other test's secret starts with

    class Cred:
        source = "auth.json"

        @staticmethod
        def reveal():
            return key

    redactor = StreamRedactor(Key(Cred(), None))
    assert redactor.push("\u03c9\u03c9 ") == "\u03c9\u03c9 "
    assert redactor.push("\u03c9\u03b6") == "\u03c9"  # the zeta may be the key's first character
    assert redactor.push("\u03c9") == "\u03b6\u03c9"  # it was not
    assert redactor.push(" " + key[:5]) == " "
    assert redactor.push(key[5:] + " \u03c9").startswith("[REDACTED")
    assert redactor.push(key[:9]) == "" and redactor.flush() == "[REDACTED]"


def test_sse_parser_is_bounded():
    parser = SseParser(max_events=3)
    events = parser.feed(b"data: a\n\n: comment\nevent: error\ndata: b\r\n\r\ndata: c")
    assert events == [("message", "a"), ("error", "b")] and parser.end() == [("message", "c")]
    with pytest.raises(SseError, match="more than 3 events"):
        parser.feed(b"data: d\n\n")
    with pytest.raises(SseError, match="line is over"):
        SseParser(max_line=10).feed(b"data: 0123456789")
    with pytest.raises(SseError, match="over 20 bytes"):
        SseParser(max_bytes=20).feed(b"data: 0123456789abcdefgh")


@pytest.mark.parametrize("transport_path", ["fast"], indirect=True)
def test_an_error_event_echoing_the_key_does_not_show_it(server, hermes_home, transport_path):
    key = f"cnry{secrets.token_hex(16)}"
    write_auth(hermes_home, {"providers": {"custom": {"api_key": key}}})
    server.default = Stream(raw=b'data: {"error": {"message": "bad key ' + key.encode() + b'"}}\n\n')
    with pytest.raises(PluginLlmProviderError) as caught:
        list(PluginLlm("writer").stream(USER))
    assert "bad key [REDACTED" in str(caught.value) and key not in str(caught.value)
    assert key not in (hermes_home / "logs" / "agent.log").read_text(encoding="utf-8")


def test_a_plugin_streams_through_ctx_llm(tmp_path, transport_path):
    from plugin_llm.testing import load_plugin

    plugin = tmp_path / "streamer"
    plugin.mkdir()
    (plugin / "plugin.yaml").write_text("name: streamer\nversion: 0.1.0\n", encoding="utf-8")
    (plugin / "__init__.py").write_text(
        "def register(ctx):\n"
        "    def run(raw_args):\n"
        "        with ctx.llm.stream([{'role': 'user', 'content': raw_args}], purpose='live') as stream:\n"
        "            deltas = list(stream)\n"
        "        return f'{len(deltas)}|' + '|'.join(deltas) + f'|{stream.result.audit[\"call_id\"]}'\n"
        "    ctx.register_command('live', run)\n", encoding="utf-8")
    with load_plugin(plugin, replies=["one two three four five six seven eight nine"]) as harness:
        count, *deltas, call_id = harness.run_command("live", "go").split("|")
        [call] = harness.calls()
    assert int(count) == len(deltas) >= 2 and "".join(deltas) == "one two three four five six seven eight nine"
    assert call["call_id"] == call_id and call["plugin_id"] == "streamer" and call["stream"] is True
