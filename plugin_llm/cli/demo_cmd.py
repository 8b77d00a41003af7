"""``plugin-llm demo``: the example plugins end to end, with no setup at all.

The demo never touches the user's home. It builds a temporary home from ``config_examples/``
(``config.yaml`` + ``plugins/``), points ``$HERMES_HOME`` at it for the duration, loads the
example plugins and shows, one section each: the plugins loaded; a plain completion (``/tldr``);
a structured extraction (``/paste-to-tasks``); an async fan-out (``/fanout``); a session turn
where the model calls a tool, then one a policy hook blocks (``tool-guard``); a trust denial for
a model override with the config lines that would allow it; the last lines of the audit log.

It runs on the route ``config.yaml`` selects (the offline ``local`` model in the example), so it
needs no key and no network. ``--keep`` keeps the temporary home and prints its path.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from plugin_llm.cli.main import CliError
from plugin_llm.host import Session
from plugin_llm.host.bootstrap import home_environment, load_manager

__all__ = ["register", "run", "find_examples"]

_TEXT = (
    "Plugins ask the host for model calls instead of holding API keys. "
    "The operator decides in config.yaml which plugin may pick its own model. "
    "Every call lands in a hash-chained audit log."
)
_NOTES = "Title: Ship the 1.0 release\nOwner: Ada\nDue: 2025-07-01\nPriority: high"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the example plugins end to end on the configured route",
        description="Run the example plugins end to end in a temporary home seeded from config_examples/ "
        "(your own home is never touched).",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary home and print its path")
    parser.add_argument("--examples", metavar="DIR",
                        help="directory holding config.yaml and plugins/ (default: the checkout's config_examples/)")
    parser.set_defaults(func=run)


def find_examples(explicit: str | None = None) -> Path:
    """The ``config_examples`` directory: ``--examples``, else the copy shipped in the package
    (``plugin_llm/examples``), else the checkout's."""
    candidates = [Path(explicit).expanduser()] if explicit else [
        Path(__file__).resolve().parents[1] / "examples",  # package data: a wheel install (a link in a checkout)
        Path(__file__).resolve().parents[2] / "config_examples",
        Path.cwd() / "config_examples",
    ]
    for candidate in candidates:
        if (candidate / "config.yaml").is_file() and (candidate / "plugins").is_dir():
            return candidate.resolve()
    where = ", ".join(str(c) for c in candidates)
    raise CliError(f"the demo needs config_examples/ (config.yaml and plugins/); not found at {where}. "
                   "Run it from a checkout of plugin-llm-gateway or pass --examples DIR.")


def run(args: argparse.Namespace) -> int:
    from plugin_llm.transport import start_background_load  # on first use: it loads the provider layer

    start_background_load()  # the demo calls the model: litellm loads while the home is seeded
    examples = find_examples(args.examples)
    home = Path(tempfile.mkdtemp(prefix="plugin-llm-demo-")).resolve()
    try:
        _seed(examples, home)

        with home_environment(home):
            _Demo(home, sys.stdout, keep=args.keep).run()
    finally:
        if args.keep:
            print(f"\nDemo home kept at {home}\n  try: HERMES_HOME={home} plugin-llm chat")
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 0


