"""The ``limits:`` section and ``plugins.entries.<id>.limits`` blocks of config.yaml.

Pure: takes the already-parsed YAML mappings, returns frozen values plus the problems found.
Limits never fail open: a key or value the gateway does not understand in a block that governs a
plugin's calls denies those calls (with one error naming the key and the fix) instead of silently
dropping the limit a typo was meant to set. ``config.py`` owns reading the file; this module owns
the rules of these two sections.

Money is held as integer nano-dollars (1e-9 USD) so that sums across processes, SQLite and Redis
are exact. Every key, its default and what it does: docs/limits.md.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping
from urllib.parse import urlsplit

__all__ = [
    "MAX_CALL_TOKENS",
    "MAX_CALL_NANO",
    "MAX_TOTAL",
    "ERROR",
    "WARNING",
    "STORES",
    "ON_STORE_ERROR",
    "HOST_KEYS",
    "PLUGIN_KEYS",
    "BUDGET_WINDOWS",
    "PRICE_KEYS",
    "NANO",
    "LimitIssue",
    "PluginLimits",
    "OperatorPrice",
    "LimitSettings",
    "NO_LIMITS",
    "parse_limit_settings",
    "limits_path",
    "redact_url",
]

ERROR = "error"
WARNING = "warning"
STORES = ("local", "redis")
ON_STORE_ERROR = ("deny", "allow")
#: keys under the host-wide ``limits:`` section
HOST_KEYS = (
    "store", "redis_url", "redis_key_prefix", "on_store_error", "store_timeout", "reservation_grace",
    "default_max_output_tokens", "prices", "defaults",
)
#: keys of one plugin's ``limits:`` block (and of ``limits.defaults``)
PLUGIN_KEYS = ("budget_usd", "requests_per_minute", "tokens_per_minute", "max_concurrent")
BUDGET_WINDOWS = ("day", "month")
#: keys of one ``limits.prices.<model>`` entry
PRICE_KEYS = ("input_per_mtok", "output_per_mtok", "max_output_tokens")
#: nano-dollars per dollar
NANO = 1_000_000_000
_MAX_USD = 1_000_000.0  # far above any sane cap, far below 2**53 nano-dollars
_MAX_COUNT = 10**12
#: the most one call reserves or settles (tokens, nano-dollars), whatever its ``max_tokens`` or its
#: provider reports: above every limit an operator can set (``_MAX_COUNT``, ``_MAX_USD``), so a
#: clamped call is still refused by any cap, and small enough that thousands add up in a store's
#: signed 64-bit counters without overflowing them
MAX_CALL_TOKENS = 2**40
MAX_CALL_NANO = 2**50
#: where the stores' counters (a window's usage, what a lease has settled) saturate: the largest integer
#: Redis's Lua numbers (doubles) hold exactly, and far from SQLite's 64-bit overflow
MAX_TOTAL = 2**53 - 1
_SAFE_PREFIX = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")


@dataclass(frozen=True)
class LimitIssue:
    """One problem in a limits block: severity, dotted config path, what is wrong, how to fix it."""

    severity: str  # ERROR | WARNING
    path: str
    problem: str
    fix: str
    plugin_id: str | None = None

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}; {self.fix}"


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


def path_key(key: str) -> str:
    """A config key as a dotted path writes it: as it is when plain, else JSON-quoted (``"image_gen/openai"``;
    a newline, a control or bidi character escaped, so no key can forge a line of output) and bounded; a key
    that may hold a credential (``max_concurrent:redis://:pw@h``, a flow mapping without its space) redacted."""
    if _PLAIN_KEY.fullmatch(key):
        return key
    key = _redacted(key)
    return json.dumps(key if len(key) <= 100 else key[:100] + "...")


def _redacted(text: str) -> str:
    """``text`` with what may be a credential cut: a URL's userinfo, query and fragment (as
    :func:`redact_url` shows a ``redis_url``), or all before the last ``@`` of a ``user:password@host``."""
    if "://" in text:
        scheme = text.partition("://")[0]
        head, _, scheme = scheme.rpartition(":")  # ("max_concurrent", "redis"): a key glued to a URL
        return (f"{head}:" if head else "") + redact_url(f"{scheme}://{text.partition('://')[2]}")
    return "***@" + text.rpartition("@")[2] if _PASSWORD_AT.search(text) else text


_PASSWORD_AT = re.compile(r":[^:@]*@")


def plugin_phrase(plugin_id: str) -> str:
    """``plugin 'id'`` for messages (an odd id JSON-quoted and bounded, as in paths)."""
    return f"plugin '{plugin_id}'" if _PLAIN_KEY.fullmatch(plugin_id) else f"plugin {path_key(plugin_id)}"


def limits_path(plugin_id: str | None, key: str = "") -> str:
    """Dotted path of a limit key: ``plugins.entries.<id>.limits.<key>`` (``limits.defaults.<key>`` for None)."""
    base = f"plugins.entries.{path_key(plugin_id)}.limits" if plugin_id is not None else "limits.defaults"
    return f"{base}.{key}" if key else base


def _userinfo(url: str) -> tuple[str, str, str | None]:
    """``(scheme, the rest after '://' and any userinfo, the userinfo or None)``. The userinfo ends at
    the last ``@``: a password may hold ``/``, ``?``, ``#`` or ``@`` (``urlsplit`` cuts it at ``/``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", url, None
    at = rest.rfind("@")
    return (scheme, rest, None) if at < 0 else (scheme, rest[at + 1:], rest[:at])


def url_secrets(url: str) -> tuple[str, ...]:
    """What of ``url`` must never be shown: its userinfo's password (as written and percent-decoded)."""
    from urllib.parse import parse_qsl, unquote

    _, rest, userinfo = _userinfo(url)
    found = [value for key, value in parse_qsl(rest.partition("?")[2].partition("#")[0]) if key == "password"]
    if userinfo:
        password = userinfo.partition(":")[2] or userinfo
        found += [password, unquote(password), userinfo]
    return tuple(dict.fromkeys(x for x in found if len(x) >= 3))


def redact_url(url: str) -> str:
    """``redis://:secret@host:6379/0`` -> ``redis://***@host:6379/0``: never show a password (nor the
    query or fragment, which may carry one)."""
    scheme, rest, userinfo = _userinfo(url)
    if not scheme:
        return "<unparseable url>"
    for mark in "?#":
        rest = rest.partition(mark)[0]
    shown = f"{scheme}://{'***@' if userinfo is not None else ''}{rest}"
    return shown if len(shown) <= 200 else shown[:197] + "..."


@dataclass(frozen=True)
class PluginLimits:
    """The effective limits of one plugin. ``None`` = no such limit.

    ``error`` is set when the block could not be understood: every call of
    the plugin is then denied with that message (``error_key`` says where).
    ``source`` is the dotted path the limits come from, for messages.
    """

    budget_day_nano: int | None = None
    budget_month_nano: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    source: str = ""
    error: str | None = None
    error_key: str | None = None

    #: True when nothing is limited and nothing is wrong: the call skips the store entirely
    #: (worked out once: every call of every plugin asks)
    empty: bool = field(init=False, repr=False, compare=False)
    has_budget: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "has_budget", self.budget_day_nano is not None or self.budget_month_nano is not None)
        object.__setattr__(self, "empty", self.error is None and all(
            v is None for v in (self.budget_day_nano, self.budget_month_nano, self.requests_per_minute,
                                self.tokens_per_minute, self.max_concurrent)
        ))

    def key(self, limit: str) -> str:
        """Config key of one limit (``budget_usd.day``, ``requests_per_minute`` ...)."""
        return f"{self.source}.{limit}" if self.source else limit

    def as_dict(self) -> dict[str, Any]:
        def usd(nano: int | None) -> float | None:
            return None if nano is None else nano / NANO

        return {
            "budget_usd": {"day": usd(self.budget_day_nano), "month": usd(self.budget_month_nano)},
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "max_concurrent": self.max_concurrent,
            "source": self.source,
            "error": self.error,
        }


