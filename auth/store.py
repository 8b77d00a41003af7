"""The credential store: Route + profile -> :class:`Credential`.

Resolution order for ``acquire(provider, profile)``: the profile's entry
(``profiles.<profile>.<provider>``; ``profile=None`` means ``default_profile``, else
``profiles.default``, else none; an undefined profile raises, never a silent fallback; ``"default"``
always means the top-level providers), then ``providers.<provider>``, then the provider's usual
environment variable (:mod:`auth.providers`); keyless providers get a ``Credential`` with
``source="none"``, everyone else a :class:`~plugin_llm.errors.PluginLlmConfigError` saying where
it looked and how to fix it.

``auth.json`` is re-read only when its stat changes (looked at on every call, or at most once per
``check_interval``); a broken file fails closed (every ``acquire`` raises until it is fixed). Pools (``keys: [...]``) hand out keys round-robin among healthy ones; a
401, 402 or 429 cools a key down; when all cool, :class:`PoolExhaustedError` (retryable, with
``retry_after``). Pool state is per home (:func:`get_store`), shared by every ``PluginLlm`` of the
process, under one lock never held across I/O (safe for asyncio tasks too).
"""

from __future__ import annotations

import math
import os
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from plugin_llm.errors import PluginLlmConfigError, PluginLlmProviderError

from ._secret import SecretRef
from .authfile import AUTH_FILE_NAME, AuthSpec, EntrySpec, FileSignature, load_auth, signature_of
from .keycmd import DEFAULT_KEY_CMD_TIMEOUT, run_key_cmd
from .providers import ENV_VARS, KEYLESS_PROVIDERS, env_vars_for, normalize_provider
from .redaction import mask, redact, register_secret

__all__ = [
    "Credential",
    "CredentialStore",
    "PoolExhaustedError",
    "get_store",
    "COOLING_STATUSES",
]

#: HTTP statuses that cool a pool key down.
COOLING_STATUSES = frozenset({401, 402, 429})

_SOURCE_OF_KIND = {"api_key": "auth.json", "keys": "pool", "key_env": "key_env", "key_cmd": "key_cmd"}


@dataclass(frozen=True, repr=False)
class Credential:
    """The key for one provider call, as handed to the transport.

    ``source`` is one of ``"auth.json"``, ``"pool"``, ``"key_env"``,
    ``"key_cmd"``, ``"env"``, ``"none"``. ``key_id`` is a stable, non-secret
    name of the key (``"openai"``, ``"work:openrouter#1"``, ``"OPENAI_API_KEY"``)
    fit for audit lines. ``profile`` is the profile whose entry supplied the key
    (None for top-level entries, environment variables and ``none``).

    The key itself is not a field: ``repr``/``str``/``vars``/``asdict`` never
    show it and pickling fails. Only the transport calls :meth:`reveal`.
    """

    provider: str
    profile: str | None
    source: str
    key_id: str
    _ref: SecretRef | None = field(default=None)

    def reveal(self) -> str | None:
        """The secret key, or None for ``source="none"``."""
        return self._ref.get() if self._ref is not None else None

    @property
    def masked(self) -> str:
        """``sk-…abcd``: safe to print."""
        return mask(self.reveal()) if self._ref is not None else "(none)"

    def __repr__(self) -> str:
        profile = f", profile={self.profile!r}" if self.profile is not None else ""
        return f"Credential(provider={self.provider!r}{profile}, source={self.source!r}, key={self.masked!r})"

    __str__ = __repr__


class PoolExhaustedError(PluginLlmProviderError):
    """Every key of a pool is cooling down after 401/402/429 responses.

    A :class:`~plugin_llm.errors.PluginLlmProviderError` with
    ``retryable=True``: the condition is transient. ``retry_after`` is the
    number of seconds until the first key is healthy again; ``keys`` the pool
    size. ``status`` is None (no request was sent for this attempt).
    """

    def __init__(self, message: str, *, provider: str, retry_after: float, keys: int) -> None:
        super().__init__(message, status=None, provider=provider, retryable=True)
        self.retry_after = retry_after
        self.keys = keys


class _NeedsIO(Exception):
    """Internal: resolution must run a key_cmd (aacquire moves it to a thread)."""


@dataclass
class _KeyState:
    """Health of one pool key. Mutated only under the store's lock."""

    ref: SecretRef
    cooling_until: float = 0.0
    streak: int = 0


@dataclass
class _Pool:
    where: str
    states: list[_KeyState]
    creds: list[Credential]
    next: int = 0