def _seed(examples: Path, home: Path) -> None:
    shutil.copy2(examples / "config.yaml", home / "config.yaml")
    shutil.copytree(examples / "plugins", home / "plugins",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    workspace = home / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("Demo file: the tool-guard policy keeps it from being deleted.\n")


class _Demo:
    def __init__(self, home: Path, out: TextIO, *, keep: bool = False) -> None:
        self.home = home
        self.out = out
        self.keep = keep

    def say(self, text: str = "") -> None:
        print(text, file=self.out)

    def section(self, number: int, title: str) -> None:
        self.say(f"\n== {number}. {title} ==")

    def run(self) -> None:
        manager = load_manager(self.home)
        with Session(manager, platform="demo") as session:
            provider, model = session.route
            self.say(f"plugin-llm demo: temporary home {self.home} (your own home is not touched)")
            self.say(f"route: provider={provider} model={model}"
                     + ("  (the offline local model; set model: in config.yaml for a real one)"
                        if provider == "local" else ""))
            self._plugins(manager)
            self._command(session, 2, "Plain completion: /tldr (ctx.llm.complete)", "tldr", _TEXT)
            self._command(session, 3, "Structured extraction: /paste-to-tasks (ctx.llm.complete_structured)",
                          "paste-to-tasks", _NOTES, show_input=True)
            self._command(session, 4, "Async fan-out: /fanout (asyncio.gather of three ctx.llm.acomplete)",
                          "fanout", "The 1.0 release shipped on time and users like it.")
            self._tools(session)
        self._trust()
        self._audit()

    def _plugins(self, manager: Any) -> None:
        self.section(1, "Plugins loaded from config_examples/plugins")
        for p in sorted(manager.list_plugins(), key=lambda p: p["key"]):
            provided = [f"{label}: {', '.join(p.get(label) or [])}"
                        for label in ("tools", "hooks", "commands") if p.get(label)]
            line = f"  {p['key']:<28} {p['status']:<12} {'; '.join(provided)}"
            self.say(line.rstrip())
            if p.get("error"):
                self.say(f"      error: {p['error']}")

    def _command(self, session: Any, number: int, title: str, name: str, raw: str, *,
                 show_input: bool = False) -> None:
        self.section(number, title)
        if show_input:
            self.say(f"  /{name}")
            self.say("\n".join("    " + line for line in raw.splitlines()))
        else:
            self.say(f"  /{name} {raw}")
        result = session.run_command(name, raw)
        if result.kind != "command":
            self.say(f"  FAILED: {result.text}")
            return
        self.say("\n".join("  " + line for line in (result.text or "").splitlines()))

    def _tools(self, session: Any) -> None:
        self.section(5, "Tool calls in a session turn, and one blocked by a policy hook (tool-guard)")
        for prompt in ("use the hello_world tool with name=Ada", 'call delete_file with {"path": "notes.txt"}'):
            self.say(f"  you> {prompt}")
            result = session.run_turn(prompt)
            for run in result.tool_runs:
                verdict = "BLOCKED" if run.blocked else "ran"
                self.say(f"  [tool {run.name}] {verdict}: {json.dumps(run.arguments)} -> {run.result}")
            self.say(f"  assistant> {result.text}")
        still = (self.home / "workspace" / "notes.txt").exists()
        self.say(f"  workspace/notes.txt still exists: {'yes' if still else 'NO'}")

    def _trust(self) -> None:
        from plugin_llm import PluginLlm, PluginLlmTrustError  # on first use: it loads the provider layer

        self.section(6, "Trust gate: a model override the operator has not granted")
        self.say('  tldr calls ctx.llm.complete(..., model="gpt-4o") without a plugins.entries.tldr block')
        try:
            PluginLlm("tldr", home=self.home).complete(
                [{"role": "user", "content": "hello"}], model="gpt-4o", purpose="demo.trust")
        except PluginLlmTrustError as exc:
            self.say(f"  refused before any provider call: PluginLlmTrustError: {exc}")
            snippet = _yaml_for(exc.config_key)
            if snippet:
                self.say("  To allow it, the operator adds to config.yaml:")
                self.say("\n".join("    " + line for line in snippet.splitlines()))
        else:  # pragma: no cover - only if someone edits the example config to trust tldr
            self.say("  (allowed: config.yaml trusts tldr with model overrides)")
        result = PluginLlm("paste-to-tasks", home=self.home).complete(
            [{"role": "user", "content": "hello"}], model="local-echo-1", purpose="demo.trust")
        self.say("  paste-to-tasks is trusted (allow_model_override + allowed_models) -> "
                 f"model={result.model!r} allowed")

    def _audit(self, count: int = 12) -> None:
        self.section(7, f"Audit trail: last {count} lines of logs/agent.log")
        records = _last_audit_records(self.home, count)
        if not records:
            self.say("  (no audit lines were written)")
            return
        self.say(f"  {'seq':>4}  {'plugin':<16} {'api':<10} {'mode':<5} {'decision':<8} {'status':<8} "
                 f"{'model':<14} tokens")
        for r in records:
            tokens = f"{r.get('gen_ai.usage.input_tokens') or 0}+{r.get('gen_ai.usage.output_tokens') or 0}"
            model = r.get("gen_ai.response.model") or r.get("gen_ai.request.model") or ""
            self.say(f"  {str(r.get('seq', '')):>4}  {str(r.get('plugin_id', '')):<16} "
                     f"{str(r.get('api', r.get('event', ''))):<10} {str(r.get('mode', '')):<5} "
                     f"{str(r.get('decision', '')):<8} {str(r.get('status', '')):<8} {str(model):<14} {tokens}")
        self.say(f"  {_verify_line(self.home)}")
        if self.keep:
            self.say(f"  inspect it: HERMES_HOME={self.home} plugin-llm audit tail")
        else:
            self.say("  (run with --keep to keep this home and inspect the log with plugin-llm audit ...)")


def _yaml_for(config_key: str) -> str:
    """``plugins.entries.tldr.llm.allow_model_override`` -> the nested YAML that sets it to true."""
    prefix = "plugins.entries."
    if not config_key or not config_key.startswith(prefix) or ".llm." not in config_key:
        return ""
    plugin_id, _, flag = config_key[len(prefix):].rpartition(".llm.")
    if not plugin_id or not flag:
        return ""
    key = plugin_id if all(c.isalnum() or c in "-_/" for c in plugin_id) else json.dumps(plugin_id)
    value = "true" if flag.startswith("allow_") and not flag.startswith("allowed_") else "[...]"
    return f"plugins:\n  entries:\n    {key}:\n      llm:\n        {flag}: {value}"


def _verify_line(home: Path) -> str:
    """One line saying whether the hash chain of the demo's log verifies."""
    try:
        from audit import verify  # type: ignore[attr-defined]

        result = verify(home)
    except Exception as exc:  # the audit package is optional for the demo
        return f"hash chain: not verified ({type(exc).__name__})"
    if result.ok:
        return f"hash chain verified: {result.records} records, no broken, missing or edited line"
    return f"hash chain BROKEN: {result.first_error}"


def _last_audit_records(home: Path, count: int) -> list[dict[str, Any]]:
    """The last ``count`` call/denial records: through ``audit.iter_records`` when the audit
    package provides it, else straight from the JSON lines of agent.log."""
    try:
        from audit import iter_records  # type: ignore[attr-defined]

        records = [dict(r) if not isinstance(r, dict) else r for r in iter_records(home)]
    except Exception:
        records = []
        path = home / "logs" / "agent.log"
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                records.append(item)
    calls = [r for r in records if r.get("plugin_id") and (r.get("api") or r.get("decision"))]
    return (calls or records)[-count:]
