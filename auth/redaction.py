"""One process-wide secret redactor: every log sink, record and output passes through it.

It knows every secret the credential store loaded (:func:`register_secret`), replaced by
``[REDACTED…abcd]`` (the last four characters only for secrets long enough that they give nothing
away), and common key *shapes* it was never told about (``sk-…``, ``Bearer <token>``, ``?key=…``,
``Authorization:``/``x-api-key:`` values, ``api_key=…``, ``AIza…``, URL userinfo, ...), replaced by
``[REDACTED]``.

It is applied to audit records (:func:`redact_obj`), stdlib logging (:class:`RedactingFilter`,
:func:`install_log_redaction`), structlog (:func:`redact_processor`), exception text and CLI
output. :func:`mask` is the display form for CLI listings (``sk-…abcd``). With no registered secret
and no trigger substring in the text, :func:`redact` is a few substring tests.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, MutableMapping
from urllib.parse import quote, quote_plus

__all__ = [
    "redact",
    "redact_secrets",
    "redact_clipped",
    "redact_field",
    "secret_prefix_start",
    "key_shaped",
    "redact_obj",
    "register_secret",
    "add_pattern_rules",
    "remove_pattern_rules",
    "pattern_rule_count",
    "pattern_rules_of",
    "mask",
    "RedactingFilter",
    "redact_processor",
    "install_log_redaction",
    "MIN_SECRET_LENGTH",
]

#: Strings shorter than this are not registered: masking every "abc" would make
#: logs unreadable and a 7-character "secret" is not one worth protecting here.
MIN_SECRET_LENGTH = 8
#: A key handed to :func:`redact_secrets` / :func:`redact_clipped` by its user
#: (the transport's own key) is hidden from this length on.
MIN_GIVEN_SECRET_LENGTH = 4
#: The shortest trailing piece of a known secret :func:`redact_clipped` hides.
MIN_FRAGMENT_LENGTH = 4
#: the same for text that arrived already cut (a provider truncating an echoed header): a shorter tail
#: is more likely a word a key happens to start with ("Bad gateway" vs a key "gateway-...") than a key
UNCUT_FRAGMENT_LENGTH = 8

_REDACTED = "[REDACTED]"

# Public, provider-wide key prefixes. mask() shows these (they identify the kind
# of key, not the key); redact() never shows them for registered secrets.
_PUBLIC_PREFIXES = (
    "sk-ant-api03-",
    "sk-ant-",
    "sk-or-v1-",
    "sk-proj-",
    "sk-svcacct-",
    "sk-",
    "github_pat_",
    "nvapi-",
    "pplx-",
    "gsk_",
    "xai-",
    "AIza",
    "hf_",
    "ghp_",
    "r8_",
)


def mask(secret: str | None) -> str:
    """Display form of a secret for listings: ``sk-…abcd``.

    Shows a well-known public prefix (``sk-``, ``sk-ant-``, ``AIza`` ...) and the
    last four characters, the latter only when at least twelve characters remain
    after the prefix. Never shows anything else of the key.
    """
    if not secret:
        return "(none)"
    prefix = next((p for p in _PUBLIC_PREFIXES if secret.startswith(p)), "")
    body = len(secret) - len(prefix)
    tail = secret[-4:] if body >= 12 else ""
    return f"{prefix}…{tail}"


def _variants(secret: str) -> set[str]:
    """The secret itself, and as it appears in URLs and JSON strings."""
    return {secret, quote(secret, safe=""), quote_plus(secret, safe=""), json.dumps(secret)[1:-1]}


def _replacement_for(secret: str) -> str:
    """What a registered secret becomes inside redacted text."""
    return f"[REDACTED…{secret[-4:]}]" if len(secret) >= 16 else _REDACTED


# --------------------------------------------------------------------------- #
# Registered secrets
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _Snapshot:
    """What redact() needs, built once per change of the secret set."""

    # (variant, replacement) pairs, longest first so that a secret containing
    # another secret is replaced whole.
    pairs: tuple[tuple[str, str], ...] = ()
    regex: re.Pattern[str] | None = None  # many secrets: one trie regex instead of a loop
    replacements: dict[str, str] | None = None


class _Registry:
    """The set of known secrets.

    ``add`` only records (cheap, so registering many keys stays linear); the
    next ``redact`` builds an immutable :class:`_Snapshot`, which readers use
    without locking.
    """

    def __init__(self) -> None:
        # re-entrant: building the pattern can run a finalizer (a collected HTTP client closing)
        # whose log line is redacted on this same thread, and so calls current() again
        self._lock = threading.RLock()
        self._known: set[str] = set()
        self._variants: dict[str, str] = {}
        self._version = 0  # bumped by add(): a snapshot built across an add is not kept
        self.snapshot: _Snapshot | None = _Snapshot()

    def add(self, secret: str) -> None:
        if secret in self._known:  # fast, lock-free common case (set lookup is atomic)
            return
        with self._lock:
            if secret in self._known:
                return
            self._known.add(secret)
            replacement = _replacement_for(secret)
            for variant in _variants(secret):
                if len(variant) >= MIN_SECRET_LENGTH:
                    self._variants.setdefault(variant, replacement)
            self._version += 1
            self.snapshot = None

    def current(self) -> _Snapshot:
        snap = self.snapshot
        if snap is not None:
            return snap
        with self._lock:
            snap = self.snapshot
            while snap is None:
                version = self._version
                pairs = tuple(sorted(self._variants.items(), key=lambda kv: -len(kv[0])))
                regex = None
                if len(pairs) > _REGEX_THRESHOLD:
                    regex = re.compile(_trie_pattern([v for v, _ in pairs]))
                built = _Snapshot(pairs, regex, dict(pairs))
                if self._version == version:  # no add() meanwhile (a re-entrant one on this thread)
                    snap = self.snapshot = built
                else:
                    snap = self.snapshot
        return snap

    def __contains__(self, secret: str) -> bool:
        return secret in self._known

    def invalidate(self) -> None:
        """The rules changed: values remembered as clean (:func:`redact_field`) are checked again."""
        with self._lock:
            self._version += 1
            self.snapshot = None


# Below this many variants a loop of `in` tests is faster than the regex.
_REGEX_THRESHOLD = 16


def _trie_pattern(words: list[str]) -> str:
    """One regex matching any of ``words``, shaped as a prefix trie.

    A flat ``a|b|c`` alternation makes the regex engine try every secret at
    every candidate position; a trie fails after a character or two. Greedy
    optional tails make the longest secret win at a given position.
    """
    trie: dict = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = True

    def emit(node: dict) -> str:
        end = "" in node
        branches = []
        for ch in sorted(k for k in node if k):
            child, chunk = node[ch], ch
            while len(child) == 1 and "" not in child:  # compress single-child chains into literals
                (nxt, child), = child.items()
                chunk += nxt
            branches.append(re.escape(chunk) + emit(child))
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if end else body

    return emit(trie)

_registry = _Registry()


def register_secret(secret: str | None) -> None:
    """Teach the redactor a secret; every later :func:`redact` hides it.

    Called by the credential store for every key it loads (``api_key``, pool
    ``keys``, ``key_env`` values, ``key_cmd`` output, environment fallbacks).
    Strings shorter than :data:`MIN_SECRET_LENGTH` are ignored. Idempotent.
    """
    if not isinstance(secret, str):
        return
    secret = secret.strip()
    if len(secret) < MIN_SECRET_LENGTH:
        return
    _registry.add(secret)


# --------------------------------------------------------------------------- #
# Key shapes
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _Rule:
    """A key shape. ``group`` of each match of ``regex`` is the secret part.

    The regex runs only when one of ``triggers`` occurs in the text (cheap
    substring tests, so clean text costs a few scans). ``lowercase`` rules are
    written in lower case and matched against ``text.lower()`` — much faster
    than ``re.IGNORECASE`` — with ``regex_ci`` as the fallback for non-ASCII
    text, where lower-casing may shift positions.
    """

    triggers: tuple[str, ...]
    lowercase: bool
    regex: re.Pattern[str]
    regex_ci: re.Pattern[str] | None
    group: int
    #: ``accept(match, text)`` decides whether a match is a secret (None: every match is)
    accept: Callable[[re.Match[str], str], bool] | None = None


def _rule(triggers: tuple[str, ...], pattern: str, group: int, *, lowercase: bool,
          accept: Callable[[re.Match[str], str], bool] | None = None) -> _Rule:
    return _Rule(triggers, lowercase, re.compile(pattern), re.compile(pattern, re.I) if lowercase else None, group,
                 accept)


def key_shaped(value: str) -> bool:
    """Whether a bare word looks like a credential rather than an English word.

    At least 8 characters and either letters mixed with digits
    (``hunter2hunter2``, ``goog0123...``), at least 16 characters mixing upper
    and lower case (base64-ish tokens), or at least 32 characters of anything
    without spaces. ``must``, ``missing``, ``Required``, ``123`` are not.
    """
    n = len(value)
    if n < 8:
        return False
    if n >= 32:
        return True
    has_digit = has_alpha = has_upper = has_lower = False
    for ch in value:
        if ch.isdigit():
            has_digit = True
        elif ch.isalpha():
            has_alpha = True
            if ch.isupper():
                has_upper = True
            else:
                has_lower = True
    return (has_digit and has_alpha) or (n >= 16 and has_upper and has_lower)


def _field_value_is_secret(match: re.Match[str], text: str) -> bool:
    """``api_key: <value>``: a value after ``=``, in quotes or after a scheme — or a key-shaped word.

    A field name followed by a colon and a plain word is prose
    (``providers.openai.api_key: must be a string``), not a credential.
    """
    start, end = match.span(4)
    value = text[start:end]
    if not any(ch.isalnum() for ch in value):  # {"api_key": "..."} in a hint
        return False
    separator = match.group(2)
    if match.group(3) or "=" in separator or separator.endswith(("\"", "'")):
        return True
    return key_shaped(value)


# Negative lookaheads: do not re-redact, and leave placeholders like api_key=None alone.
_NOT_ALREADY = r"(?!\[redacted)"
_NOT_EMPTY_WORD = r"(?!(?:none|null|true|false|undefined)\b)"

_RULES: tuple[_Rule, ...] = (
    # Header / keyword / JSON field values: "Authorization: Bearer x", {'x-api-key': 'x'},
    # api_key='x', "api_key": "x", OPENAI_API_KEY=x, client_secret=x, password: x ...
    _rule(
        ("key", "auth", "access", "refresh", "secret", "passw"),  # every name below contains one
        r"(authorization|api[_-]?key|access[_-]?token|auth[_-]?token|refresh[_-]?token|client[_-]?secret"
        r"|secret[_-]?key|password)"
        r"(\\?[\"']?\s*[:=]\s*\\?[\"']?)"
        r"((?:bearer|basic|token)\s+)?" + _NOT_ALREADY + _NOT_EMPTY_WORD
        + r"(?!(?:bearer|basic|token)\s)([^\s\"',;&}\]\\]+)",
        4,
        lowercase=True,
        accept=_field_value_is_secret,
    ),
    # Bearer tokens anywhere (e.g. a header echoed in an error body).
    _rule(("bearer",), r"\b(bearer\s+)" + _NOT_ALREADY + r"([a-z0-9\-._~+/]{8,}=*)", 2, lowercase=True),
    # Query-string credentials: ?key=..., &api_key=..., &access_token=... (one memchr for "=")
    _rule(
        ("=",),
        r"([?&;](?:key|api[_-]?key|access[_-]?token|token|auth|sig|signature|x-goog-api-key)=)"
        + _NOT_ALREADY
        + r"([^&\s#\"'<>]+)",
        2,
        lowercase=True,
    ),
    # URL userinfo (https://user:pass@host, redis://:pass@host, a token as the user), also with
    # JSON-escaped slashes: everything before the last '@' of the authority, as a URL parser reads it.
    _rule(("://", ":\\/\\/"), r"(?::/|:\\/)(?:/|\\/)" + _NOT_ALREADY + r"([^\s/?#\"'<>\\]+)@", 1,
          lowercase=True),
    # ... and percent-encoded, as in a redirect or callback parameter: http%3A%2F%2Fuser%3Apass%40host
    _rule(("%3a%2f%2f",), r"%3a%2f%2f" + _NOT_ALREADY + r"((?:(?!%2f)[^\s/?#\"'<>\\&])+)%40", 1,
          lowercase=True),
    # OpenAI / Anthropic / OpenRouter style keys (also half-masked echoes like
    # "sk-proj-abc****wxyz" in provider error messages).
    _rule(("sk-",), r"(?<![A-Za-z0-9])sk-(?=[A-Za-z_\-]*[0-9*])[A-Za-z0-9_\-*]{12,}", 0, lowercase=False),
    # Google API keys.
    _rule(("AIza",), r"AIza[0-9A-Za-z_\-]{35}", 0, lowercase=False),
    # Other well-known shapes (Groq, xAI, Hugging Face, GitHub, Perplexity,
    # NVIDIA, Replicate, AWS access key ids).
    _rule(
        ("gsk_", "xai-", "hf_", "ghp_", "github_pat_", "pplx-", "nvapi-", "r8_", "AKIA"),
        r"(?<![A-Za-z0-9])(?:gsk_[A-Za-z0-9]{20,}|xai-[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{20,}"
        r"|ghp_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}|pplx-[A-Za-z0-9]{20,}"
        r"|nvapi-[A-Za-z0-9_\-]{20,}|r8_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}(?![0-9A-Z]))",
        0,
        lowercase=False,
    ),
)


#: Extra shapes, each a (trigger, regex) whose whole match is a secret, by owner (a plugin's
#: ``ctx.register_redaction_patterns``; checked there for bounded matching cost). Replaced, never mutated.
_extra: dict[str, tuple[tuple[str, re.Pattern[str]], ...]] = {}
_extra_rules: tuple[tuple[str, re.Pattern[str]], ...] = ()
_extra_lock = threading.Lock()


def add_pattern_rules(owner: str, rules: Iterable[tuple[str, re.Pattern[str]]]) -> None:
    """Hide every match of each ``(trigger, regex)`` from now on (the regex runs only when ``trigger``
    occurs in the text; a case-insensitive regex is triggered on lower-cased text)."""
    global _extra, _extra_rules
    with _extra_lock:
        _extra = {**_extra, owner: _extra.get(owner, ()) + tuple(rules)}
        _extra_rules = tuple(rule for group in _extra.values() for rule in group)
    _registry.invalidate()


def remove_pattern_rules(owner: str) -> None:
    """Forget the rules ``owner`` added."""
    global _extra, _extra_rules
    with _extra_lock:
        if owner not in _extra:
            return
        _extra = {k: v for k, v in _extra.items() if k != owner}
        _extra_rules = tuple(rule for group in _extra.values() for rule in group)
    _registry.invalidate()


def pattern_rule_count(owner: str) -> int:
    return len(_extra.get(owner, ()))


def pattern_rules_of(owner: str) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return _extra.get(owner, ())


def _hide_extra(text: str) -> str:
    low: str | None = None
    for trigger, regex in _extra_rules:
        if regex.flags & re.IGNORECASE:
            if low is None:
                low = text.lower()
            if trigger not in low:
                continue
        elif trigger not in text:
            continue
        new = regex.sub(_REDACTED, text)
        if new != text:
            text, low = new, None
    return text


def _apply(rule: _Rule, text: str, haystack: str, regex: re.Pattern[str]) -> str:
    """Replace the secret group of every match (found in ``haystack``) in ``text``."""
    pieces: list[str] = []
    last = 0
    accept = rule.accept
    for match in regex.finditer(haystack):
        start, end = match.span(rule.group)
        if start < last:  # pragma: no cover - overlapping spans cannot come from one finditer
            continue
        if accept is not None and not accept(match, text):
            continue
        pieces.append(text[last:start])
        pieces.append(_REDACTED)
        last = end
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


def _hide_registered(text: str) -> str:
    snap = _registry.snapshot or _registry.current()
    if snap.pairs:
        regex = snap.regex
        if regex is not None:
            replacements = snap.replacements
            text = regex.sub(lambda m: replacements[m.group(0)], text)  # type: ignore[index]
        else:
            for secret, replacement in snap.pairs:
                if secret in text:
                    text = text.replace(secret, replacement)
    return text


def _hide_given(text: str, secrets: tuple[str | None, ...]) -> str:
    """Replace each of ``secrets`` (and its URL/JSON forms) in ``text``; a None or tiny one is skipped."""
    for secret in secrets:
        if not isinstance(secret, str) or len(secret) < MIN_GIVEN_SECRET_LENGTH:
            continue
        if len(secret) >= MIN_SECRET_LENGTH and secret in _registry:  # the registered variants cover it
            continue
        replacement = _replacement_for(secret)
        for variant in sorted(_variants(secret), key=len, reverse=True):
            if variant in text:
                text = text.replace(variant, replacement)
    return text


def redact_secrets(text: Any, *secrets: str | None) -> str:
    """``text`` with every registered secret and each of ``secrets`` hidden — but no key *shapes*.

    For text a provider wrote (a model's reply, tool-call arguments, the
    reported model name): a reply that echoes the request's ``Authorization``
    header must not hand the key to the plugin, but a reply that merely
    *discusses* ``api_key=...`` or shows an ``sk-...`` example must stay
    intact. ``secrets`` are keys known to the caller (the transport passes the
    one it just sent), hidden even when shorter than :data:`MIN_SECRET_LENGTH`
    (down to :data:`MIN_GIVEN_SECRET_LENGTH`).
    """
    if not isinstance(text, str):
        text = str(text)
    if secrets:
        text = _hide_given(text, secrets)
    if len(text) < MIN_SECRET_LENGTH:
        return text
    return _hide_registered(text)


def redact_clipped(text: Any, limit: int, *secrets: str | None, fragment: int = MIN_FRAGMENT_LENGTH) -> str:
    """Redact, *then* cut to ``limit`` characters, then hide a key cut off at the end.

    Cutting first would leave all but the tail of a key that straddles the
    limit in the text, unrecognisable to :func:`redact`. Text that was already
    cut before it got here (a provider or library truncating an echoed header)
    may end in the first characters of a key: a trailing fragment of at least
    ``fragment`` characters of a registered secret, or of one of ``secrets``,
    is replaced by ``[REDACTED]`` too.
    """
    text = redact(_hide_given(text if isinstance(text, str) else str(text), secrets))
    if len(text) > limit:
        text = text[:limit]
    else:  # not cut here: only a longer fragment counts, so prose ending in a word a key starts with stays
        fragment = max(fragment, UNCUT_FRAGMENT_LENGTH)
    return _hide_trailing_fragment(text, secrets, fragment)


def secret_prefix_start(text: str, *secrets: str | None) -> int:
    """Where the longest tail of ``text`` that is the *start* of a secret begins (``len(text)`` if none).

    For text that arrives in pieces (a streamed reply): the tail from there on
    may become a whole secret with the next piece, so it is held back until
    then. Candidates are every registered secret and each of ``secrets`` (from
    :data:`MIN_GIVEN_SECRET_LENGTH` characters), in their URL and JSON forms too.
    """
    candidates = [v for v, _ in (_registry.snapshot or _registry.current()).pairs]
    for secret in secrets:
        if isinstance(secret, str) and len(secret) >= MIN_GIVEN_SECRET_LENGTH:
            candidates.extend(_variants(secret))
    end = cut = len(text)
    for secret in candidates:
        head = secret[:1]
        i = text.find(head, max(0, end - len(secret) + 1)) if head else -1
        while i != -1 and i < cut:
            if secret.startswith(text[i:]):
                cut = i  # the earliest start is the longest tail
                break
            i = text.find(head, i + 1)
    return cut


def _hide_trailing_fragment(text: str, secrets: tuple[str | None, ...], fragment: int) -> str:
    fragment = max(fragment, 1)
    candidates = [v for v, _ in (_registry.snapshot or _registry.current()).pairs]
    for secret in secrets:
        if isinstance(secret, str) and len(secret) >= MIN_GIVEN_SECRET_LENGTH:
            candidates.extend(_variants(secret))
    cut = len(text)
    for secret in candidates:
        if len(secret) <= fragment:
            continue
        head = secret[:fragment]
        i = text.find(head, max(0, len(text) - len(secret) + 1))
        while i != -1 and i < cut:
            if secret.startswith(text[i:]):
                cut = i  # the earliest start is the longest fragment
                break
            i = text.find(head, i + 1)
    return text if cut == len(text) else text[:cut] + _REDACTED


def redact(text: Any) -> str:
    """Return ``text`` with every registered secret and known key shape hidden.

    Non-strings are converted with ``str()`` first. Unchanged text is returned
    as the same object, so ``redact(t) is t`` means "nothing to hide".
    """
    if not isinstance(text, str):
        text = str(text)
    if len(text) < MIN_SECRET_LENGTH:  # too short to hold a secret or a key shape
        return text
    text = _hide_registered(text)
    low: str | None = None
    for rule in _RULES:
        if rule.lowercase:
            if low is None:
                low = text.lower()
            haystack = low
        else:
            haystack = text
        for trigger in rule.triggers:
            if trigger in haystack:
                if not rule.lowercase:
                    new = _apply(rule, text, text, rule.regex)
                elif text.isascii():  # lower() kept every position: match on it
                    new = _apply(rule, text, low, rule.regex)  # type: ignore[arg-type]
                else:
                    new = _apply(rule, text, text, rule.regex_ci)  # type: ignore[arg-type]
                if new is not text:
                    text, low = new, None
                break
    if _extra_rules:
        text = _hide_extra(text)
    return text


#: :func:`redact_field` remembers clean values up to this long (field values, not message text) ...
FIELD_CACHE_MAX_CHARS = 256
#: ... and this many of them (then starts over)
FIELD_CACHE_SIZE = 4096
# (snapshot the entries were checked against, values found to hide nothing)
_clean_fields: tuple[_Snapshot | None, set[str]] = (None, set())


def redact_field(text: Any) -> str:
    """:func:`redact` for short values that recur: an audit record's plugin id, provider, model, reason.

    Same result as ``redact(text)``. A ``str`` of at most
    :data:`FIELD_CACHE_MAX_CHARS` characters in which nothing was hidden is
    remembered until the set of registered secrets changes, so the next record
    holding the same value skips the scans (one set lookup). Only such clean
    values are kept: nothing remembered holds a registered secret or a key shape.
    """
    global _clean_fields
    if type(text) is not str or len(text) > FIELD_CACHE_MAX_CHARS:
        return redact(text)
    if len(text) < MIN_SECRET_LENGTH:
        return text  # what redact() does too
    snap = _registry.snapshot
    checked_against, clean = _clean_fields
    if checked_against is not snap or snap is None:
        if snap is None:  # a secret was just registered: the next redact() builds its snapshot
            return redact(text)
        clean = set()
        _clean_fields = (snap, clean)
    elif text in clean:
        return text
    result = redact(text)
    if result is text and _registry.snapshot is snap:  # checked against the secrets still in force
        if len(clean) >= FIELD_CACHE_SIZE:
            clean.clear()
        clean.add(text)
    return result


def redact_obj(obj: Any) -> Any:
    """Redact every string inside ``obj`` (dicts — keys and values —, lists, tuples, sets).

    Other values are returned as they are. Used on audit records before they
    are hashed and written.
    """
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {(redact(k) if isinstance(k, str) else k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_obj(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(redact_obj(v) for v in obj)
    if isinstance(obj, (set, frozenset)):
        return type(obj)(redact_obj(v) for v in obj)
    return obj


# --------------------------------------------------------------------------- #
# stdlib logging
# --------------------------------------------------------------------------- #


def _redact_record(record: logging.LogRecord) -> None:
    """Rewrite a record in place so that no handler can format a secret."""
    try:
        message = record.getMessage()
    except Exception:  # bad %-args: redact the parts the error report would print
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if record.args:
            record.args = redact_obj(record.args if isinstance(record.args, (tuple, dict)) else (record.args,))
    else:
        redacted = redact(message)
        if redacted is not message:
            record.msg = redacted
            record.args = None
    if record.exc_info and record.exc_info[0] is not None and not getattr(record, "_auth_redacted_exc", False):
        # Format the traceback once, redacted; Formatter.format reuses exc_text.
        record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        record._auth_redacted_exc = True  # type: ignore[attr-defined]
    elif record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the message, its args and any traceback.

    Never drops a record. Attach it to handlers (it sees every record they
    emit, including ones propagated from child loggers).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        _redact_record(record)
        return True


_install_lock = threading.Lock()
_installed_factory = False
_FILTER = RedactingFilter()

#: Loggers of the libraries that may echo request headers or URLs.
_LIBRARY_LOGGERS = (
    "LiteLLM",
    "LiteLLM Router",
    "LiteLLM Proxy",
    "litellm",
    "httpx",
    "httpcore",
    "openai",
    "anthropic",
    "urllib3",
    "structlog",
)


def install_log_redaction(extra_loggers: Iterable[str] = ()) -> None:
    """Make every stdlib log record pass through :func:`redact`. Idempotent.

    Three layers, because handlers come and go:

    * a log-record factory wrapper redacts each record when it is created, so
      handlers added later (``basicConfig``, pytest's caplog, a host's own)
      are covered too;
    * :class:`RedactingFilter` on the root logger's handlers and on the
      handlers of litellm/httpx/openai/anthropic loggers;
    * the same filter on those loggers themselves.
    """
    global _installed_factory
    with _install_lock:
        if not _installed_factory:
            previous = logging.getLogRecordFactory()

            def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
                record = previous(*args, **kwargs)
                _redact_record(record)
                return record

            factory._auth_redacting = True  # type: ignore[attr-defined]
            if not getattr(previous, "_auth_redacting", False):
                logging.setLogRecordFactory(factory)
            _installed_factory = True
        names = ("", *_LIBRARY_LOGGERS, *extra_loggers)
        for name in names:
            logger = logging.getLogger(name) if name else logging.getLogger()
            if name and _FILTER not in logger.filters:
                logger.addFilter(_FILTER)
            for handler in logger.handlers:
                if _FILTER not in handler.filters:
                    handler.addFilter(_FILTER)


# --------------------------------------------------------------------------- #
# structlog
# --------------------------------------------------------------------------- #


def redact_processor(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: redact every string in the event dict.

    Safe anywhere in the chain: an ``exc_info`` still present is rendered here
    (as structlog's ``format_exc_info`` would, into ``exception``) so that the
    traceback is redacted too; exception objects become redacted text. Put it
    just before the renderer.
    """
    exc_info = event_dict.pop("exc_info", None)
    if exc_info:
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        elif not isinstance(exc_info, tuple):
            import sys

            exc_info = sys.exc_info()
        if exc_info and exc_info[0] is not None:
            event_dict["exception"] = "".join(traceback.format_exception(*exc_info)).rstrip("\n")
    out = {}
    for key, value in event_dict.items():
        if isinstance(value, BaseException):
            value = f"{type(value).__name__}: {value}"
        out[key] = redact_obj(value)
    event_dict.clear()
    event_dict.update(out)
    return event_dict
