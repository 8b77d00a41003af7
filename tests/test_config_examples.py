"""Everything under config_examples/ loads: YAML parses, every plugin loads in a home seeded from it,
together the plugins use every ctx method, and config.yaml documents every key."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from plugin_llm.config import parse_config
from plugin_llm.host import Session
from plugin_llm.host.bootstrap import load_manager

from tests.test_host_support import EXAMPLES

CTX_METHODS = {
    "llm.complete", "llm.complete_structured", "llm.acomplete", "llm.acomplete_structured",
    "register_tool", "register_hook", "register_command", "register_cli_command",
    "register_context_engine", "register_memory_provider", "register_skill", "register_platform",
    "register_image_gen_provider", "inject_message", "dispatch_tool",
}


@pytest.fixture
def seeded(hermes_home: Path) -> Path:
    shutil.copy2(EXAMPLES / "config.yaml", hermes_home / "config.yaml")
    shutil.copytree(EXAMPLES / "plugins", hermes_home / "plugins", ignore=shutil.ignore_patterns("__pycache__"))
    return hermes_home


def test_every_yaml_file_parses():
    files = sorted(EXAMPLES.rglob("*.yaml")) + sorted(EXAMPLES.rglob("*.yml"))
    assert len(files) >= 12
    for path in files:
        yaml.safe_load(path.read_text(encoding="utf-8"))


def test_every_python_file_compiles():
    for path in sorted(EXAMPLES.rglob("*.py")):
        compile(path.read_text(encoding="utf-8"), str(path), "exec")


def test_config_yaml_is_valid_without_warnings(tmp_path: Path):
    config = parse_config(tmp_path, (EXAMPLES / "config.yaml").read_text(encoding="utf-8"))
    assert config.warnings == ()
    assert (config.model.provider, config.model.model) == ("local", "local-echo-1")
    assert config.trust_for("paste-to-tasks").allow_model_override is True
    assert config.trust_for("tldr").allow_model_override is False
    fanout = config.limits.for_plugin("async-fanout")
    assert (fanout.requests_per_minute, fanout.max_concurrent, fanout.error) == (600, 8, None)
    assert config.limits.for_plugin("tldr").empty


def test_every_config_key_is_documented_by_a_comment():
    lines = (EXAMPLES / "config.yaml").read_text(encoding="utf-8").splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        previous = lines[i - 1].strip() if i else ""
        if "#" not in line and not previous.startswith("#"):
            # a mapping whose children are commented counts (e.g. "llm:" under an entry)
            following = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if not (stripped.endswith(":") and "#" in following):
                undocumented.append(f"{i + 1}: {line}")
    assert undocumented == []
    data = yaml.safe_load("\n".join(lines))
    assert {"model", "llm", "limits", "plugins", "audit", "memory", "context", "image_gen"} <= set(data)
    assert {"enabled", "disabled", "entries", "hook_timeout"} <= set(data["plugins"])


def test_every_example_plugin_loads_without_errors(seeded: Path):
    manager = load_manager(seeded)
    plugins = {p["key"]: p for p in manager.list_plugins()}
    on_disk = {str(p.parent.relative_to(seeded / "plugins")) for p in (seeded / "plugins").rglob("plugin.yaml")}
    assert set(plugins) == on_disk
    assert {"image_gen/sketch", "memory/jsonl", "context_engine/keep-recent"} <= on_disk  # nested keys
    for key, info in plugins.items():
        assert info["status"] == "enabled", (key, info)
        assert info["error"] is None, (key, info["error"])
        assert not info.get("warnings"), (key, info.get("warnings"))


def test_examples_register_one_of_everything(seeded: Path):
    manager = load_manager(seeded)
    assert {"hello_world", "list_files", "delete_file", "count_words"} <= set(manager.tools)
    assert manager.tools["count_words"].is_async
    assert manager.tools["hello_world"].toolset == "hello-world"  # the short register_tool form
    assert {"tldr", "paste-to-tasks", "fanout", "triage", "ls", "remember", "memories", "sketch", "inbox"} <= set(
        manager.commands)
    assert "inbox" in manager.cli_commands and "inbox" in manager.platforms
    assert {"house-style:house-style", "house-style:release-notes"} <= set(manager.skills)
    assert all(not s.injection_findings for s in manager.skills.values())
    assert manager.memory_provider is not None and manager.memory_provider.name == "jsonl"
    assert manager.image_gen_provider is not None and manager.image_gen_provider.name == "sketch"
    assert manager.context_engine is None  # context.engine: compressor keeps the built-in
    for hook in ("pre_tool_call", "transform_tool_result", "pre_llm_call", "transform_llm_output", "post_tool_call"):
        assert manager.has_hook(hook), hook


def test_examples_use_every_ctx_method():
    used: set[str] = set()
    for path in EXAMPLES.rglob("__init__.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                base = node.value
                if isinstance(base, ast.Name) and base.id == "ctx":
                    used.add(node.attr)
                elif isinstance(base, ast.Attribute) and base.attr == "llm":
                    used.add(f"llm.{node.attr}")
                elif isinstance(base, ast.Name) and base.id == "_llm" or (
                        isinstance(base, ast.Attribute) and base.attr == "_llm"):
                    used.add(f"llm.{node.attr}")
    assert CTX_METHODS <= used, CTX_METHODS - used


def test_examples_keep_recent_engine_selected_by_config(seeded: Path):
    text = (seeded / "config.yaml").read_text().replace("engine: compressor", "engine: keep-recent")
    (seeded / "config.yaml").write_text(text)
    manager = load_manager(seeded)
    engine = manager.context_engine
    assert engine is not None and engine.name == "keep-recent"
    messages = [{"role": "system", "content": "s"}]
    for i in range(5):
        messages += [
            {"role": "user", "content": f"u{i}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 400},
            {"role": "assistant", "content": f"a{i}"},
        ]
    before = json.dumps(messages)
    out = engine.compress(messages, budget_tokens=80)
    assert json.dumps(messages) == before  # input untouched
    assert out[0]["role"] == "system" and out[-4]["content"] == "u4" and out[-2]["content"] == "x" * 400
    for i, m in enumerate(out):
        if m["role"] == "tool":
            assert out[i - 1].get("tool_calls")


def test_examples_run_in_a_session_on_the_local_model(seeded: Path):
    with Session(load_manager(seeded)) as session:
        tldr = session.run_turn("/tldr First sentence here. Second one there.")
        assert tldr.text.startswith("First sentence here.")
        assert json.loads(session.run_turn("/triage Urgency: high\nTeam: billing").text) == {
            "team": "billing", "urgency": "high"}
        sketch = session.run_turn("/sketch Shape: triangle, Colour: orange, Caption: hi").text
        path = Path(sketch.split(" ")[0])
        assert path.parent == seeded / "images" and "<polygon" in path.read_text()
        assert session.run_turn("/remember the build is green").text == "Remembered."
        turn = session.run_turn("is the build green?")
        assert "the build is green" in turn.text  # recalled memory rode on the user message
        assert "House style:" in turn.text  # pre_llm_call context too
        assert all("House style" not in str(m.get("content")) for m in session.history if m["role"] == "user")
        assert session.run_turn("/ls").text.startswith('{"files": []')


# --- the JSONL memory provider ---------------------------------------------------------------------


def _memory_module():
    spec = importlib.util.spec_from_file_location("example_jsonl_memory", EXAMPLES / "plugins/memory/jsonl/__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jsonl_memory_appends_never_rewrites_and_dedups(tmp_path: Path):
    mod = _memory_module()
    path = tmp_path / "m" / "memories.jsonl"
    store = mod.JsonlMemory(path)
    assert store.recall("anything", session_id="s") is None
    assert store.add("Deploys happen on Friday", session_id="s")
    inode, size = path.stat().st_ino, path.stat().st_size
    assert not store.add("deploys   happen on friday")  # same content hash
    store.remember("hello\nremember that the VPN needs a token\n", "ok", session_id="s")
    assert path.stat().st_ino == inode and path.stat().st_size > size  # appended in place
    assert [e["text"] for e in store.entries()] == ["Deploys happen on Friday", "the VPN needs a token"]
    assert store.recall("when do deploys happen?", session_id="s") == "- Deploys happen on Friday"
    # a duplicate written by another process and a torn last line are both tolerated
    line = path.read_text().splitlines()[0]
    with open(path, "a") as fh:
        fh.write(line + "\n" + '{"id": "torn", "te')
    assert [e["text"] for e in store.entries()] == ["Deploys happen on Friday", "the VPN needs a token"]


@pytest.mark.slow
def test_jsonl_memory_dedups_the_same_memory_written_by_several_processes(tmp_path: Path):
    path = tmp_path / "memories.jsonl"
    script = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(EXAMPLES / 'plugins/memory/jsonl/__init__.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "store = m.JsonlMemory(__import__('pathlib').Path(sys.argv[1]))\n"
        "for i in range(20):\n"
        "    store.add(f'shared fact {i}', source='proc')\n"
        "    store.add(f'own fact {sys.argv[2]} {i}', source='proc')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), str(n)], env=env) for n in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    raw_lines = path.read_text().splitlines()
    assert all(json.loads(line)["id"] for line in raw_lines)  # no interleaved or torn lines
    mod = _memory_module()
    texts = [e["text"] for e in mod.JsonlMemory(path).entries()]
    assert len(texts) == len(set(texts)) == 20 + 4 * 20
    assert sum(1 for t in texts if t.startswith("shared fact")) == 20
    assert re.fullmatch(r"[0-9a-f]{32}", mod.memory_id("x"))


def test_auth_json_example_loads_through_the_store(hermes_home: Path, monkeypatch) -> None:
    from auth import get_store

    target = hermes_home / "auth.json"
    shutil.copy2(EXAMPLES / "auth.json.example", target)
    target.chmod(0o600)
    monkeypatch.setenv("MY_GATEWAY_KEY", "gateway-key-from-env-0001")
    store = get_store(hermes_home)
    assert store.acquire("openai").source == "auth.json"
    pool = [store.acquire("openrouter").key_id for _ in range(2)]
    assert sorted(pool) == ["openrouter#0", "openrouter#1"]
    assert store.acquire("custom").reveal() == "gateway-key-from-env-0001"
    assert "work" in store.profiles()
    listing = json.dumps(store.describe())
    assert "REPLACE-WITH-YOUR-KEY" not in listing  # masked
