"""The ``plugin-llm`` command table: each subcommand's module and one-line help.

It sits below the plugin manager as well as the CLI: a plugin's ``register_cli_command`` may not take a
built-in name, and the manager reads the names here without importing the CLI.
"""

from __future__ import annotations

__all__ = ["SUBCOMMANDS", "BUILTIN_NAMES"]

#: subcommand -> (module, one-line help). Order is the order shown in --help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("plugin_llm.cli.demo_cmd", "run the example plugins end to end on the configured route"),
    "try": ("plugin_llm.cli.try_cmd", "make one call as a plugin through the trust gate"),
    "serve-local": ("plugin_llm.cli.serve_local_cmd", "serve the embedded local model over OpenAI-compatible HTTP"),
    "serve": ("plugin_llm.cli.serve_cmd", "serve the gateway over HTTP to plugins holding a token"),
    "tokens": ("plugin_llm.cli.tokens_cmd", "create, list and revoke per-plugin tokens for plugin-llm serve"),
    "plugins": ("plugin_llm.cli.plugins_cmd", "list and manage plugins"),
    "run": ("plugin_llm.cli.run_cmd", "run one plugin slash command"),
    "chat": ("plugin_llm.cli.chat_cmd", "interactive session with the configured model and plugins"),
    "trust": ("plugin_llm.cli.trust_cmd", "show, check and explain the per-plugin trust policy"),
    "auth": ("plugin_llm.cli.auth_cmd", "manage credentials in auth.json"),
    "limits": ("plugin_llm.cli.limits_cmd", "show or reset per-plugin budgets and rate limits"),
    "audit": ("plugin_llm.cli.audit_cmd", "tail, query, summarise and verify the audit log"),
    "doctor": ("plugin_llm.cli.doctor_cmd", "check the home, config, credentials, audit log and plugins"),
    "completion": ("plugin_llm.cli.completion_cmd", "print a shell completion script (bash, zsh or fish)"),
}

#: names a plugin's CLI command may not take: every subcommand, and ``help``
BUILTIN_NAMES: frozenset[str] = frozenset(SUBCOMMANDS) | {"help"}
