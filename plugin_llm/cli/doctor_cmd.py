"""``plugin-llm doctor``: is this home ready? One line per check, OK / WARN / FAIL.

Checks, in order: the home and its permissions, ``auth.json`` (mode 0600),
``config.yaml`` (parses; settings understood), the ``plugins:`` section (the
findings of ``trust check``), the active route and its credentials (masked),
the audit log (writable without writing a record, and ``verify``), the
plugins (load errors, missing environment variables), bubblewrap (whether
out-of-process plugins are confined by it, and why not), and litellm (installed,
its version, not a known-malicious release), and telemetry when configured (its SDK installed). Exit code 1 when any check FAILs, else 0.

Read-only: nothing is written to the home. The enabled plugins are loaded
(that is the only way to see a ``register()`` that fails), but their load
failures are reported here instead of being appended to the audit log.
litellm is located and its version read from package metadata, never imported.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import audit
from audit.errors import AuditLogNotFoundError
from audit.signing import AuditKeyError, key_file, load_signer, pub_file, read_keyring
from auth import AUTH_FILE_NAME, CredentialStore, KEYLESS_PROVIDERS
from plugin_llm import supply_chain, trust_report as tr
from plugin_llm.cli._common import dumps_json, printable
from plugin_llm.cli.main import CliError
from plugin_llm.config import hermes_home, shown_url, top_level_warnings
from plugin_llm.errors import PluginLlmConfigError, PluginLlmError
from plugin_llm.home_env import ENV_FILENAME, read_env_text
from plugin_llm.limits import breakers
from plugin_llm.limits.settings import url_secrets
from plugin_llm.limits.store import StoreError
from plugin_llm.plugins import PluginManager
from plugin_llm.plugins.isolation.sandbox import bubblewrap_status
from plugin_llm.plugins.settings import settings_from_raw
from plugin_llm.provider_names import unknown_provider_problem
from plugin_llm.routing import resolve_chain
from plugin_llm.hardened.safe_files import UnsafeFileError, describe_file_type
from plugin_llm.telemetry import SDK_MISSING_FIX

__all__ = ["register", "run", "Check", "run_checks", "OK", "WARN", "FAIL"]

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass(frozen=True)
class Check:
    status: str  # OK | WARN | FAIL
    check: str  # short name: home, auth.json, config, trust, route, credentials, audit log, ...
    message: str
    fix: str | None = None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the home, config, credentials, audit log and plugins",
        description="Check that this home is ready: one line per check (OK/WARN/FAIL); exit 1 if any FAILs.",
    )
    parser.add_argument("--home", metavar="DIR", help="home directory (default: $HERMES_HOME or ~/.hermes)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    home = Path(args.home).expanduser() if args.home else hermes_home()
    if args.home and home.exists() and not home.is_dir():
        raise CliError(f"--home {home} is not a directory")
    if not getattr(args, "debug", False):
        # Plugin load problems become FAIL/WARN lines; keep the log quiet.
        for name in ("plugin_llm.plugins", "plugin_llm.config"):
            _quiet(logging.getLogger(name))
    checks = run_checks(home)
    counts = {status: sum(1 for c in checks if c.status == status) for status in (OK, WARN, FAIL)}
    if args.json:
        print(dumps_json({"home": str(home), "ok": counts[FAIL] == 0, "counts": counts,
                          "checks": [asdict(c) for c in checks]}))
    else:
        for c in checks:  # plugin keys and load errors are plugin-supplied text: escaped
            print(f"{c.status:<4}  {printable(c.check)}: {printable(c.message, limit=2000)}")
            if c.fix and c.status != OK:
                print(f"      fix: {printable(c.fix, limit=2000)}")
        print(f"\n{counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL ({home})")
    return 1 if counts[FAIL] else 0


def _quiet(logger: logging.Logger) -> None:
    """No "last resort" stderr output for this logger (added once per process)."""
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())


def run_checks(home: Path) -> list[Check]:
    """Every check, in the order they are printed; a check that crashes is a FAIL line."""
    out: list[Check] = []
    view = tr.read_config(home)
    found: list[list[dict[str, Any]]] = []

    def plugins() -> list[dict[str, Any]]:  # discovered and loaded once, used by two checks
        if not found:
            found.append(_list_plugins(home))
        return found[0]

    def installed() -> dict[str, str]:
        try:
            return {p["key"]: p["name"] for p in plugins()}
        except Exception:  # the plugins check reports it; the trust check still runs
            return tr.installed_plugins(home)
    steps: list[tuple[str, Callable[[], list[Check]]]] = [
        ("home", lambda: _home(home)),
        ("auth.json", lambda: _auth_file(home)),
        ("config", lambda: _config(view)),
        ("trust", lambda: _trust(tr, view, installed)),
        ("route", lambda: _route_and_credentials(view, home)),
        ("auxiliary", lambda: _auxiliary(view, home)),
        ("audit log", lambda: _audit(home, view)),
        ("plugins", lambda: _plugins(plugins(), view)),
        ("bubblewrap", lambda: _bubblewrap(plugins)),
        ("litellm", _litellm),
        ("telemetry", lambda: _telemetry(view)),
    ]
    for name, step in steps:
        try:
            out.extend(step())
        except Exception as exc:  # a bug or an odd filesystem must not hide the other checks
            out.append(Check(FAIL, name, f"the check itself failed: {type(exc).__name__}: {_safe(exc)}"))
    return out


def _safe(exc: BaseException) -> str:
    try:
        from auth import redact
    except ImportError:  # pragma: no cover
        return str(exc)
    return redact(str(exc))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ------------------------------------------------------------------ home
def _writable_by_others(path: Path, what: str) -> Check | None:
    try:
        mode = _mode(path)
    except OSError:
        return None
    if mode & 0o022:
        who = "group and world" if mode & 0o022 == 0o022 else ("world" if mode & 0o002 else "group")
        return Check(WARN, "home", f"{what} {path} is {who}-writable (mode {mode:04o}): others could change "
                     "the trust policy, plugins or audit log", f"chmod go-w {path}")
    return None


def _home(home: Path) -> list[Check]:
    if not home.exists():
        return [Check(WARN, "home", f"{home} does not exist: defaults apply (local model, no plugins, no overrides)",
                      f"mkdir -m 700 {home}")]
    if not home.is_dir():
        return [Check(FAIL, "home", f"{home} is not a directory", "remove it or point HERMES_HOME elsewhere")]
    out = [Check(OK, "home", f"{home} (mode {_mode(home):04o})")]
    for path, what in ((home, "home"), (home / "config.yaml", "config"), (home / "plugins", "plugins directory")):
        if path.exists():
            found = _writable_by_others(path, what)
            if found is not None:
                out.append(found)
    out.extend(_env_file(home))
    return out


def _not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file (a FIFO, a directory, ...), else None."""
    try:
        st = path.stat()
    except OSError:
        return None
    return None if stat.S_ISREG(st.st_mode) else describe_file_type(st.st_mode)


