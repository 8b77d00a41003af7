"""``plugin-llm tokens create|list|revoke``: per-plugin tokens for ``plugin-llm serve``.

``create PLUGIN`` prints a new token once (``plg_...``) for a plugin installed here or named in
config.yaml (``--force`` for one that is not), valid 90 days unless ``--expires`` says otherwise
(``never``: until revoked); the home keeps only
its SHA-256 with the plugin key, creation time, expiry and an id
(``<home>/service/tokens.db``, mode 0600; in Redis with ``limits.store: redis``). Whoever holds the token calls the
gateway as that plugin: its trust policy, its limits, its audit lines.
``list`` shows ids, plugins, times and status (never a token); ``revoke ID``
refuses the token within a second on every worker and replica sharing the file.
Creation and revocation are written to the audit log (without the token).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from plugin_llm.auditing import write_event
from plugin_llm.cli._common import add_home_argument, dumps_json, home_from, printable
from plugin_llm.cli.main import CliError
from plugin_llm.cli.plugin_keys import plugin_key_for
from plugin_llm.service.tokens import TokenError, parse_duration, token_key_path, token_store_for
from plugin_llm.timefmt import utc_iso, with_unix

__all__ = ["register", "DEFAULT_EXPIRES"]

#: a token's lifetime unless --expires says otherwise (``never``: until revoked)
DEFAULT_EXPIRES = "90d"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tokens", help="create, list and revoke per-plugin tokens for plugin-llm serve",
                              description=__doc__.split("\n\n")[1])
    sub = p.add_subparsers(dest="tokens_command", metavar="{create,list,revoke}")
    create = sub.add_parser("create", help="a new token for a plugin, printed once")
    create.add_argument("plugin", help="the plugin key the token calls as (e.g. my-plugin, image_gen/openai): "
                        "installed here or named in config.yaml")
    create.add_argument("--expires", metavar="DURATION", default=DEFAULT_EXPIRES,
                        help=f"lifetime such as 30d, 12h, 90m or 2w, or 'never' (default: {DEFAULT_EXPIRES})")
    create.add_argument("--force", action="store_true",
                        help="create it for a plugin this home does not know (e.g. one running on another machine)")
    create.add_argument("--json", action="store_true", help="machine-readable output (includes the token, once)")
    add_home_argument(create)
    create.set_defaults(func=run_create)
    listing = sub.add_parser("list", help="every token's id, plugin, times and status (never the token)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    add_home_argument(listing)
    listing.set_defaults(func=run_list)
    revoke = sub.add_parser("revoke", help="revoke a token by its id (see tokens list)")
    revoke.add_argument("id", help="the token id, tok_...")
    add_home_argument(revoke)
    revoke.set_defaults(func=run_revoke)


def _store(args: argparse.Namespace):
    home = home_from(args)
    if home.exists() and not home.is_dir():
        raise CliError(f"--home {home} is not a directory")
    try:
        return home, token_store_for(home)  # the file, or Redis with limits.store: redis
    except TokenError as exc:
        raise CliError(str(exc)) from None


def _when(value: Any) -> str:
    if value is None:
        return "-"
    try:
        return utc_iso(value) or "-"
    except (OverflowError, OSError, ValueError, TypeError):  # an invalid record's time, as anyone wrote it
        return "?"


def _audit(home, event: str, **fields: Any) -> None:
    write_event(home, event, **fields)


def run_create(args: argparse.Namespace) -> int:
    try:
        never = args.expires.strip().lower() == "never"
        expires_in = None if never else parse_duration(args.expires)
    except TokenError as exc:
        raise CliError(f"{exc}, or 'never'") from None
    home, store = _store(args)
    try:
        plugin = plugin_key_for(home, args.plugin, force=args.force, doing="no token was created")
        info, token = store.create(plugin.key, expires_in=expires_in)
    except TokenError as exc:
        raise CliError(str(exc)) from None
    finally:
        store.close()
    _audit(home, "service.token_created", token_id=info.id, plugin_id=info.plugin, **with_unix("expires", info.expires))
    if args.json:
        print(dumps_json({**info.as_dict(), "token": token}))
    else:
        print(token)
        expires = _when(info.expires) if info.expires is not None else "never (until revoked)"
        print(f"token {info.id} for plugin {printable(info.plugin)}, expires {expires}; "
              "shown once: store it where the plugin reads it (e.g. an environment variable)", file=sys.stderr)
    if plugin.disabled:
        print(f"warning: {printable(info.plugin)} is disabled (plugins.disabled): the service refuses its tokens "
              f"until it is enabled again (plugin-llm plugins enable {printable(info.plugin)})", file=sys.stderr)
    return 0


def run_list(args: argparse.Namespace) -> int:
    home, store = _store(args)
    try:
        rows = store.list()
    except TokenError as exc:
        raise CliError(str(exc)) from None
    finally:
        store.close()
    if args.json:
        print(dumps_json([row.as_dict() for row in rows]))
        return 0
    if not rows:
        print("No tokens (create one with: plugin-llm tokens create PLUGIN).")
        return 0
    print(f"{'ID':<17} {'PLUGIN':<30} {'CREATED':<24} {'EXPIRES':<24} STATUS")
    for row in rows:
        print(f"{printable(row.id, 17):<17} {printable(row.plugin, 30):<30} {_when(row.created):<24} "
              f"{_when(row.expires):<24} {row.status()}")
    invalid = sum(1 for row in rows if not row.signed)
    if invalid:
        print(f"{invalid} token record{'s are' if invalid != 1 else ' is'} invalid: not signed by this home's "
              f"token key ({token_key_path(home)}), so refused like unknown tokens. A record from before records "
              "were signed, or written into the store by anyone else: create a new token for the plugin and "
              "revoke the invalid one. All of them: the key is missing or another machine's (copy that key here).",
              file=sys.stderr)
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    home, store = _store(args)
    try:
        info = store.revoke(args.id)
    except TokenError as exc:
        raise CliError(str(exc)) from None
    finally:
        store.close()
    _audit(home, "service.token_revoked", token_id=info.id, plugin_id=info.plugin)
    print(f"revoked {info.id} (plugin {printable(info.plugin)}); every worker sharing {store.path} refuses it "
          "within a second")
    return 0
