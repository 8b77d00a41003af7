"""Which environment variables authenticate or steer a model provider: one rule, by name.

:func:`steering_reason` (may a plugin *set* it?) and :func:`is_credential_name`
(may a plugin *read* it?) share the tables below. Names are compared
upper-cased, so ``https_proxy`` is ``HTTPS_PROXY``. Nothing here imports
litellm: its provider names are read as text from its installed source.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path

from .authfile import AUTH_FILE_NAME, load_auth
from .providers import ENV_VARS, KEYLESS_PROVIDERS, NO_ENV_FALLBACK, env_vars_for

__all__ = ["litellm_providers", "provider_names", "route_key_names", "steering_reason", "is_credential_name",
           "auth_file_names"]

_ENUM_MEMBER = re.compile(r'^\s+[A-Z][A-Z0-9_]*\s*=\s*"([a-z0-9_.\-]+)"', re.M)

#: name parts that make a variable a secret or a file holding one (``*_API_KEY``, ``*_SECRET_ACCESS_KEY``,
#: ``*_SESSION_TOKEN``, ``*_KEY_FILE``, ``*_CREDENTIALS``, ``*_PASSWORD``, ``*_JWT`` ...)
_SECRET_WORDS = frozenset({"KEY", "KEYS", "APIKEY", "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD",
                           "LOGIN", "HEADERS", "CREDENTIAL", "CREDENTIALS", "CREDS", "JWT", "PEM", "AUTH", "OAUTH", "BEARER"})
#: name parts that make a variable an endpoint (``*_API_BASE``, ``*_BASE_URL``, ``*_ENDPOINT``, ``*_HOST`` ...)
_ENDPOINT_WORDS = frozenset({"BASE", "URL", "URI", "ENDPOINT", "HOST", "DSN", "PROXY"})
#: after a provider's own prefix only: what selects its account, project or region
_PROVIDER_WORDS = frozenset({"ACCOUNT", "PROJECT", "REGION", "LOCATION", "TENANT", "ORGANIZATION", "ORG",
                             "WORKSPACE", "DEPLOYMENT", "SPACE", "SCOPE", "CLIENT", "CERT", "CERTIFICATE"})
#: whole families read by the cloud SDKs litellm's routes use (boto3 for bedrock/sagemaker, azure-identity,
#: google-auth for vertex_ai) and by litellm itself: every variable of theirs selects or holds a credential
_FAMILIES = ("AWS", "AZURE", "VERTEX", "VERTEXAI", "GOOGLE_CLOUD", "GCLOUD", "GCS", "CLOUDSDK", "GCE_METADATA",
             "BOTO", "LITELLM")
#: single names of the same kind that no pattern catches
_EXACT = frozenset({"GOOGLE_APPLICATION_CREDENTIALS", "NETRC", "AIOHTTP_TRUST_ENV", "DISABLE_AIOHTTP_TRUST_ENV",
                    "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "HTTPX_SSL_CERT_FILE",
                    "PROJECT_ID", "REGION", "SPACE_ID"})  # the last three: litellm's watsonx fallbacks
#: TLS trust: ``SSL_*`` (SSL_CERT_FILE, SSL_CERT_DIR, SSL_VERIFY, ...) and these endings
_TLS_SUFFIXES = ("_CA_BUNDLE", "_CA_CERT", "_CA_CERTS", "_CA_FILE", "_CA_PATH", "_CERT_FILE", "_CERT_DIR",
                 "_SSL_VERIFY", "_VERIFY_SSL", "_CLIENT_CERT", "_CLIENT_KEY")


@functools.lru_cache(maxsize=1)
def litellm_providers() -> frozenset[str]:
    """litellm's provider names (its ``LlmProviders`` enum, read as text; empty when unreadable)."""
    spec = importlib.util.find_spec("litellm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    path = Path(next(iter(spec.submodule_search_locations))) / "types" / "utils.py"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return frozenset()
    start = text.find("class LlmProviders(")
    if start < 0:
        return frozenset()
    end = text.find("\nclass ", start + 1)
    return frozenset(_ENUM_MEMBER.findall(text[start:end if end > 0 else None]))


def provider_names() -> frozenset[str]:
    """Every provider a route can name whose key may come from the environment."""
    return (frozenset(ENV_VARS) | KEYLESS_PROVIDERS | litellm_providers()) - NO_ENV_FALLBACK


def route_key_names(providers: Iterable[str] = ()) -> frozenset[str]:
    """The variables the credential store reads a key from (:func:`~auth.providers.env_vars_for`) for every
    known provider and ``providers``."""
    return _route_key_names() | frozenset(v for p in providers for v in env_vars_for(str(p).strip().lower()))


@functools.lru_cache(maxsize=1)
def _route_key_names() -> frozenset[str]:
    return frozenset(v for p in provider_names() for v in env_vars_for(p))


@functools.lru_cache(maxsize=1)
def _provider_prefixes() -> frozenset[str]:
    """``NOVITA``, ``LM_STUDIO``, ... and the prefixes of the key variables themselves (``HF``, ``OR``, ``CO``)."""
    prefixes = {p.upper().replace("-", "_").replace(".", "_") for p in provider_names()}
    for name in _route_key_names():
        head, _, _ = name.rpartition("_API_KEY") if name.endswith("_API_KEY") else name.rpartition("_")
        if head:
            prefixes.add(head)
    return frozenset(p for p in prefixes if p)


def _heads(upper: str) -> Iterable[tuple[str, list[str]]]:
    """Each ``PREFIX`` / remaining words split of ``upper`` at an underscore."""
    words = upper.split("_")
    for i in range(1, len(words)):
        yield "_".join(words[:i]), words[i:]


def _is_secret_word(word: str) -> bool:
    return word in _SECRET_WORDS or word.endswith(("APIKEY", "TOKEN"))


def _network_reason(upper: str) -> str | None:
    if upper.endswith("_PROXY") or upper == "PROXY":
        return "a proxy setting (it decides where this host's requests go)"
    if upper in _EXACT or upper.startswith("SSL_") or upper.endswith(_TLS_SUFFIXES):
        return "a TLS, credential or account setting of this host's model clients"
    return None


def _family(upper: str) -> bool:
    return any(upper == f or upper.startswith(f + "_") for f in _FAMILIES)


def steering_reason(name: str, *, any_provider: bool = True) -> str | None:
    """Why a plugin may not set ``name`` (None when it may).

    Refused: every variable the credential store reads a provider key from;
    any name shaped like a key, secret, key file or endpoint (``*_API_KEY``,
    ``*_SECRET_ACCESS_KEY``, ``*_TOKEN``, ``*_CREDENTIALS``, ``*_API_BASE``,
    ``*_BASE_URL``, ``*_ENDPOINT``, ...; litellm reads ``<PROVIDER>_API_KEY``
    and ``<PROVIDER>_API_BASE`` for any provider a route names); a provider's
    account, project or region; the cloud SDK families (``AWS_*``,
    ``AZURE_*``, ...); proxies and TLS trust (``HTTPS_PROXY`` in any case,
    ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ...). ``any_provider=False``
    applies the key and endpoint shapes after a known provider's prefix only
    (``DEEPSEEK_API_BASE``, not a plugin's own ``MY_SERVICE_API_KEY``).
    """
    upper = str(name).upper()
    network = _network_reason(upper)
    if network:
        return network
    if upper in _route_key_names():
        return "a variable this host reads a model provider's key from"
    if _family(upper):
        return "a cloud SDK setting this host's model routes authenticate with"
    prefixes = _provider_prefixes()
    for head, rest in _heads(upper):
        if not any_provider and head not in prefixes:
            continue
        if any(_is_secret_word(w) for w in rest):
            return "shaped like a key, secret or key file (a provider's key is read from such a variable)"
        if any(w in _ENDPOINT_WORDS for w in rest):
            return "shaped like an endpoint (a provider's API base is read from such a variable)"
        if head in prefixes and any(w in _PROVIDER_WORDS for w in rest):
            return f"a setting of the model provider {head.lower()}"
    return None


def is_credential_name(name: str, *, key_names: Iterable[str] = (), providers: Iterable[str] = ()) -> bool:
    """May ``name`` hold a credential of this host's model routes? (Such variables are kept from plugins.)

    True for: every variable the credential store reads a key from, for every
    known provider and ``providers`` (auth.json's); ``key_names`` (auth.json's
    ``key_env``); a key, secret or key file after a provider's prefix
    (``HF_TOKEN``, ``GITHUB_API_KEY``, ``NOVITA_API_KEY``); the cloud SDK
    families; proxy settings (they may carry ``user:password@``). A plugin's
    own ``MY_SERVICE_API_KEY`` is not one, unless a provider has that name.
    """
    upper = str(name).upper()
    if upper.endswith("_PROXY") or upper in ("GOOGLE_APPLICATION_CREDENTIALS", "NETRC"):
        return True
    extra = {str(p).upper().replace("-", "_").replace(".", "_") for p in providers}
    if upper in route_key_names(providers) or upper in {str(k).upper() for k in key_names} or _family(upper):
        return True
    prefixes = _provider_prefixes() | extra
    return any(head in prefixes and any(_is_secret_word(w) for w in rest) for head, rest in _heads(upper))


def auth_file_names(home: Path) -> tuple[frozenset[str], frozenset[str]]:
    """``(key_env names, provider names)`` of ``<home>/auth.json`` (empty when it is absent or unusable)."""
    try:
        spec, _ = load_auth(Path(home) / AUTH_FILE_NAME)
    except Exception:  # an unusable auth.json holds nothing the host would use
        return frozenset(), frozenset()
    entries = list(spec.providers.values())
    for table in spec.profiles.values():
        entries.extend(table.values())
    return (frozenset(e.env_var for e in entries if e.env_var),
            frozenset(str(e.provider) for e in entries if e.provider))
