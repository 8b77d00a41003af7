"""The docs stay in step with the code: every command documented, the README a short guide."""

from __future__ import annotations

import re
from pathlib import Path

from plugin_llm.cli.main import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_the_cli_reference_lists_every_command():
    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    missing = [name for name in SUBCOMMANDS if f"| `{name}` |" not in text]
    assert not missing, f"commands missing from docs/reference/cli.md: {missing}"


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert pages and all(page in nav for page in pages), [p for p in pages if p not in nav]


def test_the_readme_is_a_short_guide_whose_links_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).is_file(), target


def test_no_docs_page_refers_to_an_issue_number():
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        assert not re.search(r"\bissue\s*#?\d+", page.read_text(encoding="utf-8"), re.I), page