def _env_file(home: Path) -> list[Check]:
    """``<home>/.env``: the host skips a file it cannot use; say so here."""
    path = home / ENV_FILENAME
    try:
        read_env_text(home)
    except UnsafeFileError as exc:
        return [Check(WARN, "home", f"{_safe(exc)}; its variables are not loaded", f"replace {path} with a regular file of NAME=value lines")]
    return []


# ------------------------------------------------------------------ auth.json
def _auth_file(home: Path) -> list[Check]:
    path = home / AUTH_FILE_NAME
    if not path.exists():
        return [Check(OK, "auth.json", "none: keys come from environment variables (e.g. OPENAI_API_KEY)")]
    kind = _not_regular(path)
    if kind is not None:  # a FIFO's or a directory's mode says nothing: name what it is
        return [Check(FAIL, "auth.json", f"{path} is {kind}, not a regular file: the gateway refuses it",
                      f"replace {path} with a regular file (see config_examples/auth.json)")]
    mode = _mode(path)
    if mode & 0o077:
        return [Check(FAIL, "auth.json", f"{path} has mode {mode:04o}: the gateway refuses a key file others can read",
                      f"chmod 600 {path}")]
    try:
        rows = CredentialStore(home).describe()
    except Exception as exc:  # PluginLlmConfigError: malformed file
        return [Check(FAIL, "auth.json", _safe(exc), f"fix {path} (see config_examples/auth.json)")]
    configured = [r for r in rows if r.get("where") != "env"]
    return [Check(OK, "auth.json", f"mode {mode:04o}, {len(configured)} credential entr{'y' if len(configured) == 1 else 'ies'}")]


