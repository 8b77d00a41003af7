"""``plugin-llm auth list|add|remove|test``: manage credentials in ``$HERMES_HOME/auth.json``.

There is deliberately no way to give a key as a command-line argument (it would
land in shell history and process listings): ``add`` takes ``--key-env VAR``,
``--key-cmd CMD`` or ``--from-stdin`` (a hidden prompt on a terminal). Every
line this command prints goes through :func:`auth.redact`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, TextIO

from auth import (
    AUTH_FILE_NAME,
    CredentialStore,
    get_store,
    locked,
    mask,
    normalize_provider,
    read_document,
    redact,
    redact_obj,
    register_secret,
    write_document,
)
from plugin_llm.hardened.bounded_repr import short_repr
from plugin_llm.cli._common import CliParser, find_audit_record
from plugin_llm.cli.main import CliError
from plugin_llm.config import ConfigSource
from plugin_llm.errors import PluginLlmError
from plugin_llm.provider_names import unknown_provider_problem
from plugin_llm.trust import TrustPolicy

__all__ = ["register", "run"]

_KEY_SOURCES = ("api_key", "keys", "key_env", "key_cmd")


# --------------------------------------------------------------------------- #
# argument parsing
# --------------------------------------------------------------------------- #


class _NoEchoParser(CliParser):
    """Sub-action parser that keeps unrecognised arguments instead of echoing them.

    argparse's "unrecognized arguments: sk-..." would print a key someone typed
    on the command line; the leftovers go to ``args._stray`` and :func:`run`
    reports them without their values. Abbreviations are off: argparse's
    "ambiguous option: --key=sk-..." error would echo the value too.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            namespace._stray = [*getattr(namespace, "_stray", []), *extras]
        return namespace, []


def register(subparsers: Any) -> None:
    """Add the ``auth`` parser and its actions to ``plugin-llm``."""
    parser = subparsers.add_parser(
        "auth",
        help="manage credentials in auth.json",
        description="Manage the credentials the host uses for provider calls ($HERMES_HOME/auth.json). "
        "Keys are never accepted as command-line arguments.",
    )
    actions = parser.add_subparsers(dest="auth_action", metavar="ACTION", parser_class=_NoEchoParser)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", help="home directory (default: $HERMES_HOME or ~/.hermes)")

    p_list = actions.add_parser(
        "list",
        parents=[common],
        help="list providers, profiles, key sources and masked keys",
        description="List configured credentials: auth.json entries and environment variables. Keys are masked. "
        "Pool health is that of this process (a fresh CLI process sees every key healthy).",
    )
    p_list.add_argument("--json", action="store_true", help="machine-readable output")

    p_add = actions.add_parser(
        "add",
        parents=[common],
        help="add or replace a provider's key source",
        description="Add a key source for PROVIDER. The key itself is read from stdin (--from-stdin), "
        "from an environment variable at call time (--key-env) or from a command's stdout (--key-cmd).",
    )
    p_add.add_argument("provider", help="provider name as litellm knows it (openai, anthropic, openrouter, ...)")
    p_add.add_argument("--profile", help="add to this named profile instead of the top-level providers")
    source = p_add.add_mutually_exclusive_group(required=True)
    source.add_argument("--key-env", metavar="VAR", help="read the key from environment variable VAR at call time")
    source.add_argument(
        "--key-cmd", metavar="CMD", help="run CMD (no shell; split like a shell would) and use its stdout as the key"
    )
    source.add_argument(
        "--from-stdin", action="store_true", help="read the key from stdin (hidden prompt on a terminal)"
    )
    p_add.add_argument("--pool", action="store_true", help="with --from-stdin: add the key to the provider's pool")
    p_add.add_argument("--replace", action="store_true", help="replace an existing entry")

    p_remove = actions.add_parser("remove", parents=[common], help="remove a provider's entry")
    p_remove.add_argument("provider")
    p_remove.add_argument("--profile", help="remove from this profile instead of the top-level providers")

    p_test = actions.add_parser(
        "test",
        parents=[common],
        help="make one minimal call with a provider's key and report the result",
    )
    p_test.add_argument("provider")
    p_test.add_argument("--profile", help="use this profile's credentials")
    p_test.add_argument("--model", help="model to call (default: the configured model if it is on PROVIDER)")
    p_test.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")

    parser.set_defaults(func=run, _auth_parser=parser)


