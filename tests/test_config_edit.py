"""plugin_llm.config_edit: round-trip edits of config.yaml that keep what the operator wrote."""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path

import pytest
import yaml

from plugin_llm.config_edit import (
    ConfigEditError,
    delete_value,
    edit_config,
    ensure_map,
    get_value,
    list_add,
    list_remove,
    set_value,
)
from plugin_llm.errors import PluginLlmConfigError

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = (REPO / "config_examples" / "config.yaml").read_text(encoding="utf-8")


def write(home: Path, text: str, mode: int | None = None) -> Path:
    path = home / "config.yaml"
    path.write_text(text, encoding="utf-8")
    if mode is not None:
        os.chmod(path, mode)
    return path


def leftovers(home: Path) -> list[str]:
    """Files an edit must never leave behind (temp files)."""
    return sorted(p.name for p in home.iterdir() if p.name.endswith(".tmp"))


def only_added(old: str, new: str) -> list[str]:
    """The lines added by the edit; fails when any line was removed or changed."""
    added, removed = [], []
    for line in difflib.ndiff(old.splitlines(), new.splitlines()):
        if line.startswith("+ "):
            added.append(line[2:])
        elif line.startswith("- "):
            removed.append(line[2:])
    assert removed == [], f"lines changed or removed: {removed}"
    return added


# --------------------------------------------------------------------------- round trip


def test_noop_edit_of_the_example_config_writes_nothing(hermes_home):
    path = write(hermes_home, EXAMPLE)
    before = os.stat(path)
    result = edit_config(hermes_home, lambda doc: None)
    assert result.changed is False and result.backup is None and result.diff == ""
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert not (hermes_home / "config.yaml.bak").exists()


def test_same_value_edit_writes_nothing(hermes_home):
    write(hermes_home, EXAMPLE)
    result = edit_config(hermes_home, lambda doc: (list_add(doc, ("plugins", "enabled"), "tldr"),
                                                   set_value(doc, ("memory", "provider"), "jsonl")))
    assert result.changed is False
    assert not (hermes_home / "config.yaml.bak").exists()


def test_append_keeps_every_comment_and_the_section_comment_in_place(hermes_home):
    path = write(hermes_home, EXAMPLE)
    result = edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "newone"))
    new = path.read_text()
    assert only_added(EXAMPLE, new) == ["    - newone"]
    lines = new.splitlines()
    i = lines.index("    - newone")
    # The new item is the last of the list; the comment that introduces `disabled:` still does.
    assert lines[i - 1].startswith("    - inbox-bridge")
    assert lines[i + 1].startswith("  # Listed here = never loads")
    assert lines[i + 2] == "  disabled:"
    assert result.changed and "+    - newone" in result.diff


def test_remove_last_item_keeps_the_following_comment(hermes_home):
    path = write(hermes_home, EXAMPLE)
    edit_config(hermes_home, lambda doc: list_remove(doc, ("plugins", "enabled"), "inbox-bridge"))
    new = path.read_text()
    assert "inbox-bridge" not in new.split("disabled:")[0]
    assert "  # Listed here = never loads, even when also listed in enabled (disabled wins)." in new
    lines = new.splitlines()
    i = lines.index("  disabled:")
    assert lines[i - 1].startswith("  # Listed here") and lines[i - 2].startswith("    - image_gen/sketch")


def test_remove_middle_item_keeps_the_other_items_comments(hermes_home):
    path = write(hermes_home, EXAMPLE)
    edit_config(hermes_home, lambda doc: list_remove(doc, ("plugins", "enabled"), "workspace"))
    new = path.read_text()
    removed = [ln for ln in difflib.ndiff(EXAMPLE.splitlines(), new.splitlines()) if ln.startswith(("- ", "+ "))]
    assert len(removed) == 1 and removed[0].startswith("-     - workspace")


