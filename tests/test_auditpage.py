"""The auditor's page over HTTP (no browser): escaping, filters, several replicas, the admin token."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from audit import AuditLog, call_record
from plugin_llm.auditpage.app import ADMIN_TOKEN_ENV, COOKIE, create_audit_app
from plugin_llm.auditpage.data import source_for
from plugin_llm.cli.main import main
from tests.test_audit_replicas import replica

ADMIN = "a" * 20 + "-admin-token-for-the-tests-0123456789"
EVIL = '<script>alert(1)</script>"><img src=x onerror=alert(2)>\u202e'


def hostile_log(home: Path) -> Path:
    log = AuditLog(home / "logs" / "agent.log")
    for status in ("ok", "denied"):
        record = call_record(call_id=f"c-{status}", plugin_id=EVIL, api="complete", mode="sync",
                             decision="denied" if status == "denied" else "allowed", status=status, purpose=EVIL,
                             decision_reason=EVIL, request_model=EVIL, cost_usd=0.5 if status == "ok" else None)
        record["decision_key"] = EVIL
        log.write(record)
    log.close()
    return home


def local(app) -> TestClient:
    return TestClient(app, base_url="http://127.0.0.1:8788")


def _unescaped(text: str) -> list[str]:
    return re.findall(r"<script>alert|<img src=x|\u202e", text)


def test_every_value_from_the_log_is_escaped_on_every_view(hermes_home):
    client = local(create_audit_app(source_for([hostile_log(hermes_home)])))
    for path in ("/", "/records", "/records?decision=denied", "/record/hermes/1", "/record/hermes/2", "/chain"):
        answer = client.get(path)
        assert answer.status_code == 200, path
        assert not _unescaped(answer.text), path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in answer.text or path == "/chain", path
        assert "script-src 'self'" in answer.headers["content-security-policy"]
        assert answer.headers["cache-control"] == "no-store"
    # the chart's data is JSON that cannot close its script element
    chart = re.search(r'id="spend-data">(.*?)</script>', client.get("/").text).group(1)
    assert "<" not in chart and json.loads(chart)["series"][0]["plugin"] == EVIL


def test_filters_are_checked_and_bounded(hermes_home):
    client = local(create_audit_app(source_for([hostile_log(hermes_home)])))
    assert client.get("/records?decision=denied").text.count('class="status-denied"') == 1
    bad = client.get("/records?since=yesterday-ish")
    assert bad.status_code == 400 and "cannot read the time" in bad.text
    assert client.get("/records?status=nope").status_code == 400
    assert client.get("/records?page=99999999999").status_code == 200
    assert client.get("/record/hermes/abc").status_code == 404
    assert client.get("/record/nobody/1").status_code == 404
    assert client.post("/records").status_code == 405


def test_several_replicas_one_view_each_chain_its_own(tmp_path):
    east, west = replica(tmp_path / "east", "alpha", 0), replica(tmp_path / "west", "beta", 30)
    client = local(create_audit_app(source_for([east, west])))
    listing = client.get("/records").text
    assert "<th>Replica</th>" in listing and listing.index("beta job 3") < listing.index("alpha job 3")  # newest first
    assert client.get("/records?replica=west").text.count("<td>west</td>") == 4
    assert "beta job 2" in client.get("/record/west/3").text
    overview = client.get("/").text
    assert re.search(r'replica=west">west</a></td><td class="n">4<', overview)
    assert "covered by the signed checkpoint" in client.get("/record/east/2").text
    path = west / "logs" / "agent.log"
    path.write_bytes(path.read_bytes().replace(b"beta job 2", b"beta job X"))
    chain = client.get("/chain").text
    assert chain.count('data-chain="whole"') == 1 and chain.count('data-chain="broken"') == 1
    assert chain.index("east") < chain.index('data-chain="whole"') < chain.index("west") < chain.index('data-chain="broken"')


def test_without_a_token_the_page_answers_only_to_loopback_names(hermes_home):
    """Another site's name resolving to 127.0.0.1 (DNS rebinding) must not read the page."""
    app = create_audit_app(source_for([hostile_log(hermes_home)]))
    for base in ("http://localhost:8788", "http://127.0.0.1", "http://[::1]:8788"):
        assert TestClient(app, base_url=base).get("/").status_code == 200, base
    for base in ("http://evil.example", "http://127.0.0.1.evil.example:8788", "http://testserver"):
        assert TestClient(app, base_url=base).get("/records").status_code == 421, base
    assert TestClient(create_audit_app(source_for([hermes_home]), token=ADMIN), base_url="http://audit.example").get(
        "/", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200  # with a token, any name


def test_a_missing_log_is_a_page_not_an_error(hermes_home):
    client = local(create_audit_app(source_for([hermes_home])))
    assert client.get("/").status_code == 200
    assert "no audit log yet" in client.get("/chain").text


def test_audit_serve_beyond_this_machine_needs_a_token(hermes_home, capsys, monkeypatch):
    assert main(["audit", "serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "add --token" in capsys.readouterr().err
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "short")
    assert main(["audit", "serve", "--token", "--port", "0"]) == 2
    assert "at least 32" in capsys.readouterr().err


@pytest.mark.slow
def test_the_service_serves_the_page_only_with_the_admin_token(hermes_home, monkeypatch):
    from plugin_llm.service.app import create_app
    from plugin_llm.service.tokens import TokenStore

    hostile_log(hermes_home)
    with TestClient(create_app(hermes_home, warm=False)) as client:  # no admin token configured: no page
        assert client.get("/audit/").status_code == 404
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "plg_" + "x" * 40)  # shaped like a plugin token: refused, no page
    with TestClient(create_app(hermes_home, warm=False)) as client:
        assert client.get("/audit/").status_code == 404
    monkeypatch.setenv(ADMIN_TOKEN_ENV, ADMIN)
    _info, plugin_token = TokenStore(hermes_home).create("some-plugin")
    with TestClient(create_app(hermes_home, warm=False), follow_redirects=False) as client:
        anonymous = client.get("/audit/")
        assert anonymous.status_code == 303 and anonymous.headers["location"] == "/audit/login"
        assert client.get("/audit/chain", headers={"Authorization": f"Bearer {plugin_token}"}).status_code == 401
        page = client.get("/audit/", headers={"Authorization": f"Bearer {ADMIN}"})
        assert page.status_code == 200 and 'href="/audit/records"' in page.text and not _unescaped(page.text)
        assert client.post("/audit/login", data={"token": "wrong"}).status_code == 401
        signed_in = client.post("/audit/login", data={"token": ADMIN})
        assert signed_in.status_code == 303 and ADMIN not in signed_in.headers["set-cookie"]
        assert "httponly" in signed_in.headers["set-cookie"].lower() and "samesite=strict" in signed_in.headers["set-cookie"].lower()
        assert client.cookies.get(COOKIE) and client.get("/audit/records").status_code == 200  # the cookie signs in
        client.cookies.clear()
        client.cookies.set(COOKIE, "0" * 64)
        assert client.get("/audit/records").status_code == 303
    events = [json.loads(x) for x in (hermes_home / "logs" / "agent.log").read_text().splitlines()]
    refused = [r for r in events if r.get("event") == "service.auth_denied"]
    assert refused and refused[0]["reason"] == "invalid_admin_token" and plugin_token not in json.dumps(events)
