"""The embedded offline model: determinism, chat, usage, structured output, tools."""

from __future__ import annotations

import json

import jsonschema
import pytest

from plugin_llm.local.model import IMAGE_TOKENS, LOCAL_MODEL, count_tokens, extract_facts, generate


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def content_of(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def structured(schema: dict, text: str, **kw) -> object:
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}
    reply = generate(user(text), response_format=rf, **kw)
    value = json.loads(content_of(reply))
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(value)]
    assert errors == [], (value, errors)
    return value


# ---------------------------------------------------------------- shape, determinism, usage


def test_same_request_gives_identical_reply():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    assert generate(messages) == generate([dict(m) for m in messages])
    assert generate(messages)["id"] != generate(user("Something else"))["id"]


def test_reply_is_an_openai_chat_completion():
    reply = generate(user("Hello there, how are you?"), model="local")
    assert reply["object"] == "chat.completion"
    assert reply["model"] == LOCAL_MODEL
    assert reply["id"].startswith("chatcmpl-local-")
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == 'Local model reply to: "Hello there, how are you?" (5 words)'
    assert "tool_calls" not in choice["message"]


def test_chat_replies_to_the_last_user_message_and_quotes_at_most_200_chars():
    long = "word " * 100
    messages = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "x"},
                {"role": "user", "content": long}]
    text = content_of(generate(messages))
    assert "(100 words)" in text
    quoted = text.split('"')[1]
    assert len(quoted) <= 201 and quoted.endswith("\u2026")


def test_summarise_returns_the_first_sentence():
    text = "Summarise this: The launch moved to May. Budget is unchanged. Team is happy."
    assert content_of(generate(user(text))) == "The launch moved to May."
    assert content_of(generate(user("tl;dr\nRain all week. Sun on Sunday."))) == "Rain all week."