NO_LIMITS = PluginLimits()


@dataclass(frozen=True)
class OperatorPrice:
    """An operator-set price (``limits.prices.<model>``), in USD per million tokens."""

    input_per_mtok: float
    output_per_mtok: float
    max_output_tokens: int | None = None


@dataclass(frozen=True)
class LimitSettings:
    """Host-wide limit settings plus every plugin's effective limits.

    ``error`` (host section unusable) denies every call of every plugin that
    has limits, since their counters cannot be trusted; plugins without
    limits are unaffected. ``redis_url`` is kept out of the repr (it may hold
    a password); :attr:`redis_url_display` is the redacted form.
    """

    store: str = "local"
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)
    redis_key_prefix: str = "plugin_llm"
    on_store_error: str = "deny"
    store_timeout: float = 2.0
    reservation_grace: float = 60.0
    default_max_output_tokens: int = 4096
    prices: Mapping[str, OperatorPrice] = field(default_factory=lambda: MappingProxyType({}))
    defaults: PluginLimits = NO_LIMITS
    plugins: Mapping[str, PluginLimits] = field(default_factory=lambda: MappingProxyType({}))
    error: str | None = None
    error_key: str | None = None

    @property
    def redis_url_display(self) -> str:
        return redact_url(self.redis_url)

    def for_plugin(self, plugin_id: str) -> PluginLimits:
        """The plugin's own block, else ``limits.defaults``; a host-section error denies limited plugins."""
        limits = self.plugins.get(plugin_id, self.defaults)
        if self.error is not None and not limits.empty:
            return PluginLimits(source=limits.source, error=self.error, error_key=self.error_key)
        return limits

    def store_identity(self) -> tuple[Any, ...]:
        """What selects a store instance: a change of any of these opens a new one."""
        if self.store == "redis":
            return ("redis", self.redis_url, self.redis_key_prefix)
        return ("local",)


