"""The local model over real HTTP on 127.0.0.1, and the FakeServer test helper."""

from __future__ import annotations

import json
import os
import threading

import httpx
import jsonschema
import pytest

from plugin_llm.local.model import LOCAL_MODEL, generate
from plugin_llm.local.server import LocalModelServer
from tests.servers import FakeServer, Reply

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before any litellm import: no network

INVOICE_SCHEMA = {
    "type": "object",
    "properties": {"vendor": {"type": "string"}, "total": {"type": "number"},
                   "due_date": {"type": "string", "format": "date"}},
    "required": ["vendor", "total", "due_date"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Vendor: ACME\nTotal: 12.50\nDue date: 2024-01-02"}]


@pytest.fixture(scope="module")
def server():
    with LocalModelServer() as srv:
        yield srv


def sse_events(text: str) -> list:
    assert text.endswith("data: [DONE]\n\n")
    blocks = [b for b in text.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks)
    return [json.loads(b[len("data: "):]) for b in blocks[:-1]]


# ---------------------------------------------------------------- LocalModelServer


def test_base_url_and_port(server):
    assert server.port > 0
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"


def test_chat_completion_round_trip_matches_generate(server):
    r = httpx.post(server.base_url + "/chat/completions", headers={"Authorization": "Bearer whatever"},
                   json={"model": "anything", "messages": MESSAGES, "temperature": 0.3})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == generate(MESSAGES)
    assert r.json()["model"] == LOCAL_MODEL


def test_alias_path_without_v1_and_json_schema(server):
    rf = {"type": "json_schema", "json_schema": {"name": "invoice", "schema": INVOICE_SCHEMA}}
    r = httpx.post(f"http://127.0.0.1:{server.port}/chat/completions",
                   json={"model": "local", "messages": MESSAGES, "response_format": rf})
    assert r.status_code == 200
    value = json.loads(r.json()["choices"][0]["message"]["content"])
    assert value == {"vendor": "ACME", "total": 12.5, "due_date": "2024-01-02"}


def test_streaming_sends_sse_chunks_with_a_final_usage_chunk(server):
    body = {"model": "local", "messages": [{"role": "user", "content": "one two three four five six seven"}],
            "stream": True}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    events = sse_events(text)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]]
    assert len([d for d in deltas if d]) > 1
    expected = generate(body["messages"])
    assert "".join(deltas) == expected["choices"][0]["message"]["content"]
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
    assert finishes[-1] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"] == expected["usage"]


def test_streaming_tool_calls(server):
    tools = [{"type": "function", "function": {"name": "hello_world", "parameters": {"type": "object"}}}]
    body = {"messages": [{"role": "user", "content": "use the hello_world tool with name=Ada"}], "tools": tools,
            "stream": True}
    events = sse_events(httpx.post(server.base_url + "/chat/completions", json=body).text)
    calls = [c for e in events if e["choices"] for c in e["choices"][0]["delta"].get("tool_calls", [])]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("hello_world", {"name": "Ada"})]
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "tool_calls"