def test_new_entry_goes_before_the_next_section_header(hermes_home):
    path = write(hermes_home, EXAMPLE)
    edit_config(hermes_home, lambda doc: set_value(
        doc, ("plugins", "entries", "image_gen/openai", "llm", "allow_model_override"), True))
    new = path.read_text()
    assert only_added(EXAMPLE, new) == ["    image_gen/openai:", "      llm:", "        allow_model_override: true"]
    # still inside plugins.entries, and the audit section keeps its header comment right above it
    assert new.index("image_gen/openai:") < new.index("# --- audit:") < new.index("\naudit:")
    data = yaml.safe_load(new)
    assert data["plugins"]["entries"]["image_gen/openai"] == {"llm": {"allow_model_override": True}}


def test_quotes_key_order_and_flow_lists_are_preserved(hermes_home):
    text = (
        "# my settings\n"
        "zeta: 1\n"
        "model:\n"
        '  provider: "openai"   # double quoted\n'
        "  model: 'gpt-4o-mini'\n"
        "plugins:\n"
        "  enabled: [alpha, \"beta\"]\n"
        "alpha_last: true\n"
    )
    path = write(hermes_home, text)
    edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "gamma"))
    new = path.read_text()
    assert new == text.replace('[alpha, "beta"]', '[alpha, "beta", "gamma"]')  # follows the last item's quoting
    edit_config(hermes_home, lambda doc: set_value(doc, ("model", "model"), "gpt-4o"))
    assert "  model: 'gpt-4o'\n" in path.read_text()  # keeps the single quotes it had
    assert list(yaml.safe_load(path.read_text())) == ["zeta", "model", "plugins", "alpha_last"]


@pytest.mark.parametrize(
    "text",
    [
        "plugins:\n    enabled:\n    - a\n    hook_timeout: 5\n",            # 4-space maps, dashes at key level
        "plugins:\n  enabled:\n  - a\n  hook_timeout: 5\n",                # 2-space, dashes at key level
        "plugins:\n    enabled:\n        - a\n    hook_timeout: 5\n",      # 4-space everything
        "plugins:\n  enabled:\n    - a\n  hook_timeout: 5\n",              # the example's style
    ],
)
def test_indentation_is_detected_and_kept(hermes_home, text):
    path = write(hermes_home, text)
    edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "b"))
    new = path.read_text()
    item = next(line for line in text.splitlines() if line.strip() == "- a")
    assert only_added(text, new) == [item.replace("- a", "- b")]


def test_strings_pyyaml_would_misread_are_quoted(hermes_home):
    path = write(hermes_home, "plugins:\n  enabled: []\n")
    values = ["on", "no", "yes", "*", "0755", "null", "1e3", "", "#x", "a: b"]

    def mutate(doc):
        for v in values:
            list_add(doc, ("plugins", "enabled"), v)
        set_value(doc, ("plugins", "entries", "on", "llm", "allowed_models"), ["*"])

    edit_config(hermes_home, mutate)
    data = yaml.safe_load(path.read_text())
    assert data["plugins"]["enabled"] == [v.strip() for v in values]
    assert data["plugins"]["entries"]["on"]["llm"]["allowed_models"] == ["*"]


def test_a_direct_assignment_that_pyyaml_reads_differently_is_refused(hermes_home):
    path = write(hermes_home, "memory:\n  provider: x\n")

    def mutate(doc):
        doc["memory"]["provider"] = "off"  # plain `off` is False for PyYAML (YAML 1.1)

    with pytest.raises(ConfigEditError, match=r"memory\.provider.*nothing was written"):
        edit_config(hermes_home, mutate)
    assert path.read_text() == "memory:\n  provider: x\n"


def test_yaml11_values_already_in_the_file_do_not_block_edits(hermes_home):
    path = write(hermes_home, "audit:\n  required: yes\nplugins:\n  enabled: [a]\n")
    edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "b"))
    assert yaml.safe_load(path.read_text()) == {"audit": {"required": True}, "plugins": {"enabled": ["a", "b"]}}


def test_the_host_reads_the_edited_file(hermes_home):
    from plugin_llm.config import get_config_source

    write(hermes_home, EXAMPLE)
    source = get_config_source(hermes_home)
    assert not source.current().trust_for("tldr").allow_model_override
    edit_config(hermes_home, lambda doc: set_value(doc, ("plugins", "entries", "tldr", "llm", "allow_model_override"), True))
    config = source.current()
    assert config.error is None and config.trust_for("tldr").allow_model_override


