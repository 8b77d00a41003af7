"""Tools over a sandbox directory, ``$HERMES_HOME/workspace/``.

Shows the full form of ``ctx.register_tool(name, toolset, schema, handler,
check_fn=..., requires_env=..., is_async=..., description=..., emoji=...)``:

- ``list_files`` — sync;
- ``delete_file`` — offered only while the workspace directory exists
  (``check_fn``); refuses anything outside the workspace by itself, and the
  ``tool-guard`` example plugin blocks it altogether before it can run;
- ``count_words`` — an ``async def`` handler (``is_async=True``).

And ``ctx.dispatch_tool``: ``/ls`` runs ``list_files`` through the same path
the model's tool calls take (``pre_tool_call`` policy hooks included), passing
the active session as ``parent_agent`` when there is one.

Handlers take the tool arguments as a dict and return a string (JSON here).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _workspace() -> Path:
    home = os.environ.get("HERMES_HOME") or "~/.hermes"  # ctx exposes no host paths
    return Path(home).expanduser() / "workspace"


def _inside(root: Path, relative: str) -> Path | None:
    """The resolved path if it stays inside ``root``, else None."""
    target = (root / relative).resolve()
    return target if target == root.resolve() or root.resolve() in target.parents else None


def register(ctx):
    root = _workspace()

    def list_files(args: dict) -> str:
        base = _inside(root, str(args.get("path") or "."))
        if base is None:
            return json.dumps({"error": "path is outside the workspace"})
        if not base.is_dir():
            return json.dumps({"files": []})
        files = sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file())
        return json.dumps({"workspace": str(root), "files": files[:200]})

    def delete_file(args: dict) -> str:
        path = str(args.get("path") or "")
        target = _inside(root, path) if path else None
        if target is None or not target.is_file():
            return json.dumps({"error": f"no such file in the workspace: {path!r}"})
        target.unlink()
        return json.dumps({"deleted": str(target.relative_to(root.resolve()))})

    async def count_words(args: dict) -> str:
        text = str(args.get("text") or "")
        return json.dumps({"words": len(text.split()), "characters": len(text)})

    ctx.register_tool(
        name="list_files",
        toolset="workspace",
        schema={
            "name": "list_files",
            "description": "List the files in the workspace (optionally under a sub-directory).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "sub-directory, default '.'"}},
            },
        },
        handler=list_files,
        description="List the files in the workspace.",
        emoji="📁",
    )
    ctx.register_tool(
        "delete_file",
        "workspace",
        {
            "name": "delete_file",
            "description": "Delete one file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "file path"}},
                "required": ["path"],
            },
        },
        delete_file,
        check_fn=root.is_dir,
        description="Delete one file from the workspace.",
        emoji="🗑",
    )
    ctx.register_tool(
        "count_words",
        "workspace",
        {
            "name": "count_words",
            "description": "Count the words and characters of a text.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
        count_words,
        is_async=True,
        description="Count the words of a text.",
        emoji="🔢",
    )

    def ls(raw_args: str) -> str:
        # Same path as a model tool call: policy hooks run, results are transformed.
        return ctx.dispatch_tool("list_files", {"path": raw_args.strip() or "."})

    ctx.register_command("ls", ls, description="list workspace files (via ctx.dispatch_tool)", args_hint="[dir]")
