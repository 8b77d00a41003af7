"""Real local git repositories for the install/update tests (file:// URLs, no network)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Plugin Author",
    "GIT_AUTHOR_EMAIL": "author@example.invalid",
    "GIT_COMMITTER_NAME": "Plugin Author",
    "GIT_COMMITTER_EMAIL": "author@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}

PLUGIN_CODE = "def register(ctx):\n    ctx.register_command('{name}-version', lambda raw: '{version}')\n"


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


class Repo:
    """A source repository: ``write`` files, ``commit`` them, ``url`` is its file:// URL."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True)
        git(path, "init", "--quiet", "-b", "main")

    @property
    def url(self) -> str:
        return self.path.as_uri()

    def write(self, files: dict[str, str]) -> "Repo":
        for rel, text in files.items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(text), encoding="utf-8")
        return self

    def commit(self, message: str = "change") -> str:
        git(self.path, "add", "-A")
        git(self.path, "commit", "--quiet", "-m", message)
        return git(self.path, "rev-parse", "HEAD")


def plugin_files(name: str, version: str = "1.0", prefix: str = "", manifest_extra: str = "") -> dict[str, str]:
    return {
        f"{prefix}plugin.yaml": f"name: {name}\nversion: \"{version}\"\ndescription: {name} plugin\n{manifest_extra}",
        f"{prefix}__init__.py": PLUGIN_CODE.format(name=name, version=version),
    }


@pytest.fixture
def git_env(monkeypatch):
    for key, value in GIT_IDENTITY.items():
        monkeypatch.setenv(key, value)
    return GIT_IDENTITY


@pytest.fixture
def make_repo(tmp_path, git_env):
    """``make_repo("name", files)`` -> a committed :class:`Repo` under tmp_path/sources."""
    counter = iter(range(1000))

    def make(name: str = "", files: dict[str, str] | None = None) -> Repo:
        repo = Repo(tmp_path / "sources" / (name or f"repo{next(counter)}"))
        repo.write(files if files is not None else plugin_files(name or "demo"))
        repo.commit("initial")
        return repo

    return make


def listing(directory: Path) -> list[str]:
    """Entries of a plugins directory that matter (not the lock file)."""
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name != ".install.lock")


__all__ = ["Repo", "git", "plugin_files", "git_env", "make_repo", "listing", "GIT_IDENTITY"]
