"""``/tldr <text>``: summarise pasted text with the user's active model.

Shows the simplest use of ``ctx.llm``: one ``complete()`` call with no
provider/model override, so it needs no trust configuration at all. The
``purpose`` string appears in the audit log (``plugin-llm audit query
--plugin tldr``) and in ``result.audit``.
"""

from __future__ import annotations

SYSTEM = "Summarise the user's text in one or two plain sentences. No preamble."


def register(ctx):
    def tldr(raw_args: str) -> str:
        text = raw_args.strip()
        if not text:
            return "Usage: /tldr <text to summarise>"
        result = ctx.llm.complete(
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Summarise this: {text}"},
            ],
            max_tokens=200,
            purpose="tldr.summarise",
        )
        u = result.usage
        return (
            f"{result.text}\n"
            f"  provider={result.provider} model={result.model} "
            f"tokens={u.input_tokens}+{u.output_tokens} call_id={result.audit.get('call_id')}"
        )

    ctx.register_command("tldr", tldr, description="summarise pasted text", args_hint="<text>")