# --------------------------------------------------------------------------- safety


def test_backup_holds_the_previous_version_and_the_mode_is_kept(hermes_home):
    path = write(hermes_home, EXAMPLE, mode=0o640)
    result = edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "x"))
    assert result.backup == hermes_home / "config.yaml.bak"
    assert result.backup.read_text() == EXAMPLE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    second = path.read_text()
    edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "y"))
    assert result.backup.read_text() == second  # always the version just replaced
    assert leftovers(hermes_home) == []


def test_a_new_file_is_created_0600_without_backup(hermes_home):
    result = edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "hello-world"))
    path = hermes_home / "config.yaml"
    assert result.changed and result.backup is None and not (hermes_home / "config.yaml.bak").exists()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text() == "plugins:\n  enabled:\n    - hello-world\n"


def test_create_false_refuses_a_missing_file(hermes_home):
    with pytest.raises(ConfigEditError, match="does not exist"):
        edit_config(hermes_home, lambda doc: set_value(doc, ("a",), 1), create=False)
    assert not (hermes_home / "config.yaml").exists()


def test_empty_and_comment_only_files(hermes_home):
    path = write(hermes_home, "")
    edit_config(hermes_home, lambda doc: set_value(doc, ("memory", "provider"), "jsonl"))
    assert yaml.safe_load(path.read_text()) == {"memory": {"provider": "jsonl"}}
    path = write(hermes_home, "# only a comment\n# and another\n")
    edit_config(hermes_home, lambda doc: set_value(doc, ("memory", "provider"), "jsonl"))
    assert path.read_text() == "# only a comment\n# and another\nmemory:\n  provider: jsonl\n"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("plugins:\n  enabled: [a\n", ":3:1:"),                  # unclosed flow list
        ("model:\n  provider: x\n bad: 1\n", ":3:2:"),            # bad indentation
        ("a: 1\na: 2\n", ":2:1:"),                                 # duplicate key (ambiguous to edit)
        ("plugins:\n\tenabled: []\n", ":2:1:"),                    # tab indentation
    ],
)
def test_unparsable_file_is_refused_with_file_line_and_left_alone(hermes_home, text, where):
    path = write(hermes_home, text)
    calls = []
    with pytest.raises(ConfigEditError) as info:
        edit_config(hermes_home, lambda doc: calls.append(doc))
    message = str(info.value)
    assert f"{path}{where}" in message and "nothing was written" in message
    assert calls == [] and path.read_text() == text
    assert not (hermes_home / "config.yaml.bak").exists() and leftovers(hermes_home) == []
    assert isinstance(info.value, PluginLlmConfigError)


def test_a_top_level_list_is_refused(hermes_home):
    write(hermes_home, "- a\n- b\n")
    with pytest.raises(ConfigEditError, match="top level is a list"):
        edit_config(hermes_home, lambda doc: None)


def test_failing_mutate_leaves_the_file_untouched(hermes_home):
    path = write(hermes_home, EXAMPLE)

    def mutate(doc):
        list_add(doc, ("plugins", "enabled"), "half-done")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        edit_config(hermes_home, mutate)
    assert path.read_text() == EXAMPLE
    assert not (hermes_home / "config.yaml.bak").exists() and leftovers(hermes_home) == []


def test_write_error_leaves_the_original_and_no_temp_files(hermes_home, monkeypatch):
    path = write(hermes_home, EXAMPLE)
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst) == path:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(ConfigEditError, match="No space left on device; nothing was written"):
        edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "x"))
    assert path.read_text() == EXAMPLE
    assert leftovers(hermes_home) == []


def test_file_changed_during_the_edit_is_not_overwritten(hermes_home):
    path = write(hermes_home, "plugins:\n  enabled: [a]\n")

    def mutate(doc):
        list_add(doc, ("plugins", "enabled"), "b")
        path.write_text("plugins:\n  enabled: [a, someone-else]\n")  # another editor saved meanwhile

    with pytest.raises(ConfigEditError, match="changed while it was being edited"):
        edit_config(hermes_home, mutate)
    assert "someone-else" in path.read_text()