# ------------------------------------------------------------------ config and trust
def _config(view: Any) -> list[Check]:
    if view.error is not None:
        return [Check(FAIL, "config", f"does not parse: {view.error}; every plugin override is refused (fail closed)",
                      "fix the YAML at that line and column")]
    if not view.exists:
        return [Check(OK, "config", f"no {view.path}: defaults apply (local model, no plugins)")]
    out = [Check(OK, "config", f"{view.path} parses")]

    # the plugins: section and every limits problem are `trust check`'s (the trust line counts them, a
    # FAIL for an error: it refuses calls); everything else the gateway warned about is listed here
    from plugin_llm.trust_report import limit_parse_issues

    # an unknown top-level section is a trust check error too (the trust line FAILs for it)
    counted = {str(issue) for issue in limit_parse_issues(view.config.raw)} | set(top_level_warnings(view.config.raw))
    # so is an unknown model.provider (the first finding of the trust line)
    problems = [w for w in view.config.warnings if not w.startswith(("plugins", "model.provider: unknown provider"))
                and w not in counted]
    problems += [p for p in settings_from_raw(view.config.raw).problems if not p.startswith("plugins")]
    for problem in problems:
        # a non-boolean audit.required already fails closed: a FAIL, so it is fixed rather than lived with
        status = FAIL if problem.startswith("audit.required:") else WARN
        out.append(Check(status, "config", problem, f"edit {view.path}"))
    return out


def _trust(tr: Any, view: Any, installed: Callable[[], dict[str, str]]) -> list[Check]:
    if view.error is not None:
        # the parse error is the config line's FAIL; one cause, one FAIL
        return [Check(WARN, "trust", "not checked: config.yaml does not parse (every override is refused meanwhile)",
                      "fix config.yaml, then run plugin-llm trust check")]
    findings = tr.check_plugins(view, installed())
    errors = [f for f in findings if f.severity == tr.ERROR]
    warnings = [f for f in findings if f.severity != tr.ERROR]
    if not findings:
        entries = len(tr.configured_plugin_ids(view))
        return [Check(OK, "trust", f"plugins section has no problems ({entries} entr{'y' if entries == 1 else 'ies'})")]
    first = (errors or warnings)[0]
    where = f" (line {first.line})" if first.line is not None else ""
    message = f"{len(errors)} error{'s' if len(errors) != 1 else ''}, {len(warnings)} warning{'s' if len(warnings) != 1 else ''}; first: {first.path}{where}: {first.problem}"
    return [Check(FAIL if errors else WARN, "trust", message, "plugin-llm trust check (each finding with its fix)")]


# ------------------------------------------------------------------ route and credentials
def _route_and_credentials(view: Any, home: Path) -> list[Check]:

    if view.error is not None:
        return [Check(WARN, "route", "unknown while config.yaml does not parse (a running gateway keeps its last good route)",
                      "fix config.yaml")]

    if view.config.model.provider and unknown_provider_problem(view.config.model.provider):
        # the trust line FAILs for it; the route and its key cannot be checked, and their fixes would repeat it
        return [Check(WARN, "route", "not checked: model.provider is not a known provider (see the trust line)",
                      "fix model.provider first (plugin-llm trust check shows the fix)")]
    try:
        chain = resolve_chain(view.config)
    except PluginLlmConfigError as exc:
        return [Check(FAIL, "route", str(exc), f"set model.provider and model.model in {view.path}")]
    route = chain[0]
    out = [Check(OK, "route", _route_text(route)), _fast_path(route), _provider_layer(chain)]
    for fallback in chain[1:]:
        out.append(Check(OK, "fallback", f"then {_route_text(fallback)}, on a failure another provider can fix"))
    if view.config.models:
        out.append(_breakers(view))
    out.extend(_credentials(home, route))
    for fallback in chain[1:]:
        if fallback.provider != route.provider or fallback.profile != route.profile:
            out.extend(_credentials(home, fallback))
    return out


