"""The layering holds: no module imports itself back through others, and the import-linter contracts of
pyproject.toml (the layers docs/architecture.md draws) are kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of modules (a package's ``__init__`` re-exporting aside)."""
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i not in ("plugin_llm",)}
             for m in graph.modules if m != "plugin_llm"}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(start: str) -> None:  # iterative Tarjan: the graph is deep enough to matter
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_back():
    graph = grimp.build_graph("plugin_llm", "auth", "audit", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_the_import_contracts_are_kept():
    run = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                          "lint_imports_command()"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
