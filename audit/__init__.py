"""Tamper-evident audit log of plugin LLM calls.

Writing: :func:`get_audit_log` / :class:`AuditLog` append hash-chained JSON
lines to ``$HERMES_HOME/logs/agent.log`` and, with a signing key
(:mod:`audit.signing`), signed checkpoints to ``agent.log.checkpoints``
(:mod:`audit.checkpoints`). Reading: :func:`iter_records`,
:func:`tail_records`, :func:`verify` (``pubkeys=`` checks the checkpoints),
:func:`stats`, :func:`export_records`. The record layout is in
:mod:`audit.records`.

Names are imported lazily, so ``import audit`` is cheap and readers (the
``plugin-llm audit`` CLI) never load the writer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    # writing
    "AuditLog",
    "AuditSettings",
    "AuditWriteError",
    "get_audit_log",
    "parse_audit_settings",
    # records
    "SCHEMA_VERSION",
    "call_record",
    "canonical_json",
    "sha256_text",
    "sha256_json",
    "new_call_id",
    "config_reload_fields",
    "is_call_record",
    # reading
    "AuditLogNotFoundError",
    "iter_records",
    "tail_records",
    "follow_records",
    "parse_time",
    "verify",
    "VerifyResult",
    "VerifyProblem",
    "CheckpointSummary",
    # signing and export
    "Signer",
    "Verifier",
    "AuditKeyError",
    "generate_key",
    "read_verifiers",
    "read_keyring",
    "Retirement",
    "export_records",
    "stats",
    "StatsRow",
    "resolve_log_path",
]

_HOME: dict[str, str] = {
    "AuditLog": "audit.writer",
    "get_audit_log": "audit.writer",
    "AuditSettings": "audit.settings",
    "parse_audit_settings": "audit.settings",
    "AuditWriteError": "audit.errors",
    "AuditLogNotFoundError": "audit.errors",
    "SCHEMA_VERSION": "audit.records",
    "call_record": "audit.records",
    "canonical_json": "audit.records",
    "sha256_text": "audit.records",
    "sha256_json": "audit.records",
    "new_call_id": "audit.records",
    "config_reload_fields": "audit.records",
    "is_call_record": "audit.records",
    "iter_records": "audit.reader",
    "tail_records": "audit.reader",
    "follow_records": "audit.reader",
    "parse_time": "audit.reader",
    "verify": "audit.verifier",
    "VerifyResult": "audit.verifier",
    "VerifyProblem": "audit.verifier",
    "CheckpointSummary": "audit.verifier",
    "Signer": "audit.signing",
    "Verifier": "audit.signing",
    "AuditKeyError": "audit.signing",
    "generate_key": "audit.signing",
    "read_verifiers": "audit.signing",
    "read_keyring": "audit.signing",
    "Retirement": "audit.signing",
    "export_records": "audit.export",
    "stats": "audit.summary",
    "StatsRow": "audit.summary",
    "resolve_log_path": "audit.logfiles",
}

if TYPE_CHECKING:  # pragma: no cover
    from audit.errors import AuditLogNotFoundError, AuditWriteError
    from audit.logfiles import resolve_log_path
    from audit.reader import follow_records, iter_records, parse_time, tail_records
    from audit.records import (
        SCHEMA_VERSION,
        call_record,
        canonical_json,
        config_reload_fields,
        is_call_record,
        new_call_id,
        sha256_json,
        sha256_text,
    )
    from audit.settings import AuditSettings, parse_audit_settings
    from audit.summary import StatsRow, stats
    from audit.export import export_records
    from audit.signing import AuditKeyError, Retirement, Signer, Verifier, generate_key, read_keyring, read_verifiers
    from audit.verifier import CheckpointSummary, VerifyProblem, VerifyResult, verify
    from audit.writer import AuditLog, get_audit_log


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'audit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
