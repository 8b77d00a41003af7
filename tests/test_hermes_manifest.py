"""Hermes manifest v2: requires_plugins (load order), requires_hermes (gate), manifest_version,
api_version, config_schema, python_dependencies, tolerant capabilities and the metadata fields."""

from __future__ import annotations

import pytest

from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.manifest import (
    HERMES_API_VERSION,
    PluginDependency,
    parse_manifest,
    version_satisfies,
)
from tests.plugin_fixtures import by_key, configure, write_plugin

ORDER: list = []  # what the test plugins record, in load order


@pytest.fixture(autouse=True)
def _clear():
    ORDER.clear()


def test_v2_fields_are_parsed():
    m = parse_manifest(
        "name: x\nmanifest_version: 2\napi_version: 3\nrequires_hermes: '>=0.19'\n"
        "requires_plugins: [base, {id: util, version_range: '>=1'}, {nope: 1}]\n"
        "python_dependencies: ['requests>=2', '']\n"
        "config_schema: {endpoint: {type: str, required: true}, retries: {type: weird}, bad: 3}\n"
        "license: MIT\nhomepage: https://example.org\ntags: [a, b]\nemits: [done]\nlistens: ['other:ready']\n"
        "author: {name: Ada, email: ada@example.org}\n",
        default_name="x")
    assert (m.manifest_version, m.api_version, m.requires_hermes) == (2, 3, ">=0.19")
    assert m.requires_plugins == (PluginDependency("base"), PluginDependency("util", ">=1"))
    assert m.python_dependencies == ("requests>=2",)
    assert set(m.config_schema) == {"endpoint", "retries"}
    assert (m.license, m.homepage, m.tags, m.emits, m.listens) == (
        "MIT", "https://example.org", ("a", "b"), ("done",), ("other:ready",))
    assert m.author == "Ada, ada@example.org"
    notes = "\n".join(m.notes)
    assert "requires_plugins entry" in notes and "python_dependencies entry" in notes
    assert "unknown type 'weird'" in notes and "config_schema entry 'bad'" in notes


def test_bad_v2_values_warn_and_never_fail():
    m = parse_manifest("name: x\nmanifest_version: 3\napi_version: soon\nrequires_plugins: base\nzzz: 1\n",
                       default_name="x")
    assert m.manifest_version == 3 and m.api_version is None and m.requires_plugins == ()
    notes = "\n".join(m.notes)
    assert "manifest_version 3 is newer" in notes and "api_version 'soon' is not an integer" in notes
    assert "requires_plugins must be a list" in notes
    assert "unknown manifest fields ignored: zzz" in notes  # a warning for v2+ manifests
    assert parse_manifest("name: x\n", default_name="x").manifest_version == 1


def test_capabilities_are_parsed_tolerantly_like_hermes():
    m = parse_manifest("name: x\ncapabilities: [llm.model_override, made.up, 7, llm.model_override, tools.override]\n",
                       default_name="x")
    assert m.capabilities == ("llm.model_override", "tools.override")
    notes = "\n".join(m.notes)
    assert "unknown capability 'made.up' dropped" in notes and "capability 7 is not a string" in notes
    m = parse_manifest("name: x\ncapabilities: {llm: all}\n", default_name="x")  # before: a ManifestError
    assert m.capabilities == () and "'capabilities' must be a list" in "\n".join(m.notes)


@pytest.mark.parametrize("spec, ok", [
    (">=0.19", True), ("0.21", True), (">=0.22", False), (">=0.19, <0.22", True), ("<0.21", False),
    ("==0.21.3", True), ("!=0.21.3", False), (">0.21.2", True), (">=banana", True), ("", True),
])
def test_version_satisfies(spec, ok):
    assert version_satisfies(spec, HERMES_API_VERSION) is ok


RECORD = "from tests.test_hermes_manifest import ORDER\ndef register(ctx):\n    ORDER.append({name!r})\n"


def _plugin(home, name: str, manifest: dict, code: str | None = None) -> None:
    write_plugin(home / "plugins", name, code or RECORD.format(name=name), {"name": name, **manifest})


def test_requires_hermes_unsatisfied_is_not_loaded_with_the_reason(hermes_home):
    _plugin(hermes_home, "future", {"requires_hermes": ">=0.22"})
    _plugin(hermes_home, "current", {"requires_hermes": ">=0.19,<0.22"})
    configure(hermes_home, enabled=["future", "current"])
    m = PluginManager(hermes_home)
    plugins = by_key(m.list_plugins())
    assert plugins["future"]["status"] == "failed"
    assert plugins["future"]["error"].startswith("requires hermes >=0.22, running 0.21.3")
    assert plugins["current"]["status"] == "enabled"
    assert ORDER == ["current"]  # the refused one was never imported


