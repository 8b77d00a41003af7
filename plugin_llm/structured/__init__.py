"""Structured output for ``PluginLlm.complete_structured``.

Pure functions, no I/O and no litellm: they turn a plugin's ``instructions`` +
``input`` + ``json_schema`` into chat ``messages`` and a ``response_format``,
and turn the model's reply text back into a parsed value plus schema errors.
The pipeline owns the calls, retries and repairs: ``normalise_input``,
``check_instructions`` and ``check_schema`` (``ValueError`` before any call),
``build_messages`` and ``response_format``; after the call ``parse_reply``, and
``repair_messages`` for a JSON reply that does not validate. Parts: :mod:`.inputs`,
:mod:`.schema`, :mod:`.request`, :mod:`.reply`.

Remote ``$ref`` targets are never fetched: only references inside the schema
itself (``#/$defs/...``, embedded ``$id``) and the JSON Schema meta-schemas
resolve. ``format`` is an annotation, as in Draft 2020-12's default
vocabulary, so results do not depend on optional format-checker packages.
"""

from plugin_llm.structured.inputs import check_text, normalise_input, snippet, text_problem
from plugin_llm.structured.reply import ParsedReply, parse_reply, repair_messages
from plugin_llm.structured.request import build_messages, response_format
from plugin_llm.structured.schema import check_instructions, check_schema, schema_sha256

__all__ = [
    "ParsedReply",
    "build_messages",
    "check_instructions",
    "check_schema",
    "check_text",
    "normalise_input",
    "parse_reply",
    "repair_messages",
    "response_format",
    "schema_sha256",
    "snippet",
    "text_problem",
]

#: the name ``call/`` and ``call_options.py`` import it by
_snippet = snippet
