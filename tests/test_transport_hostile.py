"""Hardening: the transport and the credential path: hostile providers, tracebacks, redaction.

- no key in the locals of any frame of an exception a plugin gets, nor in anything chained to it;
- provider error text is redacted before it is cut, and a key cut off at the end is hidden;
- a reply that echoes the key (content, tool-call arguments, model) reaches the plugin without it;
- a field name followed by an ordinary word is not a secret;
- malformed replies are provider errors, absurd token counts are clamped and recorded;
- the sync deadline holds against a server that trickles its body, and the abandoned attempt ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from auth.redaction import redact, redact_clipped, redact_secrets, register_secret
from plugin_llm import PluginLlm, PluginLlmConfigError, PluginLlmError, PluginLlmProviderError, PluginLlmTimeoutError
from plugin_llm.cli.main import main
from plugin_llm.config import parse_config
from plugin_llm.credentials import key_source
from plugin_llm.routing import resolve_route
from plugin_llm.transport import MAX_TOKENS, LitellmTransport, TransportRequest
from tests.conftest import audit_lines, write_config
from tests.leaks import strings_reachable
from tests.paths import transport_path  # noqa: F401  (every test on both paths)
from tests.servers import FakeServer, Reply

USER = [{"role": "user", "content": "ping"}]
MODES = ["sync", "async"]


def canary() -> str:
    return f"cnry{secrets.token_hex(16)}"


def write_auth(home: Path, doc: dict) -> None:
    path = home / "auth.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    os.chmod(path, 0o600)


def use_key(home: Path, base_url: str, key: str, *, retries: int = 0, timeout: float = 10) -> None:
    write_auth(home, {"providers": {"custom": {"api_key": key}}})
    write_config(home, f"model:\n  provider: custom\n  model: gpt-4o\n  base_url: {base_url}\n"
                       f"llm:\n  max_retries: {retries}\n  timeout: {timeout}\n")


def header(request, name: str) -> str:
    return next((v for k, v in request.headers.items() if k.lower() == name), "")


def call(llm: PluginLlm, mode: str, **kw):
    """The result, or the PluginLlmError a plugin would catch (caught here: no test frame holds the key)."""
    try:
        if mode == "sync":
            return llm.complete(USER, **kw)
        return asyncio.run(llm.acomplete(USER, **kw))
    except PluginLlmError as exc:
        return exc


def chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and all(exc is not e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def traceback_texts(exc: BaseException) -> list[str]:
    """What error reporters print: the formatted chain with every frame's locals, and every reachable str."""
    texts = ["".join(traceback.TracebackException.from_exception(exc, capture_locals=True).format())]
    for error in chain(exc):
        texts += [str(error), repr(error), *strings_reachable(error)]
        tb = error.__traceback__
        while tb is not None:
            texts += list(strings_reachable(dict(tb.tb_frame.f_locals)))
            tb = tb.tb_next
    return texts


def assert_no_key(key: str, texts) -> None:
    leaks = [t for t in texts if key in t]
    assert not leaks, leaks[0][:300]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- traceback locals


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("failure", ["500", "401", "refused"])
def test_provider_errors_carry_no_key_in_frames_or_chain(hermes_home, mode, failure):
    key = canary()
    with FakeServer() as fake:
        url = fake.base_url if failure != "refused" else f"http://127.0.0.1:{free_port()}/v1"
        use_key(hermes_home, url, key)
        fake.push(Reply.error(int(failure) if failure != "refused" else 500, "nope"))
        error = call(PluginLlm("p"), mode)
        if failure != "refused":
            assert header(fake.requests[0], "authorization") == f"Bearer {key}"  # the key really was sent
    assert isinstance(error, PluginLlmProviderError)
    assert error.__traceback__ is not None
    assert_no_key(key, traceback_texts(error))


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_deadline_errors_carry_no_key_in_frames_or_chain(hermes_home, mode):
    key = canary()
    with FakeServer([Reply.hanging()]) as fake:
        use_key(hermes_home, fake.base_url, key)
        error = call(PluginLlm("p"), mode, timeout=0.5)
    assert isinstance(error, PluginLlmTimeoutError)
    assert_no_key(key, traceback_texts(error))


def test_failing_key_cmd_error_holds_none_of_its_output(hermes_home, tmp_path):
    key = canary()
    script = tmp_path / "two_lines.py"
    script.write_text(f"print({key[:8]!r} + {key[8:]!r})\nprint('and more')\n", encoding="utf-8")
    write_auth(hermes_home, {"providers": {"custom": {"key_cmd": [sys.executable, str(script)]}}})
    write_config(hermes_home, "model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:9/v1\n")
    error = call(PluginLlm("p"), "sync")
    assert isinstance(error, PluginLlmConfigError) and "printed more than one line" in str(error)
    assert_no_key(key, traceback_texts(error))


