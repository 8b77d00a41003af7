"""The audit record schema: field names, allowed values, hashing helpers.

Every line of ``agent.log`` is one JSON object. Call records (``kind: "call"``) carry the fields
below - exactly one per call outcome (and per denial); operational events (``kind: "event"``)
carry ``event`` plus their own fields. Both carry the chain fields ``schema``, ``seq``,
``prev_hash`` and ``hash`` added by the writer. Field names follow the OpenTelemetry GenAI
semantic conventions where one exists; every field is listed in docs/reference/audit-schema.md.

With ``audit.required: true`` the gateway also writes an ``llm.call.begin`` event
(:data:`EVENT_LLM_CALL_BEGIN`, same ``call_id``) before the provider sees the request; if that
write fails the call is refused with nothing sent. A begin without an outcome record means the
host died, or the log broke, while the call was in flight.

This module is pure: no I/O, no globals that change.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SCHEMA_VERSION",
    # chain / envelope
    "SCHEMA", "SEQ", "PREV_HASH", "HASH", "TS", "EVENT", "KIND",
    "KIND_CALL", "KIND_EVENT",
    # call fields
    "CALL_ID", "PLUGIN_ID", "PURPOSE", "API", "MODE", "DECISION", "DECISION_REASON",
    "STATUS", "ERROR_TYPE", "OPERATION_NAME", "PROVIDER_NAME", "REQUEST_MODEL",
    "RESPONSE_MODEL", "AGENT_ID", "PROFILE", "INPUT_TOKENS", "OUTPUT_TOKENS",
    "COST_USD", "ATTEMPTS", "LATENCY_MS", "OVERHEAD_MS", "SCHEMA_NAME", "SCHEMA_SHA256",
    "VALIDATION", "PROMPT_SHA256", "RESPONSE_SHA256", "AUDIT_WRITE_ERROR", "USAGE_ANOMALY", "ERROR_CAUSE",
    "INPUT_MESSAGES", "OUTPUT_MESSAGES", "SYSTEM_INSTRUCTIONS", "OUTPUT_TEXT", "CONTENT_FIELDS",
    "CALL_FIELDS", "OPTIONAL_CALL_FIELDS", "DECISION_KEY", "ERROR_MESSAGE", "CONFIG_ERROR", "DENIED_ARGUMENTS",
    "REPAIRS", "AUDIT_RECORD_ERROR", "LIMITS_RESERVED_USD", "LIMITS_RESERVED_TOKENS", "LIMITS_STORE_ERROR",
    "LIMITS_LIMIT", "LIMITS_RESETS_AT", "LIMITS_REPAIR_REFUSED", "LIMITS_REPAIR_REFUSED_KEY", "LIMITS_MAX_TOKENS_SENT",
    "LIMITS_RESERVED_INPUT_TOKENS", "LIMITS_INPUT_COUNT", "INPUT_COUNTS", "STREAM", "STREAM_PARTIAL",
    "STREAM_DELIVERED_CHARS", "STREAM_ABANDONED_BY", "TIME_TO_FIRST_CHUNK",
    "REQUEST_MAX_TOKENS", "REQUEST_TEMPERATURE", "REQUEST_TOP_P", "FINISH_REASONS", "CACHE_READ_TOKENS",
    "CACHE_CREATION_TOKENS", "ROUTE", "ROUTE_ATTEMPTS", "TASK", "RESPONSE_ID",
    # builders
    "CallFacts", "denial_record", "error_record", "outcome_record", "mcp_record",
    # MCP tool calls
    "EVENT_MCP_CALL", "MCP_SERVER", "MCP_TOOL", "DURATION_MS", "ARGUMENTS_SHA256", "RESULT_SHA256", "MCP_TRUNCATED",
    "MCP_FIELDS", "OPTIONAL_MCP_FIELDS", "MCP_STATUSES",
    # values
    "APIS", "MODES", "DECISIONS", "STATUSES", "VALIDATIONS",
    # events
    "EVENT_LLM_CALL", "EVENT_LLM_CALL_BEGIN", "EVENT_CHAIN_RESUMED", "EVENT_PLUGIN_LOAD_FAILED", "EVENT_HOOK_ERROR",
    "EVENT_CONFIG_RELOADED", "EVENT_AUDIT_SETTINGS_CHANGED",
    # helpers
    "canonical_json", "canonical_record", "record_layout", "sha256_text", "sha256_json", "new_call_id", "call_record",
    "is_call_record", "is_denied", "config_reload_fields", "changed_entries",
]

#: Version of the record layout; bumped when a field changes meaning.
SCHEMA_VERSION = 1

# -- envelope, added by the writer ------------------------------------------------
SCHEMA = "schema"
SEQ = "seq"
PREV_HASH = "prev_hash"
HASH = "hash"
TS = "ts"
EVENT = "event"
KIND = "kind"
KIND_CALL = "call"
KIND_EVENT = "event"

# -- call record fields -------------------------------------------------
CALL_ID = "call_id"
PLUGIN_ID = "plugin_id"
PURPOSE = "purpose"
API = "api"
MODE = "mode"
DECISION = "decision"
DECISION_REASON = "decision_reason"
STATUS = "status"
ERROR_TYPE = "error.type"
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
AGENT_ID = "agent_id"
PROFILE = "profile"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
COST_USD = "cost_usd"
ATTEMPTS = "attempts"
LATENCY_MS = "latency_ms"
OVERHEAD_MS = "overhead_ms"
SCHEMA_NAME = "schema_name"
SCHEMA_SHA256 = "schema_sha256"
VALIDATION = "validation"
PROMPT_SHA256 = "prompt_sha256"
RESPONSE_SHA256 = "response_sha256"
#: the exact config key that would allow a trust denial, or the limit's key of a limits refusal
DECISION_KEY = "decision_key"
ERROR_MESSAGE = "error.message"
#: on denials while config.yaml is unparsable (the gate was failing closed): the parse error
CONFIG_ERROR = "config_error"
#: an endpoint or key argument a plugin passed (a trust denial): the argument names, never values
DENIED_ARGUMENTS = "denied_arguments"
REPAIRS = "repairs"
#: the outcome record could not be built in full (a defect): the exception type, and the fields it could build
AUDIT_RECORD_ERROR = "audit_record_error"
# -- limits (see docs: Budgets and rate limits) ----------------------------------------
LIMITS_RESERVED_USD = "limits.reserved_usd"
LIMITS_RESERVED_TOKENS = "limits.reserved_tokens"
LIMITS_STORE_ERROR = "limits.store_error"
LIMITS_LIMIT = "limits.limit"
LIMITS_RESETS_AT = "limits.resets_at"
LIMITS_REPAIR_REFUSED = "limits.repair_refused"
LIMITS_REPAIR_REFUSED_KEY = "limits.repair_refused_key"
LIMITS_MAX_TOKENS_SENT = "limits.max_tokens_sent"
#: the input tokens of the reservation, and how they were counted (:data:`INPUT_COUNTS`)
LIMITS_RESERVED_INPUT_TOKENS = "limits.reserved_input_tokens"
LIMITS_INPUT_COUNT = "limits.input_count"
# -- streams -----------------------------------------------------------------------------
#: the catalog route that answered (``models.<name>``), and each route of its chain tried in order:
#: ``{"route", "outcome", "latency_ms"}`` (outcome ``ok``, ``skipped`` for an open circuit breaker,
#: ``timeout``, ``provider_error:<status>``, ...)
ROUTE = "route"
ROUTE_ATTEMPTS = "route.attempts"
#: the auxiliary task the call was routed as (``task=``; its slot is ``auxiliary.<task>``), or the task a
#: denial refused; absent for a call on the default route
TASK = "task"
STREAM = "stream"
STREAM_PARTIAL = "stream.partial"
STREAM_DELIVERED_CHARS = "stream.delivered_chars"
#: why the host ended a stream early (``deadline``: its client stopped reading; ``write_timeout``)
STREAM_ABANDONED_BY = "stream.abandoned_by"
#: seconds from the call's start to the stream's first delta
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
# -- what the plugin asked for and how the reply ended (OpenTelemetry GenAI names), when known ---------------
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
FINISH_REASONS = "gen_ai.response.finish_reasons"
#: the provider's id of the reply (a stream's: of its first chunk), when it sent one
RESPONSE_ID = "gen_ai.response.id"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
#: added by the writer to the first line written after lines were lost
AUDIT_WRITE_ERROR = "audit_write_error"
#: present only when needed: what provider-reported usage had to be clamped
#: (list of short descriptions), and the exception type behind an unexpected
#: failure (``status: "error"``; ``error.type`` is what the plugin was raised)
USAGE_ANOMALY = "usage_anomaly"
ERROR_CAUSE = "error.cause"

# -- message content: only with ``audit.log_content: true`` -------------------------
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
OUTPUT_TEXT = "gen_ai.output.text"
#: dropped by the writer unless the operator opted in
CONTENT_FIELDS: tuple[str, ...] = (INPUT_MESSAGES, OUTPUT_MESSAGES, SYSTEM_INSTRUCTIONS, OUTPUT_TEXT)

#: every field of a call record, in documentation order
CALL_FIELDS: tuple[str, ...] = (
    TS, EVENT, KIND, CALL_ID, PLUGIN_ID, PURPOSE, API, MODE, DECISION, DECISION_REASON,
    STATUS, ERROR_TYPE, OPERATION_NAME, PROVIDER_NAME, REQUEST_MODEL, RESPONSE_MODEL,
    AGENT_ID, PROFILE, INPUT_TOKENS, OUTPUT_TOKENS, COST_USD, ATTEMPTS, LATENCY_MS,
    OVERHEAD_MS, SCHEMA_NAME, SCHEMA_SHA256, VALIDATION, PROMPT_SHA256, RESPONSE_SHA256,
)
#: fields a call record has only when they apply (each documented in the record schema reference)
OPTIONAL_CALL_FIELDS: tuple[str, ...] = (
    DECISION_KEY, ERROR_MESSAGE, ERROR_CAUSE, CONFIG_ERROR, DENIED_ARGUMENTS, REPAIRS, USAGE_ANOMALY,
    AUDIT_WRITE_ERROR, AUDIT_RECORD_ERROR, LIMITS_RESERVED_USD, LIMITS_RESERVED_TOKENS, LIMITS_STORE_ERROR,
    LIMITS_LIMIT, LIMITS_RESETS_AT, LIMITS_REPAIR_REFUSED, LIMITS_REPAIR_REFUSED_KEY, LIMITS_MAX_TOKENS_SENT,
    LIMITS_RESERVED_INPUT_TOKENS, LIMITS_INPUT_COUNT, STREAM, STREAM_PARTIAL, STREAM_DELIVERED_CHARS,
    STREAM_ABANDONED_BY, TIME_TO_FIRST_CHUNK, REQUEST_MAX_TOKENS, REQUEST_TEMPERATURE, REQUEST_TOP_P, FINISH_REASONS,
    CACHE_READ_TOKENS, CACHE_CREATION_TOKENS, RESPONSE_ID, ROUTE, ROUTE_ATTEMPTS, TASK, *CONTENT_FIELDS,
)

APIS = ("complete", "structured")
MODES = ("sync", "async")
DECISIONS = ("allowed", "denied")
STATUSES = ("ok", "denied", "timeout", "provider_error", "schema_error", "quota", "error", "abandoned")
VALIDATIONS = ("passed", "failed", "none")
#: ``limits.input_count``: every part counted by the model's tokenizer, or some of it by the byte bound
INPUT_COUNTS = ("exact", "bound")

# -- MCP tool calls (ctx.call_mcp): one ``mcp.call`` event per call outcome, denials included --------
EVENT_MCP_CALL = "mcp.call"
MCP_SERVER = "mcp.server"
MCP_TOOL = "mcp.tool"
DURATION_MS = "duration_ms"
ARGUMENTS_SHA256 = "arguments_sha256"
RESULT_SHA256 = "result_sha256"
MCP_TRUNCATED = "mcp.truncated"
MCP_STATUSES = ("ok", "error", "denied", "timeout", "quota")
#: fields every ``mcp.call`` record has (with the envelope's ``event``/``kind``/``ts`` and chain fields)
MCP_FIELDS: tuple[str, ...] = (CALL_ID, PLUGIN_ID, MCP_SERVER, MCP_TOOL, DECISION, STATUS, DURATION_MS,
                               ARGUMENTS_SHA256)
#: fields it has only when they apply
OPTIONAL_MCP_FIELDS: tuple[str, ...] = (RESULT_SHA256, MCP_TRUNCATED, ERROR_TYPE, ERROR_MESSAGE, DECISION_KEY,
                                        LIMITS_LIMIT, LIMITS_RESETS_AT, LIMITS_STORE_ERROR)

# -- event names ------------------------------------------------------------------
EVENT_LLM_CALL = "llm.call"
#: written before the provider call when audit.required is true (see the module docstring)
EVENT_LLM_CALL_BEGIN = "llm.call.begin"
EVENT_CHAIN_RESUMED = "chain_resumed"
EVENT_PLUGIN_LOAD_FAILED = "plugin_load_failed"
EVENT_HOOK_ERROR = "hook_error"
EVENT_CONFIG_RELOADED = "config_reloaded"
EVENT_AUDIT_SETTINGS_CHANGED = "audit_settings_changed"


# one encoder, built once: json.dumps(...) with options builds a new one per call
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(record: Mapping[str, Any]) -> bytes:
    """The bytes the chain hashes: sorted keys, no whitespace, UTF-8, no ASCII escaping.

    The reference encoding: ``verify`` checks lines against it. The writer renders
    its records with :func:`canonical_record`, which produces the same bytes faster.
    """
    return _CANONICAL.encode(record).encode("utf-8")


# -- the writer's renderer: canonical_json's bytes for a record, without the generic encoder ----------
_encode_str = json.encoder.encode_basestring  # the C function the canonical encoder uses (ensure_ascii=False)
_int_text = int.__repr__  # what the encoder writes for an int (a bool is tested first)
_float_text = float.__repr__  # ... and for a finite float
_MAX_LAYOUTS = 256  # distinct key sets remembered (a host writes a handful: call records, a few events)
_MAX_LAYOUT_CHARS = 8192
_layouts: dict[tuple[Any, ...], tuple[tuple[str, str], ...]] = {}


def record_layout(record: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """``(key, '"key":')`` for each key of ``record`` in canonical (sorted) order; None unless all are ``str``.

    Computed once per set of keys (in insertion order) and remembered.
    """
    order = tuple(record)
    layout = _layouts.get(order)
    if layout is not None:
        return layout
    for key in order:
        if type(key) is not str:
            return None
    layout = tuple((key, _encode_str(key) + ":") for key in sorted(order))
    if sum(len(prefix) for _, prefix in layout) <= _MAX_LAYOUT_CHARS:  # field names, not data: others not kept
        if len(_layouts) >= _MAX_LAYOUTS:
            _layouts.clear()  # a writer fed ever-new key sets (hostile events) keeps memory bounded
        _layouts[order] = layout
    return layout


def canonical_record(record: Mapping[str, Any]) -> bytes:
    """Exactly ``canonical_json(record)``, rendered directly: the audit writer's hot path.

    A record is a flat mapping of a few dozen fields, most of them short strings,
    numbers and nulls. Its key order (sorted, each key JSON-encoded) is computed
    once per set of keys and reused; each top-level value is encoded with the
    same primitives the canonical encoder uses (``encode_basestring``,
    ``int.__repr__``, ``float.__repr__``), and anything else (lists, dicts,
    subclasses, non-finite floats) by the canonical encoder itself, which is
    consistent because JSON encoding composes. Raises what ``canonical_json``
    raises (``UnicodeEncodeError`` for a lone surrogate, ``TypeError``,
    ``ValueError``); a record with a key that is not a ``str`` is handed to it.
    """
    layout = record_layout(record)
    if layout is None:
        return canonical_json(record)
    parts = []
    append = parts.append
    for key, prefix in layout:
        value = record[key]
        cls = type(value)
        if cls is str:
            append(prefix + _encode_str(value))
        elif value is None:
            append(prefix + "null")
        elif cls is int:
            append(prefix + _int_text(value))
        elif value is True:
            append(prefix + "true")
        elif value is False:
            append(prefix + "false")
        elif cls is float and value - value == 0.0:  # finite (inf - inf and nan - nan are nan)
            append(prefix + _float_text(value))
        else:
            append(prefix + _CANONICAL.encode(value))
    return ("{" + ",".join(parts) + "}").encode("utf-8")


def sha256_text(text: str) -> str:
    """Hex SHA-256 of ``text`` encoded as UTF-8 (prompt and response digests)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def sha256_json(value: Any) -> str:
    """Hex SHA-256 of a JSON value's canonical form (messages, schemas, trust policies)."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def new_call_id() -> str:
    """A fresh call id (32 hex digits), unique across hosts: the ``call_id`` of the record and of the result."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class CallFacts:
    """What every record of one call says of it, known before anything is sent."""

    call_id: str
    plugin_id: str
    api: str
    mode: str
    purpose: str | None
    agent_id: str | None
    profile: str | None
    schema_name: str | None
    #: the task the plugin named (``task=``), "" for none
    task: str
    #: the call is a stream (``stream``/``astream``): its every record says ``stream: true``, a denial's too
    stream: bool


