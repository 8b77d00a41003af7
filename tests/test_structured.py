"""Tests for plugin_llm/structured/: input blocks, schema checks, request shape, reply parsing, repair."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_llm.structured import (
    ParsedReply,
    build_messages,
    check_instructions,
    check_schema,
    normalise_input,
    parse_reply,
    repair_messages,
    response_format,
    schema_sha256,
)
from plugin_llm.types import PluginLlmImageInput, PluginLlmTextInput

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))

ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "total": {"type": "number"},
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["sku", "qty"],
            },
        },
    },
    "required": ["total", "items"],
}

VALID_ORDER = {"total": 12.5, "customer": {"name": "Ada"}, "items": [{"sku": "a", "qty": 1}]}


def _user_parts(messages: list[dict]) -> list[dict]:
    (user,) = [m for m in messages if m["role"] == "user"]
    return user["content"]


def _system(messages: list[dict]) -> str:
    (system,) = [m for m in messages if m["role"] == "system"]
    return system["content"]


# --------------------------------------------------------------------------
# normalise_input
# --------------------------------------------------------------------------


def test_dataclass_blocks_pass_through_in_order():
    text = PluginLlmTextInput("invoice 42")
    image = PluginLlmImageInput(data=PNG, mime_type="image/jpeg", file_name="scan.jpg")
    url = PluginLlmImageInput(url="https://example.com/a.png")

    blocks = normalise_input([text, image, url])

    assert blocks == (text, image, url)
    assert isinstance(blocks, tuple)


def test_dict_blocks_become_dataclasses():
    blocks = normalise_input(
        (
            {"type": "text", "text": "hello"},
            {"type": "image", "data": PNG, "mime_type": "image/webp", "file_name": "x.webp"},
            {"type": "image", "url": "https://example.com/cat.png"},
        )
    )

    assert blocks == (
        PluginLlmTextInput("hello"),
        PluginLlmImageInput(data=PNG, mime_type="image/webp", file_name="x.webp"),
        PluginLlmImageInput(url="https://example.com/cat.png"),
    )


def test_dicts_without_type_and_bare_strings_are_tolerated():
    blocks = normalise_input(
        ["plain string", {"text": "dict text"}, {"data": bytearray(PNG)}, {"url": "data:image/png;base64,AAAA"}]
    )

    assert blocks[0] == PluginLlmTextInput("plain string")
    assert blocks[1] == PluginLlmTextInput("dict text")
    assert blocks[2] == PluginLlmImageInput(data=PNG, mime_type="image/png")
    assert isinstance(blocks[2].data, bytes)
    assert blocks[3] == PluginLlmImageInput(url="data:image/png;base64,AAAA")


def test_normalise_is_idempotent():
    once = normalise_input([{"text": "a"}, {"data": PNG}])
    assert normalise_input(once) == once


def test_blank_text_is_fine_when_an_image_carries_the_content():
    blocks = normalise_input([{"type": "text", "text": "  "}, {"type": "image", "data": PNG}])
    assert len(blocks) == 2


@pytest.mark.parametrize("bad", [{"type": "text", "text": "x"}, PluginLlmTextInput("x"), None, 42, b"x"])
def test_non_list_input_is_refused(bad):
    with pytest.raises(ValueError) as info:
        normalise_input(bad)
    message = str(info.value)
    assert "input must be a string or a list" in message
    assert type(bad).__name__ in message
    assert "Wrap it in a list" in message


def test_a_plain_string_is_one_text_block():
    assert normalise_input("some text") == (PluginLlmTextInput("some text"),)
    with pytest.raises(ValueError, match="input has no content"):
        normalise_input("  \n")


@pytest.mark.parametrize("empty", [[], ()])
def test_empty_input_is_refused(empty):
    with pytest.raises(ValueError, match=r"input is empty.*at least one text or image block"):
        normalise_input(empty)


def test_unknown_block_type_names_the_index_and_the_valid_types():
    with pytest.raises(ValueError) as info:
        normalise_input([{"type": "text", "text": "ok"}, {"type": "video", "url": "https://x"}])
    message = str(info.value)
    assert message.startswith("input[1]: unknown block type 'video'")
    assert "'text'" in message and "'image'" in message


def test_unsupported_item_type_names_the_index():
    with pytest.raises(ValueError, match=r"^input\[2\]: unsupported block of type int"):
        normalise_input(["a", "b", 3])


def test_image_with_neither_data_nor_url_is_refused():
    with pytest.raises(ValueError) as info:
        normalise_input(["text", {"type": "image", "mime_type": "image/png"}])
    message = str(info.value)
    assert message.startswith("input[1]: image block has neither 'data' nor 'url'")
    assert "data=<bytes>" in message and "url=" in message


def test_image_with_both_data_and_url_is_refused():
    with pytest.raises(ValueError, match=r"^input\[0\]: image block has both 'data' and 'url'\. Pass exactly one"):
        normalise_input([{"type": "image", "data": PNG, "url": "https://example.com/a.png"}])


def test_image_data_that_is_not_bytes_is_refused_with_a_base64_hint():
    with pytest.raises(ValueError) as info:
        normalise_input([{"type": "image", "data": base64.b64encode(PNG).decode()}])
    message = str(info.value)
    assert message.startswith("input[0]: image 'data' must be bytes, got str")
    assert "base64.b64decode" in message


def test_dataclass_image_with_str_data_is_refused_too():
    # PluginLlmImageInput itself does not type-check data; the boundary does.
    with pytest.raises(ValueError, match=r"^input\[0\]: image 'data' must be bytes, got str"):
        normalise_input([PluginLlmImageInput(data="not bytes")])  # type: ignore[arg-type]


def test_empty_image_bytes_are_refused():
    with pytest.raises(ValueError, match=r"input\[0\]: image 'data' is empty"):
        normalise_input([{"data": b""}])


@pytest.mark.parametrize("mime", ["png", "", "image/png;base64,", 7])
def test_bad_mime_type_is_refused(mime):
    with pytest.raises(ValueError, match=r"input\[0\]: image 'mime_type' must be a media type"):
        normalise_input([{"data": PNG, "mime_type": mime}])


@pytest.mark.parametrize("url", ["file:///etc/passwd", "/tmp/cat.png", "ftp://x/y.png"])
def test_urls_other_than_http_https_and_data_are_refused(url):
    with pytest.raises(ValueError) as info:
        normalise_input([{"url": url}])
    message = str(info.value)
    assert message.startswith("input[0]: image 'url' must start with http://, https:// or data:")
    assert "data=<bytes>" in message


@pytest.mark.parametrize("blank", [["", "   "], [{"type": "text", "text": "\n\t"}], [PluginLlmTextInput(" ")]])
def test_blank_text_only_input_is_refused(blank):
    with pytest.raises(ValueError, match=r"input has no content: every text block is blank and there is no image"):
        normalise_input(blank)


def test_misspelt_key_is_refused_with_a_suggestion():
    with pytest.raises(ValueError) as info:
        normalise_input([{"type": "image", "data": PNG, "mime": "image/jpeg"}])
    message = str(info.value)
    assert message.startswith("input[0]: unknown key 'mime'")
    assert "Did you mean 'mime_type'?" in message


def test_dict_with_both_text_and_image_keys_needs_a_type():
    with pytest.raises(ValueError, match=r"^input\[0\]: cannot tell the block type .* Add 'type'"):
        normalise_input([{"text": "a", "url": "https://example.com/x.png"}])


def test_text_block_without_text_or_with_non_str_text_is_refused():
    with pytest.raises(ValueError, match=r"^input\[0\]: text block has no 'text'"):
        normalise_input([{"type": "text"}])
    with pytest.raises(ValueError, match=r"^input\[1\]: 'text' must be a str, got int"):
        normalise_input(["ok", {"type": "text", "text": 5}])


# --------------------------------------------------------------------------
# check_instructions
# --------------------------------------------------------------------------


def test_instructions_are_returned_unchanged():
    assert check_instructions("  Extract the total.\n") == "  Extract the total.\n"


@pytest.mark.parametrize("bad, expected", [(None, "must be a str"), (3, "got int"), ("", "blank"), (" \n\t", "blank")])
def test_bad_instructions_are_refused(bad, expected):
    with pytest.raises(ValueError, match=expected):
        check_instructions(bad)


# --------------------------------------------------------------------------
# check_schema / schema_sha256
# --------------------------------------------------------------------------


def test_check_schema_returns_the_schema_or_none():
    assert check_schema(None) is None
    assert check_schema(ORDER_SCHEMA) is ORDER_SCHEMA


@pytest.mark.parametrize("bad", [[{"type": "object"}], True, '{"type": "object"}'])
def test_schema_that_is_not_a_dict_is_refused(bad):
    with pytest.raises(ValueError, match=rf"json_schema must be a dict .*got {type(bad).__name__}"):
        check_schema(bad)


def test_invalid_schema_names_the_offending_path():
    with pytest.raises(ValueError) as info:
        check_schema({"type": "nope"})
    assert "json_schema is not a valid JSON Schema: at $.type:" in str(info.value)
    assert "'nope'" in str(info.value)


def test_invalid_nested_schema_names_the_nested_path():
    schema = {"type": "object", "properties": {"a": {"type": "object", "required": "b"}}}
    with pytest.raises(ValueError, match=r"at \$\.properties\.a\.required: 'b' is not of type 'array'"):
        check_schema(schema)


def test_invalid_regex_pattern_is_refused():
    with pytest.raises(ValueError, match=r"at \$\.pattern:"):
        check_schema({"type": "string", "pattern": "("})


def test_unknown_dialect_is_refused():
    with pytest.raises(ValueError, match=r"unknown dialect 'https://example\.com/my-draft'"):
        check_schema({"$schema": "https://example.com/my-draft", "type": "object"})


def test_declared_draft_is_honoured():
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"n": {"type": "integer"}},
        "properties": {"x": {"$ref": "#/definitions/n"}},
    }
    assert check_schema(draft7) is draft7
    assert parse_reply('{"x": "one"}', draft7).errors == ("$.x: 'one' is not of type 'integer'",)


def test_local_refs_and_embedded_ids_resolve():
    schema = {
        "$defs": {"qty": {"type": "integer", "minimum": 1}},
        "properties": {
            "q": {"$ref": "#/$defs/qty"},
            "sub": {"$id": "https://example.com/sub", "$defs": {"s": {"type": "string"}}, "properties": {"t": {"$ref": "#/$defs/s"}}},
        },
    }
    assert check_schema(schema) is schema
    assert parse_reply('{"q": 0, "sub": {"t": 1}}', schema).errors == (
        "$.q: 0 is less than the minimum of 1",
        "$.sub.t: 1 is not of type 'string'",
    )


def test_remote_ref_is_refused_not_fetched():
    with pytest.raises(ValueError) as info:
        check_schema({"properties": {"a": {"$ref": "https://example.invalid/schema.json"}}})
    message = str(info.value)
    assert "$ref 'https://example.invalid/schema.json' cannot be resolved" in message
    assert "never fetched" in message


@pytest.mark.parametrize("bad", [{"enum": {1, 2}}, {"maximum": float("nan")}])
def test_non_json_schema_values_are_refused(bad):
    with pytest.raises(ValueError, match="JSON-serialisable"):
        check_schema(bad)


def test_self_referencing_schema_dict_is_refused():
    schema: dict = {"type": "object"}
    schema["properties"] = {"loop": schema}
    with pytest.raises(ValueError, match="JSON-serialisable"):
        check_schema(schema)


def test_schema_sha256_is_stable_across_key_order():
    a = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "number"}}, "required": ["a"]}
    b = {"required": ["a"], "properties": {"a": {"type": "number"}, "b": {"type": "string"}}, "type": "object"}
    assert schema_sha256(a) == schema_sha256(b)
    assert re.fullmatch(r"[0-9a-f]{64}", schema_sha256(a))
    assert schema_sha256(a) != schema_sha256({**a, "required": ["b"]})


def test_schema_sha256_hashes_canonical_utf8_json():
    schema = {"title": "café", "type": "object"}
    expected = hashlib.sha256('{"title":"café","type":"object"}'.encode("utf-8")).hexdigest()
    assert schema_sha256(schema) == expected
    assert schema_sha256(None) is None


def test_editing_a_schema_after_use_takes_effect():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert parse_reply('{"a": "x"}', schema).errors == ("$.a: 'x' is not of type 'integer'",)

    schema["properties"]["a"]["type"] = "string"

    assert parse_reply('{"a": "x"}', schema).valid
    assert parse_reply('{"a": "x"}', {"type": "object", "properties": {"a": {"type": "integer"}}}).errors


# --------------------------------------------------------------------------
# response_format
# --------------------------------------------------------------------------


def test_response_format_native_schema():
    fmt = response_format(json_schema=ORDER_SCHEMA, schema_name="order", json_mode=False, native_schema=True)
    assert fmt == {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER_SCHEMA, "strict": False}}


def test_response_format_native_schema_without_name_uses_response():
    fmt = response_format(json_schema=ORDER_SCHEMA, schema_name=None, json_mode=True, native_schema=True)
    assert fmt["json_schema"]["name"] == "response"


@pytest.mark.parametrize(
    "json_schema, json_mode, native",
    [
        (ORDER_SCHEMA, False, False),
        (ORDER_SCHEMA, True, False),
        (None, True, False),
        (None, True, True),
        (None, False, False),
        (None, False, True),
    ],
)
def test_response_format_json_object_otherwise(json_schema, json_mode, native):
    fmt = response_format(json_schema=json_schema, schema_name="order", json_mode=json_mode, native_schema=native)
    assert fmt == {"type": "json_object"}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("invoice_v2", "invoice_v2"),
        ("Invoice Extract v2!", "Invoice_Extract_v2"),
        ("  line-items  ", "line-items"),
        ("fiche/récapitulatif", "fiche_r_capitulatif"),
        ("!!!", "response"),
        ("", "response"),
        ("x" * 100, "x" * 64),
    ],
)
def test_schema_name_is_sanitised_for_openai(name, expected):
    fmt = response_format(json_schema={"type": "object"}, schema_name=name, json_mode=False, native_schema=True)
    sent = fmt["json_schema"]["name"]
    assert sent == expected
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", sent)


def test_response_format_refuses_invalid_schema_and_name():
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        response_format(json_schema={"type": "nope"}, schema_name=None, json_mode=False, native_schema=True)
    with pytest.raises(ValueError, match="schema_name must be a str"):
        response_format(json_schema={"type": "object"}, schema_name=5, json_mode=False, native_schema=True)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# build_messages
# --------------------------------------------------------------------------


def _messages(**overrides):
    kwargs = dict(
        instructions="Extract the order.",
        blocks=normalise_input(["order text"]),
        json_schema=ORDER_SCHEMA,
        schema_name="order",
        system_prompt=None,
        native_schema=False,
    )
    kwargs.update(overrides)
    return build_messages(**kwargs)


def test_messages_are_one_system_then_one_user():
    messages = _messages()
    assert [m["role"] for m in messages] == ["system", "user"]


def test_system_message_puts_plugin_prompt_first_then_json_directive():
    system = _system(_messages(system_prompt="You are a careful accountant."))
    assert system.startswith("You are a careful accountant.\n\n")
    assert "single JSON value only" in system
    assert "no markdown code fences" in system


def test_schema_in_prompt_only_when_not_native():
    prompted = _system(_messages(native_schema=False))
    compact = json.dumps(ORDER_SCHEMA, separators=(",", ":"), ensure_ascii=False)
    assert f"JSON Schema:\n{compact}" in prompted
    assert "Schema name: order" in prompted

    native = _system(_messages(native_schema=True))
    assert "JSON Schema:\n" not in native
    assert '"properties"' not in native
    assert "Schema name: order" in native


def test_no_schema_means_no_schema_lines_but_still_json():
    system = _system(_messages(json_schema=None, schema_name="order"))
    assert "JSON Schema" not in system
    assert "Schema name" not in system
    assert "JSON" in system  # OpenAI json_object mode requires the word in the prompt


def test_schema_without_name_has_no_name_line():
    assert "Schema name" not in _system(_messages(schema_name=None))


def test_user_parts_start_with_instructions_then_blocks_in_order():
    blocks = normalise_input(
        [
            {"type": "text", "text": "first"},
            {"type": "image", "data": PNG, "mime_type": "image/jpeg"},
            {"type": "image", "url": "https://example.com/photo.png?size=large"},
            "last",
        ]
    )
    parts = _user_parts(_messages(blocks=blocks))

    assert parts[0] == {"type": "text", "text": "Extract the order."}
    assert parts[1] == {"type": "text", "text": "first"}
    assert parts[2]["type"] == "image_url"
    assert parts[3] == {"type": "image_url", "image_url": {"url": "https://example.com/photo.png?size=large"}}
    assert parts[4] == {"type": "text", "text": "last"}
    assert len(parts) == 5


def test_image_bytes_become_a_data_url_that_decodes_back():
    parts = _user_parts(_messages(blocks=[PluginLlmImageInput(data=PNG, mime_type="image/jpeg")]))
    url = parts[1]["image_url"]["url"]

    prefix = "data:image/jpeg;base64,"
    assert url.startswith(prefix)
    assert base64.b64decode(url[len(prefix):], validate=True) == PNG


def test_data_urls_given_as_url_pass_through_unchanged():
    data_url = "data:image/gif;base64," + base64.b64encode(b"GIF89a").decode()
    parts = _user_parts(_messages(blocks=[{"url": data_url}]))
    assert parts[1] == {"type": "image_url", "image_url": {"url": data_url}}


def test_text_only_input_is_still_a_list_of_parts_and_blank_parts_are_dropped():
    parts = _user_parts(_messages(blocks=["a", "   ", "b"]))
    assert parts == [
        {"type": "text", "text": "Extract the order."},
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]


def test_build_messages_validates_its_arguments():
    with pytest.raises(ValueError, match="instructions is blank"):
        _messages(instructions="  ")
    with pytest.raises(ValueError, match=r"input\[0\]: unknown block type"):
        _messages(blocks=[{"type": "audio", "data": b"x"}])
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        _messages(json_schema={"type": 3})
    with pytest.raises(ValueError, match="system_prompt must be a str"):
        _messages(system_prompt=["x"])


# --------------------------------------------------------------------------
# parse_reply
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        '{"a": 1}',
        '  \n{"a": 1}\n ',
        '```json\n{"a": 1}\n```',
        '```\n{"a": 1}\n```',
        '```JSON\n{"a": 1}\n```\n',
        '```json {"a": 1}```',
        'Here is the result:\n```json\n{"a": 1}\n```\nLet me know if you need more.',
        'Here is the JSON: {"a": 1}. Hope it helps!',
        'Sure! {"a": 1}',
    ],
)
def test_json_is_found_in_common_reply_shapes(reply):
    parsed = parse_reply(reply, None)
    assert parsed == ParsedReply(text=reply, parsed={"a": 1}, content_type="json", errors=())
    assert parsed.valid


def test_arrays_and_scalars_are_json_too():
    assert parse_reply("Result: [1, 2, 3] done", None).parsed == [1, 2, 3]
    assert parse_reply("42", None).parsed == 42
    assert parse_reply("null", None).content_type == "json"


@pytest.mark.parametrize("reply", ["I could not find an order in this text.", "", "   ", "{not: json}", "NaN", "```json\n{\"a\": 1\n```"])
def test_not_json_is_text(reply):
    parsed = parse_reply(reply, ORDER_SCHEMA)
    assert parsed.parsed is None
    assert parsed.content_type == "text"
    assert parsed.errors == ()
    assert parsed.text == reply
    assert not parsed.valid


def test_absurdly_deep_reply_is_text_not_a_crash():
    parsed = parse_reply("[" * 100_000 + "]" * 100_000, None)
    assert (parsed.parsed, parsed.content_type) == (None, "text")


def test_none_reply_is_an_empty_text_reply():
    parsed = parse_reply(None, None)
    assert (parsed.text, parsed.parsed, parsed.content_type) == ("", None, "text")


def test_raw_text_is_kept_verbatim():
    reply = '  ```json\n{"total": 1, "items": []}\n```  '
    assert parse_reply(reply, ORDER_SCHEMA).text == reply


def test_valid_reply_against_schema():
    parsed = parse_reply(json.dumps(VALID_ORDER), ORDER_SCHEMA)
    assert parsed.parsed == VALID_ORDER
    assert parsed.errors == ()
    assert parsed.valid


def test_schema_errors_have_json_paths_into_nested_objects_and_arrays():
    reply = {
        "total": "x",
        "customer": {},
        "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "two"}, {"sku": 3}],
    }
    parsed = parse_reply(json.dumps(reply), ORDER_SCHEMA)

    assert parsed.content_type == "json"
    assert parsed.parsed == reply
    assert not parsed.valid
    assert parsed.errors == (
        "$.customer: 'name' is a required property",
        "$.items[1].qty: 'two' is not of type 'integer'",
        "$.items[2]: 'qty' is a required property",
        "$.items[2].sku: 3 is not of type 'string'",
        "$.total: 'x' is not of type 'number'",
    )


def test_errors_are_deterministic_and_sorted_numerically():
    schema = {"type": "array", "items": {"type": "integer"}}
    reply = json.dumps(["x"] * 12)
    first = parse_reply(reply, schema).errors
    assert first == parse_reply(reply, schema).errors
    assert [e.split(":")[0] for e in first] == [f"$[{i}]" for i in range(12)]


def test_top_level_error_and_odd_keys_get_readable_paths():
    schema = {"type": "object", "properties": {"unit price": {"type": "number"}}, "required": ["id"]}
    errors = parse_reply('{"unit price": "cheap"}', schema).errors
    assert errors == ("$: 'id' is a required property", '$["unit price"]: \'cheap\' is not of type \'number\'')


def test_long_error_messages_are_capped():
    errors = parse_reply(json.dumps({"total": "z" * 5000, "items": []}), ORDER_SCHEMA).errors
    assert len(errors) == 1
    assert errors[0].startswith("$.total: 'zzz")
    assert len(errors[0]) < 300


def test_schema_is_never_skipped_for_fenced_or_prose_replies():
    fenced = parse_reply('```json\n{"total": "x", "items": []}\n```', ORDER_SCHEMA)
    prose = parse_reply('Here you go: {"total": "x", "items": []}', ORDER_SCHEMA)
    assert fenced.errors == prose.errors == ("$.total: 'x' is not of type 'number'",)


def test_prose_prefers_the_candidate_that_satisfies_the_schema():
    reply = 'As noted in [1], the order is {"total": 3, "items": []}.'
    parsed = parse_reply(reply, ORDER_SCHEMA)
    assert parsed.parsed == {"total": 3, "items": []}
    assert parsed.valid
    # Without a schema the first top-level value wins.
    assert parse_reply(reply, None).parsed == [1]


def test_prose_falls_back_to_the_first_candidate_when_none_validates():
    parsed = parse_reply('First {"total": "a"} then {"total": "b"}', ORDER_SCHEMA)
    assert parsed.parsed == {"total": "a"}
    assert "$.total: 'a' is not of type 'number'" in parsed.errors


def test_a_whole_json_reply_is_judged_as_a_whole():
    # The reply is pure JSON (an array); a matching object nested inside it must not be picked.
    parsed = parse_reply(json.dumps([VALID_ORDER]), ORDER_SCHEMA)
    assert parsed.parsed == [VALID_ORDER]
    assert parsed.errors == ("$: [{'total': 12.5, 'customer': {'name': 'Ada'}, 'items': [{'sku': 'a', 'qty': 1}]}] is not of type 'object'",)


def test_nested_values_inside_a_prose_candidate_are_not_separate_candidates():
    parsed = parse_reply('Result: [{"total": 1, "items": []}] end', ORDER_SCHEMA)
    assert parsed.parsed == [{"total": 1, "items": []}]
    assert not parsed.valid


def test_parse_reply_refuses_an_invalid_schema():
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        parse_reply('{"a": 1}', {"type": "nope"})


def test_parsed_reply_is_frozen():
    parsed = parse_reply("{}", None)
    with pytest.raises(AttributeError):
        parsed.text = "x"  # type: ignore[misc]


# --------------------------------------------------------------------------
# repair_messages
# --------------------------------------------------------------------------


def test_repair_lists_the_errors_and_keeps_the_original_messages_untouched():
    messages = _messages(blocks=[{"data": PNG}, "order"])
    before = copy.deepcopy(messages)
    reply = parse_reply('{"total": "x", "items": [{"sku": "a"}]}', ORDER_SCHEMA)

    repaired = repair_messages(messages, reply)

    assert messages == before
    assert repaired[: len(messages)] == messages
    assert repaired[len(messages)] == {"role": "assistant", "content": reply.text}
    ask = repaired[-1]
    assert ask["role"] == "user"
    assert "does not match the required JSON Schema" in ask["content"]
    assert "- $.items[0]: 'qty' is a required property" in ask["content"]
    assert "- $.total: 'x' is not of type 'number'" in ask["content"]
    assert "only the corrected JSON" in ask["content"]
    assert len(repaired) == len(messages) + 2


def test_repaired_list_shares_no_mutable_state_with_the_input():
    messages = _messages()
    before = copy.deepcopy(messages)
    repaired = repair_messages(messages, parse_reply("nope", ORDER_SCHEMA))

    repaired[0]["content"] = "changed"
    repaired[1]["content"].append({"type": "text", "text": "extra"})

    assert messages == before


def test_repair_of_a_non_json_reply_says_so():
    repaired = repair_messages([{"role": "user", "content": "x"}], parse_reply("Sorry, no.", ORDER_SCHEMA))
    assert repaired[1] == {"role": "assistant", "content": "Sorry, no."}
    assert repaired[2]["content"].startswith("Your previous reply was not valid JSON.")
    assert "no code fences" in repaired[2]["content"]


def test_repair_of_an_empty_reply_sends_a_placeholder_assistant_turn():
    repaired = repair_messages([{"role": "user", "content": "x"}], parse_reply("", None))
    assert repaired[1] == {"role": "assistant", "content": "(empty reply)"}


def test_repair_caps_the_number_of_listed_errors():
    schema = {"type": "array", "items": {"type": "integer"}}
    reply = parse_reply(json.dumps(["x"] * 25), schema)
    content = repair_messages([], reply)[-1]["content"]
    assert content.count("\n- $[") == 20
    assert "- ... and 5 more" in content


def test_repair_of_a_valid_reply_is_refused():
    with pytest.raises(ValueError, match="nothing to repair"):
        repair_messages([], parse_reply('{"total": 1, "items": []}', ORDER_SCHEMA))


# --------------------------------------------------------------------------
# Purity
# --------------------------------------------------------------------------


def test_module_does_not_import_litellm():
    root = Path(__file__).resolve().parents[1]
    code = "import sys, plugin_llm.structured; sys.exit('litellm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0
