"""auth.store / auth.authfile / auth.keycmd: resolution order, file rules, key indirection, no leaks."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import pickle
import secrets
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from auth import (
    CredentialStore,
    get_store,
    redact,
)
from plugin_llm.errors import PluginLlmConfigError
from tests.leaks import strings_reachable


def canary(prefix: str = "cnry") -> str:
    return f"{prefix}{secrets.token_hex(16)}"


def write_auth(home: Path, doc, mode: int = 0o600) -> Path:
    """Write auth.json through a rename (new inode: the store always sees the change)."""
    path = home / "auth.json"
    tmp = home / ".auth.json.test-tmp"
    tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return path


def key_script(tmp_path: Path, body: str, name: str = "keycmd.py") -> list[str]:
    script = tmp_path / name
    script.write_text(textwrap.dedent(body), encoding="utf-8")
    return [sys.executable, str(script)]


def assert_nowhere(secret: str, *objects) -> None:
    for obj in objects:
        assert secret not in repr(obj)
        assert secret not in str(obj)
        for s in strings_reachable(obj):
            assert secret not in s, f"secret reachable from {type(obj).__name__}"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


# --------------------------------------------------------------------------- resolution


def test_missing_file_uses_the_providers_usual_env_var(home):
    key = canary()
    store = CredentialStore(home, env={"OPENAI_API_KEY": key})
    cred = store.acquire("openai")
    assert (cred.source, cred.key_id, cred.profile, cred.reveal()) == ("env", "OPENAI_API_KEY", None, key)
    assert redact(f"echo {key}") != f"echo {key}"  # env values are registered with the redactor


def test_litellm_alternative_env_names_and_generic_fallback(home):
    a, b = canary(), canary()
    store = CredentialStore(home, env={"GOOGLE_API_KEY": a, "ACME_AI_API_KEY": b})
    assert store.acquire("gemini").key_id == "GOOGLE_API_KEY"
    assert store.acquire("acme-ai").reveal() == b


def test_no_key_anywhere_is_a_clear_error(home):
    store = CredentialStore(home, env={})
    with pytest.raises(PluginLlmConfigError) as info:
        store.acquire("anthropic")
    msg = str(info.value)
    assert "'anthropic'" in msg and str(home / "auth.json") in msg and "ANTHROPIC_API_KEY" in msg
    assert "plugin-llm auth add anthropic" in msg


@pytest.mark.parametrize("provider", ["local", "custom", "ollama"])
def test_keyless_providers_get_a_none_credential(home, provider):
    cred = CredentialStore(home, env={}).acquire(provider)
    assert cred.source == "none" and cred.reveal() is None
    assert repr(cred) == f"Credential(provider='{provider}', source='none', key='(none)')"


def test_custom_never_borrows_another_providers_env_key(home):
    cred = CredentialStore(home, env={"OPENAI_API_KEY": canary(), "CUSTOM_API_KEY": canary()}).acquire("custom")
    assert cred.source == "none"


def test_auth_json_api_key_beats_env_and_names_are_case_insensitive(home):
    key, env_key = canary(), canary()
    write_auth(home, {"providers": {"OpenAI": {"api_key": key}}})
    store = CredentialStore(home, env={"OPENAI_API_KEY": env_key})
    cred = store.acquire(" openai ")
    assert (cred.source, cred.key_id, cred.reveal()) == ("auth.json", "openai", key)


def test_profile_resolution_order(home):
    work, top, env = canary(), canary(), canary()
    write_auth(home, {
        "providers": {"openai": {"api_key": top}},
        "profiles": {"work": {"openai": {"api_key": work}}, "empty": {}},
    })
    store = CredentialStore(home, env={"OPENAI_API_KEY": env, "ANTHROPIC_API_KEY": env})
    assert store.acquire("openai", "work").reveal() == work  # 1. the profile's entry
    assert store.acquire("openai", "work").profile == "work"
    assert store.acquire("openai", "empty").reveal() == top  # 2. then the top-level entry
    assert store.acquire("anthropic", "work").reveal() == env  # 3. then the environment
    assert store.acquire("openai").reveal() == top  # no default profile: top level
    assert store.acquire("openai", "default").reveal() == top  # "default" is always known


def test_profiles_default_is_the_default_profile(home):
    dflt, top = canary(), canary()
    write_auth(home, {"providers": {"openai": {"api_key": top}},
                      "profiles": {"default": {"openai": {"api_key": dflt}}}})
    store = CredentialStore(home, env={})
    assert store.acquire("openai").reveal() == dflt
    assert store.default_profile == "default"


def test_default_profile_field_selects_the_default(home):
    personal, top = canary(), canary()
    write_auth(home, {"default_profile": "personal", "providers": {"openai": {"api_key": top}},
                      "profiles": {"personal": {"openai": {"api_key": personal}}, "work": {}}})
    store = CredentialStore(home, env={})
    assert store.acquire("openai").reveal() == personal
    assert store.acquire("openai", "work").reveal() == top
    assert store.profiles() == ["personal", "work"]


def test_unknown_profile_is_an_error_never_a_fallback(home):
    top = canary()
    write_auth(home, {"providers": {"openai": {"api_key": top}}, "profiles": {"work": {}}})
    store = CredentialStore(home, env={"OPENAI_API_KEY": canary()})
    with pytest.raises(PluginLlmConfigError) as info:
        store.acquire("openai", "wrok")
    msg = str(info.value)
    assert "'wrok'" in msg and "work" in msg and "never falls back" in msg
    assert top not in msg


def test_key_env_reads_the_variable_at_call_time(home):
    first, second = canary(), canary()
    write_auth(home, {"providers": {"custom": {"key_env": "MY_GATEWAY_KEY"}}})
    env = {"MY_GATEWAY_KEY": first}
    store = CredentialStore(home, env=env)
    cred = store.acquire("custom")
    assert (cred.source, cred.key_id, cred.reveal()) == ("key_env", "MY_GATEWAY_KEY", first)
    assert store.acquire("custom") is cred  # cached while the value is the same
    env["MY_GATEWAY_KEY"] = second
    assert store.acquire("custom").reveal() == second


def test_key_env_unset_is_an_error_naming_the_variable(home):
    write_auth(home, {"profiles": {"work": {"openai": {"key_env": "WORK_OPENAI"}}}})
    store = CredentialStore(home, env={"OPENAI_API_KEY": canary()})
    with pytest.raises(PluginLlmConfigError, match="profiles.work.openai.key_env names the environment variable "
                                                   "WORK_OPENAI, which is not set"):
        store.acquire("openai", "work")


def test_reload_when_the_file_changes(home):
    one, two = canary(), canary()
    write_auth(home, {"providers": {"openai": {"api_key": one}}})
    store = CredentialStore(home, env={})
    assert store.acquire("openai").reveal() == one
    assert store.acquire("openai") is store.acquire("openai")  # cached between changes
    write_auth(home, {"providers": {"openai": {"api_key": two}}})
    assert store.acquire("openai").reveal() == two
    (home / "auth.json").unlink()
    with pytest.raises(PluginLlmConfigError):
        store.acquire("openai")


def test_with_a_check_interval_a_removed_key_stops_working_within_it(home, monkeypatch):
    import auth.store as store_module

    key, other = canary(), canary()
    write_auth(home, {"providers": {"openai": {"api_key": key}}})
    now = [100.0]
    store = CredentialStore(home, env={}, clock=lambda: now[0])
    store.set_check_interval(0.25)
    looks = []
    real = store_module._stat_signature
    monkeypatch.setattr(store_module, "_stat_signature", lambda path: looks.append(path) or real(path))
    assert store.acquire("openai").reveal() == key
    for _ in range(20):
        store.acquire("openai")
    assert len(looks) == 2  # the first load (and its re-check under the lock), then nothing within the interval
    write_auth(home, {"providers": {"openai": {"api_key": other}}})
    now[0] += 0.25
    assert store.acquire("openai").reveal() == other  # a changed key: in use after the interval
    (home / "auth.json").unlink()
    now[0] += 0.125
    assert store.acquire("openai").reveal() == other  # within the interval
    now[0] += 0.125
    with pytest.raises(PluginLlmConfigError):  # removed: no key for openai any more
        store.acquire("openai")


def test_get_store_is_one_per_home(home, monkeypatch):
    monkeypatch.chdir(home.parent)
    assert get_store(home) is get_store(str(home)) is get_store(Path(home.name))
    assert get_store(home) is not get_store(home.parent)


# --------------------------------------------------------------------------- file rules


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_group_or_world_accessible_file_is_refused(home, mode):
    key = canary()
    path = write_auth(home, {"providers": {"openai": {"api_key": key}}}, mode=mode)
    store = CredentialStore(home, env={"OPENAI_API_KEY": canary()})
    with pytest.raises(PluginLlmConfigError) as info:
        store.acquire("openai")
    msg = str(info.value)
    assert str(path) in msg and f"chmod 600 {path}" in msg and key not in msg
    os.chmod(path, 0o600)  # the fix applies to the very next call (ctime/mode are in the change check)
    assert store.acquire("openai").reveal() == key


BAD_FILES = [
    ('{"providers": {"openai": {"api_key": "K"}', "invalid JSON at line 1, column", None),
    ('{"providers": \n {"openai": {"api_key": "K",}}}', "invalid JSON at line 2, column", None),
    ('["K"]', "top level must be a JSON object", None),
    ('{"providers": {"openai": {"api_key": "K"}}, "provders": {}}', "unknown top-level field", "'providers'"),
    ('{"providers": ["K"]}', "providers: must be an object", None),
    ('{"providers": {"openai": "K"}}', "providers.openai: must be an object", None),
    ('{"providers": {"openai": {}}}', "providers.openai: has no key source", "exactly one of"),
    ('{"providers": {"openai": {"api_key": "K", "key_env": "X"}}}', "providers.openai: has several key sources",
     "exactly one of"),
    ('{"providers": {"openai": {"apikey": "K"}}}', "providers.openai.apikey: unknown field", "'api_key'"),
    ('{"providers": {"openai": {"api_key": 12345}}}', "providers.openai.api_key: must be a string", None),
    ('{"providers": {"openai": {"api_key": "  "}}}', "providers.openai.api_key: is empty", None),
    ('{"providers": {"openai": {"api_key": "K\\nK"}}}', "contains whitespace", None),
    ('{"providers": {"openrouter": {"keys": "K"}}}', "providers.openrouter.keys: must be a list", None),
    ('{"providers": {"openrouter": {"keys": []}}}', "providers.openrouter.keys: is empty", None),
    ('{"providers": {"openrouter": {"keys": ["K", 5]}}}', "providers.openrouter.keys[1]: must be a string", None),
    ('{"providers": {"openrouter": {"keys": ["K", "K"]}}}', "providers.openrouter.keys[1]: duplicates keys[0]",
     None),
    ('{"providers": {"custom": {"key_env": "not a name"}}}', "providers.custom.key_env: must name", None),
    ('{"providers": {"custom": {"key_cmd": 5}}}', "providers.custom.key_cmd: must be a list", None),
    ('{"providers": {"custom": {"key_cmd": []}}}', "providers.custom.key_cmd: is empty", None),
    ('{"providers": {"custom": {"key_cmd": "pass \\"unclosed"}}}', "cannot be split", None),
    ('{"providers": {"openai": {"api_key": "K"}, "OPENAI": {"api_key": "K"}}}', "duplicates providers.openai",
     None),
    ('{"providers": {"openai": {"api_key": "K"}, "openai": {"api_key": "K"}}}', "appears twice", None),
    ('{"profiles": ["work"]}', "profiles: must be an object", None),
    ('{"profiles": {"work": {"openai": {"keys": ["K"], "api_key": "K"}}}}', "profiles.work.openai: has several",
     None),
    ('{"profiles": {"bad name": {}}}', "is not a profile name", None),
    ('{"default_profile": "work", "profiles": {}}', "default_profile: names the unknown profile 'work'", None),
    ('{"default_profile": 3}', "default_profile: must be a string", None),
]


@pytest.mark.parametrize("text, problem, hint", BAD_FILES)
def test_malformed_files_are_clear_errors_with_no_partial_load(home, text, problem, hint):
    key = canary()
    path = write_auth(home, text.replace('"K"', json.dumps(key)))
    # A valid env key exists: a broken file must still fail closed, never fall through to it.
    store = CredentialStore(home, env={"OPENAI_API_KEY": canary(), "OPENROUTER_API_KEY": canary()})
    for provider in ("openai", "openrouter", "custom"):
        with pytest.raises(PluginLlmConfigError) as info:
            store.acquire(provider)
        msg = str(info.value)
        assert msg.startswith(str(path)) and problem in msg
        assert key not in msg and key not in repr(info.value)
        if hint:
            assert hint in msg


def test_invalid_utf8_is_reported(home):
    path = home / "auth.json"
    path.write_bytes(b'{"providers": {"openai": {"api_key": "\xff\xfe"}}}')
    os.chmod(path, 0o600)
    with pytest.raises(PluginLlmConfigError, match="not valid UTF-8"):
        CredentialStore(home, env={}).acquire("openai")


def test_underscore_fields_are_comments(home):
    key = canary()
    write_auth(home, {"_comment": "x", "providers": {"_note": "y", "openai": {"_why": "z", "api_key": key}},
                      "profiles": {"_c": 1}})
    assert CredentialStore(home, env={}).acquire("openai").reveal() == key


def test_broken_file_fails_closed_until_fixed(home):
    good = canary()
    write_auth(home, {"providers": {"openai": {"api_key": good}}})
    store = CredentialStore(home, env={"ANTHROPIC_API_KEY": canary()})
    assert store.acquire("openai").reveal() == good
    write_auth(home, '{"providers": {"openai": {"api_key": ')
    for provider in ("openai", "anthropic"):  # no stale key, no env fallback
        with pytest.raises(PluginLlmConfigError, match="invalid JSON"):
            store.acquire(provider)
    write_auth(home, {"providers": {"openai": {"api_key": good}}})
    assert store.acquire("openai").reveal() == good


# --------------------------------------------------------------------------- key_cmd


def test_key_cmd_output_is_the_key_run_once_per_file_version(home, tmp_path):
    key = canary()
    counter = tmp_path / "runs"
    argv = key_script(tmp_path, f"""
        import pathlib
        p = pathlib.Path({str(counter)!r})
        p.write_text(str(int(p.read_text()) + 1) if p.exists() else "1")
        print("  {key}  ")
    """)
    write_auth(home, {"profiles": {"work": {"anthropic": {"key_cmd": argv}}}})
    store = CredentialStore(home, env={})
    cred = store.acquire("anthropic", "work")
    assert (cred.source, cred.key_id, cred.reveal()) == ("key_cmd", "work:anthropic", key)
    assert store.acquire("anthropic", "work") is cred
    assert counter.read_text() == "1"
    assert key not in redact(f"leak {key}")
    write_auth(home, {"profiles": {"work": {"anthropic": {"key_cmd": argv}}}, "_touched": True})
    store.acquire("anthropic", "work")
    assert counter.read_text() == "2"


def test_key_cmd_string_form_is_split_without_a_shell(home, tmp_path):
    key = canary()
    argv = key_script(tmp_path, "import sys; print(sys.argv[1] + '|' + sys.argv[2])")
    cmd = f"{argv[0]} {argv[1]} '{key};$HOME' \"`id`\""
    write_auth(home, {"providers": {"custom": {"key_cmd": cmd}}})
    cred = CredentialStore(home, env={}).acquire("custom")
    assert cred.reveal() == f"{key};$HOME|`id`"  # split like a shell, but nothing expanded or run


@pytest.mark.parametrize(
    "body, problem",
    [
        ("import sys; print({k!r}); print({k!r}, file=sys.stderr); sys.exit(3)", "exited with status 3"),
        ("import sys; sys.stdout.write(''); print({k!r}, file=sys.stderr)", "printed nothing"),
        ("print({k!r}); print('second line {k}')", "more than one line"),
        ("import sys; sys.stdout.buffer.write(b'\\xff' + {k!r}.encode())", "not UTF-8"),
    ],
)
def test_key_cmd_failures_never_show_the_output(home, tmp_path, body, problem):
    secret = canary()
    argv = key_script(tmp_path, body.format(k=secret))
    write_auth(home, {"providers": {"openai": {"key_cmd": argv}}})
    store = CredentialStore(home, env={"OPENAI_API_KEY": canary()})
    with pytest.raises(PluginLlmConfigError) as info:
        store.acquire("openai")
    msg = str(info.value)
    assert problem in msg and "providers.openai" in msg
    assert secret not in msg and secret not in repr(info.value)
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


@pytest.mark.slow
def test_key_cmd_timeout_kills_it(home, tmp_path):
    secret = canary()
    argv = key_script(tmp_path, f"import time; print({secret!r}, flush=True); time.sleep(30)")
    write_auth(home, {"providers": {"openai": {"key_cmd": argv}}})
    store = CredentialStore(home, env={}, key_cmd_timeout=0.5)
    with pytest.raises(PluginLlmConfigError) as info:
        store.acquire("openai")
    assert "did not finish within 0.5 s" in str(info.value) and secret not in str(info.value)


def test_key_cmd_not_found(home, tmp_path):
    write_auth(home, {"providers": {"openai": {"key_cmd": [str(tmp_path / "no-such-helper")]}}})
    with pytest.raises(PluginLlmConfigError, match="command not found"):
        CredentialStore(home, env={}).acquire("openai")


def test_key_cmd_runs_once_under_concurrency(home, tmp_path):
    key = canary()
    counter = tmp_path / "runs"
    argv = key_script(tmp_path, f"""
        import pathlib, time
        time.sleep(0.2)
        p = pathlib.Path({str(counter)!r})
        p.write_text(p.read_text() + "x" if p.exists() else "x")
        print({key!r})
    """)
    write_auth(home, {"providers": {"openai": {"key_cmd": argv}}})
    store = CredentialStore(home, env={})
    results = []
    threads = [threading.Thread(target=lambda: results.append(store.acquire("openai").reveal())) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [key] * 6 and counter.read_text() == "x"


def test_aacquire_resolves_key_cmd_and_profiles(home, tmp_path):
    key = canary()
    write_auth(home, {"providers": {"openai": {"key_cmd": key_script(tmp_path, f"print({key!r})")}},
                      "profiles": {"p": {"openai": {"api_key": canary()}}}})
    store = CredentialStore(home, env={})

    async def main():
        loop_thread = threading.get_ident()
        first = await store.aacquire("openai")
        assert threading.get_ident() == loop_thread
        return first, await store.aacquire("openai", "p")

    first, second = asyncio.run(main())
    assert first.reveal() == key and second.profile == "p"


# --------------------------------------------------------------------------- no leaks


def test_credentials_and_store_never_expose_a_key(home, tmp_path):
    file_key, pool_key, env_key, cmd_key, kenv_key = (canary() for _ in range(5))
    write_auth(home, {
        "providers": {"openai": {"api_key": file_key}, "openrouter": {"keys": [pool_key, canary()]},
                      "custom": {"key_env": "GW_KEY"}},
        "profiles": {"work": {"anthropic": {"key_cmd": key_script(tmp_path, f"print({cmd_key!r})")}}},
    })
    store = CredentialStore(home, env={"GW_KEY": kenv_key, "GROQ_API_KEY": env_key})
    creds = [store.acquire("openai"), store.acquire("openrouter"), store.acquire("custom"),
             store.acquire("anthropic", "work"), store.acquire("groq")]
    assert [c.reveal() for c in creds] == [file_key, pool_key, kenv_key, cmd_key, env_key]
    rows = store.describe()
    for secret in (file_key, pool_key, env_key, cmd_key, kenv_key):
        assert_nowhere(secret, store, rows, *creds)
        assert secret not in json.dumps(rows)
        for cred in creds:
            assert secret not in json.dumps(dataclasses.asdict(cred), default=repr)
    assert repr(creds[0]) == f"Credential(provider='openai', source='auth.json', key='…{file_key[-4:]}')"
    assert str(creds[3]) == f"Credential(provider='anthropic', profile='work', source='key_cmd', key='…{cmd_key[-4:]}')"


def test_credentials_cannot_be_pickled_but_copy_fine(home):
    key = canary()
    cred = CredentialStore(home, env={"OPENAI_API_KEY": key}).acquire("openai")
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(cred)
    assert copy.deepcopy(cred).reveal() == key and copy.copy(cred).reveal() == key


def test_describe_lists_sources_without_running_commands(home, tmp_path):
    marker = tmp_path / "ran"
    write_auth(home, {
        "providers": {"openai": {"api_key": "sk-abcdefghijklmnop1234"}, "custom": {"key_env": "UNSET_VAR"},
                      "mistral": {"key_cmd": key_script(tmp_path, f"open({str(marker)!r}, 'w'); print('k' * 20)")}},
        "profiles": {"work": {}},
    })
    rows = {(r["provider"], r["profile"]): r for r in CredentialStore(home, env={"GROQ_API_KEY": canary()}).describe()}
    assert rows[("openai", None)]["key"] == "sk-…1234"
    assert rows[("custom", None)]["health"] == "unset"
    assert rows[("mistral", None)]["key"] == "(not run yet)" and not marker.exists()
    assert rows[("groq", None)]["source"] == "env"
    assert rows[(None, "work")]["source"] == "empty"
