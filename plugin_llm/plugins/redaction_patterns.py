"""``ctx.register_redaction_patterns``: a plugin's own secret shapes, checked for bounded cost.

Every redacted log line, audit record and output runs these regexes, so a pattern that backtracks
catastrophically would stall them all. Python's ``re`` has no time limit; instead a pattern must stay
in a subset whose matching cost is linear in the text: literals, character classes, anchors and
unrepeated groups (alternation allowed); repeats only of one character (or class), each bounded, the
product of their ranges at most :data:`MAX_CHOICES`; one unbounded repeat only as the pattern's last
item (it cannot fail after running, so nothing backtracks into it); no backreferences, lookarounds or
conditionals. Hermes's rule is kept too: at least two literal leading characters, which become the
cheap trigger that decides whether the regex runs at all.
"""

from __future__ import annotations

import re
from typing import Any

try:
    from re import _constants as _c, _parser as _p  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - before Python 3.11
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

__all__ = ["MAX_PATTERN_CHARS", "MAX_PER_PLUGIN", "MAX_CHOICES", "MAX_PLUGIN_CHOICES", "compile_pattern", "cost_of"]

MAX_PATTERN_CHARS = 256
#: patterns one plugin may add (more are refused)
MAX_PER_PLUGIN = 32
#: the product of the bounded repeats' ranges (max - min + 1): the backtracking per starting position
MAX_CHOICES = 256
#: the sum of that over one plugin's patterns (what one plugin may add to the redactor's worst case)
MAX_PLUGIN_CHOICES = 1024

_SINGLE = {_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN}
_PLAIN = _SINGLE | {_c.AT}
_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT} | ({_c.POSSESSIVE_REPEAT} if hasattr(_c, "POSSESSIVE_REPEAT") else set())


class _Refused(ValueError):
    pass


def compile_pattern(pattern: Any) -> tuple[str, re.Pattern[str]]:
    """``(trigger, regex)`` for an accepted pattern; ValueError saying why it is refused."""
    if not isinstance(pattern, str):
        raise ValueError(f"a pattern must be a string, got {type(pattern).__name__}")
    if not pattern or len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"a pattern must be 1-{MAX_PATTERN_CHARS} characters long")
    try:
        parsed = _p.parse(pattern)
        regex = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"it does not compile: {exc}") from None
    items = list(parsed)
    prefix = ""
    for op, arg in items:
        if op is not _c.LITERAL:
            break
        prefix += chr(arg)
    if len(prefix) < 2:
        raise ValueError("it must start with at least two literal characters (e.g. 'acme_' before the token part)")
    try:
        choices = _check(items, top=True)
    except _Refused as exc:
        raise ValueError(str(exc)) from None
    if choices > MAX_CHOICES:
        raise ValueError(f"its bounded repeats allow {choices} combinations per position, over {MAX_CHOICES}: "
                         "narrow their ranges")
    trigger = prefix.lower() if regex.flags & re.IGNORECASE else prefix
    return trigger, regex


def cost_of(regex: re.Pattern[str]) -> int:
    """The backtracking choices per starting position of an accepted pattern."""
    return _check(list(_p.parse(regex.pattern)), top=True)


def _check(items: list[Any], *, top: bool) -> int:
    """The backtracking choices of ``items`` (a sequence); _Refused for what is outside the subset."""
    choices = 1
    for index, (op, arg) in enumerate(items):
        if op in _PLAIN:
            continue
        if op in _REPEATS:
            low, high, body = arg
            body = list(body)
            if len(body) != 1 or body[0][0] not in _SINGLE:
                raise _Refused("only a single character or class may be repeated (not a group)")
            if high == _c.MAXREPEAT:
                if not (top and index == len(items) - 1):
                    raise _Refused("an unbounded repeat ('*', '+', '{n,}') is allowed only as the last item; "
                                   "bound the others, e.g. '{1,64}'")
                continue
            choices *= high - low + 1
        elif op is _c.SUBPATTERN:
            choices *= _check(list(arg[-1]), top=False)
        elif op is _c.BRANCH:
            choices *= sum(_check(list(branch), top=False) for branch in arg[1])
        else:
            raise _Refused(f"{str(op).lower()} is not allowed (no backreferences, lookarounds or conditionals)")
        if choices > MAX_CHOICES:
            return choices
    return choices
