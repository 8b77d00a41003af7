"""A brake on token guessing: too many refused tokens from one address get 429.

``service.failed_auth`` in config.yaml: after ``max_failures`` refused tokens within ``window_seconds`` the
address is answered 429 with ``Retry-After`` for ``block_seconds``, its token not looked at; audited and
counted like the other refusals, never with a token; shared by the workers (SQLite) and the replicas (Redis).
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from plugin_llm.config import parse_config
from plugin_llm.service.tokens import token_key_path, token_store_for
from tests.conftest import write_config
from tests.redis_server import own_redis_server  # noqa: F401
from tests.service_server import ServiceServer
from tests.test_service_serve import Serve

COMPLETE = "/v1/plugin-llm/complete"


def _brake(max_failures: int = 3, window: float = 60, block: float = 30, extra: str = "") -> str:
    return (f"{extra}service:\n  failed_auth:\n    max_failures: {max_failures}\n    window_seconds: {window}\n"
            f"    block_seconds: {block}\n")


def _guess() -> str:
    return "plg_" + secrets.token_urlsafe(32)


def _post(url: str, token: str | None) -> httpx.Response:
    """A call whose body is refused after authentication: 400 means the token was accepted, 401 refused."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=30) as client:  # a fresh connection each: with workers, the kernel spreads them
        return client.post(url + COMPLETE, content=b"{", headers=headers)


def _denials(home: Path, event: str = "service.auth_denied") -> list[dict]:
    path = home / "logs" / "agent.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if f'"{event}"' in line]


def _refusals(home: Path) -> Counter:
    """(client, reason) -> refusals: an address's first of a window has a record, the rest are in its summary."""
    counts: Counter = Counter((d["client"], d["reason"]) for d in _denials(home))
    for summary in _denials(home, "service.auth_denied.summary"):
        for reason, count in summary["reasons"].items():
            counts[(summary["client"], reason)] += count
    return counts


@pytest.mark.slow
def test_after_max_failures_the_address_gets_429_and_its_token_is_not_checked(hermes_home):
    write_config(hermes_home, _brake(max_failures=3, block=30))
    with ServiceServer(hermes_home) as service:
        valid = service.token("guarded")
        assert _post(service.url, valid).status_code == 400  # accepted (the body is the problem)
        guesses = [_guess() for _ in range(5)]
        assert [_post(service.url, g).status_code for g in guesses[:3]] == [401, 401, 401]
        blocked = _post(service.url, guesses[3])
        assert blocked.status_code == 429
        assert 1 <= int(blocked.headers["Retry-After"]) <= 30
        error = blocked.json()["error"]
        assert error["code"] == "too_many_failed_authentications" and "service.failed_auth" in error["message"]
        time.sleep(0.6)  # past the 0.5 s cache: the valid token would be looked up again if it were checked
        refused_valid = _post(service.url, valid)
        assert refused_valid.status_code == 429  # blocked: not even a valid token is looked at
        metrics = httpx.get(service.url + "/metrics").text
    assert 'plugin_llm_service_denials_total{plugin="",reason="too_many_failures"} 2.0' in metrics
    assert 'plugin_llm_service_denials_total{plugin="",reason="unknown"} 3.0' in metrics
    [first] = _denials(hermes_home)  # the address's first refusal of the window, recorded at once
    assert first["reason"] == "unknown" and first["client"] == "127.0.0.1"
    [summary] = _denials(hermes_home, "service.auth_denied.summary")  # the others, summarized at shutdown
    assert summary["client"] == "127.0.0.1" and summary["count"] == 4
    assert summary["reasons"] == {"too_many_failures": 2, "unknown": 2}
    assert summary["token_ids"] == [] and summary["plugin_ids"] == []  # the valid token: not looked up
    assert _refusals(hermes_home) == {("127.0.0.1", "unknown"): 3, ("127.0.0.1", "too_many_failures"): 2}
    log = (hermes_home / "logs" / "agent.log").read_text()
    for token in (valid, *guesses):
        assert token not in log and token[4:] not in log and token not in metrics


@pytest.mark.slow
def test_missing_tokens_are_not_counted_and_the_brake_can_be_turned_off(hermes_home):
    write_config(hermes_home, _brake(max_failures=2))
    with ServiceServer(hermes_home) as service:
        valid = service.token("p")
        assert [_post(service.url, None).status_code for _ in range(5)] == [401] * 5  # no guess made
        assert _post(service.url, valid).status_code == 400
    write_config(hermes_home, _brake(max_failures=0))
    with ServiceServer(hermes_home) as service:
        assert [_post(service.url, _guess()).status_code for _ in range(6)] == [401] * 6
        assert _post(service.url, valid).status_code == 400


@pytest.mark.slow
def test_successes_do_not_reset_the_count_and_the_block_ends(hermes_home):
    write_config(hermes_home, _brake(max_failures=3, window=60, block=1))
    with ServiceServer(hermes_home) as service:
        valid = service.token("p")
        assert [_post(service.url, _guess()).status_code for _ in range(2)] == [401, 401]
        assert [_post(service.url, valid).status_code for _ in range(5)] == [400] * 5  # under the limit: served
        assert _post(service.url, _guess()).status_code == 401  # the third failure: blocked from now on
        blocked = _post(service.url, valid)
        assert blocked.status_code == 429 and blocked.headers["Retry-After"] == "1"
        time.sleep(1.1)  # the block is over
        assert _post(service.url, valid).status_code == 400
        # the window still holds three failures: the next refused token blocks the address again at once
        assert _post(service.url, _guess()).status_code == 401
        assert _post(service.url, valid).status_code == 429


