"""``ctx.call_mcp``: a plugin calls a tool on an MCP server of ``mcp_servers`` through the host's client,
against real servers of the official SDK (tests/mcp_server.py) over stdio and streamable HTTP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from plugin_llm import mcp_client
from plugin_llm.plugins import PluginManager
from tests.conftest import write_config
from tests.plugin_fixtures import write_plugin

SERVER = Path(__file__).with_name("mcp_server.py")
MODES = ["in-process", "process"]
CANARY = "sk-canary-mcp-0123456789abcdefghijklmnop"

PLUGIN = '''
import json

def register(ctx):
    def probe(args):
        try:
            return json.dumps(ctx.call_mcp(args["server"], args["tool"], args.get("arguments"),
                                           args.get("timeout", 30)))
        except Exception as exc:
            return json.dumps({"raised": type(exc).__name__, "message": str(exc),
                               "limit": getattr(exc, "limit", None), "key": getattr(exc, "config_key", None)})
    ctx.register_tool("probe", {"name": "probe", "description": "p"}, probe)
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def http_url():
    """The test server over streamable HTTP, on a free port of 127.0.0.1."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the MCP test server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def managers():
    made: list[PluginManager] = []
    yield made
    for manager in made:
        manager.shutdown()


def _servers(http: str | None = None, env: dict | None = None) -> dict:
    servers: dict = {"local": {"command": sys.executable, "args": [str(SERVER)], "env": env or {}}}
    if http is not None:
        servers["web"] = {"url": http}
    return servers


def _load(home: Path, managers: list, mode: str = "in-process", entry: dict | None = None,
          servers: dict | None = None, key: str = "mcpuser") -> PluginManager:
    write_plugin(home / "plugins", key, PLUGIN)
    entry = dict(entry or {})
    if mode == "process":
        entry["isolation"] = "process"
    config = {"plugins": {"enabled": [key], "entries": {key: entry}}, "mcp_servers": servers or _servers()}
    write_config(home, yaml.safe_dump(config))
    manager = PluginManager(home)
    managers.append(manager)
    manager.discover_plugins()
    plugin = manager.get_plugin(key)
    assert plugin["status"] == "enabled", plugin["error"]
    return manager


def _call(manager: PluginManager, server: str, tool: str, arguments: dict | None = None, timeout=30) -> dict:
    return json.loads(manager.dispatch_tool("probe", {"server": server, "tool": tool, "arguments": arguments,
                                                      "timeout": timeout}))


def _mcp_records(home: Path) -> list[dict]:
    path = home / "logs" / "agent.log"
    lines = path.read_text(encoding="utf-8").split("\n") if path.exists() else []
    return [r for r in (json.loads(line) for line in lines if line.strip()) if r.get("event") == "mcp.call"]


# --- without a server ---------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [(30, 30.0), (0, 1.0), (-5, 1.0), (0.2, 1.0), (601, 600.0),
                                                (1e9, 600.0), ("12", 12.0), ("soon", 30.0), (None, 30.0),
                                                (float("nan"), 30.0), ([1], 30.0)])
def test_timeout_is_clamped_to_hermes_range(value, seconds):
    assert mcp_client.clamp_timeout(value) == seconds


@pytest.mark.parametrize("allowlist", [None, "local", {"local": True}, [], ["other"], ["local:other_tool"]])
def test_a_plugin_without_the_server_in_its_allowlist_gets_permission_error_naming_the_key(
        hermes_home, managers, allowlist):
    entry = {} if allowlist is None else {"mcp_allowlist": allowlist}
    manager = _load(hermes_home, managers, entry=entry)
    out = _call(manager, "local", "echo", {"text": "hi"})
    assert out["raised"] == "PermissionError"
    assert "plugins.entries.mcpuser.mcp_allowlist" in out["message"]
    [record] = _mcp_records(hermes_home)
    assert record["status"] == "denied" and record["decision"] == "denied"
    assert record["decision_key"] == "plugins.entries.mcpuser.mcp_allowlist"
    assert record["plugin_id"] == "mcpuser" and record["mcp.server"] == "local" and record["mcp.tool"] == "echo"