# ------------------------------------------------------------------ parsing
def _did_you_mean(word: str, known) -> str:
    close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: Any) -> str:
    """A short, bounded rendering of a YAML value for messages (never an unbounded repr). A string that
    may hold a credential (a Redis URL put under the wrong key) is shown :func:`_redacted`."""
    if isinstance(value, str):
        value = _redacted(value)
    text = repr(value) if isinstance(value, (int, float, bool, str)) or value is None else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


class _Bad(ValueError):
    """A value that fails closed; the message says what was expected."""


def _money(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Bad(f"expected a number of US dollars such as 1.50, got {_show(value)}")
    if value < 0 or value > _MAX_USD:
        raise _Bad(f"expected an amount between 0 and {_MAX_USD:,.0f} US dollars, got {_show(value)}")
    return int(round(value * NANO))


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"expected a whole number of {what} (0 or more), got {_show(value)}")
    if value < 0 or value > _MAX_COUNT:
        raise _Bad(f"expected a whole number of {what} between 0 and {_MAX_COUNT}, got {_show(value)}")
    return value


#: the most a call may wait for the store, and the longest a dead process's reservation may count
#: past its call's deadline (beyond these, a typo: 2e10 for 20)
_MAX_SECONDS = {"store_timeout": 60.0, "reservation_grace": 86_400.0}


def _seconds(value: Any, key: str) -> float:
    top = _MAX_SECONDS[key]
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
            or value > top):
        raise _Bad(f"expected a number of seconds above 0 and at most {top:,.0f}, got {_show(value)}")
    return float(value)


def _choice(value: Any, choices: tuple[str, ...]) -> str:
    if isinstance(value, str) and value.strip().lower() in choices:
        return value.strip().lower()
    raise _Bad(f"expected one of {', '.join(choices)}, got {_show(value)}")


