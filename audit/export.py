"""Records out of the log for other tools: CSV, JSON lines, OTLP/JSON logs. Streaming, constant memory.

- ``csv``: one row per record, a header row first, every call field of
  :data:`audit.records.CALL_FIELDS` as a column; nested values are JSON text; a text cell starting
  with ``=``, ``+``, ``-``, ``@``, tab or CR gets a leading ``'`` (CSV injection).
- ``jsonl``: each record exactly as parsed, one JSON object per line.
- ``otlp``: one OTLP/JSON ``ExportLogsServiceRequest`` document (an OpenTelemetry collector's
  ``/v1/logs``), attributes under their GenAI names, the gateway's own fields as ``plugin_llm.*``.

Columns, severities and names in full: docs/design.md, "The audit log".
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from typing import Any, TextIO

from audit.reader import record_time
from audit.records import CALL_FIELDS, EVENT, HASH, KIND, PREV_HASH, SEQ, STATUS, TS, is_call_record

__all__ = ["FORMATS", "CSV_COLUMNS", "export_records", "otlp_log_record", "otlp_attribute_name"]

FORMATS = ("csv", "jsonl", "otlp")
CSV_COLUMNS: tuple[str, ...] = (
    SEQ, TS, KIND, EVENT,
    *(f for f in CALL_FIELDS if f not in (TS, EVENT, KIND)),
    "other", PREV_HASH, HASH,
)
_KNOWN = frozenset(CSV_COLUMNS) | {"schema"}
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_STANDARD_PREFIXES = ("gen_ai.", "error.type")
SERVICE_NAME = "plugin-llm-gateway"
SCOPE_NAME = "plugin_llm.audit"
GENAI_EVENT = "gen_ai.client.inference.operation.details"


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _csv(records: Iterable[dict[str, Any]], out: TextIO) -> int:
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    count = 0
    for record in records:
        other = {k: v for k, v in record.items() if k not in _KNOWN}
        row = [_cell(record.get(c)) for c in CSV_COLUMNS if c != "other"]
        row.insert(CSV_COLUMNS.index("other"), _cell(other) if other else "")
        writer.writerow(row)
        count += 1
    return count


def _jsonl(records: Iterable[dict[str, Any]], out: TextIO) -> int:
    count = 0
    for record in records:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        count += 1
    return count


def otlp_attribute_name(field: str) -> str:
    """The OTLP attribute key of a record field: GenAI and ``error.type`` as they are, others ``plugin_llm.<field>``."""
    return field if field.startswith(_STANDARD_PREFIXES) else f"plugin_llm.{field}"


def _any_value(value: Any, depth: int = 0) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return {"intValue": str(value)}
        return {"stringValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if depth >= 32:
        return {"stringValue": json.dumps(value, ensure_ascii=False)}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_any_value(v, depth + 1) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": [{"key": str(k), "value": _any_value(v, depth + 1)} for k, v in value.items()
                                           if v is not None]}}
    return {"stringValue": str(value)}


def _severity(record: dict[str, Any]) -> tuple[int, str]:
    status = record.get(STATUS)
    if not is_call_record(record) or status == "ok":
        return 9, "INFO"
    if status == "denied":
        return 13, "WARN"
    return 17, "ERROR"


def _unix_nano(ts: Any) -> str | None:
    moment = record_time({TS: ts})
    if moment is None:
        return None
    return str(int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000)


def otlp_log_record(record: dict[str, Any]) -> dict[str, Any]:
    """One OTLP/JSON ``LogRecord`` for an audit record."""
    number, text = _severity(record)
    call = is_call_record(record)
    event = record.get(EVENT)
    log: dict[str, Any] = {}
    nano = _unix_nano(record.get(TS))
    if nano is not None:
        log["timeUnixNano"] = nano
        log["observedTimeUnixNano"] = nano
    log["severityNumber"] = number
    log["severityText"] = text
    log["eventName"] = GENAI_EVENT if call else f"plugin_llm.{event}"
    summary = f"{record.get('plugin_id') or '-'} {record.get(STATUS) or '-'}" if call else str(event)
    log["body"] = {"stringValue": summary}
    log["attributes"] = [
        {"key": otlp_attribute_name(k), "value": _any_value(v)}
        for k, v in record.items()
        if v is not None and k != TS
    ]
    return log


def _otlp(records: Iterable[dict[str, Any]], out: TextIO) -> int:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": SERVICE_NAME}}]}
    scope = {"name": SCOPE_NAME, "version": "1"}
    out.write('{"resourceLogs":[{"resource":' + json.dumps(resource) + ',"scopeLogs":[{"scope":'
              + json.dumps(scope) + ',"logRecords":[\n')
    count = 0
    for record in records:
        out.write(("," if count else "") + json.dumps(otlp_log_record(record), ensure_ascii=False) + "\n")
        count += 1
    out.write("]}]}]}\n")
    return count


def export_records(records: Iterable[dict[str, Any]], fmt: str, out: TextIO) -> int:
    """Write ``records`` to ``out`` in ``fmt`` (one of :data:`FORMATS`); returns how many."""
    if fmt == "csv":
        return _csv(records, out)
    if fmt == "jsonl":
        return _jsonl(records, out)
    if fmt == "otlp":
        return _otlp(records, out)
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
