"""plugin.yaml parsing: fields, defaults and every way a manifest can be broken."""

from __future__ import annotations

import logging

import pytest
import yaml

from plugin_llm.plugins.manifest import EnvRequirement, ManifestError, load_manifest, parse_manifest


def test_all_fields_parsed():
    m = parse_manifest(
        """
name: weather
version: "2.1"
description: Weather lookups
author: Jane
requires_env:
  - WEATHER_KEY
  - {name: WEATHER_UNITS, description: metric or imperial}
provides_tools: [weather_now]
provides_hooks: [post_tool_call]
kind: general
""",
        default_name="dir-name",
    )
    assert (m.name, m.key, m.version, m.description, m.author, m.kind, m.declared_kind) == (
        "weather", "weather", "2.1", "Weather lookups", "Jane", "standalone", "general")
    assert m.requires_env == (EnvRequirement("WEATHER_KEY"), EnvRequirement("WEATHER_UNITS", "metric or imperial"))
    assert m.required_env_names == ("WEATHER_KEY", "WEATHER_UNITS")
    assert m.provides_tools == ("weather_now",)
    assert m.provides_hooks == ("post_tool_call",)


def test_name_defaults_to_directory_and_category_prefixes_key():
    m = parse_manifest("version: 1.0\n", default_name="openai", category="image_gen")
    assert m.name == "openai"
    assert m.key == "image_gen/openai"
    assert m.version == "1.0"  # a YAML number is kept readable


def test_empty_manifest_is_fine():
    m = parse_manifest("", default_name="bare")
    assert m.key == "bare" and m.version == ""


def test_unknown_fields_tolerated_and_debug_logged(caplog):
    caplog.set_level(logging.DEBUG, logger="plugin_llm.plugins")
    m = parse_manifest("name: x\nflavour: mint\ncolour: green\nlicense: MIT\n", default_name="x")
    assert dict(m.extra) == {"flavour": "mint", "colour": "green"}
    assert m.license == "MIT"  # a Hermes manifest v2 field now
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and "unknown manifest fields" in r.getMessage()]
    assert debug and "flavour" in debug[0].getMessage() and "colour" in debug[0].getMessage()


def test_malformed_yaml_names_file_and_line():
    with pytest.raises(ManifestError) as err:
        parse_manifest("name: x\nversion: [1, 2\n", default_name="x", where="/p/x/plugin.yaml")
    assert "/p/x/plugin.yaml" in str(err.value)
    assert "invalid YAML" in str(err.value) and "line" in str(err.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_non_mapping_rejected(text):
    with pytest.raises(ManifestError, match="must be a mapping"):
        parse_manifest(text, default_name="x")


@pytest.mark.parametrize("name", ["../evil", "a/b", "a\\b", "..", "has:colon", "with space", ""])
def test_names_that_are_not_plain_names_rejected(name):
    with pytest.raises(ManifestError) as err:
        parse_manifest(yaml.safe_dump({"name": name}), default_name="x")
    assert repr(name) in str(err.value) or "non-empty" in str(err.value)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("requires_env: 5\n", "requires_env"),
        ("requires_env: [{description: no name}]\n", "requires_env"),
        ("requires_env: ['NOT VALID']\n", "not a valid environment variable name"),
        ("provides_tools: {a: 1}\n", "provides_tools"),
        ("description: [a]\n", "description"),
        ("version: true\n", "version"),
    ],
)
def test_wrong_field_types_rejected(text, fragment):
    with pytest.raises(ManifestError, match=fragment):
        parse_manifest("name: x\n" + text, default_name="x")


def test_load_manifest_reads_file(tmp_path):
    d = tmp_path / "cat" / "thing"
    d.mkdir(parents=True)
    (d / "plugin.yaml").write_text("description: hi\n", encoding="utf-8")
    m = load_manifest(d / "plugin.yaml", category="cat")
    assert m.key == "cat/thing" and m.description == "hi"


def test_load_manifest_unreadable_is_manifest_error(tmp_path):
    (tmp_path / "plugin.yaml").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ManifestError, match="cannot read manifest"):
        load_manifest(tmp_path / "plugin.yaml")