def run(args: argparse.Namespace) -> int:
    """Dispatch ``plugin-llm auth <action>``."""
    action = getattr(args, "auth_action", None)
    stray = getattr(args, "_stray", None)
    if stray:
        _reject_stray(action, stray)
    if action is None:
        args._auth_parser.print_help()
        return 2
    command = {"list": _cmd_list, "add": _cmd_add, "remove": _cmd_remove, "test": _cmd_test}[action]
    try:
        return command(args)
    except OSError as exc:  # unwritable home, disk full...: an operator problem, not a traceback
        where = f" {exc.filename}" if exc.filename else ""
        raise CliError(f"auth {action}: cannot access{where}: {exc.strerror or exc}", 1) from None


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def _reject_stray(action: str | None, stray: list[str]) -> None:
    """Refuse unexpected arguments without showing their values (one may be a key)."""
    options = []
    for value in stray:
        name, _, rest = value.partition("=")
        for part in (value, rest):  # possibly a real key: nothing prints it from now on
            register_secret(part)
        if value.startswith("-"):
            options.append(name)
    what = f"unknown option(s) {', '.join(options)}" if options else f"{len(stray)} unexpected argument(s)"
    hint = ""
    if action == "add":
        hint = (
            "; auth add never takes a key on the command line (it would land in shell history and process "
            "listings; if you typed a real key, consider rotating it). Use --from-stdin, --key-env VAR or "
            "--key-cmd CMD"
        )
    raise CliError(f"auth {action or ''}: {what} (values not shown){hint}".replace("auth :", "auth:"))


def _out(text: str = "", *, file: TextIO | None = None) -> None:
    """Print through the redactor (every line of this command does)."""
    print(redact(text), file=file or sys.stdout)


def _home(args: argparse.Namespace) -> Path:
    if getattr(args, "home", None):
        return Path(args.home).expanduser()
    try:
        from plugin_llm.config import hermes_home
    except ImportError:  # pragma: no cover - the config module is part of the package
        raw = os.environ.get("HERMES_HOME", "").strip()
        return Path(raw).expanduser() if raw else Path("~/.hermes").expanduser()
    return hermes_home()


def _auth_path(args: argparse.Namespace) -> Path:
    return _home(args) / AUTH_FILE_NAME


def _provider_name(raw: str) -> str:
    name = normalize_provider(raw)
    if not name or not all(c.isalnum() or c in "_-." for c in name):
        raise CliError(f"{short_repr(raw)} is not a provider name (letters, digits, '_', '-', '.')")
    return name


def _find_key(table: dict[str, Any], provider: str) -> str | None:
    """The existing spelling of ``provider`` in a table (names are case-insensitive)."""
    return next((k for k in table if not k.startswith("_") and normalize_provider(k) == provider), None)


def _table(doc: dict[str, Any], profile: str | None, *, create: bool, path: Path) -> dict[str, Any] | None:
    if profile is None:
        if create:
            doc.setdefault("providers", {})
        return doc.get("providers")
    profiles = doc.setdefault("profiles", {}) if create else doc.get("profiles", {})
    if profile not in profiles:
        if not create:
            known = ", ".join(sorted(p for p in profiles if not p.startswith("_"))) or "none"
            raise CliError(f"{path} has no profile {profile!r} (profiles: {known})")
        profiles[profile] = {}
    return profiles[profile]


def _where(provider: str, profile: str | None) -> str:
    return f"providers.{provider}" if profile is None else f"profiles.{profile}.{provider}"


def _read_key_from_stdin(provider: str) -> str:
    stream = sys.stdin
    if stream is None:
        raise CliError("--from-stdin: no standard input")
    if stream.isatty():
        line = getpass.getpass(f"API key for {provider} (input hidden): ")
    else:
        line = stream.readline()
    key = line.strip()
    if not key:
        raise CliError("--from-stdin: no key on standard input (expected one line)")
    if any(ch.isspace() or ord(ch) < 32 for ch in key):
        raise CliError("--from-stdin: the key contains spaces or control characters; give one key on one line")
    return key


# --------------------------------------------------------------------------- #
# list
# --------------------------------------------------------------------------- #