def _parse_plugin_block(block: Any, plugin_id: str | None) -> tuple[PluginLimits, list[LimitIssue]]:
    """One ``limits:`` block -> PluginLimits. Every problem is reported (an operator fixes them in
    one pass); any of them fails the whole block closed, its calls refused with the first."""
    source = limits_path(plugin_id)
    if block is None:
        return PluginLimits(source=source), []
    issues: list[LimitIssue] = []

    def problem(key: str, what: str, fix: str) -> None:
        issues.append(LimitIssue(ERROR, limits_path(plugin_id, key), what, fix, plugin_id))

    values: dict[str, Any] = {}
    if not isinstance(block, Mapping):
        problem("", f"expected a mapping of limits, got {type(block).__name__}",
                "write e.g. `limits: {budget_usd: {day: 1.0}, requests_per_minute: 30}`")
        block = {}
    for raw_key, value in block.items():
        key = str(raw_key)
        if key not in PLUGIN_KEYS:
            problem(path_key(key), f"unknown limit{_did_you_mean(key, PLUGIN_KEYS)}", f"use one of {', '.join(PLUGIN_KEYS)}")
            continue
        try:
            if key == "budget_usd":
                if not isinstance(value, Mapping):
                    raise _Bad(f"expected a mapping of window -> US dollars, got {_show(value)}; "
                               "write e.g. budget_usd: {day: 1.0, month: 20}")
                if not value:
                    raise _Bad("no window given; write e.g. budget_usd: {day: 1.0, month: 20}")
                for window, amount in value.items():
                    window = str(window)
                    if window not in BUDGET_WINDOWS:
                        problem(f"budget_usd.{path_key(window)}", f"unknown budget window{_did_you_mean(window, BUDGET_WINDOWS)}",
                                "use day and/or month (calendar windows in UTC)")
                        continue
                    try:
                        values[f"budget_{window}_nano"] = _money(amount)
                    except _Bad as exc:
                        problem(f"budget_usd.{window}", str(exc), "set a number of US dollars such as 1.50")
            elif key == "requests_per_minute":
                values[key] = _count(value, "requests")
            elif key == "tokens_per_minute":
                values[key] = _count(value, "tokens")
            else:
                values[key] = _count(value, "calls in flight")
        except _Bad as exc:
            problem(key, str(exc), "fix the value or remove the key")
    if not issues:
        return PluginLimits(source=source, **values), issues
    first = issues[0]
    who = plugin_phrase(plugin_id) if plugin_id is not None else "every plugin without its own limits block"
    more = f" (and {len(issues) - 1} more problem{'s' if len(issues) > 2 else ''} in this block)" if len(issues) > 1 else ""
    message = (f"{first.path} in config.yaml: {first.problem}; calls of {who} are refused until it is fixed "
               f"({first.fix}){more}")
    return PluginLimits(source=source, error=message, error_key=first.path), issues


