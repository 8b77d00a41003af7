"""auth.redaction: registered secrets, key shapes, logging and structlog sinks."""

from __future__ import annotations

import io
import json
import logging
import secrets
import threading
from urllib.parse import quote

import pytest
import structlog

from auth import (
    RedactingFilter,
    install_log_redaction,
    mask,
    redact,
    redact_obj,
    redact_processor,
    register_secret,
)


def canary(prefix: str = "cnry") -> str:
    """A unique secret with no well-known key shape (so only registration can hide it)."""
    return f"{prefix}{secrets.token_hex(16)}"


# --------------------------------------------------------------------------- registered secrets


def test_registered_secret_is_replaced_and_shows_at_most_its_last_four():
    secret = canary()
    register_secret(secret)
    out = redact(f"error calling provider with key {secret} (retry)")
    assert secret not in out
    assert out == f"error calling provider with key [REDACTED…{secret[-4:]}] (retry)"


def test_short_registered_secret_shows_nothing_of_itself():
    secret = "q" + secrets.token_hex(5)  # 11 chars: long enough to register, too short to show a tail
    register_secret(secret)
    assert redact(f"x {secret} y") == "x [REDACTED] y"


def test_very_short_strings_are_not_registered():
    register_secret("abc1234")  # 7 chars
    assert redact("abc1234 stays") == "abc1234 stays"


def test_url_and_json_encoded_forms_of_a_secret_are_hidden():
    secret = canary() + "/+=&x"
    register_secret(secret)
    text = f"GET https://h/v1?token={quote(secret, safe='')} body={json.dumps({'k': secret})}"
    out = redact(text)
    assert secret not in out and quote(secret, safe="") not in out
    assert secret[:20] not in out


def test_secret_containing_another_secret_is_replaced_whole():
    inner = canary()
    outer = "pre" + inner + "post"
    register_secret(inner)
    register_secret(outer)
    out = redact(f"a {outer} b {inner} c")
    assert out == f"a [REDACTED…{outer[-4:]}] b [REDACTED…{inner[-4:]}] c"


def test_many_registered_secrets_use_the_regex_path_and_still_hide_all():
    many = [canary() for _ in range(60)]
    for s in many:
        register_secret(s)
    text = " | ".join(many)
    out = redact(text)
    assert not any(s in out for s in many)
    assert out.count("[REDACTED…") == 60


