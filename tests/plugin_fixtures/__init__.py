"""Helpers for the plugin manager tests: write plugins and config into a temporary home."""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

from tests.conftest import write_config

#: The seeds' hello-world plugin, verbatim (seed 001).
HELLO_WORLD_MANIFEST = '''name: hello-world
version: "1.0"
description: A minimal example plugin
'''

HELLO_WORLD_INIT = '''"""Minimal Hermes plugin — registers a tool and a hook."""


def register(ctx):
    # --- 工具：hello_world ---
    schema = {
        "name": "hello_world",
        "description": "Returns a friendly greeting for the given name.",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "description": "Name to greet",
                }
            },
            "required": ["name"],
        },
    }

    def handle_hello(params):
        name = params.get("name", "World")
        return f"Hello, {name}! 👋  (from the hello-world plugin)"

    ctx.register_tool("hello_world", schema, handle_hello)

    # --- 掛鉤：記錄每個 tool 調用 ---
    def on_tool_call(tool_name, params, result):
        print(f"[hello-world] tool called: {tool_name}")

    ctx.register_hook("post_tool_call", on_tool_call)
'''


def write_plugin(
    root: Path,
    rel: str,
    code: str = "def register(ctx):\n    pass\n",
    manifest: str | dict | None = None,
    files: dict[str, str] | None = None,
) -> Path:
    """``root/<rel>/`` with plugin.yaml (``name: <last part>`` by default) and __init__.py."""
    directory = root / rel
    directory.mkdir(parents=True, exist_ok=True)
    if manifest is None:
        manifest = {"name": rel.split("/")[-1], "version": "0.1"}
    text = yaml.safe_dump(manifest) if isinstance(manifest, dict) else manifest
    (directory / "plugin.yaml").write_text(text, encoding="utf-8")
    if code is not None:
        (directory / "__init__.py").write_text(textwrap.dedent(code), encoding="utf-8")
    for name, content in (files or {}).items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content), encoding="utf-8")
    return directory


def configure(home: Path, *, enabled=(), disabled=(), **sections) -> Path:
    """config.yaml with ``plugins.enabled/disabled`` plus any other top-level sections."""
    data: dict = dict(sections)
    plugins = dict(data.pop("plugins", {}))
    if enabled:
        plugins["enabled"] = list(enabled)
    if disabled:
        plugins["disabled"] = list(disabled)
    if plugins:
        data["plugins"] = plugins
    return write_config(home, yaml.safe_dump(data, sort_keys=False))


def by_key(plugins: list[dict]) -> dict[str, dict]:
    return {p["key"]: p for p in plugins}