def _cmd_list(args: argparse.Namespace) -> int:
    home = _home(args)
    store = CredentialStore(home)
    rows = store.describe()  # raises PluginLlmConfigError for a broken / unsafe file
    path = store.path
    if args.json:
        payload = {
            "file": str(path),
            "exists": path.exists(),
            "default_profile": store.default_profile,
            "profiles": store.profiles(),
            "credentials": rows,
        }
        _out(json.dumps(redact_obj(payload), indent=2))
        return 0
    state = "" if path.exists() else "  (not present: only environment variables are used)"
    _out(f"credentials file: {path}{state}")
    profiles = store.profiles()
    if profiles:
        default = store.default_profile
        _out("profiles: " + ", ".join(f"{p} (default)" if p == default else p for p in profiles))
    if not rows:
        _out("no credentials configured. Add one with: plugin-llm auth add PROVIDER --from-stdin")
        return 0
    table = [("PROVIDER", "PROFILE", "SOURCE", "KEY", "HEALTH", "WHERE")]
    for row in rows:
        if row["source"] == "empty":
            table.append(("-", row["profile"], "(empty profile)", "", "", row["where"]))
            continue
        detail = row["where"]
        if row.get("env_var") and row["source"] == "key_env":
            detail += f" -> ${row['env_var']}"
        elif row["source"] == "env":
            detail = f"${row['env_var']}"
        elif row.get("command"):
            detail += f" -> {row['command']}"
        table.append((row["provider"], row["profile"] or "-", row["source"], row["key"], row["health"], detail))
        for key in row.get("keys", ()):
            table.append(("", "", f"  {key['key_id']}", key["key"], key["health"], ""))
    widths = [max(len(str(r[i])) for r in table) for i in range(len(table[0]))]
    for r in table:
        _out("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


# --------------------------------------------------------------------------- #
# add / remove
# --------------------------------------------------------------------------- #


def _known_provider(text: str, outcome: str) -> str:
    """The provider name, refused with a "did you mean" when it is no provider: any later message
    (a missing key, `auth add <typo>`) would repeat the typo as the fix."""
    provider = _provider_name(text)
    problem = unknown_provider_problem(provider)
    if problem is not None:
        raise CliError(f"{problem}; {outcome}")
    return provider


def _cmd_add(args: argparse.Namespace) -> int:
    provider = _known_provider(args.provider, "nothing was added")  # a key stored under a typo is never used
    profile = args.profile.strip() if args.profile else None
    if args.pool and not args.from_stdin:
        raise CliError("--pool adds a literal key to a pool: use it with --from-stdin")

    if args.key_env is not None:
        var = args.key_env.strip()
        if not var or not (var[0].isalpha() or var[0] == "_") or not all(c.isalnum() or c == "_" for c in var):
            raise CliError(f"--key-env: {args.key_env!r} is not an environment variable name")
        entry: dict[str, Any] = {"key_env": var}
        shown = f"key_env ${var}"
    elif args.key_cmd is not None:
        try:
            argv = shlex.split(args.key_cmd)
        except ValueError as exc:
            raise CliError(f"--key-cmd: cannot split the command: {exc}") from None
        if not argv:
            raise CliError("--key-cmd: empty command")
        entry = {"key_cmd": argv}
        shown = f"key_cmd {shlex.join(argv)}"
    else:
        key = _read_key_from_stdin(provider)
        register_secret(key)
        entry = {"api_key": key}
        shown = f"api_key {mask(key)}"

    path = _auth_path(args)
    where = _where(provider, profile)
    with locked(path):
        doc = read_document(path)
        table = _table(doc, profile, create=True, path=path)
        assert table is not None
        existing_name = _find_key(table, provider)
        existing = table.get(existing_name) if existing_name else None
        kept = {k: v for k, v in existing.items() if k.startswith("_")} if isinstance(existing, dict) else {}
        current = next((k for k in _KEY_SOURCES if isinstance(existing, dict) and k in existing), None)
        if args.pool:
            key = entry["api_key"]
            if current == "keys":
                keys = list(existing["keys"])
            elif current == "api_key":
                keys = [existing["api_key"]]
            elif current is None or args.replace:
                keys = []
            else:
                raise CliError(f"{where} uses {current}; a pool needs literal keys (use --replace to start a pool)")
            if key in keys:
                raise CliError(f"{where}: that key is already in the pool")
            keys.append(key)
            entry = {"keys": keys}
            shown = f"pool key #{len(keys) - 1} {mask(key)} ({len(keys)} keys)"
        elif existing is not None and not args.replace:
            raise CliError(
                f"{where} already has a key source ({current or 'invalid'}) in {path}; use --replace to overwrite it"
                + (" or --pool to add the key to a pool" if args.from_stdin else "")
            )
        if existing_name and existing_name != provider:
            del table[existing_name]
        table[provider] = {**kept, **entry}
        write_document(path, doc)

    _out(f"{'updated' if existing is not None else 'added'} {where}: {shown} -> {path} (mode 0600)")
    if args.key_env is not None and not os.environ.get(entry.get("key_env", "")):
        _out(f"note: ${entry['key_env']} is not set in this shell; the host process must have it", file=sys.stderr)
    if args.key_cmd is not None and shutil.which(entry["key_cmd"][0]) is None:
        _out(f"note: {entry['key_cmd'][0]!r} was not found on PATH; check with: plugin-llm auth test {provider}",
             file=sys.stderr)
    return 0


def _cmd_remove(args: argparse.Namespace) -> int:
    provider = _provider_name(args.provider)
    profile = args.profile.strip() if args.profile else None
    path = _auth_path(args)
    where = _where(provider, profile)
    with locked(path):
        if not path.exists():
            raise CliError(f"{path} does not exist; nothing to remove")
        doc = read_document(path)
        table = _table(doc, profile, create=False, path=path)
        name = _find_key(table, provider) if table else None
        if name is None:
            raise CliError(f"{path} has no entry {where}")
        del table[name]
        write_document(path, doc)
    _out(f"removed {where} from {path}")
    if profile is not None and not any(not k.startswith("_") for k in table):
        _out(f"note: profile {profile!r} is now empty; it stays defined (calls using it fall back to the "
             "top-level providers). Delete it from auth.json to make it unknown.", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- #
# test
# --------------------------------------------------------------------------- #


#: A small, cheap model per provider for ``auth test`` when neither --model nor
#: the configured route names one for that provider.
_TEST_MODELS = {
    "openai": "gpt-4o-mini",
    "anthropic": "claude-3-5-haiku-latest",
    "openrouter": "openai/gpt-4o-mini",
    "gemini": "gemini-2.0-flash",
    "groq": "llama-3.1-8b-instant",
    "mistral": "mistral-small-latest",
    "deepseek": "deepseek-chat",
    "xai": "grok-3-mini",
    "together_ai": "meta-llama/Llama-3.2-3B-Instruct-Turbo",
    "local": "local-echo-1",
}

AUTH_TEST_IDENTITY = "auth-test"


class _AuthTestConfig:
    """The operator's config, plus provider/model/profile trust for the ``auth-test`` identity only.

    Injected into ``PluginLlm`` (no module patching): the call goes through the
    real pipeline — routing, credential store, transport, audit log — as the
    operator asked for it on the command line.
    """

    def __init__(self, home: Path) -> None:
        self._inner = ConfigSource(home)
        self.home = self._inner.home
        self.path = self._inner.path

    def on_reload(self, callback: Any) -> None:
        self._inner.on_reload(callback)

    def current(self) -> Any:
        return self._with_trust(self._inner.current())

    def loaded(self) -> Any:
        config = self._inner.loaded()
        return None if config is None else self._with_trust(config)

    @staticmethod
    def _with_trust(config: Any) -> Any:
        import dataclasses

        policy = TrustPolicy(allow_provider_override=True, allow_model_override=True, allow_profile_override=True)
        return dataclasses.replace(config, trust={**config.trust, AUTH_TEST_IDENTITY: policy})


def _cmd_test(args: argparse.Namespace) -> int:
    """One minimal call with PROVIDER's credentials; reports success or the provider's error, redacted."""
    import time

    provider = _known_provider(args.provider, "no call was made")
    profile = args.profile.strip() if args.profile else None
    home = _home(args)
    # Resolve first: a missing key, an unknown profile or a broken auth.json is
    # reported without any call (PluginLlmConfigError -> exit 1 with the fix).
    cred = get_store(home).acquire(provider, profile)
    source = f"{cred.source} {cred.key_id} ({cred.masked})" if cred.source != "none" else "no key (keyless provider)"
    _out(f"credential: {provider}{' profile ' + profile if profile else ''} via {source}")

    config = _AuthTestConfig(home)
    configured = config.current().model
    model = args.model
    if model is None and (configured.provider or "").lower() != provider:
        model = _TEST_MODELS.get(provider)
        if model is None:
            raise CliError(f"no default test model for provider {provider!r}: pass --model MODEL")
    from plugin_llm.llm import PluginLlm  # on first use: it loads the provider layer

    from plugin_llm.cli._waiting import provider_layer_notice  # on first use: it loads the provider layer

    llm = PluginLlm(AUTH_TEST_IDENTITY, home=home, config_source=config)  # type: ignore[arg-type]
    started = time.monotonic()
    try:
        with provider_layer_notice():
            result = llm.complete(
                [{"role": "user", "content": "Reply with the single word: ok"}],
                provider=provider,
                model=model,
                profile=profile,
                max_tokens=16,
                timeout=args.timeout,
                purpose="plugin-llm auth test",
            )
    except PluginLlmError as exc:
        _out(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - started
    # the call's own time, as its audit record has it: without the one-time import of the provider layer
    record = find_audit_record(home, result.audit["call_id"]) or {}
    latency_ms = record.get("latency_ms")
    if isinstance(latency_ms, (int, float)) and not isinstance(latency_ms, bool):
        elapsed = latency_ms / 1000.0
    usage = result.usage
    _out(f"OK: {result.provider}/{result.model} answered in {elapsed:.2f} s "
         f"({usage.input_tokens} in / {usage.output_tokens} out tokens); audited as plugin {AUTH_TEST_IDENTITY!r}")
    return 0
