"""``plugin-llm serve`` as a process: start-up URL, SIGTERM drain, workers sharing tokens and metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from plugin_llm.cli.main import main
from plugin_llm.service.server import ServeOptions, tls_warning
from plugin_llm.service.tokens import TokenStore
from tests.conftest import audit_lines, write_config
from tests.servers import FakeServer, Reply

USER = [{"role": "user", "content": "hello"}]
ROOT = Path(__file__).resolve().parents[1]


class Serve:
    """``python -m plugin_llm serve --port 0 ...`` in a subprocess; the URL read from its first line."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "plugin_llm", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**os.environ, "HERMES_HOME": str(home), **(env or {})})
        self.first_line = self.proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in self.first_line, self.proc.stderr.read()[-2000:]
        self.url = self.first_line.split("listening on ", 1)[1].split()[0]

    def pids(self, wanted: int, limit: float = 60.0) -> set[int]:
        """Worker pids answering /healthz (fresh connections), once ``wanted`` of them answer."""
        seen: set[int] = set()
        deadline = time.monotonic() + limit
        while len(seen) < wanted and time.monotonic() < deadline:
            try:
                seen.add(httpx.get(self.url + "/healthz", timeout=5).json()["pid"])
            except httpx.HTTPError:
                time.sleep(0.1)
        return seen

    def terminate(self) -> None:
        self.signalled = True
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> tuple[int, str, str]:
        """SIGTERM (once) and wait; exit code, stdout, stderr."""
        if self.proc.poll() is None and not getattr(self, "signalled", False):
            self.terminate()
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, self.first_line + out, err


@pytest.mark.slow
def test_sigterm_drains_the_call_in_flight_then_exits_0(hermes_home):
    with FakeServer(default=Reply(content="slow answer", delay=1.0)) as upstream:
        write_config(hermes_home, f"model:\n  provider: custom\n  model: m\n  base_url: {upstream.base_url}\n")
        token = TokenStore(hermes_home).create("drained")[1]
        serve = Serve(hermes_home)
        try:
            assert serve.pids(1)
            answers: list[httpx.Response] = []
            caller = threading.Thread(target=lambda: answers.append(httpx.post(
                serve.url + "/v1/plugin-llm/complete", json={"messages": USER, "timeout": 20},
                headers={"Authorization": f"Bearer {token}"}, timeout=60)))
            caller.start()
            deadline = time.monotonic() + 60
            while not upstream.requests and time.monotonic() < deadline:
                time.sleep(0.02)
            assert upstream.requests, "the call never reached the provider"
            serve.terminate()  # while the provider is still answering
            caller.join(timeout=60)
            code, out, err = serve.stop()
        finally:
            if serve.proc.poll() is None:
                serve.proc.kill()
    assert answers and answers[0].status_code == 200 and answers[0].json()["text"] == "slow answer"
    assert code == 0 and "stopped by SIGTERM" in out and "1 worker" in out, (code, out, err[-3000:])
    assert "warning" not in err.lower() and token not in out + err  # 127.0.0.1: no clear-text warning
    [line] = audit_lines(hermes_home)
    assert line["status"] == "ok" and line["plugin_id"] == "drained"


@pytest.mark.slow
def test_two_workers_share_tokens_revocation_and_metrics(hermes_home):
    store = TokenStore(hermes_home)
    info, token = store.create("shared")
    serve = Serve(hermes_home, "--workers", "2", env={"PLUGIN_LLM_SERVICE_WARM": "0"})  # no call: no litellm
    try:
        assert len(serve.pids(2)) == 2  # both workers answer on the one socket

        def statuses(n: int) -> list[int]:
            # a fresh connection each, so the kernel spreads them over both workers; the body is refused
            # after authentication (400), so a valid token shows as 400 and a refused one as 401
            return [httpx.post(serve.url + "/v1/plugin-llm/complete", content=b"{", timeout=30,
                               headers={"Authorization": f"Bearer {token}"}).status_code for _ in range(n)]

        assert statuses(20) == [400] * 20
        assert main(["tokens", "revoke", info.id]) == 0
        time.sleep(1.0)  # the promised bound: every worker refuses a revoked token within one second
        assert statuses(20) == [401] * 20
        metrics = httpx.get(serve.url + "/metrics").text  # any worker reports the sum over both
        assert 'plugin_llm_service_calls_total{endpoint="complete",model="default",plugin="shared",status="bad_request"} 20.0' \
            in metrics
        assert 'plugin_llm_service_denials_total{plugin="",reason="revoked"} 20.0' in metrics
        code, out, err = serve.stop()
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
    assert code == 0 and "2 workers" in out and "stopped" in out, (code, out, err[-3000:])
    assert token not in out + err
    log = (hermes_home / "logs" / "agent.log").read_text()
    denied = [json.loads(line) for line in log.splitlines() if '"service.auth_denied"' in line]
    summaries = [json.loads(line) for line in log.splitlines() if '"service.auth_denied.summary"' in line]
    # each worker: its first refusal from the address at once, the rest summarized when it stopped
    assert len(denied) + sum(s["count"] for s in summaries) == 20 and 1 <= len(denied) <= 4
    assert {d["reason"] for d in denied} == {"revoked"} and token not in log
    assert all(s["reasons"] == {"revoked": s["count"]} and s["client"] == "127.0.0.1" for s in summaries)


def test_serve_refuses_bad_options_in_one_line(hermes_home, capsys):
    assert main(["serve", "--workers", "0"]) == 2
    assert main(["serve", "--port", "70000"]) == 2
    assert main(["serve", "--ssl-certfile", "cert.pem"]) == 2
    assert main(["serve", "--home", str(hermes_home / "missing")]) == 2
    err = capsys.readouterr().err
    assert "--workers must be between 1" in err and "--port must be between 0 and 65535" in err
    assert "go together" in err and "not a directory" in err and "Traceback" not in err


def test_beyond_loopback_without_tls_is_warned_about(hermes_home):
    assert tls_warning(ServeOptions(home=hermes_home)) is None
    assert tls_warning(ServeOptions(home=hermes_home, host="::1")) is None
    warning = tls_warning(ServeOptions(home=hermes_home, host="0.0.0.0"))
    assert warning and "clear text" in warning and "--behind-tls-proxy" in warning
    assert tls_warning(ServeOptions(home=hermes_home, host="0.0.0.0", behind_tls_proxy=True)) is None
    assert tls_warning(ServeOptions(home=hermes_home, host="10.0.0.5", ssl_certfile="c", ssl_keyfile="k")) is None