def _opening(facts: CallFacts, decision: str, provider: str | None, request_model: str | None,
             latency_ms: float) -> dict[str, Any]:
    record = {
        EVENT: EVENT_LLM_CALL, CALL_ID: facts.call_id, PLUGIN_ID: facts.plugin_id, PURPOSE: facts.purpose,
        API: facts.api, MODE: facts.mode, DECISION: decision, OPERATION_NAME: "chat", PROVIDER_NAME: provider,
        REQUEST_MODEL: request_model, AGENT_ID: facts.agent_id, PROFILE: facts.profile,
        SCHEMA_NAME: facts.schema_name, LATENCY_MS: round(latency_ms, 3),
    }
    if facts.task:
        record[TASK] = facts.task
    if facts.stream:
        record[STREAM] = True
    return record


def denial_record(facts: CallFacts, *, provider: str | None, request_model: str | None, latency_ms: float,
                  reason: str, key: str | None, error_type: str, config_error: str | None = None,
                  denied_arguments: list[str] | None = None) -> dict[str, Any]:
    """The record of a call the trust gate refused: nothing was sent."""
    record = _opening(facts, "denied", provider, request_model, latency_ms)
    record.update({DECISION_REASON: reason, DECISION_KEY: key, STATUS: "denied", ERROR_TYPE: error_type,
                   ATTEMPTS: 0, CONFIG_ERROR: config_error})
    if denied_arguments is not None:
        record[DENIED_ARGUMENTS] = denied_arguments
    return record


