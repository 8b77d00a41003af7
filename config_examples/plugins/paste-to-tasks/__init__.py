"""``/paste-to-tasks <text>``: turn pasted notes into a validated task record.

Shows ``ctx.llm.complete_structured``: ``instructions`` + ``input`` blocks +
a JSON Schema. The host asks the model for JSON, parses it (code fences
stripped), validates it against the schema and returns the Python object on
``result.parsed`` (``content_type == "json"``). If the model cannot produce
JSON at all, ``parsed`` is None and ``result.text`` keeps the raw reply.

On the offline ``local`` model, ``Key: value`` lines fill the fields::

    /paste-to-tasks Title: Ship the 1.0 release
    Owner: Ada
    Due: 2025-07-01
    Priority: high
"""

from __future__ import annotations

import json

TASK_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "description": "what needs doing, imperative"},
        "owner": {"type": "string", "description": "who does it ('' when unknown)"},
        "due": {"type": "string", "description": "ISO date or '' when none"},
        "priority": {"type": "string", "enum": ["low", "normal", "high"]},
    },
    "required": ["title", "owner", "due", "priority"],
    "additionalProperties": False,
}


def register(ctx):
    def paste_to_tasks(raw_args: str) -> str:
        text = raw_args.strip()
        if not text:
            return "Usage: /paste-to-tasks <pasted notes>"
        result = ctx.llm.complete_structured(
            instructions="Extract the single task described in the notes.",
            input=[{"type": "text", "text": text}],
            json_schema=TASK_SCHEMA,
            schema_name="task",
            purpose="paste-to-tasks.extract",
        )
        if result.parsed is None:  # the model did not answer with JSON
            return f"Could not extract a task (content_type={result.content_type}); raw reply:\n{result.text}"
        return json.dumps(result.parsed, indent=2, ensure_ascii=False)

    ctx.register_command(
        "paste-to-tasks", paste_to_tasks, description="extract a task from pasted notes", args_hint="<notes>"
    )
