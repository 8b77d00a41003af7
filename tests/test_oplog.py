"""Operational log lines (not the audit log): JSON or console, redacted, escaped, with bound call ids."""

from __future__ import annotations

import io
import json
import logging

import pytest

from auth.redaction import register_secret
from plugin_llm import oplog

CANARY = "sk-canary-oplog-0123456789abcdefXYZ"


@pytest.fixture
def log_to():
    handlers = list(logging.getLogger().handlers)

    def install(fmt: str) -> io.StringIO:
        stream = io.StringIO()
        oplog.install(fmt, logging.INFO, stream=stream)
        return stream

    yield install
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)


def test_json_lines_carry_level_logger_time_and_the_bound_call_id(log_to):
    stream = log_to("json")
    with oplog.bound(call_id="c0ffee", trace_id=None):
        logging.getLogger("plugin_llm.service").warning("store %s is down", "limits")
    logging.getLogger("plugin_llm.service").warning("after")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["event"] == "store limits is down" and first["level"] == "warning"
    assert first["logger"] == "plugin_llm.service" and first["call_id"] == "c0ffee" and "trace_id" not in first
    assert first["timestamp"].endswith("Z")
    assert "call_id" not in second  # unbound once the context ends


def test_no_secret_reaches_either_format(log_to):
    register_secret(CANARY)
    for fmt in oplog.FORMATS:
        stream = log_to(fmt)
        logging.getLogger("plugin_llm").error("provider said: invalid key %s", CANARY)
        try:
            raise RuntimeError(f"boom {CANARY}")
        except RuntimeError:
            logging.getLogger("plugin_llm").exception("failed")
        assert CANARY not in stream.getvalue() and "boom" in stream.getvalue()


def test_console_lines_escape_what_could_drive_a_terminal(log_to):
    stream = log_to("console")
    logging.getLogger("plugin_llm.plugins").warning("plugin %s failed", "evil\x1b]0;title\x07")
    assert "\x1b" not in stream.getvalue() and "evil" in stream.getvalue()


def test_an_unknown_format_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="console, json"):
        oplog.formatter("xml")


@pytest.fixture
def cli_handlers():
    yield
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_plugin_llm_oplog", False):
            root.removeHandler(handler)


def test_the_cli_writes_its_own_log_lines_as_json_on_request(hermes_home, capsys, cli_handlers):
    from plugin_llm.cli.main import main
    from tests.conftest import write_config

    write_config(hermes_home, "limts:\n  defaults: {requests_per_minute: 1}\n")
    main(["--log-format", "json", "trust", "show"])
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert any("limts" in line["event"] and line["level"] == "warning" for line in lines), lines


def test_an_unknown_log_format_is_a_usage_error_with_the_choices(capsys, cli_handlers):
    from plugin_llm.cli.main import main

    assert main(["--log-format", "jsno", "doctor"]) == 2
    err = capsys.readouterr().err
    assert "'jsno' is not a log format" in err and "did you mean 'json'" in err and "Traceback" not in err