def error_record(facts: CallFacts, *, provider: str | None, request_model: str | None, latency_ms: float,
                 status: str, error_type: str | None, decision_reason: str | None, attempts: int | None = None,
                 error_message: str | None = None, record_error: str | None = None) -> dict[str, Any]:
    """The record of a call that failed before a full outcome could be told: no route for it, or an outcome
    record that could not be built (``record_error``, a defect)."""
    record = _opening(facts, "allowed", provider, request_model, latency_ms)
    record.update({STATUS: status, ERROR_TYPE: error_type, DECISION_REASON: decision_reason})
    if error_message is not None:
        record[ERROR_MESSAGE] = error_message
    if attempts is not None:
        record[ATTEMPTS] = attempts
    if record_error is not None:
        record[AUDIT_RECORD_ERROR] = record_error
    return record


def outcome_record(facts: CallFacts, *, provider: str | None, request_model: str | None, latency_ms: float,
                   decision_reason: str | None, status: str, error: BaseException | None,
                   response_model: str | None, usage: tuple[int, int, float | None], attempts: int,
                   overhead_ms: float, prompt_sha256: str | None, response_sha256: str | None,
                   anomalies: list[str] | None = None, structured: tuple[str | None, str, int] | None = None,
                   content: tuple[Any, str | None] | None = None,
                   details: Mapping[str, Any] | None = None, route: str | None = None,
                   route_attempts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The record of a call that was admitted: its outcome, usage and hashes. ``usage`` is (input tokens,
    output tokens, cost), ``structured`` (schema digest, validation, repairs) for a structured call,
    ``content`` (messages, reply text) only when the operator logs content; ``details`` the request's sampling
    parameters, the finish reason and cache token counts, keyed by their declared names (None values dropped);
    ``route`` the catalog route that answered and ``route_attempts`` each route of its chain tried."""
    record = _opening(facts, "allowed", provider, request_model, latency_ms)
    record.update({
        DECISION_REASON: decision_reason, STATUS: status,
        ERROR_TYPE: type(error).__name__ if error else None, ERROR_MESSAGE: str(error) if error else None,
        RESPONSE_MODEL: response_model, INPUT_TOKENS: usage[0], OUTPUT_TOKENS: usage[1], COST_USD: usage[2],
        ATTEMPTS: attempts, OVERHEAD_MS: round(max(0.0, overhead_ms), 3), PROMPT_SHA256: prompt_sha256,
        RESPONSE_SHA256: response_sha256,
    })
    if anomalies:
        record[USAGE_ANOMALY] = list(anomalies)
    if structured is not None:
        record[SCHEMA_SHA256], record[VALIDATION], record[REPAIRS] = structured
    if content is not None:
        record[INPUT_MESSAGES], record[OUTPUT_TEXT] = content
    if details:
        for key, value in details.items():
            if value is not None:
                record[key] = value
    if route is not None:
        record[ROUTE] = route
    if route_attempts:
        record[ROUTE_ATTEMPTS] = [dict(attempt) for attempt in route_attempts]
    return record


def _check(name: str, value: str | None, allowed: Iterable[str]) -> None:
    if value is not None and value not in allowed:
        raise ValueError(f"audit record field {name!r} must be one of {', '.join(allowed)}; got {value!r}")


def call_record(
    *,
    call_id: str,
    plugin_id: str,
    api: str,
    mode: str,
    decision: str,
    status: str,
    purpose: str | None = None,
    decision_reason: str | None = None,
    error_type: str | None = None,
    operation: str = "chat",
    provider: str | None = None,
    request_model: str | None = None,
    response_model: str | None = None,
    agent_id: str | None = None,
    profile: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    cost_usd: float | None = None,
    attempts: int | None = None,
    latency_ms: float | None = None,
    overhead_ms: float | None = None,
    schema_name: str | None = None,
    schema_sha256: str | None = None,
    validation: str = "none",
    prompt_sha256: str | None = None,
    response_sha256: str | None = None,
    content: Mapping[str, Any] | None = None,
    ts: str | None = None,
) -> dict[str, Any]:
    """Build one call record with every field of the schema present (``None`` when unknown).

    ``content`` holds message content keyed by :data:`CONTENT_FIELDS`; the writer
    drops it unless ``audit.log_content`` is on. Enumerated fields are checked
    so a typo in the core fails loudly in tests instead of polluting the log.
    """
    _check(API, api, APIS)
    _check(MODE, mode, MODES)
    _check(DECISION, decision, DECISIONS)
    _check(STATUS, status, STATUSES)
    _check(VALIDATION, validation, VALIDATIONS)
    record: dict[str, Any] = {
        EVENT: EVENT_LLM_CALL,
        KIND: KIND_CALL,
        CALL_ID: call_id,
        PLUGIN_ID: plugin_id,
        PURPOSE: purpose,
        API: api,
        MODE: mode,
        DECISION: decision,
        DECISION_REASON: decision_reason,
        STATUS: status,
        ERROR_TYPE: error_type,
        OPERATION_NAME: operation,
        PROVIDER_NAME: provider,
        REQUEST_MODEL: request_model,
        RESPONSE_MODEL: response_model,
        AGENT_ID: agent_id,
        PROFILE: profile,
        INPUT_TOKENS: input_tokens,
        OUTPUT_TOKENS: output_tokens,
        COST_USD: cost_usd,
        ATTEMPTS: attempts,
        LATENCY_MS: latency_ms,
        OVERHEAD_MS: overhead_ms,
        SCHEMA_NAME: schema_name,
        SCHEMA_SHA256: schema_sha256,
        VALIDATION: validation,
        PROMPT_SHA256: prompt_sha256,
        RESPONSE_SHA256: response_sha256,
    }
    if ts is not None:
        record[TS] = ts
    if content:
        unknown = set(content) - set(CONTENT_FIELDS)
        if unknown:
            raise ValueError(f"unknown audit content field(s) {sorted(unknown)}; use {list(CONTENT_FIELDS)}")
        record.update(content)
    return record


def mcp_record(*, plugin_id: str, server: str, tool: str, status: str, duration_ms: float,
               arguments_sha256: str, result_sha256: str | None = None, truncated: bool = False,
               error_type: str | None = None, error_message: str | None = None, decision_key: str | None = None,
               extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fields of one ``mcp.call`` event (written with ``write_event``): a plugin's MCP tool call,
    its arguments and result by digest only."""
    _check(STATUS, status, MCP_STATUSES)
    record: dict[str, Any] = {
        CALL_ID: new_call_id(), PLUGIN_ID: plugin_id, MCP_SERVER: server, MCP_TOOL: tool,
        DECISION: "denied" if status in ("denied", "quota") else "allowed", STATUS: status,
        DURATION_MS: round(max(0.0, duration_ms), 3), ARGUMENTS_SHA256: arguments_sha256,
    }
    if result_sha256 is not None:
        record[RESULT_SHA256] = result_sha256
    if truncated:
        record[MCP_TRUNCATED] = True
    for name, value in ((ERROR_TYPE, error_type), (ERROR_MESSAGE, error_message), (DECISION_KEY, decision_key)):
        if value is not None:
            record[name] = value
    for name, value in (extra or {}).items():
        if name not in OPTIONAL_MCP_FIELDS:
            raise ValueError(f"unknown mcp.call field {name!r}; use {list(OPTIONAL_MCP_FIELDS)}")
        record[name] = value
    return record


def is_call_record(record: Mapping[str, Any]) -> bool:
    """True for a call/denial record, False for an operational event."""
    kind = record.get(KIND)
    if kind is not None:
        return kind == KIND_CALL
    return record.get(EVENT) == EVENT_LLM_CALL


def is_denied(record: Mapping[str, Any]) -> bool:
    """A refused call: the trust gate's (status ``denied``) or a limit's (status ``quota``, decision
    ``denied``). What ``audit query --decision denied`` lists and ``audit stats`` counts as DENIED."""
    return record.get(DECISION) == "denied" or record.get(STATUS) == "denied"


def changed_entries(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """Sorted keys whose value differs between two ``plugins.entries`` mappings."""
    old = old or {}
    new = new or {}
    return sorted(k for k in set(old) | set(new) if k not in old or k not in new or sha256_json(old[k]) != sha256_json(new[k]))


def config_reload_fields(old_policy: Mapping[str, Any] | None, new_policy: Mapping[str, Any]) -> dict[str, Any]:
    """Fields of a ``config_reloaded`` event: digest of the new effective policy and what changed.

    Pass the *effective* per-plugin trust policy (plugin id -> its ``llm`` block
    after validation), not the raw YAML, so the digest changes only when what
    the gate enforces changes.
    """
    return {
        "trust_policy_sha256": sha256_json(dict(new_policy)),
        "changed_entries": changed_entries(old_policy, new_policy),
    }