def test_failing_key_cmd_in_async_call_chains_nothing(hermes_home, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('cnry-not-shown')\nsys.exit(3)\n", encoding="utf-8")
    write_auth(hermes_home, {"providers": {"custom": {"key_cmd": [sys.executable, str(script)]}}})
    write_config(hermes_home, "model:\n  provider: custom\n  model: m\n  base_url: http://127.0.0.1:9/v1\n")
    error = call(PluginLlm("p"), "async")
    assert isinstance(error, PluginLlmConfigError) and "exited with status 3" in str(error)
    assert chain(error) == [error]  # no internal "needs a thread" exception in the report
    assert_no_key("cnry-not-shown", traceback_texts(error))


@pytest.mark.slow
def test_key_cmd_timeout_chains_nothing(tmp_path):
    from auth.keycmd import run_key_cmd

    script = tmp_path / "slow.py"
    script.write_text("import sys, time\nsys.stdout.write('cnrypartial'); sys.stdout.flush()\ntime.sleep(30)\n")
    try:
        run_key_cmd([sys.executable, str(script)], where="test", timeout=0.5)
    except PluginLlmConfigError as exc:
        error = exc
    assert "did not finish within 0.5 s" in str(error)
    assert error.__context__ is None and error.__cause__ is None  # TimeoutExpired carries the partial output


# --------------------------------------------------------------------------- redact, then truncate


def test_key_straddling_the_message_limit_is_hidden(hermes_home):
    key = canary()  # no well-known shape: only the transport's own knowledge can hide it
    with FakeServer() as fake:
        use_key(hermes_home, fake.base_url, key)
        fake.push(Reply.error(400, "Z" * 700))
        probe = call(PluginLlm("p"), "sync")
        kept = str(probe).count("Z")  # how much of the body fits after litellm's own prefix
        assert 100 < kept < 500
        fake.push(Reply.error(400, "Z" * (kept - len(key) // 2) + key))  # the key is cut in its middle
        error = call(PluginLlm("p"), "sync")
    assert isinstance(error, PluginLlmProviderError)
    half = key[: len(key) // 2 - 1]
    log = (hermes_home / "logs" / "agent.log").read_text(encoding="utf-8")
    for text in (str(error), log):
        assert half not in text and key[:8] not in text
    assert "[REDACTED" in str(error)[-20:]


def test_redact_clipped_redacts_before_cutting_and_hides_a_cut_off_key():
    key = canary()
    register_secret(key)
    text = "x" * 40 + key + " tail"
    out = redact_clipped(text, 50)
    assert key[:6] not in out and len(out) <= 50 + len("[REDACTED]")
    # already cut upstream: the text ends in the first characters of a known key
    assert redact_clipped("echo: " + key[:12], 500) == "echo: [REDACTED]"
    # a key handed in by the caller (not registered) is hidden whole and cut
    given = "QWxhZGRpbjpvcGVu"
    assert redact_clipped("body " + given[:9], 500, given) == "body [REDACTED]"
    assert redact_clipped("ends with abc", 500, given) == "ends with abc"  # too short a fragment to be one


# --------------------------------------------------------------------------- replies that echo the key


def echo_reply(_json, headers, _path):
    auth = next(v for k, v in headers.items() if k.lower() == "authorization")
    key = auth.split()[-1]
    body = {
        "id": "chatcmpl-echo", "object": "chat.completion", "created": 1, "model": f"m-{key}",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": f"your header was {auth}",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "lookup", "arguments": json.dumps({"token": key})}}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return 200, body


@pytest.mark.parametrize("mode", MODES)
def test_reply_echoing_the_key_reaches_the_plugin_without_it(hermes_home, mode):
    key = canary()
    with FakeServer([Reply(body=echo_reply)]) as fake:
        use_key(hermes_home, fake.base_url, key)
        result = call(PluginLlm("p"), mode)
        assert header(fake.requests[0], "authorization") == f"Bearer {key}"
    assert not isinstance(result, Exception)
    assert "your header was Bearer [REDACTED" in result.text and result.model.startswith("m-[REDACTED")
    texts = [repr(result), *strings_reachable(result), (hermes_home / "logs" / "agent.log").read_text(encoding="utf-8")]
    assert_no_key(key, texts)


def test_transport_hides_the_key_in_tool_call_arguments_and_model(hermes_home):
    key = canary()
    with FakeServer([Reply(body=echo_reply)]) as fake:
        use_key(hermes_home, fake.base_url, key)
        response = LitellmTransport().complete(transport_request(hermes_home))
    assert_no_key(key, [repr(response), json.dumps(response.message), *strings_reachable(response)])
    [tool_call] = response.message["tool_calls"]
    assert tool_call["function"]["name"] == "lookup"
    assert json.loads(tool_call["function"]["arguments"])["token"].startswith("[REDACTED")


def test_try_output_shows_no_echoed_key(hermes_home, capsys):
    key = canary()
    with FakeServer([Reply(body=echo_reply)]) as fake:
        use_key(hermes_home, fake.base_url, key)
        main(["try", "--as", "p", "--force", "--json", "hello"])
    out = capsys.readouterr()
    assert "your header was" in out.out and key not in out.out + out.err


def test_redact_secrets_hides_known_keys_but_not_shapes_in_model_text():
    registered, given = canary(), "ad-hoc-Key-0123"
    register_secret(registered)
    text = f"use api_key=sk-example0123456789abcd like this; mine: {registered} / {given}"
    out = redact_secrets(text, given)
    assert registered not in out and given not in out
    assert "api_key=sk-example0123456789abcd" in out  # a reply discussing keys stays readable


# --------------------------------------------------------------------------- words after field names


@pytest.mark.parametrize(
    "text",
    [
        "/h/auth.json: providers.openai.api_key: must be a string, not a number",
        "providers.openai.password: is empty",
        "Authorization: missing header",
        "x-api-key: required for this endpoint",
        'must be an object like {"api_key": "..."}',
    ],
)
def test_field_name_then_ordinary_word_is_left_alone(text):
    assert redact(text) == text


@pytest.mark.parametrize(
    "text, hidden",
    [
        ("x-api-key: zz0123456789abcdef", "zz0123456789abcdef"),
        ("api_key: AbCdEfGhIjKlMnOpQr", "AbCdEfGhIjKlMnOpQr"),
        ('{"password": "hunter2"}', "hunter2"),
        ("secret_key=Something", "Something"),
        ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    ],
)
def test_key_shaped_quoted_or_assigned_values_are_still_hidden(text, hidden):
    assert hidden not in redact(text)


def test_bad_auth_json_error_reads_as_written(hermes_home, capsys):
    write_auth(hermes_home, {"providers": {"openai": {"api_key": 123}}})
    assert main(["auth", "list"]) != 0
    assert "providers.openai.api_key: must be a string, not a number" in capsys.readouterr().err


# --------------------------------------------------------------------------- malformed replies, usage


def completion(**over) -> dict:
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    body.update(over)
    return body


def with_message(**message) -> dict:
    return completion(choices=[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **message}}])


MALFORMED = {
    "empty choices": (completion(choices=[]), "no choices"),
    "no choices": ({k: v for k, v in completion().items() if k != "choices"}, "no choices"),
    "choices not a list": (completion(choices={"0": 1}), "not a list"),
    "null message": (completion(choices=[{"index": 0, "message": None}]), "malformed"),
    "content is a number": (with_message(content=5), "malformed"),
    "tool_calls not a list": (with_message(content=None, tool_calls={"a": 1}), "malformed"),
    "tool call without function": (with_message(content=None, tool_calls=[{"id": "x", "type": "function"}]), "malformed"),
    "not JSON": (b'{"choices": [', "not valid JSON"),
    "a JSON list": ([1, 2], "malformed"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_reply_is_a_final_provider_error(hermes_home, name):
    body, words = MALFORMED[name]
    reply = Reply(body=body, headers={"Content-Type": "application/json"}) if isinstance(body, bytes) else Reply(body=body)
    with FakeServer([reply], default=Reply(content="a retry would get this")) as fake:
        use_key(hermes_home, fake.base_url, canary(), retries=2)
        error = call(PluginLlm("p"), "sync")
        assert len(fake.requests) == 1  # not retried
    assert type(error) is PluginLlmProviderError, error
    assert "custom sent a malformed reply (model gpt-4o)" in str(error) and words in str(error)
    assert error.status is None and error.retryable is False
    assert "Traceback" not in str(error) and len(str(error)) < 200
    assert audit_lines(hermes_home)[-1]["status"] == "provider_error"


@pytest.mark.parametrize("mode", MODES)
def test_empty_choices_is_a_provider_error_sync_and_async(hermes_home, mode):
    with FakeServer([Reply(body=completion(choices=[]))]) as fake:
        use_key(hermes_home, fake.base_url, canary())
        error = call(PluginLlm("p"), mode)
    assert isinstance(error, PluginLlmProviderError) and "malformed reply" in str(error) and "no choices" in str(error)


def transport_request(home: Path, timeout: float = 10) -> TransportRequest:
    route = resolve_route(parse_config(home, (home / "config.yaml").read_text(encoding="utf-8")))
    return TransportRequest(route=route, messages=USER, keys=key_source(home, route.provider, route.profile),
                            deadline=time.monotonic() + timeout)


def test_absurd_token_counts_are_clamped_and_recorded(hermes_home):
    usage = {"prompt_tokens": int("9" * 401), "completion_tokens": -5, "total_tokens": 10**30}
    with FakeServer([Reply(usage=usage)]) as fake:
        use_key(hermes_home, fake.base_url, canary())
        response = LitellmTransport().complete(transport_request(hermes_home))
    assert response.text == "ok"
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == \
        (MAX_TOKENS, 0, MAX_TOKENS)
    assert any("prompt_tokens was out of range" in a for a in response.anomalies)
    assert any("completion_tokens was negative" in a for a in response.anomalies)
    assert all(len(a) < 120 for a in response.anomalies)  # never the 401 digits


def test_wellformed_reply_has_no_anomalies(hermes_home):
    with FakeServer([Reply(content="fine")]) as fake:
        use_key(hermes_home, fake.base_url, canary())
        response = LitellmTransport().complete(transport_request(hermes_home))
    assert response.text == "fine" and response.anomalies == () and response.usage.total_tokens == 10


# --------------------------------------------------------------------------- the sync deadline


class TrickleServer:
    """Answers every request with a 200 and a large Content-Length, then one byte every 0.2 s."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.base_url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.stop = threading.Event()
        self.client_gone = threading.Event()  # the client closed a connection it was being trickled on
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            while not self.stop.wait(0.2):
                conn.sendall(b" ")
        except OSError:
            if not self.stop.is_set():
                self.client_gone.set()
        finally:
            conn.close()

    def __enter__(self) -> "TrickleServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.listener.close()
        for conn in self.conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def on_worker_thread(monkeypatch):
    """Run sync attempts to every network provider on a worker thread (as for providers not known to use only httpx)."""
    from plugin_llm.transport import _deadline

    monkeypatch.setattr(_deadline, "INLINE_PROVIDERS", frozenset({"local"}))


@pytest.mark.parametrize("transport_path, mode", [
    ("fast", "sync"), ("fast", "async"), ("fallback", "sync"), ("fallback", "sync-worker"), ("fallback", "async"),
], indirect=["transport_path"])
@pytest.mark.slow
def test_deadline_holds_against_a_trickling_body(hermes_home, transport_path, mode, request):
    if mode == "sync-worker":
        request.getfixturevalue("on_worker_thread")
    LitellmTransport().ready()  # litellm's import is not part of the call
    outcome: list = []
    with TrickleServer() as server:
        use_key(hermes_home, server.base_url, canary())
        how = "async" if mode == "async" else "sync"
        worker = threading.Thread(target=lambda: outcome.append(call(PluginLlm("p"), how, timeout=1)), daemon=True)
        worker.start()
        worker.join(timeout=8)  # a hang guard far above the 1 s deadline
        returned = not worker.is_alive()
        # the attempt does not go on reading for ever (abandoned or not): the connection is dropped
        gone = server.client_gone.wait(timeout=8)
    assert returned, "complete(timeout=1) was still running after 8 s"
    assert isinstance(outcome[0], PluginLlmTimeoutError)
    assert gone, "the trickled connection was still open 8 s after the deadline"
    assert audit_lines(hermes_home)[-1]["status"] == "timeout"


@pytest.mark.slow
@pytest.mark.parametrize("transport_path", ["fallback"], indirect=True)  # the fast path never leaves the thread
def test_a_late_answer_is_discarded(hermes_home, on_worker_thread):
    with FakeServer([Reply(content="too late", delay=1.5), Reply(content="in time")]) as fake:
        use_key(hermes_home, fake.base_url, canary())
        llm = PluginLlm("p")
        assert isinstance(call(llm, "sync", timeout=1), PluginLlmTimeoutError)
        assert llm.complete(USER).text == "in time"


@pytest.mark.parametrize("transport_path", ["fallback"], indirect=True)
@pytest.mark.parametrize("failure", ["500", "refused"])
def test_worker_thread_errors_carry_no_key_either(hermes_home, on_worker_thread, failure):
    key = canary()
    with FakeServer([Reply.error(500, "nope")]) as fake:
        use_key(hermes_home, fake.base_url if failure == "500" else f"http://127.0.0.1:{free_port()}/v1", key)
        error = call(PluginLlm("p"), "sync")
    assert isinstance(error, PluginLlmProviderError)
    assert_no_key(key, traceback_texts(error))


def test_local_provider_answers_inline_without_a_thread_hop(hermes_home, monkeypatch):
    from plugin_llm.transport import _deadline

    def no_hop(job):
        raise AssertionError("the in-process local model was handed to a worker thread")

    monkeypatch.setattr(_deadline.WORKERS, "run", no_hop)
    result = PluginLlm("p").complete([{"role": "user", "content": "Summarise: the cat sat."}])
    assert "the cat sat." in result.text and result.provider == "local"


def test_an_attempt_that_waited_past_its_deadline_is_not_started():
    from plugin_llm.transport import _deadline, _keys

    class NoKey:
        source = "none"

        def reveal(self):
            return None

    started: list = []
    job = _deadline.Job(lambda **kw: started.append(kw), {}, _keys.Key(NoKey(), None), time.monotonic() - 1)
    job.run()
    assert started == [] and isinstance(job.failure, TimeoutError) and job.response is None


def test_prose_ending_in_a_word_a_registered_key_starts_with_is_not_redacted(transport_path):
    register_secret("gateway-key-from-env-0001")
    assert redact_clipped("custom refused the call (HTTP 502): Bad gateway", 500) == \
        "custom refused the call (HTTP 502): Bad gateway"
    # cut here, a key straddling the limit is still hidden down to MIN_FRAGMENT_LENGTH characters
    filler = ("lorem ipsum dolor " * 30)[:496]  # prose: no earlier test registers words as secrets
    clipped = redact_clipped(filler + "gateway-key-from-env-0001", 500)
    assert clipped.startswith(filler) and "gate" not in clipped[len(filler):]
    # arrived cut (a provider truncated an echoed key): a tail of 8+ characters is hidden
    assert redact_clipped("echo: gateway-ke", 500) == "echo: [REDACTED]"


# --------------------------------------------------------------------------- URL userinfo in base_url


def _drain(llm: PluginLlm, mode: str):
    """The call's text, or the PluginLlmError a plugin would catch."""
    try:
        if mode == "sync":
            return llm.complete(USER).text
        if mode == "async":
            return asyncio.run(llm.acomplete(USER)).text
        return "".join(str(piece) for piece in llm.stream(USER))
    except PluginLlmError as exc:
        return exc


@pytest.mark.parametrize("mode", ["sync", "async", "stream"])
@pytest.mark.parametrize("failure", ["refused", "500"])
def test_a_base_url_password_appears_nowhere(hermes_home, mode, failure, caplog):
    password = canary()
    with FakeServer() as fake:
        server = fake.base_url if failure != "refused" else f"http://127.0.0.1:{free_port()}/v1"
        url = server.replace("http://", f"http://alice:{password}@")
        use_key(hermes_home, url, canary())
        fake.push(Reply.error(500, "nope"))
        with caplog.at_level("DEBUG"):
            llm = PluginLlm("p")
            error = _drain(llm, mode)
    config = parse_config(hermes_home, (hermes_home / "config.yaml").read_text(encoding="utf-8"))
    assert isinstance(error, PluginLlmError), error
    texts = [str(error), repr(error),
             "".join(traceback.TracebackException.from_exception(error, capture_locals=True).format()),
             repr(resolve_route(config)), repr(config), caplog.text]
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in hermes_home.rglob("*")
              if p.is_file() and p.name != "config.yaml"]
    assert_no_key(password, texts)
    assert audit_lines(hermes_home)[-1]["status"] == "provider_error"  # the call was audited
    if failure == "refused" and "cannot reach" in str(error):
        assert "http://[REDACTED]@127.0.0.1" in str(error)  # the endpoint is still named, without its userinfo


def test_a_base_url_password_is_hidden_even_without_its_url(hermes_home):
    """A provider echoing the password alone (reply text only passes redact_secrets, no shapes)."""
    password = canary()
    parse_config(hermes_home, f"model:\n  provider: custom\n  model: m\n  base_url: https://alice:{password}@gw.example/v1\n")
    assert password not in redact_secrets(f"your password is {password}")
    assert password[:-4] not in redact_clipped(f"cut: {password[:-4]}", 200)