def _auxiliary(view: Any, home: Path) -> list[Check]:
    """Each ``auxiliary.<task>`` slot: its route resolves, and the key of each route it adds is there."""
    if view.error is not None or not view.config.auxiliary:
        return []
    try:
        default = resolve_chain(view.config)
    except PluginLlmConfigError:  # the route line FAILs for it
        default = ()
    checked = {(route.provider, route.profile) for route in default}
    out: list[Check] = []
    for task, slot in view.config.auxiliary.items():
        try:
            chain = resolve_chain(view.config, task=task)
        except PluginLlmConfigError as exc:
            out.append(Check(FAIL, f"auxiliary {task}", f"every call with task={task!r} is refused: {_safe(exc)}",
                             f"fix auxiliary.{task} in {view.path} (plugin-llm trust explain PLUGIN --task {task} "
                             "shows where it goes)"))
            continue
        what = "the default route, " if slot.route is None else ""
        then = "".join(f", then {_route_text(fallback)}" for fallback in chain[1:])
        timeout = f" (timeout {slot.timeout:g}s)" if slot.timeout is not None else ""
        out.append(Check(OK, f"auxiliary {task}", f"task={task!r} takes {what}{_route_text(chain[0])}{then}{timeout}"))
        for route in chain:
            if (route.provider, route.profile) not in checked:
                checked.add((route.provider, route.profile))
                out.extend(_credentials(home, route))
    return out


def _route_text(route: Any) -> str:
    endpoint = f" at {shown_url(route.base_url)}" if route.base_url else ""
    named = f"{route.name}: " if route.name else ""
    return f"{named}{route.provider} / {route.model}{endpoint}"


def _breakers(view: Any) -> Check:
    """The catalog routes' circuit breakers: OK while every one is closed."""
    import time

    config = view.config
    if not config.llm.breaker.failures:
        return Check(OK, "breakers", "off (llm.breaker: false): a failing route is tried on every call")
    try:
        held = breakers.states(config.limits, config.home, time.time())
    except StoreError as exc:
        return Check(WARN, "breakers", f"state unknown: the limits store did not answer ({_safe(exc)})",
                     "plugin-llm limits doctor")
    down = [state.as_dict() for name, state in sorted(held.items()) if name in config.models and state.state != "closed"]
    if not down:
        return Check(OK, "breakers", f"all {len(config.models)} route(s) of models: closed")
    shown = "; ".join(f"{d['route']} {d['state']} after {d['failures']} failure(s), next probe {d['retry_at'] or '-'}"
                      for d in down)
    return Check(WARN, "breakers", f"skipped while open: {shown}",
                 "check the provider of each open route; it is probed again after llm.breaker.cooldown")


def _credentials(home: Path, route: Any) -> list[Check]:

    out: list[Check] = []
    try:
        cred = CredentialStore(home).acquire(route.provider, route.profile)
    except PluginLlmError as exc:
        keyless = route.provider in KEYLESS_PROVIDERS
        out.append(Check(WARN if keyless else FAIL, "credentials", f"{route.provider}: {_safe(exc)}",
                         f"plugin-llm auth add {route.provider} --from-stdin, or export the provider's key variable"))
        return out
    if cred.source == "none":
        out.append(Check(OK, "credentials", f"{route.provider} needs no key"))
    else:
        origin = {"env": f"environment variable {cred.key_id}", "key_env": f"key_env {cred.key_id}",
                  "key_cmd": "key_cmd", "pool": f"auth.json pool ({cred.key_id})"}.get(cred.source, f"auth.json ({cred.key_id})")
        profile = f", profile {cred.profile}" if cred.profile else ""
        out.append(Check(OK, "credentials", f"{route.provider}: {cred.masked} from {origin}{profile}"))
    return out


def _fast_path(route: Any) -> Check:
    """Whether the route's calls take the transport's fast path, and why (litellm is not imported)."""
    from plugin_llm.transport import TESTED_LITELLM, fast_path_decision  # on first use: it loads the provider layer

    fast, why = fast_path_decision(route)
    if fast:
        return Check(OK, "fast path", f"yes: {why}")
    if "outside the range" in why:
        low, high = (".".join(map(str, v)) for v in TESTED_LITELLM)
        return Check(WARN, "fast path", f"no: {why}",
                     f"pip install 'litellm>={low},<{high}' (see docs/performance.md, 'Upgrading litellm')")
    return Check(OK, "fast path", f"no: {why}")