def test_an_allowed_server_that_is_not_configured_is_an_error_envelope_naming_its_key(hermes_home, managers):
    manager = _load(hermes_home, managers, entry={"mcp_allowlist": ["ghost"]})
    out = _call(manager, "ghost", "echo", {"text": "hi"})
    assert out["ok"] is False and "mcp_servers.ghost" in out["error"]
    [record] = _mcp_records(hermes_home)
    assert record["status"] == "error"


# --- stdio --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_tool_call_over_stdio_returns_hermes_envelope_and_one_audit_record(hermes_home, managers, mode):
    manager = _load(hermes_home, managers, mode, entry={"mcp_allowlist": ["local"]})
    out = _call(manager, "local", "echo", {"text": "hello from a plugin"})
    assert out["ok"] is True and out["result"] == "hello from a plugin"
    assert "truncated" not in out
    denied = _call(manager, "remote-thing", "echo", {"text": "x"})
    assert denied["raised"] == "PermissionError" and "plugins.entries.mcpuser.mcp_allowlist" in denied["message"]
    ok, refused = _mcp_records(hermes_home)
    assert ok["status"] == "ok" and ok["decision"] == "allowed" and ok["mcp.tool"] == "echo"
    assert ok["arguments_sha256"] == mcp_client.records.sha256_json({"text": "hello from a plugin"})
    assert ok["result_sha256"] == mcp_client.records.sha256_json(out)
    assert isinstance(ok["duration_ms"], float) and ok["duration_ms"] >= 0
    assert "hello from a plugin" not in json.dumps(ok)  # by digest only
    assert refused["status"] == "denied" and refused["mcp.server"] == "remote-thing"


@pytest.mark.slow
def test_structured_content_errors_and_truncation(hermes_home, managers):
    manager = _load(hermes_home, managers, entry={"mcp_allowlist": ["local"]})
    point = _call(manager, "local", "point", {"x": 1, "y": 2})
    assert point["ok"] is True and json.loads(point["result"]) == {"x": 1, "y": 2}
    assert point.get("structuredContent") in ({"x": 1, "y": 2}, {"result": {"x": 1, "y": 2}})
    big = _call(manager, "local", "big", {"n": 70_000})
    assert big["ok"] is True and big["truncated"] is True and big["result"] == "x" * 65_536
    within = _call(manager, "local", "big", {"n": 65_000})
    assert within["ok"] is True and "truncated" not in within and len(within["result"]) == 65_000
    assert within["structuredContent"] == {"result": "x" * 65_000}
    failed = _call(manager, "local", "fail", {"why": "on purpose"})
    assert failed["ok"] is False and isinstance(failed["error"], str) and failed["error"]
    unknown = _call(manager, "local", "no_such_tool", {})
    assert unknown["ok"] is False and "no_such_tool" in unknown["error"]
    statuses = [(r["mcp.tool"], r["status"], r.get("mcp.truncated")) for r in _mcp_records(hermes_home)]
    assert statuses == [("point", "ok", None), ("big", "ok", True), ("big", "ok", None), ("fail", "error", None),
                        ("no_such_tool", "error", None)]


