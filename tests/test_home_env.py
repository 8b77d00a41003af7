"""<home>/.env is applied once, never overrides the environment, and its values are redacted."""

from __future__ import annotations

import os

from auth import redact
from plugin_llm.config import get_config_source
from plugin_llm.plugins import PluginManager
from tests.conftest import write_config


def test_env_file_is_loaded_without_overriding(hermes_home, monkeypatch):
    monkeypatch.delenv("DEMO_TOKEN", raising=False)
    monkeypatch.setenv("ALREADY_SET", "from-the-shell")
    (hermes_home / ".env").write_text('# saved by plugins install\nDEMO_TOKEN="tok-ENVFILE-0123456789"\nexport ALREADY_SET=from-file\n')
    try:
        get_config_source(hermes_home)
        assert os.environ["DEMO_TOKEN"] == "tok-ENVFILE-0123456789"
        assert os.environ["ALREADY_SET"] == "from-the-shell"
        assert "tok-ENVFILE-0123456789" not in redact("leaked tok-ENVFILE-0123456789 here")
    finally:
        os.environ.pop("DEMO_TOKEN", None)


def test_plugin_requires_env_satisfied_by_env_file(hermes_home, monkeypatch):
    monkeypatch.delenv("NEEDS_ME_KEY", raising=False)
    plugin = hermes_home / "plugins" / "needy"
    plugin.mkdir(parents=True)
    (plugin / "plugin.yaml").write_text("name: needy\nrequires_env: [NEEDS_ME_KEY]\n")
    (plugin / "__init__.py").write_text("def register(ctx):\n    pass\n")
    write_config(hermes_home, "plugins:\n  enabled: [needy]\n")
    (hermes_home / ".env").write_text("NEEDS_ME_KEY=value-from-env-file-42\n")
    try:
        [info] = PluginManager(hermes_home).list_plugins()
        assert info["status"] == "enabled" and info["missing_env"] == []
    finally:
        os.environ.pop("NEEDS_ME_KEY", None)