@dataclass
class _Loaded:
    """One generation of ``auth.json``: what a given file signature resolved to."""

    sig: Any
    error: str | None = None  # fail closed: acquire raises this until the file changes
    spec: AuthSpec | None = None
    default_profile: str | None = None
    fixed: dict[str, Credential] = field(default_factory=dict)  # api_key entries, by JSON path
    pools: dict[str, _Pool] = field(default_factory=dict)  # keys entries, by JSON path
    states: dict[SecretRef, _KeyState] = field(default_factory=dict)  # every pool key
    commands: dict[str, Credential] = field(default_factory=dict)  # key_cmd results (lazily)
    command_locks: dict[str, threading.Lock] = field(default_factory=dict)


def _entry_key_id(entry: EntrySpec) -> str:
    return entry.provider if entry.profile is None else f"{entry.profile}:{entry.provider}"


def _stat_signature(path: Path) -> FileSignature | tuple[str, int]:
    try:
        return signature_of(os.stat(path))
    except FileNotFoundError:
        return None
    except OSError as exc:  # e.g. an unreadable home directory: fail closed, retry on the next call
        return ("error", exc.errno or 0)


class CredentialStore:
    """Credentials of one home directory. Use :func:`get_store` to share one per process.

    ``env`` replaces ``os.environ`` (tests); ``clock`` is a monotonic clock in
    seconds (tests inject a fake one). Cooldowns: a 429 with ``Retry-After``
    cools the key for exactly that long (capped at ``cooldown_cap``); otherwise
    the n-th consecutive failure of a key cools it for ``base * 2**(n-1)``
    seconds, capped, with ``base`` = ``cooldown_base`` (1 s) for 429 and
    ``auth_cooldown_base`` (30 s) for 401/402, which rarely heal by themselves.
    """

    def __init__(
        self,
        home: Path | str,
        *,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        key_cmd_timeout: float = DEFAULT_KEY_CMD_TIMEOUT,
        cooldown_base: float = 1.0,
        auth_cooldown_base: float = 30.0,
        cooldown_cap: float = 300.0,
    ) -> None:
        self.home = Path(home)
        self.path = self.home / AUTH_FILE_NAME
        environ = os.environ if env is None else env
        # A closure, not an attribute: the environment holds secrets and must
        # not show up in vars() of the store.
        self._getenv: Callable[[str], str | None] = lambda name: environ.get(name)
        self._clock = clock
        self._key_cmd_timeout = key_cmd_timeout
        self._cooldown_base = cooldown_base
        self._auth_cooldown_base = auth_cooldown_base
        self._cooldown_cap = cooldown_cap
        self._lock = threading.Lock()  # pool state and caches; never held across I/O
        self._load_lock = threading.Lock()  # serialises re-reads of auth.json
        self._loaded: _Loaded | None = None
        self.check_interval = 0.0
        self._checked_at = 0.0
        self._env_creds: dict[tuple[str, str, str | None, str], Credential] = {}
        self._none_creds: dict[str, Credential] = {}

    def __repr__(self) -> str:
        return f"CredentialStore(home={str(self.home)!r})"

    def set_check_interval(self, seconds: float) -> None:
        """Look at ``auth.json`` at most once per ``seconds`` of ``clock`` (0: on every call): a changed or
        removed key takes effect within that long."""
        self.check_interval = max(0.0, float(seconds))

    # ------------------------------------------------------------------ load

    def _current(self) -> _Loaded:
        loaded = self._loaded
        if self.check_interval:
            now = self._clock()
            if loaded is not None and now - self._checked_at < self.check_interval:
                if loaded.error is not None:
                    raise PluginLlmConfigError(loaded.error)
                return loaded
            self._checked_at = now
        sig = _stat_signature(self.path)
        if loaded is None or loaded.sig != sig:
            loaded = self._reload()
        if loaded.error is not None:
            raise PluginLlmConfigError(loaded.error)
        return loaded

    def _reload(self) -> _Loaded:
        with self._load_lock:
            sig = _stat_signature(self.path)
            loaded = self._loaded
            if loaded is not None and loaded.sig == sig:
                return loaded  # another thread just did it
            if isinstance(sig, tuple) and sig and sig[0] == "error":
                new = _Loaded(sig=sig, error=f"{self.path}: cannot check the file (errno {sig[1]})")
            else:
                try:
                    spec, read_sig = load_auth(self.path)
                except PluginLlmConfigError as exc:
                    new = _Loaded(sig=sig, error=str(exc))
                else:
                    new = self._build(spec, read_sig, loaded)
            with self._lock:
                self._loaded = new
            return new

    def _build(self, spec: AuthSpec, sig: FileSignature, old: _Loaded | None) -> _Loaded:
        """Index a validated spec; carry pool health over for keys that did not change."""
        new = _Loaded(sig=sig, spec=spec)
        default = spec.default_profile
        if default is None and "default" in spec.profiles:
            default = "default"
        new.default_profile = default if default in spec.profiles else None
        tables = [spec.providers, *spec.profiles.values()]
        with self._lock:  # old pool states are read under the lock that guards them
            for table in tables:
                for entry in table.values():
                    for ref in entry.secrets:
                        register_secret(ref.get())
                    if entry.kind == "api_key":
                        new.fixed[entry.where] = Credential(
                            entry.provider, entry.profile, "auth.json", _entry_key_id(entry), entry.secrets[0]
                        )
                    elif entry.kind == "keys":
                        new.pools[entry.where] = pool = self._build_pool(entry, old)
                        for state in pool.states:
                            new.states[state.ref] = state
                    elif entry.kind == "key_cmd":
                        new.command_locks[entry.where] = threading.Lock()
        return new

    def _build_pool(self, entry: EntrySpec, old: _Loaded | None) -> _Pool:
        previous = old.pools.get(entry.where) if old is not None and old.pools else None
        by_secret = {s.ref.get(): s for s in previous.states} if previous is not None else {}
        states = []
        for ref in entry.secrets:
            state = by_secret.get(ref.get())
            states.append(state if state is not None else _KeyState(ref))
        base = _entry_key_id(entry)
        creds = [Credential(entry.provider, entry.profile, "pool", f"{base}#{i}", s.ref) for i, s in enumerate(states)]
        start = previous.next % len(states) if previous is not None else 0
        return _Pool(entry.where, states, creds, start)

    # --------------------------------------------------------------- acquire

    def acquire(self, provider: str, profile: str | None = None) -> Credential:
        """The credential for one call to ``provider`` (see the module docstring for the order).

        Raises :class:`PluginLlmConfigError` (no key, unknown profile, broken
        ``auth.json``, failing ``key_cmd``) or :class:`PoolExhaustedError`.
        """
        return self._acquire(provider, profile, run_commands=True)

    async def aacquire(self, provider: str, profile: str | None = None) -> Credential:
        """Async :meth:`acquire`: runs inline, except a first ``key_cmd`` run, done in a thread."""
        try:
            return self._acquire(provider, profile, run_commands=False)
        except _NeedsIO:
            pass
        import asyncio  # lazily: most processes never need it here

        # outside the except block: a failing key_cmd's error chains no internal _NeedsIO
        return await asyncio.to_thread(self._acquire, provider, profile, run_commands=True)

    def _acquire(self, provider: str, profile: str | None, *, run_commands: bool) -> Credential:
        loaded = self._current()
        spec = loaded.spec
        assert spec is not None
        name = normalize_provider(provider)
        if profile is None:
            profile_name = loaded.default_profile
        else:
            profile_name = profile.strip()
            if profile_name not in spec.profiles:
                if profile_name != "default":
                    raise self._unknown_profile(profile, name, spec)
                profile_name = None
        entry = None
        if profile_name is not None:
            entry = spec.profiles[profile_name].get(name)
        if entry is None:
            entry = spec.providers.get(name)
        if entry is not None:
            kind = entry.kind
            if kind == "api_key":
                return loaded.fixed[entry.where]
            if kind == "keys":
                return self._from_pool(loaded.pools[entry.where], name)
            if kind == "key_env":
                return self._from_key_env(entry)
            return self._from_key_cmd(loaded, entry, run_commands)
        for var in env_vars_for(name):
            cred = self._from_env(var, "env", None, name, var)
            if cred is not None:
                return cred
        if name in KEYLESS_PROVIDERS:
            cred = self._none_creds.get(name)
            if cred is None:
                cred = self._none_creds.setdefault(name, Credential(name, None, "none", "none"))
            return cred
        raise self._no_key(name, profile_name, spec)

    def _from_pool(self, pool: _Pool, provider: str) -> Credential:
        states = pool.states
        n = len(states)
        with self._lock:
            now = self._clock()
            start = pool.next
            for k in range(n):
                i = (start + k) % n
                if states[i].cooling_until <= now:
                    pool.next = i + 1
                    return pool.creds[i]
            wait = min(s.cooling_until for s in states) - now
        plural = "all 1 key" if n == 1 else f"all {n} keys"
        raise PoolExhaustedError(
            f"{plural} of the {provider!r} pool ({self.path.name} {pool.where}.keys) "
            f"{'is' if n == 1 else 'are'} cooling down after 401/402/429 responses; "
            f"the first is usable again in {wait:.1f} s",
            provider=provider,
            retry_after=max(wait, 0.0),
            keys=n,
        )

    def _from_env(self, var: str, source: str, profile: str | None, provider: str, key_id: str) -> Credential | None:
        value = self._getenv(var)
        if not value or not (value := value.strip()):
            return None
        cache_key = (source, provider, profile, var)
        cred = self._env_creds.get(cache_key)
        if cred is not None and cred.reveal() == value:
            return cred
        register_secret(value)
        cred = Credential(provider, profile, source, key_id, SecretRef(value))
        with self._lock:
            self._env_creds[cache_key] = cred
        return cred

    def _from_key_env(self, entry: EntrySpec) -> Credential:
        var = entry.env_var or ""
        cred = self._from_env(var, "key_env", entry.profile, entry.provider, var)
        if cred is None:
            raise PluginLlmConfigError(
                f"{self.path}: {entry.where}.key_env names the environment variable {var}, which is not set "
                f"(or empty) in this process. Fix: export {var}=... before starting, or change the entry "
                f"with `plugin-llm auth add {entry.provider}"
                f"{' --profile ' + entry.profile if entry.profile else ''} --replace ...`"
            )
        return cred

    def _from_key_cmd(self, loaded: _Loaded, entry: EntrySpec, run_commands: bool) -> Credential:
        cred = loaded.commands.get(entry.where)
        if cred is not None:
            return cred
        if not run_commands:
            raise _NeedsIO()
        # One run per entry and generation; other entries and cached keys are not blocked.
        with loaded.command_locks[entry.where]:
            cred = loaded.commands.get(entry.where)
            if cred is None:
                key = run_key_cmd(entry.argv, where=f"{self.path.name} {entry.where}", timeout=self._key_cmd_timeout)
                register_secret(key)
                cred = Credential(entry.provider, entry.profile, "key_cmd", _entry_key_id(entry), SecretRef(key))
                with self._lock:
                    loaded.commands[entry.where] = cred
        return cred

    def _unknown_profile(self, requested: str, provider: str, spec: AuthSpec) -> PluginLlmConfigError:
        known = ", ".join(sorted(spec.profiles)) or "none"
        return PluginLlmConfigError(
            f"unknown credential profile {requested!r} (asked for provider {provider!r}); {self.path} defines "
            f"profiles: {known}. An unknown profile never falls back to another key. Fix: add it under "
            f"\"profiles\" in {self.path.name} (`plugin-llm auth add {provider} --profile {requested} "
            f"--from-stdin`) or correct the profile name"
        )

    def _no_key(self, provider: str, profile: str | None, spec: AuthSpec) -> PluginLlmConfigError:
        places = []
        if profile is not None:
            places.append(f"profiles.{profile}.{provider}")
        places.append(f"providers.{provider}")
        looked = f"{self.path} ({', '.join(places)})"
        variables = env_vars_for(provider)
        if variables:
            looked += " and the environment variable" + ("s " if len(variables) > 1 else " ") + ", ".join(variables)
        fix = f"`plugin-llm auth add {provider} --from-stdin` (or --key-env VAR / --key-cmd CMD)"
        if variables:
            fix += f", or export {variables[0]}"
        return PluginLlmConfigError(f"no API key for provider {provider!r}: looked in {looked}. Fix: {fix}")

    # ------------------------------------------------------------- feedback

    def report_failure(self, cred: Credential, status: int, retry_after: float | None = None) -> None:
        """Tell the store a call with ``cred`` failed with HTTP ``status``.

        401/402/429 on a pool key cool that key down (see the class docstring);
        other statuses, and keys that are not in a pool (nothing to rotate to),
        are ignored.
        """
        if status not in COOLING_STATUSES or cred.source != "pool" or cred._ref is None:
            return
        loaded = self._loaded
        state = loaded.states.get(cred._ref) if loaded is not None else None
        if state is None:
            return  # a key removed from auth.json since
        with self._lock:
            state.streak += 1
            if status == 429 and retry_after is not None and not math.isnan(retry_after):
                cool = min(max(float(retry_after), 0.0), self._cooldown_cap)
            else:
                base = self._cooldown_base if status == 429 else self._auth_cooldown_base
                cool = min(self._cooldown_cap, base * 2.0 ** min(state.streak - 1, 32))
            state.cooling_until = max(state.cooling_until, self._clock() + cool)

    def report_success(self, cred: Credential) -> None:
        """A call with ``cred`` succeeded: its failure streak restarts at zero.

        A cooldown already running is left alone (the success may belong to a
        request sent before the failure).
        """
        if cred.source != "pool" or cred._ref is None:
            return
        loaded = self._loaded
        state = loaded.states.get(cred._ref) if loaded is not None else None
        if state is not None and state.streak:
            with self._lock:
                state.streak = 0

    # ------------------------------------------------------------ listings

    def profiles(self) -> list[str]:
        """Profile names defined in ``auth.json``, sorted."""
        spec = self._current().spec
        return sorted(spec.profiles) if spec is not None else []

    @property
    def default_profile(self) -> str | None:
        """The profile used when a call names none (None: the top-level providers)."""
        return self._current().default_profile

    def _health(self, state: _KeyState, now: float) -> str:
        left = state.cooling_until - now
        return "healthy" if left <= 0 else f"cooling {math.ceil(left)}s"

    def describe(self) -> list[dict[str, Any]]:
        """One dict per configured credential, for ``plugin-llm auth list``. Never a secret.

        Keys: ``provider, profile, source, key_id, key`` (masked), ``health``,
        ``where`` (JSON path or ``env``), and for pools ``keys`` (a list of
        ``{key_id, key, health}``), for ``key_env``/``env`` ``env_var``, for
        ``key_cmd`` ``command``. Environment fallbacks are listed for known
        providers without a top-level entry. ``key_cmd`` commands are not run.
        """
        loaded = self._current()
        spec = loaded.spec
        assert spec is not None
        rows: list[dict[str, Any]] = []
        with self._lock:
            now = self._clock()
            tables = [(None, spec.providers)] + [(p, spec.profiles[p]) for p in sorted(spec.profiles)]
            for profile, table in tables:
                if profile is not None and not table:
                    rows.append({"provider": None, "profile": profile, "source": "empty", "key_id": "",
                                 "key": "", "health": "", "where": f"profiles.{profile}"})
                for provider in sorted(table):
                    rows.append(self._describe_entry(loaded, table[provider], now))
            for provider in sorted(ENV_VARS):
                if provider in spec.providers:
                    continue
                for var in ENV_VARS[provider]:
                    value = (self._getenv(var) or "").strip()
                    if value:
                        register_secret(value)
                        rows.append({"provider": provider, "profile": None, "source": "env", "key_id": var,
                                     "key": mask(value), "health": "healthy", "where": "env", "env_var": var})
                        break
        return rows

    def _describe_entry(self, loaded: _Loaded, entry: EntrySpec, now: float) -> dict[str, Any]:
        row: dict[str, Any] = {
            "provider": entry.provider,
            "profile": entry.profile,
            "source": _SOURCE_OF_KIND[entry.kind],
            "key_id": _entry_key_id(entry),
            "where": entry.where,
        }
        if entry.kind == "api_key":
            row.update(key=mask(entry.secrets[0].get()), health="healthy")
        elif entry.kind == "keys":
            pool = loaded.pools[entry.where]
            keys = [
                {"key_id": cred.key_id, "key": mask(state.ref.get()), "health": self._health(state, now)}
                for state, cred in zip(pool.states, pool.creds)
            ]
            healthy = sum(1 for k in keys if k["health"] == "healthy")
            row.update(
                key=f"{len(keys)} keys",
                health="healthy" if healthy == len(keys) else f"{healthy}/{len(keys)} healthy",
                keys=keys,
            )
        elif entry.kind == "key_env":
            value = (self._getenv(entry.env_var or "") or "").strip()
            if value:
                register_secret(value)
            row.update(key_id=entry.env_var, env_var=entry.env_var, key=mask(value) if value else "(unset)",
                       health="healthy" if value else "unset")
        else:
            cred = loaded.commands.get(entry.where)
            row.update(command=redact(shlex.join(entry.argv)), key=cred.masked if cred else "(not run yet)",
                       health="healthy" if cred else "not run yet")
        return row


_STORES: dict[str, CredentialStore] = {}
_STORES_LOCK = threading.Lock()


def get_store(home: Path | str) -> CredentialStore:
    """The process-wide store of ``home`` (one per resolved path; thread-safe).

    Every ``PluginLlm`` of a home shares it, and with it the pool health.
    """
    key = os.fspath(home)
    store = _STORES.get(key)
    if store is not None:
        return store
    with _STORES_LOCK:
        resolved = str(Path(key).expanduser().resolve())
        store = _STORES.get(resolved)
        if store is None:
            store = CredentialStore(Path(resolved))
            _STORES[resolved] = store
        _STORES[key] = store
    return store
