"""``auth.json``: read it safely, validate it completely, write it atomically.

Shape: ``{"default_profile": "work", "providers": {"openai": {"api_key": "sk-..."}},
"profiles": {"work": {"openai": {"keys": ["sk-1", "sk-2"]}}}}``. A provider entry holds exactly one
of ``api_key`` (a string), ``keys`` (a non-empty list of strings: a pool), ``key_env`` (an
environment variable name) or ``key_cmd`` (argv list, or a string split with :func:`shlex.split`;
run without a shell). Keys starting with ``_`` are ignored anywhere (``"_comment": "..."``).
Anything else is an error.

Every problem raises :class:`~plugin_llm.errors.PluginLlmConfigError` naming the file, the JSON
path and the fix, never quoting a secret. Loading is all or nothing: a file with one bad entry
yields no credentials at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from plugin_llm.errors import PluginLlmConfigError
from plugin_llm.hardened.safe_files import read_home_file
from plugin_llm.hardened.safe_json import loads_bounded

from ._secret import SecretRef
from .providers import normalize_provider

__all__ = [
    "AUTH_FILE_NAME",
    "ENTRY_KINDS",
    "EntrySpec",
    "AuthSpec",
    "FileSignature",
    "parse_auth",
    "load_auth",
    "read_document",
    "write_document",
    "locked",
    "signature_of",
]

AUTH_FILE_NAME = "auth.json"
ENTRY_KINDS = ("api_key", "keys", "key_env", "key_cmd")
_TOP_LEVEL_KEYS = ("providers", "profiles", "default_profile")
_MAX_BYTES = 1 << 20

_PROVIDER_RE = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
_PROFILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BAD_KEY_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")

#: (st_ino, st_dev, st_size, st_mtime_ns, st_ctime_ns, st_mode): changes when the
#: file is rewritten, replaced or chmod-ed. ``None``: the file does not exist.
FileSignature = tuple[int, int, int, int, int, int] | None


def signature_of(st: os.stat_result) -> tuple[int, int, int, int, int, int]:
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


@dataclass(frozen=True)
class EntrySpec:
    """One validated provider entry. Secrets are held as :class:`SecretRef`."""

    provider: str
    profile: str | None  # None: the top-level ``providers`` table
    kind: str  # one of ENTRY_KINDS
    where: str  # JSON path for messages: "providers.openai", "profiles.work.openai"
    secrets: tuple[SecretRef, ...] = ()  # api_key: one; keys: the pool
    env_var: str | None = None  # key_env
    argv: tuple[str, ...] = ()  # key_cmd


@dataclass(frozen=True)
class AuthSpec:
    """A fully validated ``auth.json`` (empty when the file does not exist)."""

    path: Path
    providers: Mapping[str, EntrySpec] = field(default_factory=dict)
    profiles: Mapping[str, Mapping[str, EntrySpec]] = field(default_factory=dict)
    default_profile: str | None = None


def _error(path: Path, where: str, problem: str, fix: str = "") -> PluginLlmConfigError:
    location = f"{path}: {where}: " if where else f"{path}: "
    return PluginLlmConfigError(location + problem + (f" ({fix})" if fix else ""))


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _did_you_mean(word: str, choices: tuple[str, ...] | list[str]) -> str:
    import difflib  # error path only

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else "allowed: " + ", ".join(choices)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _decode(raw: bytes, path: Path) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _error(path, "", f"not valid UTF-8 (byte offset {exc.start})", "save the file as UTF-8") from None
    try:  # nesting is checked first: a deep [[[[...]]]] is an error here, not a RecursionError
        doc = loads_bounded(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise _error(path, "", f"the key {exc.key!r} appears twice in one object", "keep one of them") from None
    except json.JSONDecodeError as exc:
        # exc.msg never quotes the document, so no secret can leak through it.
        raise _error(path, "", f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise _error(path, "", f"the top level must be a JSON object, not {_type_name(doc)}")
    return doc


def _check_key_string(value: Any, path: Path, where: str) -> str:
    if not isinstance(value, str):
        raise _error(path, where, f"must be a string, not {_type_name(value)}")
    value = value.strip()
    if not value:
        raise _error(path, where, "is empty")
    if _BAD_KEY_CHARS.search(value):
        raise _error(path, where, "contains whitespace or control characters (a pasted key with a line break?)")
    return value


def _parse_entry(raw: Any, provider: str, profile: str | None, where: str, path: Path) -> EntrySpec:
    if not isinstance(raw, dict):
        raise _error(path, where, f"must be an object like {{\"api_key\": \"...\"}}, not {_type_name(raw)}")
    fields = [k for k in raw if not k.startswith("_")]
    for name in fields:
        if name not in ENTRY_KINDS:
            raise _error(path, f"{where}.{name}", "unknown field", _did_you_mean(name, ENTRY_KINDS))
    if len(fields) != 1:
        problem = ("has no key source" if not fields else "has several key sources (" + ", ".join(fields) + ")")
        raise _error(path, where, problem, "give exactly one of api_key, keys, key_env, key_cmd")
    kind = fields[0]
    value = raw[kind]
    at = f"{where}.{kind}"
    if kind == "api_key":
        return EntrySpec(provider, profile, kind, where, secrets=(SecretRef(_check_key_string(value, path, at)),))
    if kind == "keys":
        if not isinstance(value, list):
            raise _error(path, at, f"must be a list of keys, not {_type_name(value)}")
        if not value:
            raise _error(path, at, "is empty", "list at least one key, or remove the entry")
        seen: dict[str, int] = {}
        refs = []
        for i, item in enumerate(value):
            key = _check_key_string(item, path, f"{at}[{i}]")
            if key in seen:
                raise _error(path, f"{at}[{i}]", f"duplicates {kind}[{seen[key]}]", "list each key once")
            seen[key] = i
            refs.append(SecretRef(key))
        return EntrySpec(provider, profile, kind, where, secrets=tuple(refs))
    if kind == "key_env":
        if not isinstance(value, str) or not _ENV_NAME_RE.match(value.strip()):
            shown = _type_name(value) if not isinstance(value, str) else "not a valid variable name"
            raise _error(path, at, f"must name an environment variable (like MY_API_KEY): {shown}")
        return EntrySpec(provider, profile, kind, where, env_var=value.strip())
    # key_cmd
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise _error(path, at, f"cannot be split into arguments: {exc}", "or give it as a list") from None
    elif isinstance(value, list) and all(isinstance(a, str) for a in value):
        argv = list(value)
    else:
        raise _error(path, at, f"must be a list of arguments or a command string, not {_type_name(value)}")
    if not argv or not argv[0].strip():
        raise _error(path, at, "is empty", 'give the command, e.g. ["pass", "show", "openai"]')
    return EntrySpec(provider, profile, kind, where, argv=tuple(argv))


def _parse_provider_table(raw: Any, profile: str | None, where: str, path: Path) -> dict[str, EntrySpec]:
    if not isinstance(raw, dict):
        raise _error(path, where, f"must be an object mapping provider names to entries, not {_type_name(raw)}")
    table: dict[str, EntrySpec] = {}
    for name, entry in raw.items():
        if name.startswith("_"):
            continue
        provider = normalize_provider(name)
        at = f"{where}.{name}"
        if not _PROVIDER_RE.match(provider):
            raise _error(path, at, "is not a provider name (letters, digits, '_', '-', '.')")
        if provider in table:
            raise _error(path, at, f"duplicates {where}.{table[provider].provider} (names are case-insensitive)")
        table[provider] = _parse_entry(entry, provider, profile, at, path)
    return table


def parse_auth(raw: bytes | str, path: Path) -> AuthSpec:
    """Validate the bytes of an ``auth.json``; all or nothing."""
    doc = _decode(raw.encode() if isinstance(raw, str) else raw, path)
    return _spec_from_document(doc, path)


def _spec_from_document(doc: dict[str, Any], path: Path) -> AuthSpec:
    for name in doc:
        if not name.startswith("_") and name not in _TOP_LEVEL_KEYS:
            raise _error(path, name, "unknown top-level field", _did_you_mean(name, _TOP_LEVEL_KEYS))
    providers = _parse_provider_table(doc.get("providers", {}), None, "providers", path)
    raw_profiles = doc.get("profiles", {})
    if not isinstance(raw_profiles, dict):
        raise _error(path, "profiles", f"must be an object mapping profile names to providers, not "
                     f"{_type_name(raw_profiles)}")
    profiles: dict[str, dict[str, EntrySpec]] = {}
    for name, table in raw_profiles.items():
        if name.startswith("_"):
            continue
        if not _PROFILE_RE.match(name):
            raise _error(path, f"profiles.{name}", "is not a profile name (letters, digits, '_', '-', '.')")
        profiles[name] = _parse_provider_table(table, name, f"profiles.{name}", path)
    default = doc.get("default_profile")
    if default is not None:
        if not isinstance(default, str):
            raise _error(path, "default_profile", f"must be a string, not {_type_name(default)}")
        if default not in profiles and default != "default":
            known = ", ".join(sorted(profiles)) or "none defined"
            raise _error(path, "default_profile", f"names the unknown profile {default!r} (profiles: {known})")
    return AuthSpec(path=path, providers=providers, profiles=profiles, default_profile=default)


def _check_mode(st: os.stat_result, path: Path) -> None:
    if os.name == "posix" and st.st_mode & 0o077:
        raise PluginLlmConfigError(
            f"{path} is readable or writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"refusing to use the credentials in it. Fix: chmod 600 {shlex.quote(str(path))}"
        )


def _read(path: Path) -> tuple[bytes, os.stat_result] | None:
    """The file's bytes and the ``fstat`` of what was read; None when it does not exist.

    A FIFO, a directory or a device in its place is refused before it is
    opened for reading (never a hang), the 0600 rule is checked on the opened
    descriptor before anything is read, and the size is bounded.
    """
    got = read_home_file(path, max_bytes=_MAX_BYTES, check=_check_mode)
    return (got.data, got.stat) if got is not None else None


def load_auth(path: Path) -> tuple[AuthSpec, FileSignature]:
    """Read, permission-check and validate ``path``; a missing file is an empty spec."""
    got = _read(path)
    if got is None:
        return AuthSpec(path=path), None
    raw, st = got
    return parse_auth(raw, path), signature_of(st)


def read_document(path: Path) -> dict[str, Any]:
    """The raw JSON object of ``path`` for editing (``{}`` if missing), validated first.

    Refuses (like the store) a group/world-readable or invalid file, so the CLI
    never rewrites a file it could not have used.
    """
    got = _read(path)
    if got is None:
        return {}
    doc = _decode(got[0], path)
    _spec_from_document(doc, path)
    return doc


def write_document(path: Path, doc: Mapping[str, Any]) -> None:
    """Atomically replace ``path`` with ``doc``: 0600 temp file in the same directory, fsync, rename.

    The document is validated first; an invalid one is never written.
    """
    from plugin_llm.hardened.atomic_write import write_atomic  # CLI write path only

    _spec_from_document(dict(doc), path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    write_atomic(path, data, sync_dir=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialise read-modify-write cycles on ``path`` across processes (``flock``)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: best effort
        yield
        return
    fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