@pytest.mark.parametrize("payload", [b"{not json", b"[1, 2]", b'{"messages": "hi"}'])
def test_bad_request_body_is_a_400_with_an_openai_error(server, payload):
    r = httpx.post(server.base_url + "/chat/completions", content=payload,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


def test_unknown_path_is_404_and_wrong_method_405(server):
    r = httpx.post(server.base_url + "/completions", json={"prompt": "x"})
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(server.base_url + "/nope").status_code == 404
    assert httpx.get(server.base_url + "/chat/completions").status_code == 405


def test_models_and_health(server):
    models = httpx.get(server.base_url + "/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [LOCAL_MODEL]
    assert httpx.get(f"{server.base_url}/models/{LOCAL_MODEL}").json()["id"] == LOCAL_MODEL
    assert httpx.get(f"http://127.0.0.1:{server.port}/health").json()["status"] == "ok"


def test_keep_alive_reuses_one_connection(server):
    peers = []
    with httpx.Client(base_url=server.base_url) as client:
        for text in ("first", "second"):
            with client.stream("POST", "/chat/completions",
                               json={"messages": [{"role": "user", "content": text}]}) as r:
                peers.append(r.extensions["network_stream"].get_extra_info("client_addr"))
                assert text in json.loads(r.read())["choices"][0]["message"]["content"]
    assert peers[0] == peers[1]  # same local port -> same TCP connection


def test_concurrent_requests_are_served():
    results: list[int] = []
    with LocalModelServer() as srv, httpx.Client() as client:
        def one(i: int) -> None:
            r = client.post(srv.base_url + "/chat/completions", json={"messages": [{"role": "user", "content": str(i)}]})
            results.append(r.status_code)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [200] * 8


def test_stop_closes_the_server():
    srv = LocalModelServer().start()
    url = srv.base_url
    with httpx.Client() as client:
        assert client.get(url + "/models").status_code == 200
        srv.stop()
        with pytest.raises(httpx.TransportError):
            client.get(url + "/models")
    with pytest.raises(RuntimeError):
        _ = srv.base_url


def test_litellm_round_trip_with_json_schema(server):
    import litellm

    response = litellm.completion(
        model="openai/local-echo-1",
        api_base=server.base_url,
        api_key="x",
        messages=MESSAGES,
        response_format={"type": "json_schema", "json_schema": {"name": "invoice", "schema": INVOICE_SCHEMA,
                                                                "strict": True}},
        max_retries=0,
    )
    value = json.loads(response.choices[0].message.content)
    jsonschema.validate(value, INVOICE_SCHEMA)
    assert value["vendor"] == "ACME" and value["total"] == 12.5
    assert response.model.endswith(LOCAL_MODEL)
    expected = generate(MESSAGES)["usage"]
    assert response.usage.prompt_tokens == expected["prompt_tokens"] > 0
    assert response.usage.completion_tokens > 0
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


# ---------------------------------------------------------------- FakeServer


def test_fake_server_plays_its_script_then_the_default():
    with FakeServer([Reply(content="first"), Reply.json('{"a": 1}')], default=Reply(content="default")) as fake:
        fake.push(Reply(content="pushed"))
        with httpx.Client(base_url=fake.base_url) as client:
            texts = [client.post("/chat/completions", json={"messages": []}).json()["choices"][0]["message"]["content"]
                     for _ in range(5)]
    assert texts == ["first", '{"a": 1}', "pushed", "default", "default"]


def test_fake_server_normal_reply_shape():
    with FakeServer() as fake:
        body = httpx.post(fake.base_url + "/chat/completions", json={"messages": []}).json()
    assert body["model"] == "fake-model-2024-01-01"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "ok"}
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def test_fake_server_error_reply_with_headers():
    with FakeServer([Reply.error(429, "slow down", headers={"Retry-After": "2"}), Reply.error(500, "boom")]) as fake:
        r1 = httpx.post(fake.base_url + "/chat/completions", json={})
        r2 = httpx.post(fake.base_url + "/chat/completions", json={})
        r3 = httpx.post(fake.base_url + "/chat/completions", json={})
    assert r1.status_code == 429 and r1.headers["retry-after"] == "2"
    assert r1.json()["error"] == {"message": "slow down", "type": "rate_limit_error", "param": None, "code": None}
    assert r2.status_code == 500 and r2.json()["error"]["message"] == "boom"
    assert r3.status_code == 200


def test_fake_server_malformed_body():
    with FakeServer([Reply.malformed()]) as fake:
        r = httpx.post(fake.base_url + "/chat/completions", json={})
    assert r.status_code == 200
    with pytest.raises(ValueError):
        r.json()


def test_fake_server_callable_body_echoes_the_request():
    def echo(request_json, headers, path):
        auth = {k.lower(): v for k, v in headers.items()}.get("authorization", "")
        return 401, {"error": {"message": f"bad key {auth} for {path}", "type": "authentication_error"}}

    with FakeServer([Reply(body=echo)]) as fake:
        r = httpx.post(fake.base_url + "/chat/completions", json={}, headers={"Authorization": "Bearer sk-test"})
    assert r.status_code == 401
    assert r.json()["error"]["message"] == "bad key Bearer sk-test for /v1/chat/completions"


def test_fake_server_records_requests():
    with FakeServer() as fake:
        httpx.post(fake.base_url + "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                   headers={"X-Trace": "abc"})
        httpx.get(fake.base_url + "/models")
        recorded = fake.requests
    assert [(r.method, r.path) for r in recorded] == [("POST", "/v1/chat/completions"), ("GET", "/v1/models")]
    assert recorded[0].json == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert {k.lower(): v for k, v in recorded[0].headers.items()}["x-trace"] == "abc"
    assert recorded[1].json is None


def test_fake_server_streams_when_asked():
    with FakeServer([Reply(content="streamed")]) as fake:
        text = httpx.post(fake.base_url + "/chat/completions", json={"stream": True, "messages": []}).text
    events = sse_events(text)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == "streamed"
    assert events[-1]["usage"]["total_tokens"] == 10


def test_fake_server_tool_call_reply():
    with FakeServer([Reply.tool_call("hello_world", {"name": "Ada"})]) as fake:
        message = httpx.post(fake.base_url + "/chat/completions", json={}).json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {"name": "hello_world", "arguments": '{"name": "Ada"}'}


def test_fake_server_hang_is_released_by_stop():
    fake = FakeServer([Reply(hang=True)]).start()
    outcome: list[object] = []

    def client() -> None:
        try:
            outcome.append(httpx.post(fake.base_url + "/chat/completions", json={}, timeout=30).status_code)
        except httpx.TransportError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    while not fake.requests:  # the hanging request has arrived
        threading.Event().wait(0.01)
    fake.stop()  # must return although a handler is hanging
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.TransportError)


def test_serve_forever_prints_its_url_and_stops_on_ctrl_c():
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from plugin_llm.local.server import serve_forever; serve_forever('127.0.0.1', 0)"],
        cwd=root, env={**os.environ, "PYTHONPATH": root}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("local model listening on http://127.0.0.1:") and line.endswith("/v1")
        url = line.rsplit(" ", 1)[1]
        assert httpx.get(url + "/models").json()["data"][0]["id"] == LOCAL_MODEL
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert out == "" and "Traceback" not in err