def test_concurrent_registration_loses_nothing():
    batch = [canary() for _ in range(80)]

    def worker(chunk):
        for s in chunk:
            register_secret(s)

    threads = [threading.Thread(target=worker, args=(batch[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = redact(" ".join(batch))
    assert not any(s in out for s in batch)


# --------------------------------------------------------------------------- key shapes


@pytest.mark.parametrize(
    "text, hidden",
    [
        ("Authorization: Bearer abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrstuvwx"),
        ("{'authorization': 'Bearer tok_0123456789abcdef'}", "tok_0123456789abcdef"),
        ("headers: {'x-api-key': 'zz-0123456789abcdef'}", "zz-0123456789abcdef"),
        ('{"api-key": "azure0123456789abcdef"}', "azure0123456789abcdef"),
        ("x-goog-api-key: goog0123456789abcdef", "goog0123456789abcdef"),
        ("https://generativelanguage.googleapis.com/v1/models?key=plainkey0123456789&alt=sse", "plainkey0123456789"),
        ("https://h/v1/chat?foo=1&key=plainkey0123456789", "plainkey0123456789"),
        ("https://h/v1/chat?api_key=plainkey0123456789#frag", "plainkey0123456789"),
        ("litellm.completion(model='x', api_key='unknown0123456789')", "unknown0123456789"),
        ('{"api_key": "unknown0123456789"}', "unknown0123456789"),
        ("OPENAI_API_KEY=unknown0123456789 python x.py", "unknown0123456789"),
        ("Incorrect API key provided: sk-proj-abcdefghij0123456789xyz", "sk-proj-abcdefghij0123456789xyz"),
        ("Incorrect API key provided: sk-proj-abc*****************wxyz.", "sk-proj-abc*****************wxyz"),
        ("key sk-ant-api03-abcdefghij0123456789 rejected", "sk-ant-api03-abcdefghij0123456789"),
        ("google AIzaSyA0123456789abcdefghijklmnopqrstuv used", "AIzaSyA0123456789abcdefghijklmnopqrstuv"),
        ("groq gsk_abcdefghij0123456789ABCD used", "gsk_abcdefghij0123456789ABCD"),
        ("password=hunter2hunter2", "hunter2hunter2"),
    ],
)
def test_common_key_shapes_are_hidden_without_registration(text, hidden):
    out = redact(text)
    assert hidden not in out
    assert "[REDACTED]" in out


def test_header_name_and_scheme_survive_for_readability():
    assert redact("Authorization: Bearer abcdefghijklmnopqrstuvwx") == "Authorization: Bearer [REDACTED]"
    assert redact("https://h/v1?key=abcdefghijkl&alt=sse") == "https://h/v1?key=[REDACTED]&alt=sse"


# URL userinfo: the password (or a token standing as the user) is a secret in every URL shape
@pytest.mark.parametrize(
    "text, hidden, kept",
    [
        ("cannot reach custom (https://alice:s3cretPW@gw.example.com/v1): refused", "s3cretPW",
         "https://[REDACTED]@gw.example.com/v1"),
        ("HTTP://Alice:s3cretPW@GW.example.com:8443/v1", "s3cretPW", "HTTP://[REDACTED]@GW.example.com:8443/v1"),
        ("redis://:s3cretPW@127.0.0.1:6379/0", "s3cretPW", "redis://[REDACTED]@127.0.0.1:6379/0"),
        ("https://ghtok0123456789@git.example.com/x.git", "ghtok0123456789", "https://[REDACTED]@git.example.com/x.git"),
        ("https://alice:p@ss@w0rd@host/v1", "ss@w0rd", "https://[REDACTED]@host/v1"),  # unencoded '@': the last one ends it
        ("https://alice:s3cret%2FPW@host/v1", "s3cret%2FPW", "https://[REDACTED]@host/v1"),
        ("http://alice:s3cretPW@[::1]:8080/v1", "s3cretPW", "http://[REDACTED]@[::1]:8080/v1"),
        ('{"base_url": "http:\\/\\/alice:s3cretPW@host\\/v1"}', "s3cretPW", "http:\\/\\/[REDACTED]@host"),
        ("next=https%3A%2F%2Falice%3As3cretPW%40host%2Fv1", "s3cretPW", "https%3A%2F%2F[REDACTED]%40host%2Fv1"),
        ("url='https://alice:s3cretPW@host' other='x'", "s3cretPW", "'https://[REDACTED]@host'"),
        ("ünïcode https://alice:s3cretPW@host/v1", "s3cretPW", "https://[REDACTED]@host/v1"),
    ],
)
def test_url_userinfo_is_a_secret(text, hidden, kept):
    out = redact(text)
    assert hidden not in out and kept in out
    assert redact(out) == out  # already redacted: left alone
    assert hidden not in json.dumps(redact_obj({"error": text}))


@pytest.mark.parametrize("text", [
    "see https://example.com/a@b and write to bob@example.com",
    "https://host:8080/v1 is up; mail ops@example.com",
    "git@github.com:org/repo.git",
])
def test_an_at_sign_outside_a_url_authority_is_not_userinfo(text):
    assert redact(text) is text


@pytest.mark.parametrize(
    "text",
    [
        '{"event": "llm.call", "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3, "status": "ok"}',
        "max_tokens=100 temperature=0.2 api_key=None",
        "task-management-system and scikit-learn",
        "Bearer tokens are described in RFC 6750",
        "plain text without anything interesting",
    ],
)
def test_ordinary_text_is_returned_unchanged(text):
    assert redact(text) is text


def test_redact_accepts_non_strings():
    assert redact(12) == "12"


def test_redact_obj_walks_nested_containers_and_keeps_types():
    secret = canary()
    register_secret(secret)
    record = {
        "event": "llm.call",
        "error": {"message": f"bad key {secret}", "list": [secret, 3, None], "tuple": (secret,)},
        secret: "as a key",
        "n": 5,
    }
    out = redact_obj(record)
    assert secret not in json.dumps(out, default=str)
    assert out["n"] == 5 and out["error"]["list"][1:] == [3, None]
    assert isinstance(out["error"]["tuple"], tuple)
    assert secret in json.dumps(record)  # the input is not mutated


# --------------------------------------------------------------------------- mask


@pytest.mark.parametrize(
    "secret, shown",
    [
        ("sk-abcdefghijklmnop1234", "sk-…1234"),
        ("sk-ant-api03-abcdefghijklmnopWXYZ", "sk-ant-api03-…WXYZ"),
        ("sk-or-v1-abcdefghijklmnop9876", "sk-or-v1-…9876"),
        ("AIzaSyA0123456789abcdefghijklmnopqrstuv", "AIza…stuv"),
        ("plainsecret0123456789", "…6789"),
        ("shortkey12", "…"),
        ("sk-short", "sk-…"),
        ("", "(none)"),
        (None, "(none)"),
    ],
)
def test_mask(secret, shown):
    assert mask(secret) == shown


# --------------------------------------------------------------------------- logging


@pytest.fixture
def log_stream():
    """A handler attached to the root logger *after* install_log_redaction (like basicConfig later)."""
    install_log_redaction()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    yield stream
    root.removeHandler(handler)
    root.setLevel(old_level)


def test_logging_output_never_contains_a_registered_secret(log_stream, caplog):
    secret = canary()
    register_secret(secret)
    log = logging.getLogger("plugin_llm.test")
    log.error("provider said: invalid key %s", secret)
    log.warning(f"inline {secret}")
    log.info("dict arg %(k)s", {"k": secret})
    text = log_stream.getvalue()
    assert secret not in text and secret not in caplog.text
    assert text.count("[REDACTED…") == 3


def test_library_loggers_and_tracebacks_are_redacted(log_stream, caplog):
    secret = canary()
    register_secret(secret)
    try:
        raise RuntimeError(f"Client error for url 'https://h/v1?key={secret}'")
    except RuntimeError:
        logging.getLogger("httpx").exception("request failed")
        logging.getLogger("LiteLLM").error("failed", exc_info=True)
    text = log_stream.getvalue()
    assert "RuntimeError" in text and "Traceback" in text
    assert secret not in text and secret not in caplog.text


def test_unregistered_key_shapes_are_redacted_in_logs(log_stream):
    logging.getLogger("openai").warning("Authorization: Bearer abcdefghijklmnopqrstuvwx")
    assert "abcdefghijklmnopqrstuvwx" not in log_stream.getvalue()


def test_install_is_idempotent():
    install_log_redaction()
    install_log_redaction()
    factory = logging.getLogRecordFactory()
    assert getattr(factory, "_auth_redacting", False)
    for name in ("LiteLLM", "httpx", "openai"):
        filters = [f for f in logging.getLogger(name).filters if isinstance(f, RedactingFilter)]
        assert len(filters) == 1


def test_filter_on_a_handler_redacts_records_created_elsewhere():
    secret = canary()
    register_secret(secret)
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "key=%s", (secret,), None)
    assert RedactingFilter().filter(record) is True
    assert secret not in record.getMessage()


def test_bad_format_args_are_still_redacted():
    secret = canary()
    register_secret(secret)
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "%d items " + secret, ("notanumber",), None)
    RedactingFilter().filter(record)
    assert secret not in str(record.msg)


# --------------------------------------------------------------------------- structlog


def _structlog_logger(buf: io.StringIO):
    return structlog.wrap_logger(
        structlog.PrintLogger(file=buf),
        processors=[redact_processor, structlog.processors.JSONRenderer()],
    )


def test_structlog_processor_redacts_event_fields_and_exceptions():
    secret = canary()
    register_secret(secret)
    buf = io.StringIO()
    log = _structlog_logger(buf)
    log.error(f"call failed {secret}", url=f"https://h/v1?x=1&key={secret}", nested={"h": [secret]})
    try:
        raise ValueError(f"echo {secret}")
    except ValueError as exc:
        log.error("boom", exc_info=True, error=exc)
    out = buf.getvalue()
    assert secret not in out
    lines = [json.loads(line) for line in out.splitlines()]
    assert "Traceback" in lines[1]["exception"] and "ValueError" in lines[1]["error"]


def test_structlog_processor_redacts_unregistered_shapes():
    buf = io.StringIO()
    _structlog_logger(buf).info("req", headers={"Authorization": "Bearer abcdefghijklmnopqrstuvwx"})
    assert "abcdefghijklmnopqrstuvwx" not in buf.getvalue()


# --------------------------------------------------------------------------- httpx echoes


def test_httpx_request_and_error_text_is_redacted():
    import httpx  # a test dependency (the test extra)

    secret = canary()
    register_secret(secret)
    request = httpx.Request(
        "POST", f"https://api.example.test/v1/chat?key={secret}", headers={"Authorization": f"Bearer {secret}"}
    )
    response = httpx.Response(401, request=request, text=f"bad Authorization: Bearer {secret}")
    try:
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        texts = [str(exc), repr(exc), redact(dict(request.headers)), response.text, str(request.url)]
    for text in texts:
        assert secret not in redact(text)