def _provider_layer(chain: Any) -> Check:
    """Whether calls on the route or its fallbacks load litellm (decided without importing it)."""
    from plugin_llm.transport import needs_litellm  # on first use: the transport package

    needing = [route for route in chain if needs_litellm(route)]
    if not needing:
        return Check(OK, "provider layer", "not loaded: the gateway sends these calls itself, without litellm")
    which = ", ".join(dict.fromkeys(route.label for route in needing))
    return Check(OK, "provider layer", f"litellm loads for calls on {which} (its import takes a few seconds, once)")


# ------------------------------------------------------------------ audit log
def _audit(home: Path, view: Any) -> list[Check]:
    logs = home / "logs"
    log = logs / "agent.log"
    required = bool(getattr(view.config.audit, "required", False))
    consequence = "calls fail closed (audit.required is true)" if required else "calls run but are not audited"
    writable = _audit_writable(home, logs, log, consequence)
    out = [writable]
    if writable.status == FAIL and not logs.is_dir():
        return out
    signing, pubkeys = _audit_signing(home, view.config.audit, has_records=_has_records(logs))
    out.append(signing)
    out.extend(_audit_verify(log, pubkeys))
    return out


def _has_records(logs: Path) -> bool:
    """Whether the audit log (the live file or a rotated one) holds anything yet."""
    try:
        return any(p.is_file() and p.stat().st_size > 0 for p in logs.glob("agent.log*"))
    except OSError:
        return False


def _audit_signing(home: Path, settings: Any, *, has_records: bool = False) -> tuple[Check, Any]:
    """Is the log signed (checkpoints an outsider can check) or only hash-chained? Unsigned is a WARN
    once the log holds records (they can be rewritten unnoticed), OK before the first call."""
    key = key_file(home, getattr(settings, "signing_key", "") or None)
    key_cmd = tuple(getattr(settings, "key_cmd", ()) or ())
    if not key_cmd and not key.exists():
        return Check(WARN if has_records else OK, "audit signing",
                     "no signing key: the log is tamper-evident against accidents only "
                     "(anyone who can write it can rewrite it and recompute the chain)",
                     "plugin-llm audit keygen (signed checkpoints an auditor checks with the public key)"), None
    try:
        signer = load_signer(key, key_cmd)
    except AuditKeyError as exc:
        return Check(FAIL, "audit signing", f"the signing key cannot be used, so no checkpoints are signed: {exc}",
                     "fix the key, or plugin-llm audit keygen --rotate"), None
    pub = pub_file(key)
    try:  # the public keys with the key rotation records (a retired key vouches for nothing after it)
        pubkeys = read_keyring(pub) if pub.is_file() else ([signer.verifier], [])
    except (AuditKeyError, OSError):
        pubkeys = ([signer.verifier], [])
    every = getattr(settings, "checkpoint_every", 1000)
    seconds = getattr(settings, "checkpoint_seconds", 60)
    return Check(OK, "audit signing", f"signed checkpoints (key id {signer.key_id_hex}, every {every} records "
                 f"and {seconds:g} s); auditors verify with {pub}"), pubkeys


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _audit_writable(home: Path, logs: Path, log: Path, consequence: str) -> Check:
    if logs.exists() and not logs.is_dir():
        return Check(FAIL, "audit log", f"{logs} is not a directory, so {log} cannot be written: {consequence}",
                     f"move {logs} aside; the log directory is created on the first call")
    if log.exists() or log.is_symlink():
        if not log.is_file():
            return Check(FAIL, "audit log", f"{log} is not a regular file: {consequence}", f"move {log} aside")
        try:
            with open(log, "ab"):  # opened for append, nothing written
                pass
        except OSError as exc:
            return Check(FAIL, "audit log", f"{log} cannot be appended to ({exc.strerror}): {consequence}",
                         f"chmod u+w {log}, or check who owns it")
        return Check(OK, "audit log", f"{log} is appendable")
    parent = logs if logs.is_dir() else _nearest_existing(logs)
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return Check(FAIL, "audit log", f"{log} cannot be created: {parent} is not writable: {consequence}",
                     f"chmod u+w {parent}, or check who owns it")
    return Check(OK, "audit log", f"{log} does not exist yet; it is created on the first call")


