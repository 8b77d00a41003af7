"""Async slash commands that fan out several model calls concurrently.

``/fanout <text>`` runs three ``ctx.llm.acomplete`` calls at once with
``asyncio.gather`` (a summary, a title and a sentiment) and prints them in a
fixed order. ``/triage <text>`` does the same with
``acomplete_structured``. An async handler is just an ``async def``: the host
awaits it in ``plugin-llm chat`` and runs it on an event loop for
``plugin-llm run``. Each call is audited separately with ``mode: async``.
"""

from __future__ import annotations

import asyncio
import json

ASKS = (
    ("summary", "Summarise this in one sentence: {text}"),
    ("title", "Give this a short title: {text}"),
    ("sentiment", "Is the tone of this positive, neutral or negative? {text}"),
)

TRIAGE = {
    "urgency": {"type": "object", "properties": {"urgency": {"type": "string", "enum": ["low", "medium", "high"]}},
                "required": ["urgency"]},
    "team": {"type": "object", "properties": {"team": {"type": "string"}}, "required": ["team"]},
}


def register(ctx):
    async def fanout(raw_args: str) -> str:
        text = raw_args.strip()
        if not text:
            return "Usage: /fanout <text>"
        calls = [
            ctx.llm.acomplete(
                [{"role": "user", "content": template.format(text=text)}],
                max_tokens=120,
                purpose=f"async-fanout.{label}",
            )
            for label, template in ASKS
        ]
        results = await asyncio.gather(*calls)  # concurrent, results in call order
        lines = [f"{label:>9}: {r.text}" for (label, _), r in zip(ASKS, results)]
        total = sum(r.usage.total_tokens for r in results)
        lines.append(f"({len(results)} concurrent calls, {total} tokens in total)")
        return "\n".join(lines)

    async def triage(raw_args: str) -> str:
        text = raw_args.strip()
        if not text:
            return "Usage: /triage <ticket text with e.g. 'Urgency: high' and 'Team: billing'>"
        results = await asyncio.gather(*(
            ctx.llm.acomplete_structured(
                instructions=f"Classify the ticket's {field}.",
                input=[{"type": "text", "text": text}],
                json_schema=schema,
                schema_name=f"triage_{field}",
                purpose=f"async-fanout.triage.{field}",
            )
            for field, schema in TRIAGE.items()
        ))
        merged = {}
        for r in results:
            if isinstance(r.parsed, dict):
                merged.update(r.parsed)
        return json.dumps(merged, sort_keys=True)

    ctx.register_command("fanout", fanout, description="three concurrent completions", args_hint="<text>")
    ctx.register_command("triage", triage, description="concurrent structured classification", args_hint="<ticket>")
