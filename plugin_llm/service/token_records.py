"""What a service token is: its shape, its record (:class:`TokenInfo`), its digest and its files.

A token is ``plg_`` + 32 random bytes (:data:`TOKEN_PREFIX`, :data:`TOKEN_BYTES`); only its SHA-256
(:func:`digest`) is kept. :class:`TokenError` is an operator's mistake or an unusable store. The
stores are in :mod:`.token_file` and :mod:`.token_redis`; :mod:`.tokens` is the way in.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "TOKEN_PREFIX",
    "TOKEN_BYTES",
    "CACHE_SECONDS",
    "MAX_PLUGIN",
    "REASON_BLOCKED",
    "REASON_BAD_SIGNATURE",
    "TokenError",
    "TokenInfo",
    "tokens_path",
    "failures_path",
    "token_key_path",
    "digest",
    "parse_duration",
]

#: the refusal reason (audit, metrics) of a token whose record the home's key did not sign
REASON_BAD_SIGNATURE = "bad_signature"

#: the refusal reason (audit, metrics) of a request from an address with too many failed authentications
REASON_BLOCKED = "too_many_failures"

TOKEN_PREFIX = "plg_"
#: random bytes in a token (256 bits)
TOKEN_BYTES = 32
#: a verified token is trusted this long without asking the file again (revocation latency)
CACHE_SECONDS = 0.5
_DURATION = re.compile(r"\s*(\d{1,6})\s*([smhdw]?)\s*")
_UNIT_SECONDS = {"": 86400, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: the longest plugin key a token is made for
MAX_PLUGIN = 256


class TokenError(Exception):
    """An operator mistake with tokens (unknown id, bad plugin key or duration), or an unusable file."""


@dataclass(frozen=True)
class TokenInfo:
    """One token's row: never the token itself."""

    id: str
    plugin: str
    created: float
    expires: float | None
    revoked: float | None
    #: False: the home's key did not sign this record (forged, edited, signed with another key, or older)
    signed: bool = field(default=True, compare=False)

    def status(self, now: float | None = None) -> str:
        """``active``, ``expired``, ``revoked``, or ``invalid`` (its record is not signed by the home's key)."""
        if not self.signed:
            return "invalid"
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and self.expires <= (time.time() if now is None else now):
            return "expired"
        return "active"

    def as_dict(self) -> dict:
        """For ``--json``: times in the CLI's one format, each with its ``*_unix`` seconds."""
        from plugin_llm.timefmt import with_unix

        return {"id": self.id, "plugin": self.plugin, **with_unix("created", self.created),
                **with_unix("expires", self.expires), **with_unix("revoked", self.revoked), "status": self.status()}


def tokens_path(home: Path | str) -> Path:
    from plugin_llm.home_layout import TOKENS_DB, host_path

    return host_path(home, TOKENS_DB)


def failures_path(home: Path | str) -> Path:
    from plugin_llm.home_layout import AUTH_FAILURES_DB, host_path

    return host_path(home, AUTH_FAILURES_DB)


def token_key_path(home: Path | str) -> Path:
    """The key that signs token records (host-only: never in a plugin's sandbox, never in Redis)."""
    return Path(home) / "service" / "token_key"


def digest(token: str) -> str:
    """Hex SHA-256 of a token (what the file keeps)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` (a bare number is days) -> seconds."""
    match = _DURATION.fullmatch(text or "")
    if match is None or int(match.group(1)) == 0:
        raise TokenError(f"--expires must be a positive duration such as 30d, 12h, 90m or 2w, got {text[:40]!r}")
    return float(int(match.group(1)) * _UNIT_SECONDS[match.group(2)])