def _audit_verify(log: Path, keyring: Any = None) -> list[Check]:
    pubkeys, retirements = keyring if keyring is not None else (None, ())
    try:
        # retention pruning old files is normal operation: shown as a history_start warning, not a failure
        result = audit.verify(log, allow_pruned_head=True, pubkeys=pubkeys, retirements=retirements)
    except AuditLogNotFoundError:
        return [Check(OK, "audit verify", "no audit log yet")]
    except OSError as exc:
        return [Check(WARN, "audit verify", f"cannot read {log}: {exc.strerror or exc}")]
    files = len(result.files)
    if not result.ok:
        problem = result.first_error
        return [Check(FAIL, "audit verify", f"chain broken: {problem}" if problem else "chain broken",
                      "plugin-llm audit verify (the log may have been edited or truncated; keep a copy before rotating)")]
    out = [Check(OK, "audit verify", f"chain intact: {result.records} record{'s' if result.records != 1 else ''} "
                 f"in {files} file{'s' if files != 1 else ''}")]
    warnings = [w for w in result.warnings if w.kind != "unverified_tail"]
    for tail in result.warnings:
        if tail.kind == "unverified_tail":  # a running writer's normal state until its next checkpoint
            out.append(Check(OK, "audit verify", tail.detail))
    for warning in warnings[:3]:
        out.append(Check(WARN, "audit verify", str(warning), "plugin-llm audit verify"))
    if len(warnings) > 3:
        out.append(Check(WARN, "audit verify", f"... and {len(warnings) - 3} more warnings", "plugin-llm audit verify"))
    return out


# ------------------------------------------------------------------ plugins
def _list_plugins(home: Path) -> list[dict[str, Any]]:
    # doctor is read-only: a plugin failing to load here is reported as a FAIL line,
    # not appended to the audit log as the host does.
    manager = PluginManager(home, audit_events=False)
    try:
        return manager.list_plugins()
    finally:
        manager.shutdown()  # out-of-process plugins were started to be checked: stop them now


def _plugins(plugins: list[dict[str, Any]], view: Any) -> list[Check]:
    counts: dict[str, int] = {}
    for p in plugins:
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in counts.items()) or "none"
    note = " (config.yaml does not parse: none enabled)" if view.error is not None else ""
    isolated = sum(1 for p in plugins if p["status"] == "enabled" and p.get("isolation") == "process")
    if isolated:
        note += f"; {isolated} of them out of process"
    out = [Check(OK, "plugins", f"{len(plugins)} found: {summary}{note}")]
    for p in plugins:
        if p["status"] == "failed":
            out.append(Check(FAIL, "plugin " + p["key"], f"failed to load: {p['error']}",
                             f"fix it (plugin-llm plugins info {p['key']}) or add it to plugins.disabled"))
        elif p["status"] == "enabled":
            if p.get("isolation") == "process":
                how = "confined by bubblewrap" if p.get("confinement") == "bubblewrap" else \
                    "without bubblewrap (it can read files this OS user can)"
                if p.get("isolation_network") == "host":  # it can reach every service the host can (Redis too)
                    how += ", with the host's network"
                out.append(Check(OK, "plugin " + p["key"], f"runs out of process, {how}"))
                if p.get("isolation_network") == "host" and _open_redis(view):
                    out.append(Check(WARN, "plugin " + p["key"], "has the host's network, and limits.redis_url has no "
                                     "password: it can connect to that Redis and change the limit counts there "
                                     "(token records are signed: it cannot make one)",
                                     "give the Redis a password (requirepass) and put it in limits.redis_url, or "
                                     f"drop isolation_network: host from plugins.entries.{p['key']}"))
            if p["missing_env"]:
                out.append(Check(WARN, "plugin " + p["key"], f"missing environment variable{'s' if len(p['missing_env']) > 1 else ''} "
                                 f"{', '.join(p['missing_env'])} (it loads, but may not work)",
                                 f"export {p['missing_env'][0]}=... before starting the host"))
            for warning in p.get("warnings") or ():
                out.append(Check(WARN, "plugin " + p["key"], warning))
    return out