@pytest.mark.slow
def test_two_workers_share_the_count(hermes_home):
    write_config(hermes_home, _brake(max_failures=4, block=60))
    store = token_store_for(hermes_home)
    valid = store.create("shared")[1]
    store.close()
    serve = Serve(hermes_home, "--workers", "2", env={"PLUGIN_LLM_SERVICE_WARM": "0"})
    try:
        assert len(serve.pids(2)) == 2
        assert [_post(serve.url, _guess()).status_code for _ in range(4)] == [401] * 4  # spread over both
        # both workers refuse now: the one that counted the fourth from memory, the other from the shared file
        answers = [_post(serve.url, token).status_code for token in [_guess()] * 10 + [valid] * 10]
        assert answers == [429] * 20, answers
        code, out, err = serve.stop()
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
    assert code == 0, err[-3000:]
    assert (hermes_home / "service" / "auth_failures.db").stat().st_mode & 0o077 == 0  # owner only
    # each worker records its first refusal at once and summarizes the rest when it stops: no count is lost
    assert _refusals(hermes_home) == {("127.0.0.1", "unknown"): 4, ("127.0.0.1", "too_many_failures"): 20}
    assert 1 <= len(_denials(hermes_home)) <= 4  # a first record per worker (and per minute)


def _post_from(url: str, token: str, forwarded_for: str) -> int:
    with httpx.Client(timeout=30) as client:
        return client.post(url + COMPLETE, content=b"{", headers={
            "Authorization": f"Bearer {token}", "X-Forwarded-For": forwarded_for}).status_code


@pytest.mark.slow
@pytest.mark.parametrize("trusted", [False, True], ids=["no-proxy-configured", "forwarded-allow-ips"])
def test_x_forwarded_for_is_believed_only_from_a_configured_proxy(hermes_home, trusted):
    """By default a client cannot name its own address (uvicorn alone would believe 127.0.0.1's header):
    rotating X-Forwarded-For neither escapes the brake nor gets another address blocked."""
    write_config(hermes_home, _brake(max_failures=2, block=60))
    serve = Serve(hermes_home, *(["--forwarded-allow-ips", "127.0.0.1"] if trusted else []),
                  env={"PLUGIN_LLM_SERVICE_WARM": "0"})
    try:
        answers = [_post_from(serve.url, _guess(), f"203.0.113.{n}") for n in range(1, 5)]
        code, _out, err = serve.stop()
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
    assert code == 0, err[-3000:]
    clients = [d["client"] for d in _denials(hermes_home)]
    if trusted:  # four proxied clients, each with one failure: nobody blocked
        assert answers == [401] * 4
        assert clients == [f"203.0.113.{n}" for n in range(1, 5)]
    else:  # one connection address: blocked after two, whatever the header says
        assert answers == [401, 401, 429, 429]
        assert clients == ["127.0.0.1"]  # its first refusal; the other three are in its summary
        assert _refusals(hermes_home) == {("127.0.0.1", "unknown"): 2, ("127.0.0.1", "too_many_failures"): 2}


@pytest.mark.slow
def test_with_limits_in_redis_replicas_on_two_machines_share_the_count(tmp_path, own_redis_server):  # noqa: F811
    homes = [tmp_path / "machine-a", tmp_path / "machine-b"]
    for home in homes:
        home.mkdir()
        write_config(home, _brake(max_failures=3, extra=f"limits:\n  store: redis\n  redis_url: "
                                                         f"{own_redis_server.url}\n  store_timeout: 2\n"))
    store = token_store_for(homes[0])
    valid = store.create("roaming")[1]
    store.close()
    (homes[1] / "service").mkdir(exist_ok=True)  # every machine has the same token key
    shutil.copy2(token_key_path(homes[0]), token_key_path(homes[1]))
    with ServiceServer(homes[0]) as a, ServiceServer(homes[1]) as b:
        assert _post(b.url, valid).status_code == 400
        assert [_post(a.url, _guess()).status_code for _ in range(3)] == [401] * 3  # guessed at machine A
        assert not (homes[0] / "service" / "auth_failures.db").exists()  # counted in Redis
        time.sleep(0.6)  # machine B's cache of the valid token is over
        answer = _post(b.url, valid)  # machine B knows from Redis
        assert answer.status_code == 429 and 1 <= int(answer.headers["Retry-After"]) <= 30
        assert _post(b.url, _guess()).status_code == 429


def test_the_settings_name_typos_and_keep_the_brake_on(tmp_path):
    config = parse_config(tmp_path, "service:\n  faild_auth: {}\n  failed_auth:\n    max_failure: 5\n"
                                    "    window_seconds: -3\n    block_seconds: forever\n")
    brake = config.service.failed_auth
    assert (brake.max_failures, brake.window_seconds, brake.block_seconds) == (20, 60.0, 60.0)  # the defaults
    warnings = "\n".join(config.warnings)
    assert "service.faild_auth: unknown key, ignored (did you mean 'failed_auth'?)" in warnings
    assert "service.failed_auth.max_failure: unknown key, ignored (did you mean 'max_failures'?)" in warnings
    assert "service.failed_auth.window_seconds: expected seconds" in warnings and "using 60" in warnings
    assert "service.failed_auth.block_seconds" in warnings and "'forever'" in warnings
    assert parse_config(tmp_path, "servce: {}\n").warnings[0].startswith("'servce': unknown top-level section "
                                                                         "(did you mean 'service'?)")
    tuned = parse_config(tmp_path, _brake(max_failures=0, window=5, block=7)).service.failed_auth
    assert (tuned.max_failures, tuned.window_seconds, tuned.block_seconds, tuned.enabled) == (0, 5.0, 7.0, False)
