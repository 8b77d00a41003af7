"""The environment of an isolated plugin's child: an allowlist, never the host's credentials.

The child inherits :data:`PASSED_ENV` (and ``LC_*``, proxies without ``user:pass@``) plus its own
``requires_env`` from the host's environment or ``<home>/.env``; never ``HERMES_HOME``, a credential
variable of the host, a ``key_env`` of ``auth.json`` or a value holding the limits store's password
(those are withheld, and named). ``PYTHONPATH`` gets the gateway's packages when the host imports
them from a source checkout.
"""

from __future__ import annotations

import importlib.util
import os
import re
import site
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

from plugin_llm.home_env import read_env_file
from plugin_llm.limits.settings import url_secrets
from plugin_llm.plugin_env import credential_check

__all__ = ["PASSED_ENV"]

#: Host environment variables a child inherits when set (``LC_*`` too). Nothing here carries a secret.
PASSED_ENV = (
    "PATH", "LANG", "LANGUAGE", "TZ",
    # the interpreter's own settings (PYTHONPATH also gets the plugin_llm package when the host needs it)
    "PYTHONPATH", "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONUTF8",
    "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDEVMODE",
    "PYTHONFAULTHANDLER", "PYTHONUNBUFFERED", "PYTHONOPTIMIZE", "PYTHONINTMAXSTRDIGITS",
    "LD_LIBRARY_PATH",  # an interpreter built with shared libraries outside the system paths needs it to start
    # TLS trust for plugins that call APIs (file paths)
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
)
#: Proxy settings are passed only without credentials in them (``user:pass@`` is withheld).
_PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy")
#: Never passed, whatever ``requires_env`` says: the host's own identity and credentials.
_NEVER_ENV = frozenset({"HERMES_HOME", "PLUGIN_LLM_TOKEN"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _credential_names(home: Path) -> Callable[[str], bool]:
    """Is a variable one of the host's credentials (:func:`plugin_llm.plugin_env.credential_check`)? Proxies
    are passed by their own rule (without ``user:pass@``), never by ``requires_env``."""
    credential = credential_check(home)
    return lambda name: name in _NEVER_ENV or credential(name)


def _child_env(requires_env: Sequence[str], home: Path, credential_names: Callable[[str], bool],
               scratch: Path) -> tuple[dict[str, str], tuple[str, ...]]:
    host = os.environ
    env: dict[str, str] = {}
    for name in PASSED_ENV:
        if host.get(name):
            env[name] = host[name]
    for name, value in host.items():
        if name.startswith("LC_") and _ENV_NAME.match(name):
            env[name] = value
    for name in _PROXY_ENV:
        value = host.get(name)
        if value and "@" not in value:
            env[name] = value
    env.setdefault("PATH", os.defpath)
    pythonpath = _pythonpath(env.get("PYTHONPATH"))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    user_site = _user_site()
    if user_site is not None:  # the host imports from the user's site-packages: so must the child
        env["PYTHONUSERBASE"] = site.getuserbase()
    # Fewer malloc arenas: per-thread arenas reserve 64 MiB of address space each, which RLIMIT_AS would count.
    env["MALLOC_ARENA_MAX"] = host.get("MALLOC_ARENA_MAX") or "2"

    withheld: list[str] = []
    wanted = [n for n in dict.fromkeys(requires_env) if isinstance(n, str) and _ENV_NAME.match(n)]
    dotenv: dict[str, str] | None = None
    for name in wanted:
        if credential_names(name):
            withheld.append(name)
            if name not in _PROXY_ENV:  # a proxy the allowlist passed (without credentials) stays
                env.pop(name, None)
            continue
        value = host.get(name)
        if not value:  # as the host loads <home>/.env: the process environment wins, the file fills in
            if dotenv is None:
                dotenv = _home_env(home)
            value = dotenv.get(name)
        if value:
            env[name] = value
    env["HOME"] = env["TMPDIR"] = str(scratch)
    return env, tuple(withheld)


def _without_store_secrets(env: dict[str, str], withheld: tuple[str, ...], home: Path) -> tuple[str, ...]:
    """Drop every variable whose value holds the password of ``limits.redis_url`` (the store of the tokens and
    limits: a plugin must never be able to write what authenticates or limits it); their names join ``withheld``."""
    try:
        from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

        found = url_secrets(get_config_source(home).current().limits.redis_url)
    except Exception:  # an unreadable config names no store the host could use
        return withheld
    dropped = [name for name, value in env.items() if any(secret in value for secret in found)]
    for name in dropped:
        del env[name]
    return (*withheld, *dropped)


def _home_env(home: Path) -> dict[str, str]:
    values = read_env_file(home)
    if values:
        from auth import register_secret  # as load_home_env does: .env values are often keys

        for value in values.values():
            register_secret(value)
    return values


def _site_dirs() -> set[str]:
    dirs = set()
    try:
        dirs.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:  # pragma: no cover - old virtualenv's site module
        pass
    return dirs


def _user_site() -> str | None:
    """The user's site-packages when the host imports from it (it follows HOME, which the child does not share)."""
    user_site = site.USER_SITE if site.ENABLE_USER_SITE else None
    if user_site and os.path.isdir(user_site) and user_site in sys.path:
        return user_site
    return None


def _package_roots() -> list[str]:
    """The directories the gateway's packages are imported from (plugin_llm, and auth/audit beside it)."""
    roots = []
    for name in ("plugin_llm", "auth", "audit"):
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if found is not None and found.origin:
            roots.append(os.path.dirname(os.path.dirname(os.path.realpath(found.origin))))
    return list(dict.fromkeys(roots))


def _pythonpath(host_value: str | None) -> str:
    """The host's PYTHONPATH, plus the package roots the host imports through ``sys.path`` (a source checkout).

    A venv and an editable install need nothing here: the interpreter is the
    host's (``sys.executable``), which finds its own site-packages and their
    ``.pth`` import hooks.
    """
    entries = [os.path.abspath(p) for p in (host_value or "").split(os.pathsep) if p]  # the child's cwd differs
    on_path = {os.path.realpath(p or os.getcwd()) for p in sys.path}
    site_dirs = _site_dirs()
    for root in _package_roots():
        if root in on_path and root not in site_dirs and root not in entries:
            entries.append(root)
    return os.pathsep.join(entries)
