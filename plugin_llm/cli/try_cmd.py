"""``plugin-llm try --as PLUGIN PROMPT``: one call as a plugin, through the trust gate.

Operators use it to check a trust entry before a plugin relies on it: the call
is made exactly as ``ctx.llm`` would make it for that plugin, and the result,
usage, cost and the audit record are printed.
"""

from __future__ import annotations

import argparse
import json
import sys

from plugin_llm.cli._common import add_home_argument, dumps_json, find_audit_record, home_from, printable, printable_text
from plugin_llm.cli.main import CliError
from plugin_llm.cli.plugin_keys import plugin_key_for
from plugin_llm.config import get_config_source


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "try",
        help="make one call as a plugin through the trust gate",
        description="Make one LLM call as PLUGIN, exactly as its ctx.llm would, and print the result, usage, cost and audit record.",
    )
    p.add_argument("--as", dest="plugin", required=True, metavar="PLUGIN",
                   help="plugin id (manifest key, e.g. my-plugin or image_gen/openai): installed here or named in config.yaml")
    p.add_argument("--force", action="store_true",
                   help="call as a plugin this home does not know or has disabled (e.g. one running on another machine)")
    p.add_argument("--provider", help="provider override (needs allow_provider_override)")
    p.add_argument("--model", help="model override (needs allow_model_override)")
    p.add_argument("--agent-id", help="agent id override (needs allow_agent_id_override)")
    p.add_argument("--profile", help="credential profile (needs allow_profile_override)")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--timeout", type=float, help="seconds (capped by llm.max_timeout)")
    p.add_argument("--purpose", default="plugin-llm try", help="free-form audit purpose")
    p.add_argument("--schema", help="JSON Schema (inline JSON or @file): make a structured call instead")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("prompt", nargs="+", help="the user message")
    add_home_argument(p)
    p.set_defaults(func=run)


def _schema(text: str | None):
    if text is None:
        return None
    raw = text
    if text.startswith("@"):
        try:
            raw = open(text[1:], encoding="utf-8").read()
        except OSError as exc:
            raise CliError(f"--schema: cannot read {text[1:]}: {exc.strerror}") from None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise CliError(f"--schema is not valid JSON ({exc}); pass inline JSON or @path/to/schema.json") from None


def _plugin_key(home, args: argparse.Namespace) -> str:
    """The key to call as: refused when no plugin here has it or it is disabled (a typo would make a real,
    billed call under a name nobody configured), unless --force."""
    plugin = plugin_key_for(home, args.plugin, force=args.force, doing="no call was made")
    if plugin.disabled and not args.force:
        raise CliError(f"{printable(plugin.key)} is disabled (plugins.disabled in config.yaml): it makes no calls; "
                       f"no call was made. Enable it (plugin-llm plugins enable {printable(plugin.key)}) or use --force")
    return plugin.key


def run(args: argparse.Namespace) -> int:
    from plugin_llm.llm import PluginLlm  # on first use: it loads the provider layer

    home = home_from(args)
    prompt = " ".join(args.prompt)

    config = get_config_source(home).current()
    if config.error:
        print(f"plugin-llm: warning: {config.error}\n  config.yaml does not parse: every plugin override is refused "
              "(fail closed) and calls use the last good route until it is fixed", file=sys.stderr)
    schema = _schema(args.schema)
    llm = PluginLlm(_plugin_key(home, args), home=home)
    common = dict(
        provider=args.provider, model=args.model, agent_id=args.agent_id, profile=args.profile,
        temperature=args.temperature, max_tokens=args.max_tokens, timeout=args.timeout, purpose=args.purpose,
    )
    from plugin_llm.cli._waiting import provider_layer_notice  # on first use: it loads the provider layer

    try:
        with provider_layer_notice():
            if schema is not None or args.schema is not None:
                result = llm.complete_structured(instructions=prompt, input=[prompt], json_schema=schema,
                                                 system_prompt=args.system, **common)
            else:
                messages = (([{"role": "system", "content": args.system}] if args.system else [])
                            + [{"role": "user", "content": prompt}])
                result = llm.complete(messages, **common)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    record = find_audit_record(home, result.audit["call_id"])
    if args.json:
        out = {
            "text": result.text, "provider": result.provider, "model": result.model, "agent_id": result.agent_id,
            "usage": vars(result.usage), "audit": result.audit, "audit_record": record,
        }
        if hasattr(result, "parsed"):
            out.update(parsed=result.parsed, content_type=result.content_type)
        print(dumps_json(out))
        return 0
    u = result.usage
    cost = "unpriced" if u.cost_usd is None else f"${u.cost_usd:.6f}"
    print(printable_text(result.text))
    if hasattr(result, "parsed"):
        print(f"\nparsed ({result.content_type}): {dumps_json(result.parsed, indent=None)}")
    print(f"\nroute:  {printable(result.provider)} / {printable(result.model)}")
    print(f"usage:  {u.input_tokens} in, {u.output_tokens} out, {u.total_tokens} total   cost: {cost}")
    print(f"call:   {result.audit['call_id']}  (plugin {printable(result.audit['plugin_id'])})")
    print("audit:  " + (dumps_json(record, indent=None) if record else f"(no line found in {home / 'logs' / 'agent.log'})"))
    sys.stdout.flush()
    return 0