def _open_redis(view: Any) -> bool:
    """The limits (and tokens) live in a Redis that takes connections without a password."""
    config = getattr(view, "config", None)
    settings = getattr(config, "limits", None) if view.error is None else None
    return settings is not None and settings.store == "redis" and not url_secrets(settings.redis_url)


# ------------------------------------------------------------------ bubblewrap
def _bubblewrap(plugins: Callable[[], list[dict[str, Any]]]) -> list[Check]:
    """Whether out-of-process plugins run inside bubblewrap here, and why not (a WARN only when one is isolated)."""
    status = bubblewrap_status()
    if status.usable:
        return [Check(OK, "bubblewrap", f"in effect for out-of-process plugins: {status.reason}")]
    try:
        isolated = [p["key"] for p in plugins() if p.get("isolation") == "process" and p.get("status") == "enabled"]
    except Exception:  # the plugins check reports it
        isolated = []
    message = f"not in effect: {status.reason}; out-of-process plugins get process confinement only " \
              "(they can read files this OS user can)"
    if isolated:
        return [Check(WARN, "bubblewrap", f"{message}; isolated plugins: {', '.join(isolated[:10])}",
                      "install bubblewrap (apt-get install bubblewrap) so isolated plugins cannot read the home "
                      "and get no network unless isolation_network: host")]
    return [Check(OK, "bubblewrap", message)]


# ------------------------------------------------------------------ litellm
def _telemetry(view: Any, find_spec: Callable[[str], Any] | None = None) -> list[Check]:
    """With ``telemetry:`` configured: its SDK and exporter are installed (found, not imported), and the
    variables ``headers_from_env`` names are set (their names only, never a value)."""
    import importlib.util

    settings = view.config.telemetry
    if not settings.enabled:
        return []
    find_spec = find_spec or importlib.util.find_spec
    exporter = "grpc" if settings.protocol == "grpc" else "http"
    modules = ("opentelemetry.sdk", f"opentelemetry.exporter.otlp.proto.{exporter}")
    try:
        missing = [m for m in modules if find_spec(m) is None]
    except (ImportError, ValueError):
        missing = list(modules)
    if missing:
        return [Check(WARN, "telemetry", f"configured (telemetry.otlp_endpoint) but {', '.join(missing)} is not "
                      "installed: no traces or metrics are exported", SDK_MISSING_FIX)]
    out = [Check(OK, "telemetry", f"exports traces and metrics to {settings.otlp_endpoint} ({settings.protocol})")]
    for header, env in settings.headers_from_env:
        if not os.environ.get(env):
            out.append(Check(WARN, "telemetry", f"telemetry.headers_from_env.{header}: ${env} is not set, so the "
                             "header is not sent", f"set {env} in the environment or in <home>/.env"))
    return out


def _litellm(version_of: Callable[[str], str | None] | None = None,
             files_of: Callable[[str], Any] | None = None) -> list[Check]:
    """litellm installed, its version, and not a known-malicious release (``version_of``/``files_of``:
    the package metadata readers, replaceable in tests)."""
    import importlib.util

    version_of = version_of or supply_chain.installed_version
    files_of = files_of or supply_chain.distribution_files
    # the poisoned releases ran at interpreter start: checked even when the package directory is gone
    bad = [Check(FAIL, "litellm", p.problem, p.fix)
           for p in supply_chain.check_distribution("litellm", version_of=version_of, files_of=files_of)]
    spec = importlib.util.find_spec("litellm")  # locates the package; does not import it
    if spec is None:
        return bad or [Check(FAIL, "litellm", "not installed: every provider call (even the local model) goes through it",
                             "pip install litellm")]
    version = version_of("litellm")
    if version is None:
        return [Check(WARN, "litellm", f"found at {spec.origin} but without package metadata (version unknown)",
                      "reinstall it: pip install --force-reinstall litellm")]
    if bad:
        return bad
    out = [Check(OK, "litellm", f"{version} installed (not imported by doctor; not a known-malicious release)")]
    locations = list(spec.submodule_search_locations or ())
    if locations and not (Path(locations[0]) / "model_prices_and_context_window_backup.json").is_file():
        out.append(Check(WARN, "litellm", "its bundled price map is missing: cost_usd cannot be computed offline",
                         "reinstall litellm"))
    return out