def test_dry_run_returns_the_diff_and_writes_nothing(hermes_home):
    path = write(hermes_home, EXAMPLE)
    result = edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "disabled"), "tldr"), dry_run=True)
    assert result.changed and result.backup is None
    assert "+    - tldr" in result.diff
    assert path.read_text() == EXAMPLE and not (hermes_home / "config.yaml.bak").exists()


def test_crlf_line_endings_are_kept(hermes_home):
    path = hermes_home / "config.yaml"
    path.write_bytes(b"plugins:\r\n  enabled:\r\n    - a  # first\r\n")
    edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "b"))
    assert path.read_bytes() == b"plugins:\r\n  enabled:\r\n    - a  # first\r\n    - b\r\n"


def test_a_symlinked_config_stays_a_symlink(hermes_home, tmp_path):
    real = tmp_path / "dotfiles" / "hermes-config.yaml"
    real.parent.mkdir()
    real.write_text("plugins:\n  enabled: [a]\n")
    (hermes_home / "config.yaml").symlink_to(real)
    edit_config(hermes_home, lambda doc: list_add(doc, ("plugins", "enabled"), "b"))
    assert (hermes_home / "config.yaml").is_symlink()
    assert real.read_text() == "plugins:\n  enabled: [a, b]\n"
    assert (real.parent / "hermes-config.yaml.bak").read_text() == "plugins:\n  enabled: [a]\n"


# --------------------------------------------------------------------------- helpers


def _doc(text: str):
    from ruamel.yaml import YAML

    return YAML(typ="rt").load(text)


def test_ensure_map_creates_levels_and_refuses_scalars():
    doc = _doc("plugins:\n  entries:\n")
    llm = ensure_map(doc, "plugins", "entries", "image_gen/openai", "llm")
    llm["allow_model_override"] = True
    assert get_value(doc, ("plugins", "entries", "image_gen/openai", "llm", "allow_model_override")) is True
    doc = _doc("plugins: everything\n")
    with pytest.raises(ConfigEditError, match=r"plugins in config.yaml is a string, expected a mapping"):
        ensure_map(doc, "plugins", "enabled")


def test_list_add_and_remove_semantics():
    doc = _doc("plugins:\n  enabled: solo\n  disabled: [a, ' b ', a]\n")
    assert list_add(doc, ("plugins", "enabled"), " solo ") is False     # exact after strip
    assert list_add(doc, ("plugins", "enabled"), "Solo") is True         # case matters
    assert list(doc["plugins"]["enabled"]) == ["solo", "Solo"]            # a lone string became a list
    assert list_remove(doc, ("plugins", "disabled"), "a") is True         # every occurrence
    assert list_remove(doc, ("plugins", "disabled"), "b") is True         # stripped comparison
    assert list(doc["plugins"]["disabled"]) == []
    assert list_remove(doc, ("plugins", "disabled"), "a") is False
    assert list_remove(doc, ("nothing", "here"), "a") is False
    doc = _doc("plugins:\n  enabled: {a: 1}\n")
    with pytest.raises(ConfigEditError, match="plugins.enabled in config.yaml is a mapping, expected a list"):
        list_add(doc, ("plugins", "enabled"), "x")


def test_set_and_delete_value():
    doc = _doc("a:\n  b: 1  # keep me\n  c: 2\n")
    assert set_value(doc, ("a", "b"), 1) is False
    assert set_value(doc, ("a", "b"), True) is True       # True is not 1
    assert set_value(doc, ("a", "d", "e"), ["x"]) is True
    assert delete_value(doc, ("a", "c")) is True
    assert delete_value(doc, ("a", "c")) is False
    assert delete_value(doc, ("zzz", "c")) is False
    import io

    from ruamel.yaml import YAML

    out = io.StringIO()
    YAML(typ="rt").dump(doc, out)
    assert "b: true # keep me" in out.getvalue()  # the comment stays on its line
    assert yaml.safe_load(out.getvalue()) == {"a": {"b": True, "d": {"e": ["x"]}}}