def test_requires_plugins_orders_the_load(hermes_home):
    _plugin(hermes_home, "a-app", {"requires_plugins": ["z-base"]})
    _plugin(hermes_home, "m-mid", {"requires_plugins": [{"id": "a-app"}]})
    _plugin(hermes_home, "z-base", {})
    configure(hermes_home, enabled=["a-app", "m-mid", "z-base"])
    m = PluginManager(hermes_home)
    m.discover_plugins()
    assert ORDER == ["z-base", "a-app", "m-mid"]
    assert [p["key"] for p in m.list_plugins()] == ["a-app", "m-mid", "z-base"]  # listings keep discovery order


def test_missing_dependency_warns_and_loads_anyway(hermes_home):
    _plugin(hermes_home, "app", {"requires_plugins": ["absent", "off"]})
    _plugin(hermes_home, "off", {})
    configure(hermes_home, enabled=["app"])
    plugins = by_key(PluginManager(hermes_home).list_plugins())
    assert plugins["app"]["status"] == "enabled"
    warnings = "\n".join(plugins["app"]["warnings"])
    assert "requires plugin 'absent', which is not loaded" in warnings and "loading anyway" in warnings
    assert "requires plugin 'off'" in warnings


def test_dependency_cycle_warns_and_keeps_discovery_order(hermes_home, caplog):
    _plugin(hermes_home, "a", {"requires_plugins": ["b"]})
    _plugin(hermes_home, "b", {"requires_plugins": ["a"]})
    configure(hermes_home, enabled=["a", "b"])
    PluginManager(hermes_home).discover_plugins()
    assert ORDER == ["a", "b"]
    assert any("dependency cycle" in r.getMessage() for r in caplog.records)


def test_python_dependencies_are_reported_never_installed(hermes_home):
    _plugin(hermes_home, "deps", {"python_dependencies": ["PyYAML>=5", "surely-not-installed-h16-pkg==1.0"]})
    configure(hermes_home, enabled=["deps"])
    plugin = by_key(PluginManager(hermes_home).list_plugins())["deps"]
    assert plugin["status"] == "enabled"
    assert plugin["python_dependencies"] == ["PyYAML>=5", "surely-not-installed-h16-pkg==1.0"]
    warnings = "\n".join(plugin["warnings"])
    assert "'surely-not-installed-h16-pkg==1.0' is not installed" in warnings and "PyYAML" not in warnings


def test_config_schema_mismatches_warn_and_never_block(hermes_home):
    _plugin(hermes_home, "schema", {"config_schema": {
        "endpoint": {"type": "str", "required": True},
        "retries": {"type": "int"},
        "verbose": {"type": "bool", "required": True, "default": False},
    }})
    configure(hermes_home, enabled=["schema"], plugins={"entries": {"schema": {"settings": {"retries": True}}}})
    plugin = by_key(PluginManager(hermes_home).list_plugins())["schema"]
    assert plugin["status"] == "enabled"
    assert plugin["warnings"] == [
        "plugins.entries.schema.settings.endpoint is required by the plugin's config_schema but is not set",
        "plugins.entries.schema.settings.retries should be int (got bool)",
    ]
    assert plugin["config_schema"]["retries"] == {"type": "int"}


def test_list_plugins_shows_the_v2_metadata(hermes_home):
    _plugin(hermes_home, "meta", {"manifest_version": 2, "api_version": 1, "license": "MIT", "homepage": "https://x.org",
                                  "tags": ["t"], "requires_hermes": ">=0.19", "requires_plugins": ["meta2"]})
    configure(hermes_home, enabled=["meta"])
    plugin = by_key(PluginManager(hermes_home).list_plugins())["meta"]
    assert {k: plugin[k] for k in ("manifest_version", "api_version", "license", "homepage", "tags",
                                   "requires_hermes", "requires_plugins")} == {
        "manifest_version": 2, "api_version": 1, "license": "MIT", "homepage": "https://x.org", "tags": ["t"],
        "requires_hermes": ">=0.19", "requires_plugins": [{"id": "meta2", "version_range": None}]}


def test_the_hermes_version_plugins_see_is_the_one_requires_hermes_is_checked_against():
    from plugin_llm.compat.hermes import hermes_cli
    from plugin_llm.plugins.manifest import HERMES_API_VERSION

    assert hermes_cli.__version__ == HERMES_API_VERSION == "0.21.3"