def _parse_prices(raw: Any) -> tuple[dict[str, OperatorPrice], list[LimitIssue]]:
    """``limits.prices``: a bad entry leaves that model unpriced (budgets then refuse it), never free."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [LimitIssue(ERROR, "limits.prices", f"expected a mapping of model -> price, got {type(raw).__name__}",
                               "write e.g. prices: {custom/my-model: {input_per_mtok: 0.5, output_per_mtok: 1.5}}")]
    prices: dict[str, OperatorPrice] = {}
    issues: list[LimitIssue] = []
    for raw_model, entry in raw.items():
        model = str(raw_model).strip().lower()
        path = f"limits.prices.{json.dumps(_redacted(model)[:100])}"
        unpriced = "calls to this model are refused for plugins with a budget until it is fixed"
        if not isinstance(entry, Mapping):
            issues.append(LimitIssue(ERROR, path, f"expected a mapping with input_per_mtok and output_per_mtok, got {_show(entry)}", unpriced))
            continue
        unknown = [str(k) for k in entry if str(k) not in PRICE_KEYS]
        for key in unknown:
            issues.append(LimitIssue(ERROR, f"{path}.{path_key(key)}", f"unknown key{_did_you_mean(key, PRICE_KEYS)}",
                                     unpriced))
        if unknown:  # (a missing key is then most likely the misspelt one: not reported twice)
            continue
        try:
            missing = [k for k in ("input_per_mtok", "output_per_mtok") if k not in entry]
            if missing:
                raise _Bad(f"{' and '.join(missing)} missing")
            ins = [_money(entry[k]) / NANO for k in ("input_per_mtok", "output_per_mtok")]
            out_max = entry.get("max_output_tokens")
            out_max = None if out_max is None else _count(out_max, "tokens")
        except _Bad as exc:
            issues.append(LimitIssue(ERROR, path, str(exc), unpriced))
            continue
        prices[model] = OperatorPrice(input_per_mtok=ins[0], output_per_mtok=ins[1], max_output_tokens=out_max)
    return prices, issues


def parse_limit_settings(section: Any, plugins: Any) -> tuple[LimitSettings, list[LimitIssue]]:
    """Settings from ``limits:`` and the ``limits`` block of each ``plugins.entries.<id>``.

    Never raises. Problems come back as :class:`LimitIssue` values (their
    ``str()`` is a one-line warning for config.py's list); each error is also
    folded into the settings so the calls it governs are refused.
    """
    issues: list[LimitIssue] = []
    values: dict[str, Any] = {}
    error: tuple[str, str] | None = None  # (path, message) of the first host-section error

    def host_error(key: str, problem: str, fix: str) -> None:
        nonlocal error
        path = f"limits.{path_key(key)}" if key else "limits"
        issues.append(LimitIssue(ERROR, path, problem, fix))
        if error is None:
            error = (path, f"{path} in config.yaml: {problem}; calls of every plugin with limits are refused "
                           f"until it is fixed ({fix})")

    if section is not None and not isinstance(section, Mapping):
        host_error("", f"expected a mapping, got {type(section).__name__}", "write e.g. `limits: {store: local}`")
        section = {}
    section = section or {}
    for raw_key, value in section.items():
        key = str(raw_key)
        if key not in HOST_KEYS:
            host_error(key, f"unknown setting{_did_you_mean(key, HOST_KEYS)}", f"use one of {', '.join(HOST_KEYS)}")
            continue
        if key in ("prices", "defaults"):
            continue
        try:
            if key == "store":
                values[key] = _choice(value, STORES)
            elif key == "on_store_error":
                values[key] = _choice(value, ON_STORE_ERROR)
            elif key == "redis_url":
                if not isinstance(value, str) or not value.strip().lower().startswith(("redis://", "rediss://", "unix://")):
                    raise _Bad("expected a URL such as redis://127.0.0.1:6379/0 (rediss:// for TLS, unix:// for a socket)")
                userinfo = _userinfo(value.strip())[2]
                if userinfo is not None and any(c in userinfo for c in "/?#"):
                    raise _Bad(f"{redact_url(value.strip())}: its password holds '/', '?' or '#', which a URL "
                               "cannot carry as they are; percent-encode them (%2F, %3F, %23)")
                try:
                    urlsplit("redis://" + _userinfo(value.strip())[1]).port
                except ValueError:
                    raise _Bad(f"{redact_url(value.strip())} has no valid port: write a number from 1 to 65535 "
                               "after the host, as in redis://127.0.0.1:6379/0") from None
                values[key] = value.strip()
            elif key == "redis_key_prefix":
                if not isinstance(value, str) or not _SAFE_PREFIX.fullmatch(value):
                    raise _Bad(f"expected 1-64 letters, digits or _ . : -, got {_show(value)}")
                values[key] = value
            elif key in ("store_timeout", "reservation_grace"):
                values[key] = _seconds(value, key)
            elif key == "default_max_output_tokens":
                values[key] = _count(value, "tokens") or LimitSettings.default_max_output_tokens
        except _Bad as exc:
            host_error(key, str(exc), "fix the value or remove the key")
    prices, price_issues = _parse_prices(section.get("prices"))
    issues.extend(price_issues)
    defaults, default_issues = _parse_plugin_block(section.get("defaults"), None)
    issues.extend(default_issues)

    per_plugin: dict[str, PluginLimits] = {}
    entries = plugins.get("entries") if isinstance(plugins, Mapping) else None
    if isinstance(entries, Mapping):
        for raw_id, entry in entries.items():
            if not isinstance(entry, Mapping) or entry.get("limits") is None:
                continue  # no block of its own (a bare `limits:` too): limits.defaults apply
            plugin_id = str(raw_id)
            if not isinstance(raw_id, str):  # `007:` is the int 7, `on:` is True: not the plugin that was meant
                issues.append(LimitIssue(
                    ERROR, f"plugins.entries.{path_key(plugin_id)}",
                    f"the key is a YAML {type(raw_id).__name__}, not a plugin id: these limits apply to plugin "
                    f"{path_key(plugin_id)}, and none to a plugin spelt otherwise (007, yes, null ...)",
                    f"quote the key as the plugin's id is spelt, e.g. '{path_key(plugin_id)}':", plugin_id))
            limits, plugin_issues = _parse_plugin_block(entry.get("limits"), plugin_id)
            issues.extend(plugin_issues)
            per_plugin[plugin_id] = limits

    settings = LimitSettings(
        **values,
        prices=MappingProxyType(prices),
        defaults=defaults,
        plugins=MappingProxyType(per_plugin),
        error=error[1] if error else None,
        error_key=error[0] if error else None,
    )
    if settings.store == "redis" and "redis_url" not in section:
        issues.append(LimitIssue(WARNING, "limits.redis_url", "not set; using redis://127.0.0.1:6379/0",
                                 "set limits.redis_url to the Redis every gateway host shares"))
    return settings, issues
