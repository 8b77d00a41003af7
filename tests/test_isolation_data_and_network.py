"""Out-of-process plugins, follow-ups: persistent private data, no network, the CLI's pid.

Real child processes (the worker), real bubblewrap (``.ci/run`` installs it), a real socket on
127.0.0.1 for the network checks, the real CLI for the listing.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import stat
import time
from pathlib import Path

import pytest
import yaml

from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.isolation.sandbox import bubblewrap_status, plugin_data_dir
from plugin_llm.plugins.settings import settings_from_raw
from tests.bounded import run_bounded
from tests.conftest import write_config
from tests.plugin_fixtures import write_plugin


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def managers():
    made: list[PluginManager] = []
    yield made
    for manager in made:
        manager.shutdown()


def _manager(home: Path, made: list[PluginManager]) -> PluginManager:
    manager = PluginManager(home)
    made.append(manager)
    manager.discover_plugins()
    return manager


def _config(home: Path, entries: dict[str, dict]) -> None:
    write_config(home, yaml.safe_dump({"plugins": {"enabled": list(entries), "entries": entries}}))


# A memory-style plugin as Hermes plugins write them: its data under get_hermes_home().
MEMO = '''
import json, os
from hermes_constants import get_hermes_home


def register(ctx):
    def remember(args):
        with open(get_hermes_home() / "memory.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"text": args["text"]}) + "\\n")
        return "stored"

    def recall(args):
        path = get_hermes_home() / "memory.jsonl"
        if not path.exists():
            return json.dumps([])
        return json.dumps([json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()])

    def where(args):
        return json.dumps({"hermes_home": str(get_hermes_home()), "HOME": os.environ.get("HOME"),
                           "HERMES_HOME": os.environ.get("HERMES_HOME"), "pid": os.getpid()})

    for fn in (remember, recall, where):
        ctx.register_tool(fn.__name__, {"name": fn.__name__}, fn)
'''

SNOOP = '''
import json, os


def register(ctx):
    def snoop(args):
        out = {}
        for name, path in args.items():
            try:
                with open(path, "rb") as f:
                    out[name] = "read:" + f.read(1000).decode("latin-1")
            except OSError as exc:
                out[name] = "unreadable: " + type(exc).__name__
        return json.dumps(out)

    ctx.register_tool("snoop", {"name": "snoop"}, snoop)
'''

NET = '''
import socket


def register(ctx):
    def connect(args):
        try:
            socket.create_connection(("127.0.0.1", args["port"]), timeout=5).close()
            return "connected"
        except OSError as exc:
            return "refused: " + type(exc).__name__

    ctx.register_tool("connect", {"name": "connect"}, connect)
'''


@pytest.mark.slow
def test_an_isolated_memory_plugin_keeps_its_data_across_restarts_and_no_other_plugin_reads_it(
        hermes_home, managers):
    assert bubblewrap_status().usable, "bubblewrap must work here (.ci/run installs it): " + bubblewrap_status().reason
    canary = f"cnry{secrets.token_hex(16)}"
    auth = hermes_home / "auth.json"
    auth.write_text(json.dumps({"providers": {"openai": {"api_key": canary}}}), encoding="utf-8")
    os.chmod(auth, 0o600)
    write_plugin(hermes_home / "plugins", "memo", MEMO)
    write_plugin(hermes_home / "plugins", "snoop", SNOOP)
    _config(hermes_home, {"memo": {"isolation": "process"}, "snoop": {"isolation": "process"}})
    manager = _manager(hermes_home, managers)
    memo = manager.get_plugin("memo")
    assert memo["status"] == "enabled", memo["error"]
    assert memo["confinement"] == "bubblewrap"

    data = hermes_home / "plugin-data" / "memo"
    assert memo["data_dir"] == str(data.resolve())
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((hermes_home / "plugin-data").stat().st_mode) == 0o700
    where = json.loads(manager.dispatch_tool("where", {}))
    # what the plugin sees as its home: its own directory, never the real one
    assert where["hermes_home"] == where["HOME"] == where["HERMES_HOME"] == str(data.resolve())
    assert manager.dispatch_tool("remember", {"text": "first"}) == "stored"
    assert json.loads((data / "memory.jsonl").read_text(encoding="utf-8").splitlines()[0]) == {"text": "first"}

    # killed: restarted in a new process, which reads back what the first one wrote
    first = manager.get_plugin("memo")["pid"]
    os.kill(first, signal.SIGKILL)

    def until_restarted() -> int:
        while True:
            manager.dispatch_tool("recall", {})  # fails while the fault is noticed, then starts a new process
            pid = manager.get_plugin("memo")["pid"]
            if pid not in (None, first):
                return pid
            time.sleep(0.05)

    run_bounded(until_restarted, 30)
    assert json.loads(manager.dispatch_tool("recall", {})) == ["first"]
    assert manager.dispatch_tool("remember", {"text": "second"}) == "stored"
    assert json.loads(manager.dispatch_tool("recall", {})) == ["first", "second"]

    # another isolated plugin sees neither memo's data nor the real home's auth.json; its own data dir is its own
    seen = json.loads(manager.dispatch_tool("snoop", {"memo": str(data / "memory.jsonl"), "auth": str(auth),
                                                      "config": str(hermes_home / "config.yaml")}))
    assert all(v.startswith("unreadable") for v in seen.values()), seen
    assert canary not in json.dumps(seen)
    assert manager.get_plugin("snoop")["data_dir"] == str((hermes_home / "plugin-data" / "snoop").resolve())


def test_data_dirs_are_one_per_key_and_never_a_symlink(hermes_home, tmp_path):
    from plugin_llm.plugins.isolation.sandbox import SandboxUnavailable

    nested = plugin_data_dir(hermes_home, "image_gen/openai")
    assert nested.parent == hermes_home / "plugin-data" and nested.name == "image_gen%2Fopenai"
    assert plugin_data_dir(hermes_home, "..").parent == hermes_home / "plugin-data"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (hermes_home / "plugin-data" / "linked").symlink_to(elsewhere)
    with pytest.raises(SandboxUnavailable, match=r"plugin-data/linked must be a directory owned by this user"):
        plugin_data_dir(hermes_home, "linked")


@pytest.mark.slow
def test_isolation_network_none_cuts_the_network_under_bubblewrap(hermes_home, managers):
    assert bubblewrap_status().usable, bubblewrap_status().reason
    write_plugin(hermes_home / "plugins", "net-on", NET)
    write_plugin(hermes_home / "plugins", "net-off", NET.replace('"connect"', '"connect_off"'))
    _config(hermes_home, {"net-on": {"isolation": "process", "isolation_network": "host"},  # the opt-in
                          "net-off": {"isolation": "process", "isolation_network": "none"}})
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        manager = _manager(hermes_home, managers)
        assert manager.get_plugin("net-off")["isolation_network"] == "none"
        assert manager.get_plugin("net-on")["isolation_network"] == "host"
        assert run_bounded(lambda: manager.dispatch_tool("connect", {"port": port}), 60) == "connected"
        assert run_bounded(lambda: manager.dispatch_tool("connect_off", {"port": port}), 60).startswith("refused")


def test_isolation_network_none_without_bubblewrap_refuses_to_start_the_plugin(hermes_home, managers, tmp_path,
                                                                              monkeypatch):
    empty = tmp_path / "no-bwrap"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    write_plugin(hermes_home / "plugins", "net-off", NET)
    _config(hermes_home, {"net-off": {"isolation": "process", "isolation_network": "none"}})
    manager = _manager(hermes_home, managers)
    plugin = manager.get_plugin("net-off")
    assert plugin["status"] == "failed"
    assert "isolation_network: none needs bubblewrap" in plugin["error"]
    assert "plugins.entries.net-off.isolation_network: host" in plugin["error"]
    assert "bwrap is not on PATH" in plugin["error"]
    assert "connect" not in manager.tools


def test_isolation_network_is_validated_and_known_to_trust_check(hermes_home, capsys):
    from plugin_llm.cli.main import main

    typo = settings_from_raw({"plugins": {"entries": {"p": {"isolation_network": "nnone"}}}})
    assert typo.entry("p").isolation_network == "none"
    assert "plugins.entries.p.isolation_network: unknown value 'nnone' (did you mean 'none'?)" in typo.problems[0]
    assert settings_from_raw({"plugins": {"entries": {"p": {"isolation_network": False}}}}).entry("p") \
        .isolation_network == "none"
    assert settings_from_raw({"plugins": {"entries": {"p": {}}}}).entry("p").isolation_network is None  # unset
    assert settings_from_raw({"plugins": {"entries": {"p": {"isolation_network": "host"}}}}).entry("p") \
        .isolation_network == "host"
    write_plugin(hermes_home / "plugins", "p")
    _config(hermes_home, {"p": {"isolation": "process", "isolation_network": "none"}})
    code = main(["trust", "check"])
    out = capsys.readouterr().out
    assert "unknown key" not in out and code == 0, out


@pytest.mark.slow
def test_the_cli_listing_reports_no_pid_of_a_process_it_stopped(hermes_home, managers, capsys):
    from plugin_llm.cli.main import main

    write_plugin(hermes_home / "plugins", "memo", MEMO)
    _config(hermes_home, {"memo": {"isolation": "process"}})
    assert main(["plugins", "list", "--json"]) == 0
    listed = {p["key"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["memo"]["isolation"] == "process" and "pid" not in listed["memo"]
    assert listed["memo"]["data_dir"] == str((hermes_home / "plugin-data" / "memo").resolve())
    assert main(["plugins", "info", "memo", "--json"]) == 0
    assert "pid" not in json.loads(capsys.readouterr().out)
    assert main(["plugins", "info", "memo"]) == 0
    assert f"its data: {(hermes_home / 'plugin-data' / 'memo').resolve()}" in capsys.readouterr().out
    # the library listing reports it while the process runs, and not once it is stopped
    manager = _manager(hermes_home, managers)
    pid = manager.get_plugin("memo")["pid"]
    assert pid is not None and _alive(pid)
    manager.shutdown()
    assert manager.get_plugin("memo")["pid"] is None


# --- a child that stops reading cannot hold the host past a time limit ---------------------

FROZEN = '''
import os, signal, threading, time


def register(ctx):
    def freeze(args):
        def stop():
            time.sleep(0.2)  # after the answer is on its way
            os.kill(os.getpid(), signal.SIGSTOP)

        threading.Thread(target=stop, daemon=True).start()
        return "freezing"

    def guard(tool_name, args=None, **_):
        return None

    ctx.register_tool("freeze", {"name": "freeze"}, freeze)
    ctx.register_tool("ok", {"name": "ok"}, lambda args: "ok")
    ctx.register_hook("pre_tool_call", guard)
'''


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                children = Path(f"/proc/{current}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            out += [int(c) for c in children]
            todo += [int(c) for c in children]
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


@pytest.mark.slow
def test_a_child_that_stops_reading_is_stopped_at_the_time_limit_even_while_the_host_sends(hermes_home, managers):
    """A hook call whose arguments fill the pipe of a child that no longer reads: the send itself is
    bounded by plugins.hook_timeout (before, the host waited in write() forever, holding the channel)."""
    write_plugin(hermes_home / "plugins", "frozen", FROZEN)
    write_config(hermes_home, yaml.safe_dump({"plugins": {"enabled": ["frozen"], "hook_timeout": 1,
                                                          "entries": {"frozen": {"isolation": "process"}}}}))
    manager = _manager(hermes_home, managers)
    pid = manager.get_plugin("frozen")["pid"]
    assert manager.dispatch_tool("freeze", {}) == "freezing"

    def until_stopped() -> None:
        while not any(_state(p) == "T" for p in [pid, *_descendants(pid)]):
            time.sleep(0.05)

    run_bounded(until_stopped, 30)
    # 4 MiB of arguments: far more than a pipe holds, so the guard's call cannot even be sent
    blocked = run_bounded(lambda: manager.dispatch_tool("ok", {"blob": "x" * (4 << 20)}), 30)
    assert "timed out" in blocked and "blocked (fail-closed)" in blocked

    def until_ok() -> str:
        while True:
            text = manager.dispatch_tool("ok", {})
            if text == "ok":
                return text
            time.sleep(0.05)

    assert run_bounded(until_ok, 30) == "ok"
    assert manager.get_plugin("frozen")["pid"] not in (None, pid)


def test_a_message_nested_past_the_json_parsers_limit_is_a_protocol_error():
    from plugin_llm.plugins.isolation.protocol import Channel, ChannelClosed, ProtocolError

    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader:
        channel = Channel(reader, write_fd)
        os.write(write_fd, b"[" * 20_000 + b"\n")  # under a pipe buffer: no reader needed
        with pytest.raises(ProtocolError, match="not a JSON message") as caught:
            channel.receive()
        assert not isinstance(caught.value, ChannelClosed)
        channel.close()
