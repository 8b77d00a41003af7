"""Refusals of unauthenticated requests in the audit log: one record per client address per window.

The first refusal of an address in a window is recorded at once (``service.auth_denied``, as before); the
others are counted and summarized in one ``service.auth_denied.summary`` record when the window closes (a
timer, the next refusal after it, or shutdown). At most ``max_addresses`` addresses are tracked per window;
the refusals of any other address are summarized together under ``other_addresses``. So a flood of any size
adds at most ``2 * max_addresses + 1`` records per window and process, and memory stays bounded. They are
spare records (``AuditLog.write_spare_event``): they never rotate the log, so they push no record out.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["RefusalAudit", "EVENT_AUTH_DENIED", "EVENT_AUTH_DENIED_SUMMARY", "WINDOW_SECONDS", "MAX_ADDRESSES"]

EVENT_AUTH_DENIED = "service.auth_denied"
EVENT_AUTH_DENIED_SUMMARY = "service.auth_denied.summary"
WINDOW_SECONDS = 60.0
MAX_ADDRESSES = 100
#: distinct token ids, plugins and paths a summary names (then it only counts)
_MAX_NAMES = 8

Write = Callable[..., bool]  # write(event, force=False, **fields) -> written (False: no room)


class _Tally:
    """Refusals summarized together: one address's after its first in the window, or the other addresses'."""

    __slots__ = ("count", "first", "last", "reasons", "clients", "token_ids", "plugin_ids", "paths", "details")

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.reasons: dict[str, int] = {}
        self.clients: list[str] = []  # the other addresses: a few of them, as examples
        self.token_ids: list[str] = []
        self.plugin_ids: list[str] = []
        self.paths: list[str] = []
        self.details: list[str] = []  # a store's errors (token store outages)

    def add(self, now: float, reason: str, client: str, token_id: Any, plugin_id: Any, path: str,
            detail: Any) -> None:
        self.first = now if not self.count else min(self.first, now)
        self.last = max(self.last, now)
        self.count += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        self._name(client=client, token_id=token_id, plugin_id=plugin_id, path=path, detail=detail)

    def merge(self, other: "_Tally", client: str) -> None:
        if not other.count:
            return
        self.first = other.first if not self.count else min(self.first, other.first)
        self.last = max(self.last, other.last)
        self.count += other.count
        for reason, count in other.reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + count
        for value in other.clients or [client]:
            self._name(client=value)
        for value in other.token_ids:
            self._name(token_id=value)
        for value in other.plugin_ids:
            self._name(plugin_id=value)
        for value in other.paths:
            self._name(path=value)
        for value in other.details:
            self._name(detail=value)

    def _name(self, *, client: Any = None, token_id: Any = None, plugin_id: Any = None, path: Any = None,
              detail: Any = None) -> None:
        for names, value, most in ((self.clients, client, _MAX_NAMES), (self.token_ids, token_id, _MAX_NAMES),
                                   (self.plugin_ids, plugin_id, _MAX_NAMES), (self.paths, path, _MAX_NAMES),
                                   (self.details, detail, 2)):
            if isinstance(value, str) and value and value not in names and len(names) < most:
                names.append(value[:500])


class RefusalAudit:
    """Aggregates the refusals of one process (each uvicorn worker has its own) into bounded audit records.

    ``write(event, force=False, **fields) -> bool`` appends an audit event that never rotates the log
    (False: no room for it, nothing written; ``force``: written all the same) and never raises;
    ``clock`` gives epoch seconds; ``timer`` closes a window on time (off in tests that drive ``clock``).
    A record that finds no room is not lost: its refusal is counted in a summary, and a summary that finds
    none is folded into the window's one ``other_addresses`` summary, which is always written.
    """

    def __init__(self, write: Write, *, window: float = WINDOW_SECONDS, max_addresses: int = MAX_ADDRESSES,
                 clock: Callable[[], float] = time.time, timer: bool = True) -> None:
        self._write = write
        self._window = float(window)
        self._max = max(1, int(max_addresses))
        self._clock = clock
        self._use_timer = timer
        self._lock = threading.Lock()
        self._end: float | None = None  # when the open window closes (None: no window open)
        self._seen: dict[str, _Tally] = {}  # address -> refusals after its first
        self._other = _Tally()  # addresses beyond max_addresses
        self._timer: threading.Timer | None = None
        _LIVE.add(self)

    def refused(self, client: str | None, reason: str, *, path: str, token_id: Any = None, plugin_id: Any = None,
                **extra: Any) -> None:
        """Count one refusal; the first of its address in the window is written now, with ``extra``."""
        now = self._clock()
        address = (client or "")[:100]
        with self._lock:
            if self._end is not None and now >= self._end:
                self._close_locked()
            if self._end is None:
                self._end = now + self._window
                self._arm_locked()
            tally = self._seen.get(address)
            if tally is None and len(self._seen) < self._max:
                tally = self._seen[address] = _Tally()
                if self._write(EVENT_AUTH_DENIED, reason=reason, token_id=token_id, plugin_id=plugin_id, path=path,
                               client=address or None, **extra):
                    return
            (tally if tally is not None else self._other).add(now, reason, address, token_id, plugin_id, path,
                                                              extra.get("detail"))

    def flush(self) -> None:
        """Close the open window now: write its summaries (shutdown; a window's end)."""
        with self._lock:
            self._close_locked()

    def close(self) -> None:
        self.flush()

    def _close_locked(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        seen, other, self._seen, self._other, self._end = self._seen, self._other, {}, _Tally(), None
        for address, tally in seen.items():
            if tally.count and not self._summary(tally, client=address or None, other_addresses=False):
                other.merge(tally, address)  # no room for it: counted with the others
        if other.count:
            self._summary(other, force=True, client=None, other_addresses=True, clients=other.clients)

    def _summary(self, tally: _Tally, force: bool = False, **fields: Any) -> bool:
        from audit.processors import format_ts

        return self._write(EVENT_AUTH_DENIED_SUMMARY, force=force, count=tally.count,
                           reasons=dict(sorted(tally.reasons.items())), first=format_ts(tally.first),
                           last=format_ts(tally.last), window_seconds=self._window, token_ids=tally.token_ids,
                           plugin_ids=tally.plugin_ids, paths=tally.paths,
                           **({"details": tally.details} if tally.details else {}), **fields)

    def _arm_locked(self, delay: float | None = None) -> None:
        if not self._use_timer:
            return
        timer = threading.Timer(self._window if delay is None else delay, _timer_fired, (weakref.ref(self),))
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            if self._end is None:
                return
            if self._clock() >= self._end - 0.001:
                self._close_locked()
            else:  # the wall clock disagrees with the timer (a clock step): try again at the end
                self._arm_locked(max(0.01, self._end - self._clock()))


def _timer_fired(ref: "weakref.ref[RefusalAudit]") -> None:
    audit = ref()
    if audit is not None:
        try:
            audit._on_timer()
        except Exception:  # noqa: BLE001 - a timer thread never dies noisily; shutdown flushes what is left
            pass


_LIVE: "weakref.WeakSet[RefusalAudit]" = weakref.WeakSet()


def _flush_all() -> None:
    """At interpreter exit (an app stopped without its lifespan): no count is lost."""
    for audit in list(_LIVE):
        try:
            audit.flush()
        except Exception:  # noqa: BLE001 - exiting must finish
            pass


atexit.register(_flush_all)