def test_usage_counts_tokens_consistently():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, there!"}]
    reply = generate(messages)
    usage = reply["usage"]
    assert usage["prompt_tokens"] == count_tokens("Be brief.") + count_tokens("Hi, there!") == 3 + 4
    assert usage["completion_tokens"] == count_tokens(content_of(reply))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_images_count_a_fixed_number_of_tokens():
    parts = [{"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    reply = generate([{"role": "user", "content": parts}])
    assert reply["usage"]["prompt_tokens"] == count_tokens("What is this?") + IMAGE_TOKENS
    assert content_of(reply).endswith("(3 words, 1 image)")


def test_max_tokens_truncates_with_finish_reason_length():
    full = generate(user("Please tell me about the weather in Paris"))
    cut = generate(user("Please tell me about the weather in Paris"), max_tokens=4)
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == 4
    assert content_of(full).startswith(content_of(cut))
    assert count_tokens(content_of(cut)) == 4
    roomy = generate(user("Hi"), max_tokens=1000)
    assert roomy["choices"][0]["finish_reason"] == "stop"


# ---------------------------------------------------------------- facts and json_schema


def test_extract_facts_lines_inline_and_bullets():
    facts = extract_facts("Vendor: ACME Corp\nTotal: 12.50; Due date: 2024-01-02\nTags:\n- red\n- blue\n"
                          "This sentence is far too long to ever be a key: nope")
    assert facts["vendor"] == ("Vendor", "ACME Corp")
    assert facts["total"][1] == "12.50"
    assert facts["duedate"] == ("Due date", "2024-01-02")
    assert facts["tags"][1] == ["red", "blue"]
    assert not any("sentence" in k for k in facts)


def test_invoice_example_fills_and_coerces_facts():
    schema = {
        "type": "object",
        "properties": {
            "vendor": {"type": "string"},
            "total": {"type": "number"},
            "due_date": {"type": "string", "format": "date"},
            "paid": {"type": "boolean"},
            "line_count": {"type": "integer"},
            "currency": {"type": "string", "enum": ["USD", "EUR"]},
        },
        "required": ["vendor", "total", "due_date", "paid", "line_count", "currency"],
        "additionalProperties": False,
    }
    text = "Vendor: ACME\nTotal: 12.50\nDue date: 2024-01-02\nPaid: yes\nLine count: 3\nCurrency: eur"
    assert structured(schema, text) == {
        "vendor": "ACME", "total": 12.5, "due_date": "2024-01-02", "paid": True, "line_count": 3, "currency": "EUR",
    }


@pytest.mark.parametrize(
    "raw, expected",
    [("$12.50", 12.5), ("1,200.00", 1200.0), ("EUR 1.234,50", 1234.5), ("-3", -3.0), ("15%", 15.0)],
)
def test_number_facts_are_coerced(raw, expected):
    schema = {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]}
    assert structured(schema, f"Amount: {raw}") == {"amount": expected}


def test_facts_that_do_not_fit_fall_back_to_valid_defaults():
    schema = {
        "type": "object",
        "properties": {
            "count": {"type": "integer", "minimum": 1},
            "ratio": {"type": "number", "maximum": 1},
            "flag": {"type": "boolean"},
            "level": {"enum": ["low", "high"]},
            "code": {"type": "string", "minLength": 3},
        },
        "required": ["count", "ratio", "flag", "level", "code"],
    }
    value = structured(schema, "Count: 2.5\nRatio: 7\nFlag: maybe\nLevel: extreme\nCode: ab")
    assert value == {"count": 1, "ratio": 0.0, "flag": False, "level": "low", "code": "xxx"}


def test_keys_match_ignoring_case_spaces_underscores_and_hyphens():
    schema = {"type": "object", "properties": {"dueDate": {"type": "string"}, "invoice_no": {"type": "string"},
                                               "ship-to": {"type": "string"}}}
    value = structured(schema, "DUE DATE: tomorrow\nInvoice-No: 42\nShip to: Berlin")
    assert value == {"dueDate": "tomorrow", "invoice_no": "42", "ship-to": "Berlin"}


# ~12 varied schemas, each output checked with jsonschema (formats included).
SCHEMAS = {
    "flat_scalars": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"},
                     "c": {"type": "integer"}, "d": {"type": "boolean"}, "e": {"type": "null"}},
                     "required": ["a", "b", "c", "d", "e"]},
    "nested_objects": {"type": "object", "properties": {"customer": {"type": "object", "properties": {
        "name": {"type": "string"}, "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                                                 "zip": {"type": "string"}},
                                                "required": ["city", "zip"]}}, "required": ["name", "address"]}},
        "required": ["customer"]},
    "arrays": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "uniqueItems": True},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 5}, "minItems": 1, "maxItems": 3},
        "rows": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}},
                                            "required": ["sku"]}, "minItems": 2}},
        "required": ["tags", "scores", "rows"]},
    "enums_and_const": {"type": "object", "properties": {"kind": {"const": "invoice"},
                        "status": {"type": "string", "enum": ["open", "closed"]}, "level": {"enum": [3, 1, 2]}},
                        "required": ["kind", "status", "level"]},
    "defs_refs": {"$defs": {"money": {"type": "object", "properties": {"amount": {"type": "number",
                  "exclusiveMinimum": 0}, "currency": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                  "required": ["amount", "currency"]}},
                  "type": "object", "properties": {"price": {"$ref": "#/$defs/money"},
                  "tax": {"$ref": "#/$defs/money"}}, "required": ["price", "tax"]},
    "definitions_draft7": {"definitions": {"id": {"type": "string", "minLength": 4}}, "type": "object",
                           "properties": {"ids": {"type": "array", "items": {"$ref": "#/definitions/id"},
                                                  "minItems": 1}}, "required": ["ids"]},
    "anyof_oneof": {"type": "object", "properties": {
        "maybe": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]},
        "either": {"oneOf": [{"type": "integer", "minimum": 10}, {"type": "string", "maxLength": 0}]}},
        "required": ["maybe", "either"]},
    "type_lists": {"type": "object", "properties": {"note": {"type": ["string", "null"]},
                   "qty": {"type": ["integer", "string"], "minimum": 2}}, "required": ["note", "qty"]},
    "formats": {"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                "dt": {"type": "string", "format": "date-time"}, "mail": {"type": "string", "format": "email"},
                "site": {"type": "string", "format": "uri"}, "uid": {"type": "string", "format": "uuid"},
                "ip": {"type": "string", "format": "ipv4"}}, "required": ["d", "dt", "mail", "site", "uid", "ip"]},
    "numeric_bounds": {"type": "object", "properties": {"pct": {"type": "number", "minimum": 10, "maximum": 20},
                       "even": {"type": "integer", "multipleOf": 2, "minimum": 3},
                       "neg": {"type": "integer", "maximum": -5}}, "required": ["pct", "even", "neg"]},
    "recursive_tree": {"$defs": {"node": {"type": "object", "properties": {"label": {"type": "string"},
                       "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["label", "children"]}}, "$ref": "#/$defs/node"},
    "allof_and_top_level_array": {"type": "array", "minItems": 2, "items": {"allOf": [
        {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        {"properties": {"y": {"type": "string", "minLength": 2}}, "required": ["y"]}]}},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_output_validates_without_facts(name):
    structured(SCHEMAS[name], "Please extract the data.")


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_output_validates_with_noisy_facts(name):
    text = ("A: hello\nB: not a number\nC: 7\nD: yes\nE: something\nName: Ada\nCity: Paris\nZip: 75001\n"
            "Tags: x, x, y\nScores: 1, 6, 9, 12\nStatus: CLOSED\nLevel: 2\nMaybe: write to ada@example.org\n"
            "Either: 4\nNote: n/a\nQty: 1\nD: 02/03/2024\nDT: 2024-02-03 10:30\nMail: nobody\n"
            "Site: example.com/page\nUid: nope\nIP: 999.1.1.1\nPct: 15\nEven: 7\nNeg: -9\nLabel: root\nIds: ab, abcd")
    structured(SCHEMAS[name], text)


def test_facts_fill_nested_objects_arrays_and_formats():
    value = structured(SCHEMAS["nested_objects"], "Customer name: Ada\nCity: Paris\nZip: 75001")
    assert value == {"customer": {"name": "Ada", "address": {"city": "Paris", "zip": "75001"}}}
    value = structured(SCHEMAS["arrays"], "Tags: red, green, red\nScores: 1, 6, 9, 12")
    assert value["tags"] == ["red", "green"]
    assert value["scores"] == [6, 9, 12]
    value = structured(SCHEMAS["formats"], "D: March 4, 2024\nDT: 2024-03-04 10:30\nMail: Ada <ada@example.org>\n"
                                           "Site: example.com/page")
    assert (value["d"], value["dt"], value["mail"], value["site"]) == (
        "2024-03-04", "2024-03-04T10:30:00Z", "ada@example.org", "https://example.com/page")
    value = structured(SCHEMAS["anyof_oneof"], "Maybe: write to ada@example.org\nEither: 12")
    assert value == {"maybe": "ada@example.org", "either": 12}


def test_json_object_with_schema_in_prompt():
    schema = {"type": "object", "properties": {"vendor": {"type": "string"}, "total": {"type": "number"}},
              "required": ["vendor", "total"]}
    messages = [
        {"role": "system", "content": "Answer with JSON only.\nJSON Schema:\n" + json.dumps(schema, indent=2)},
        {"role": "user", "content": "Vendor: ACME\nTotal: $12.50"},
    ]
    value = json.loads(content_of(generate(messages, response_format={"type": "json_object"})))
    assert value == {"vendor": "ACME", "total": 12.5}


def test_json_object_without_schema_returns_facts_or_a_reply():
    reply = generate(user("Vendor Name: ACME\nTotal: 12.50"), response_format={"type": "json_object"})
    assert json.loads(content_of(reply)) == {"vendor_name": "ACME", "total": "12.50"}
    reply = generate(user("hello"), response_format={"type": "json_object"})
    assert json.loads(content_of(reply)) == {"reply": 'Local model reply to: "hello" (1 word)'}


def test_repair_turn_still_returns_valid_output_from_the_original_facts():
    schema = {"type": "object", "properties": {"total": {"type": "number"}, "error": {"type": "string"}},
              "required": ["total"]}
    rf = {"type": "json_schema", "json_schema": {"name": "inv", "schema": schema}}
    messages = [
        {"role": "user", "content": "Total: 12.50"},
        {"role": "assistant", "content": '{"total": "twelve"}'},
        {"role": "user", "content": "Your previous reply was invalid JSON for the schema.\n"
                                    "Error: $.total: 'twelve' is not of type 'number'\nTotal: wrong"},
    ]
    value = json.loads(content_of(generate(messages, response_format=rf)))
    jsonschema.validate(value, schema)
    assert value == {"total": 12.5, "error": ""}


# ---------------------------------------------------------------- tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["city"]}}}
HELLO = {"type": "function", "function": {"name": "hello_world", "parameters": {
    "type": "object", "properties": {"name": {"type": "string"}}}}}


def calls_of(reply: dict) -> list[tuple[str, dict]]:
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    message = reply["choices"][0]["message"]
    assert message["content"] is None
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


def test_call_tool_with_json_arguments():
    reply = generate(user('Please call get_weather with {"city": "Rome", "days": 2}'), tools=[WEATHER, HELLO])
    assert calls_of(reply) == [("get_weather", {"city": "Rome", "days": 2})]
    call = reply["choices"][0]["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert reply == generate(user('Please call get_weather with {"city": "Rome", "days": 2}'), tools=[WEATHER, HELLO])
    assert reply["usage"]["completion_tokens"] == count_tokens("get_weather") + count_tokens(
        call["function"]["arguments"])


def test_use_the_tool_with_coerced_key_value_arguments():
    text = 'Use the get_weather tool with city="Paris, France", days=3, metric=yes, tags=a, and units=C'
    reply = generate(user(text), tools=[WEATHER])
    assert calls_of(reply) == [("get_weather", {"city": "Paris, France", "days": 3, "metric": True, "tags": ["a"],
                                                "units": "C"})]


def test_use_the_tool_without_arguments_and_several_calls():
    assert calls_of(generate(user("use the hello_world tool"), tools=[HELLO])) == [("hello_world", {})]
    reply = generate(user("Call hello_world, then use get_weather with city=Oslo"), tools=[WEATHER, HELLO])
    assert calls_of(reply) == [("hello_world", {}), ("get_weather", {"city": "Oslo"})]
    ids = [c["id"] for c in reply["choices"][0]["message"]["tool_calls"]]
    assert len(set(ids)) == 2


def test_unoffered_tool_and_casual_use_are_not_tool_calls():
    reply = generate(user('call get_weather with {"city": "Rome"}'), tools=[HELLO])
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert "tool_calls" not in reply["choices"][0]["message"]
    reply = generate(user("I use get_weather sometimes"), tools=[WEATHER])
    assert reply["choices"][0]["finish_reason"] == "stop"
    reply = generate(user("call hello_world"))  # no tools offered at all
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_tool_choice_none_required_and_named():
    assert generate(user("call hello_world"), tools=[HELLO], tool_choice="none")["choices"][0][
        "finish_reason"] == "stop"
    forced = generate(user("City: Lima"), tools=[WEATHER], tool_choice="required")
    name, args = calls_of(forced)[0]
    assert name == "get_weather" and args["city"] == "Lima"
    named = generate(user("hi"), tools=[WEATHER, HELLO],
                     tool_choice={"type": "function", "function": {"name": "hello_world"}})
    assert calls_of(named) == [("hello_world", {"name": ""})]


def test_tool_results_are_reported_in_the_follow_up_reply():
    messages = [
        {"role": "user", "content": "use the hello_world tool with name=Ada"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "hello_world", "arguments": '{"name": "Ada"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Hello, Ada!"},
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
    ]
    reply = generate(messages, tools=[HELLO, WEATHER])
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert content_of(reply) == "Tool hello_world returned: Hello, Ada!\nTool get_weather returned: sunny"
    assert reply["usage"]["prompt_tokens"] > count_tokens("use the hello_world tool with name=Ada")
