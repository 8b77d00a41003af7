"""Credentials for the gateway: ``auth.json``, profiles, pools, key indirection, redaction.

Plugins never see anything from this package. The host resolves a
:class:`Credential` for each call (:func:`get_store` ->
:meth:`CredentialStore.acquire`), the transport alone calls
:meth:`Credential.reveal`, and every log sink, audit line, exception message
and CLI output passes through :func:`redact`.

Importing this package is cheap (stdlib only plus :mod:`plugin_llm.errors`);
it never imports litellm.
"""

from .authfile import (
    AUTH_FILE_NAME,
    AuthSpec,
    EntrySpec,
    load_auth,
    locked,
    parse_auth,
    read_document,
    write_document,
)
from .keycmd import DEFAULT_KEY_CMD_TIMEOUT, run_key_cmd
from .providers import ENV_VARS, KEYLESS_PROVIDERS, env_vars_for, normalize_provider
from .redaction import (
    MIN_SECRET_LENGTH,
    RedactingFilter,
    install_log_redaction,
    mask,
    redact,
    redact_obj,
    redact_processor,
    register_secret,
)
from .store import COOLING_STATUSES, Credential, CredentialStore, PoolExhaustedError, get_store

__all__ = [
    # redaction
    "redact",
    "redact_obj",
    "register_secret",
    "mask",
    "RedactingFilter",
    "redact_processor",
    "install_log_redaction",
    "MIN_SECRET_LENGTH",
    # store
    "Credential",
    "CredentialStore",
    "PoolExhaustedError",
    "get_store",
    "COOLING_STATUSES",
    # auth.json
    "AUTH_FILE_NAME",
    "AuthSpec",
    "EntrySpec",
    "load_auth",
    "parse_auth",
    "read_document",
    "write_document",
    "locked",
    # key sources
    "run_key_cmd",
    "DEFAULT_KEY_CMD_TIMEOUT",
    "ENV_VARS",
    "KEYLESS_PROVIDERS",
    "env_vars_for",
    "normalize_provider",
]