@pytest.mark.slow
def test_a_hung_server_answers_with_a_timeout_envelope_at_the_clamped_timeout(hermes_home, managers, tmp_path):
    pid_file = tmp_path / "server.pid"
    servers = _servers(env={"MCP_TEST_PID_FILE": str(pid_file)})
    manager = _load(hermes_home, managers, entry={"mcp_allowlist": ["local"]}, servers=servers)
    out = _call(manager, "local", "sleep", {"seconds": 600}, timeout=0.01)  # clamped to 1 s
    assert out == {"ok": False, "error": "MCP server 'local' did not answer tool 'sleep' within 1s"}
    [record] = _mcp_records(hermes_home)
    assert record["status"] == "timeout"
    mcp_client.shutdown(30)  # the connection closes, the child is stopped
    assert not [t for t in mcp_client._threads if t.is_alive()]
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.slow
def test_no_provider_key_reaches_a_stdio_server(hermes_home, managers, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    monkeypatch.setenv("MY_SERVER_TOKEN", "server-own-secret")
    servers = _servers(env={"SERVER_TOKEN": "${MY_SERVER_TOKEN}", "PLAIN": "value"})
    manager = _load(hermes_home, managers, entry={"mcp_allowlist": ["local"]}, servers=servers)
    out = _call(manager, "local", "environment")
    assert out["ok"] is True
    env = dict(line.split("=", 1) for line in out["result"].splitlines() if "=" in line)
    assert env["SERVER_TOKEN"] == "server-own-secret" and env["PLAIN"] == "value"
    assert CANARY not in out["result"] and "OPENAI_API_KEY" not in env and "MY_SERVER_TOKEN" not in env


@pytest.mark.parametrize("env", [{"OPENAI_API_KEY": "${OPENAI_API_KEY}"}, {"KEY_FOR_SERVER": "${OPENAI_API_KEY}"},
                                 {"ANTHROPIC_API_KEY": "literal"}])
def test_a_server_env_that_would_copy_a_provider_key_is_refused_naming_the_entry(hermes_home, managers,
                                                                                 monkeypatch, env):
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    manager = _load(hermes_home, managers, entry={"mcp_allowlist": ["local"]}, servers=_servers(env=env))
    out = _call(manager, "local", "environment")
    name = next(iter(env))
    assert out["ok"] is False and f"mcp_servers.local.env.{name}" in out["error"]
    assert CANARY not in json.dumps(out) and CANARY not in (hermes_home / "logs" / "agent.log").read_text()


@pytest.mark.slow
def test_mcp_calls_count_under_the_plugins_requests_per_minute(hermes_home, managers):
    entry = {"mcp_allowlist": ["local"], "limits": {"requests_per_minute": 1}}
    manager = _load(hermes_home, managers, entry=entry)
    if time.time() % 60 > 40:  # the limit counts per calendar minute: keep both calls in one
        time.sleep(61 - time.time() % 60)
    assert _call(manager, "local", "echo", {"text": "one"})["ok"] is True
    refused = _call(manager, "local", "echo", {"text": "two"})
    assert refused["raised"] in ("PluginLlmQuotaError", "PluginLlmLimitError")
    assert refused["limit"] == "requests_per_minute"
    assert refused["key"] == "plugins.entries.mcpuser.limits.requests_per_minute"
    ok, quota = _mcp_records(hermes_home)
    assert ok["status"] == "ok"
    assert quota["status"] == "quota" and quota["decision"] == "denied"
    assert quota["limits.limit"] == "requests_per_minute"


# --- streamable HTTP ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_tool_call_over_streamable_http(hermes_home, managers, http_url, mode):
    manager = _load(hermes_home, managers, mode, entry={"mcp_allowlist": ["web:echo"]}, servers=_servers(http_url))
    out = _call(manager, "web", "echo", {"text": "over http"})
    assert out["ok"] is True and out["result"] == "over http"
    other_tool = _call(manager, "web", "big", {"n": 3})
    assert other_tool["raised"] == "PermissionError"
    assert [r["status"] for r in _mcp_records(hermes_home)] == ["ok", "denied"]


@pytest.mark.slow
def test_an_unreachable_http_server_is_an_error_envelope(hermes_home, managers):
    servers = {"gone": {"url": f"http://127.0.0.1:{_free_port()}/mcp"}}
    manager = _load(hermes_home, managers, entry={"mcp_allowlist": ["gone"]}, servers=servers)
    out = _call(manager, "gone", "echo", {"text": "x"}, timeout=5)
    assert out["ok"] is False and "gone/echo" in out["error"]
    assert [r["status"] for r in _mcp_records(hermes_home)] in (["error"], ["timeout"])


# --- the record schema ------------------------------------------------------------------------


def test_mcp_call_fields_are_declared_and_documented(hermes_home, managers, monkeypatch):
    """What an mcp.call record carries is declared in audit.records and listed in the schema reference."""
    from audit import records

    manager = _load(hermes_home, managers, entry={"mcp_allowlist": ["ghost"]})
    _call(manager, "local", "echo", {"text": "x"})  # denied
    _call(manager, "ghost", "echo", {"text": "x"})  # error: not configured
    written = _mcp_records(hermes_home)
    assert [r["status"] for r in written] == ["denied", "error"]
    envelope = {records.SCHEMA, records.SEQ, records.PREV_HASH, records.HASH, records.TS, records.KIND,
                records.EVENT}
    declared = set(records.MCP_FIELDS) | set(records.OPTIONAL_MCP_FIELDS)
    assert {k for r in written for k in r} <= declared | envelope
    assert set(records.MCP_FIELDS) <= {k for r in written for k in r}
    doc = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "audit-schema.md").read_text("utf-8")
    section = doc.split('`event: "mcp.call"`', 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert not [k for k in sorted(declared) if not any(f"`{k}`" in row for row in rows)]
    with pytest.raises(ValueError, match="must be one of"):
        records.mcp_record(plugin_id="p", server="s", tool="t", status="provider_error", duration_ms=1,
                           arguments_sha256="0")


def test_the_config_check_knows_mcp_allowlist_and_warns_when_it_is_not_a_list(hermes_home):
    from plugin_llm.trust_report import check_plugins, read_config

    installed = {"good": "good", "bad": "bad"}
    config = {"plugins": {"entries": {"good": {"mcp_allowlist": ["local", "web:echo"]},
                                      "bad": {"mcp_allowlist": "local"}}}, "mcp_servers": _servers()}
    write_config(hermes_home, yaml.safe_dump(config))
    findings = check_plugins(read_config(hermes_home), installed, model_known=lambda name: True)
    about = [f for f in findings if "mcp_allowlist" in f.path]
    assert [(f.plugin_id, f.severity) for f in about] == [("bad", "warning")], findings
    assert "every ctx.call_mcp of this plugin is denied" in about[0].problem


@pytest.mark.slow
def test_with_audit_required_nothing_reaches_the_server_when_the_log_cannot_be_written(hermes_home, managers,
                                                                                       tmp_path):
    pid_file = tmp_path / "server.pid"
    write_plugin(hermes_home / "plugins", "mcpuser", PLUGIN)
    config = {"plugins": {"enabled": ["mcpuser"], "entries": {"mcpuser": {"mcp_allowlist": ["local"]}}},
              "mcp_servers": _servers(env={"MCP_TEST_PID_FILE": str(pid_file)}), "audit": {"required": True}}
    write_config(hermes_home, yaml.safe_dump(config))
    manager = PluginManager(hermes_home)
    managers.append(manager)
    manager.discover_plugins()
    (hermes_home / "logs").mkdir(exist_ok=True)
    log = hermes_home / "logs" / "agent.log"
    if log.exists():
        log.unlink()
    log.mkdir()  # the log cannot be opened
    out = _call(manager, "local", "echo", {"text": "x"})
    assert out["raised"] == "AuditWriteError"
    assert not pid_file.exists()  # the server was never started


@pytest.mark.parametrize(("server", "tool"), [("a:b", "c"), ("", "echo"), ("local", ""), ("local", "x" * 129),
                                              (3, "echo"), ("local", None), ("lo cal", "echo")])
def test_bad_server_or_tool_names_are_a_value_error(hermes_home, managers, server, tool):
    manager = _load(hermes_home, managers, entry={"mcp_allowlist": ["a:b:c", "local"]})
    out = json.loads(manager.dispatch_tool("probe", {"server": server, "tool": tool}))
    assert out["raised"] == "ValueError" and "ctx.call_mcp()" in out["message"]


def test_arguments_that_are_not_a_json_object_are_a_type_error_and_audited(hermes_home, managers):
    manager = _load(hermes_home, managers, entry={"mcp_allowlist": ["local"]})
    out = _call(manager, "local", "echo", [1, 2])  # type: ignore[arg-type]
    assert out["raised"] == "TypeError" and "arguments must be a dict" in out["message"]
    [record] = _mcp_records(hermes_home)
    assert record["status"] == "error" and record["error.type"] == "TypeError"
