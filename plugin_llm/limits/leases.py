"""Leases: most admissions decided in memory, against headroom reserved in the store beforehand.

A *lease* is a reservation row like a call's, holding several calls' worth of one plugin's
headroom (calls in flight, requests and tokens of the minute, nano-dollars of the day and month).
The store counts it like any reservation, so totals across threads, processes and machines never
exceed a limit. Per store and plugin this process keeps one :class:`LeaseBook`: a call with room
in the lease is admitted and settled in memory; a keeper thread hands settled usage to the store
and resizes the lease in one atomic :class:`~plugin_llm.limits.store.LeaseOp`; a call without room
makes that step itself, and the store decides exactly as for a single call.

Only a busy plugin gets more than its calls in flight; near a limit leases shrink to exact per-call
reservations. A limit may refuse slightly early while another process holds unused headroom,
never late. A lease expires like a reservation (its calls' latest deadline plus
``limits.reservation_grace``); a forked child starts with none. Why leases (the per-call costs
measured), sizing and the renewal rules: docs/design.md, "Limits and leases".
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable

from plugin_llm.limits.lease_state import CLOSED, ZERO, Lease, LeasedTicket, capped_dims
from plugin_llm.limits.settings import MAX_TOTAL
from plugin_llm.limits.store import Denial, LeaseGrant, LeaseOp, StoreError, buckets_at

if TYPE_CHECKING:
    from plugin_llm.limits.settings import PluginLimits
    from plugin_llm.limits.store import LimitStore

__all__ = ["LeaseBook", "Lease", "book_for", "LeasedTicket", "ENABLED", "RENEW_INTERVAL", "MAX_RENEW_INTERVAL", "IDLE_RETURN", "BUSY_WINDOW", "MAX_CALLS"]

_log = logging.getLogger("plugin_llm.limits")

#: False: every admission is one store step, as before leases (bench_limits.py's "per call" rows)
ENABLED = True
#: the keeper's passes are at least this far apart (seconds), but for an admission's alarm; near a
#: limit, in exact mode and while leases retire it looks on every pass. (A pass costs a thread
#: wake-up, 25-80 us of CPU on a loaded machine: see benchmarks/bench_limits.py.)
RENEW_INTERVAL = 0.1
#: the longest a lease far from every limit goes without a store step: its settled usage reaches the
#: store at least this often (what a crash can leave uncounted: the usage of calls that finished this
#: long before it); never more than half the admission slack (see the module docstring)
MAX_RENEW_INTERVAL = 0.25
#: a lease with nothing in flight and no admission for this long is given back
IDLE_RETURN = 1.0
#: two store round trips of a plugin this close together make it busy (lease slices grow)
BUSY_WINDOW = 1.0
#: the most calls' worth a lease holds beyond its calls in flight
MAX_CALLS = 1024
_MAX_SLACK = 2.0
_BIG = 1 << 62  # the room under a limit the plugin does not have


def _slots(n: int, peak: int) -> int:
    """The spare concurrency slots a lease wants: twice the most calls in flight at once lately
    (calls in flight, not calls per interval, use slots), at most the slice of ``n`` calls."""
    return min(n, max(1, 2 * peak))


class LeaseBook:
    """This process's leases of one plugin in one store (see the module docstring)."""

    __slots__ = ("lock", "current", "closed", "store", "plugin_id", "grace", "timeout", "slack", "max_interval", "io",
                 "retiring", "n", "last_sync", "want_tok", "want_nano", "waiting", "__weakref__")

    def __init__(self, store: "LimitStore", plugin_id: str, grace: float, timeout: float) -> None:
        self.store = store
        self.plugin_id = plugin_id
        self.lock = threading.Lock()  # in-memory state only: never held across a store call
        self.io = threading.Lock()  # one store step of this book at a time
        self.current: Lease | None = None
        self.retiring: list[Lease] = []  # leases of an earlier minute (or given back) still to finish
        self.grace = self.timeout = self.slack = self.max_interval = 0.0
        self.configure(grace, timeout)
        self.n = 0  # calls' worth wanted beyond the calls in flight (0: exact per call)
        self.last_sync = float("-inf")
        self.want_tok = self.want_nano = 0  # worst case of the last call, to size the slice
        self.waiting = 0  # calls waiting for this book's store step (``io``)
        self.closed = False
        _BOOKS.add(self)

    def configure(self, grace: float, timeout: float) -> None:
        """``limits.reservation_grace`` and ``limits.store_timeout`` as they are now (a reload may
        change them): the slack of in-memory admissions stays within a quarter of the grace."""
        with self.lock:
            self.grace, self.timeout = grace, timeout  # timeout: the keeper's bound per store step
            self.slack = min(_MAX_SLACK, max(0.0, grace) / 4)
            self.max_interval = max(RENEW_INTERVAL, min(MAX_RENEW_INTERVAL, self.slack / 2))
            for lease in (self.current, *self.retiring):
                if lease is not None and lease.admit_until != CLOSED:
                    lease.admit_until = lease.expires + self.slack

    # -- the caller's side
    def try_fast(self, limits: "PluginLimits", input_tokens: int, output_tokens: int, cost: int | None, price,
                 call_expiry: float, now: float) -> LeasedTicket | None:
        """Admit in memory when the current lease has room; None when the store must decide.
        (``cost`` is the worst case in nano-dollars, None when unpriced; ``price`` settles it.)"""
        tokens, nano = input_tokens + output_tokens, cost or 0
        with self.lock:
            lease = self.current
            if (lease is None or lease.limits is not limits or call_expiry > lease.admit_until
                    or not lease.t0 <= now < lease.t1 or now >= lease.expires):  # (the row may be gone)
                return None
            room = lease.room
            if room[0] < 1 or room[1] < 1 or room[2] < tokens or room[3] < nano:
                return None
            room[0] -= 1
            room[1] -= 1
            room[2] -= tokens
            room[3] -= nano
            ticket = LeasedTicket(lease, input_tokens, output_tokens, cost, price, call_expiry)
            inflight = lease.inflight
            inflight.add(ticket)
            if len(inflight) > lease.peak:
                lease.peak = len(inflight)
            if call_expiry > lease.latest:
                lease.latest = call_expiry
            lease.admitted += 1
            alarm = lease.admitted == lease.alarm
        if alarm:  # about half the slice is used: the keeper looks now rather than at its next deadline
            _WAKE.set()
        return ticket

    def admit(self, limits: "PluginLimits", input_tokens: int, output_tokens: int, cost: int | None, price,
              call_expiry: float, now: float, *, timeout: float,
              also_waiting: "Callable[[], int] | None" = None) -> LeasedTicket | Denial:
        """Admit with a store step (the lease had no room, or none exists): exact, may raise StoreError.
        ``also_waiting``: how many other calls wait for this step elsewhere (async calls on a loop)."""
        start = time.monotonic()
        with self.lock:
            self.waiting += 1
        try:
            acquired = self.io.acquire(timeout=max(0.0, timeout))
        finally:
            with self.lock:
                self.waiting -= 1
        if not acquired:
            raise StoreError(f"the {self.store.name} limits store is busy (waited {timeout:.2f}s for this "
                             f"process's other calls of plugin '{self.plugin_id}')")
        try:
            # a step made meanwhile may have made room
            got = self.try_fast(limits, input_tokens, output_tokens, cost, price, call_expiry, now)
            if got is not None:
                return got
            tokens, nano = input_tokens + output_tokens, cost or 0
            retire = None
            with self.lock:
                waiting = self.waiting + (also_waiting() if also_waiting is not None else 0)
                if waiting:  # other calls wait for this step: busy, and the slice covers them at once
                    self.n = min(MAX_CALLS, max(self.n * 2, 2 * waiting))
                elif 0 <= now - self.last_sync < BUSY_WINDOW:
                    self.n = min(MAX_CALLS, max(1, self.n * 2))
                else:
                    self.n = 0  # quiet: exact per-call reservations
                self.last_sync = now
                self.want_tok, self.want_nano = tokens, nano
                lease = self.current
                if lease is not None and not lease.t0 <= now < lease.t1:  # a new minute: a new lease
                    retire, lease = lease, None
                    self.retiring.append(retire)
                if lease is None:
                    lease = self.current = Lease(self, buckets_at(now), limits)
                if waiting:  # they will be in flight together: slots for all of them
                    lease.peak = max(lease.peak, len(lease.inflight) + waiting + 1)
            if retire is not None:  # its spare headroom must not count against the new lease
                self._step(retire, give_back=True, timeout=timeout - (time.monotonic() - start))
            ticket = LeasedTicket(lease, input_tokens, output_tokens, cost, price, call_expiry)
            result = self._step(lease, give_back=False, timeout=timeout - (time.monotonic() - start),
                                ask=(1, 1, tokens, nano), limits=limits, now=now, call_expiry=call_expiry,
                                ticket=ticket)
            return result if isinstance(result, Denial) else ticket
        finally:
            self.io.release()

    # -- one store step (the io lock is held)
    def _step(self, lease: Lease, *, give_back: bool, timeout: float, ask: tuple[int, int, int, int] = ZERO,
              limits: "PluginLimits | None" = None, now: float | None = None,
              call_expiry: float = 0.0, ticket: LeasedTicket | None = None) -> LeaseGrant | Denial:
        """Hand the settled usage to the store and resize ``lease`` in one store step; with ``ask``,
        the reservation of the call ``ticket`` too, which is admitted under the lease before any
        other call can take the room granted for it."""
        now = time.time() if now is None else now
        limits = lease.limits if limits is None else limits
        with self.lock:
            inflight = lease.inflight
            for t in [t for t in inflight if t.expires_at <= now]:  # stopped counting in the store: no longer held
                inflight.remove(t)
            r = lease.in_flight()
            settled = (min(MAX_TOTAL, lease.u_req), min(MAX_TOTAL, lease.u_tok), min(MAX_TOTAL, lease.u_nano))
            n = 0 if give_back or lease is not self.current else self.n
            target = (_slots(n, lease.peak), n, n * self.want_tok, n * self.want_nano) if n else ZERO
            lease.peak = r[0]
            if give_back or lease.near or any(ask):  # exact: hold only the calls in flight (+ this call + the
                keep, want = r, target  # slice); admissions wait
                lease.renewing = True
                lease.admit_until = CLOSED
            else:  # far from every limit: keep what is held (less what settles), top the spare up to the
                # slice; admissions go on meanwhile, within what is held now, which the step never shrinks
                h, c = lease.held, lease.capped
                keep = (max(r[0], h[0]) if c[0] else r[0], max(r[1], h[1] - settled[0]) if c[1] else r[1],
                        max(r[2], h[2] - settled[1]) if c[2] else r[2], max(r[3], h[3] - settled[2]) if c[3] else r[3])
                want = tuple(max(0, t - (k - x)) for t, k, x in zip(target, keep, r))
            if lease.admitted:
                lease.last_used = time.monotonic()
            lease.admitted = 0
        keep_expires = max(lease.latest, now)
        op = LeaseOp(lease.id, lease.buckets, now, max(keep_expires, call_expiry), keep_expires, settled, keep, ask, want,
                     tuple(lease.sent))
        try:
            result = self.store.lease(self.plugin_id, op, limits, timeout=max(0.0, timeout))
        except BaseException:
            with self.lock:
                lease.renewing = False  # nothing known to be applied: the usage is sent again next time
                self._reopen(lease)
            raise
        with self.lock:
            lease.renewing = False
            lease.stepped = time.monotonic()
            lease.u_req -= settled[0]
            lease.u_tok -= settled[1]
            lease.u_nano -= settled[2]
            lease.sent = [a + b for a, b in zip(lease.sent, settled)]
            if isinstance(result, Denial):
                lease.held, lease.expires = keep, keep_expires
                self._reopen(lease)
                return result
            lease.held, lease.expires = result.held, result.expires
            # the store granted less than half the slice somewhere (it grants at most 1/LEASE_SHARE of
            # what is free): near that limit, so steps stay exact
            lease.near = any(c and w and 2 * (held - k - a) < w
                             for c, w, held, k, a in zip(lease.capped, want, result.held, keep, ask))
            lease.alarm = self.n // 2 if self.n and not lease.near else 0
            if limits is not lease.limits:
                lease.limits, lease.capped = limits, capped_dims(limits)
            if ticket is not None:  # the asking call: in flight under the lease
                lease.inflight.add(ticket)
                lease.peak = max(lease.peak, len(lease.inflight))
                lease.latest = max(lease.latest, ticket.expires_at)
                lease.admitted += 1
                lease.last_used = time.monotonic()
            self._reopen(lease)
            if give_back and not any(keep) and not lease.pending():
                self._drop(lease)  # the store deleted the row
        return result

    def _reopen(self, lease: Lease) -> None:
        """Work ``room`` out afresh from what the store holds, and admit in memory again unless
        the book is in exact mode (the lock is held)."""
        r, h, c = lease.in_flight(), lease.held, lease.capped
        lease.room = [h[0] - r[0] if c[0] else _BIG, h[1] - r[1] - lease.u_req if c[1] else _BIG,
                      h[2] - r[2] - lease.u_tok if c[2] else _BIG, h[3] - r[3] - lease.u_nano if c[3] else _BIG]
        open_ = self.n and not lease.renewing and not lease.dead
        lease.admit_until = lease.expires + self.slack if open_ else CLOSED

    def _drop(self, lease: Lease) -> None:
        """Forget a lease the store holds nothing of (the lock is held)."""
        lease.dead = True
        lease.admit_until = CLOSED
        if lease is self.current:
            self.current = None
        if lease in self.retiring:
            self.retiring.remove(lease)

    # -- the keeper's side
    def active(self) -> bool:
        return self.current is not None or bool(self.retiring)

    def tick(self) -> None:
        """One keeper pass: hand finished usage to the store, resize, give idle leases back."""
        if not self.io.acquire(blocking=False):
            return  # a caller is making a step right now
        try:
            timeout = self.timeout
            for lease in list(self.retiring):
                if self._spare(lease):
                    self._step(lease, give_back=True, timeout=timeout)
            lease = self.current
            if lease is None:
                return
            if not lease.admitted and time.monotonic() - lease.last_used >= IDLE_RETURN:  # idle: give back all
                # but the calls in flight
                if self._spare(lease):
                    self._step(lease, give_back=True, timeout=timeout)
                if lease.dead:
                    self.n = 0
            elif (lease.admitted or lease.pending()) and self._due(lease):
                if self.n:  # hold about two renewal intervals' worth of calls
                    self.n = min(MAX_CALLS, max(self.n, 2 * lease.admitted))
                self._step(lease, give_back=False, timeout=timeout)
        finally:
            self.io.release()

    def next_pass(self, now: float) -> float:
        """Seconds until this book needs a keeper pass (0: on the next one). A lease far from every
        limit needs one when its step is due by time (``max_interval`` after the last one, if there
        is usage to hand over) or when it is idle; the admission at half its slice wakes the keeper
        sooner (``alarm``). Near a limit, in exact mode, after that alarm and while leases retire,
        the keeper looks on every pass (:data:`RENEW_INTERVAL`)."""
        lease = self.current
        if lease is None or self.retiring or lease.near or not self.n or (lease.alarm and lease.admitted >= lease.alarm):
            return 0.0
        due = lease.last_used + IDLE_RETURN
        if lease.admitted or lease.pending():
            due = min(due, lease.stepped + self.max_interval)
        return due - now

    def _due(self, lease: Lease) -> bool:
        """Whether an active lease needs its store step now: it is near a limit (exact steps), it
        has not had one for ``max_interval``, or under some limit less than half the slice is left
        (so that calls keep finding room in memory). Else the step waits: far from every limit,
        what it would do -- hand settled usage over, top the slice up -- is not needed yet."""
        n = self.n
        if lease.near or not n or time.monotonic() - lease.stepped >= self.max_interval:
            return True
        with self.lock:
            room, c = lease.room, lease.capped
            return ((c[0] and 2 * room[0] < _slots(n, lease.peak)) or (c[1] and 2 * room[1] < n)
                    or (c[2] and 2 * room[2] < n * self.want_tok) or (c[3] and 2 * room[3] < n * self.want_nano))

    def _spare(self, lease: Lease) -> bool:
        """Whether giving ``lease`` back needs a store step (else it is marked done here)."""
        with self.lock:
            r = lease.in_flight()
            if lease.pending() or lease.held != r or any(t.expires_at <= time.time() for t in lease.inflight):
                return True
            if not any(r):  # holds nothing: the store has no row left
                self._drop(lease)
            return False

    def flush_closed(self) -> None:
        """A call finished after its store was closed: apply its usage now."""
        try:
            self.give_back(self.timeout)
        except Exception:  # noqa: BLE001 - a finished call never fails because its bookkeeping did
            _log.exception("limits: usage of plugin '%s' not applied after its store was closed", self.plugin_id)

    def give_back(self, timeout: float) -> None:
        """Hand every lease's finished usage to the store and return all headroom beyond the calls
        in flight (before a read, a reset, or closing the store). Raises StoreError."""
        if not self.io.acquire(timeout=max(0.0, timeout)):
            raise StoreError(f"the {self.store.name} limits store is busy (plugin '{self.plugin_id}')")
        try:
            with self.lock:
                leases = [*self.retiring, *([self.current] if self.current is not None else [])]
                for lease in [x for x in leases if x.stepped == float("-inf") and not x.inflight and not x.pending()]:
                    leases.remove(lease)  # no step of it ever succeeded: nothing to give back, nothing to hand over
                    self._drop(lease)
            for lease in leases:
                self._step(lease, give_back=True, timeout=timeout)
        finally:
            self.io.release()

    def wake(self) -> None:
        _start_keeper()
        _WAKE.set()

    def close(self) -> None:
        """Stop using this book (its store is being closed): no more admissions, no more renewals."""
        self.closed = True
        _BOOKS.discard(self)

    def forget(self) -> None:
        """In a forked child: the parent's leases are the parent's."""
        self.lock = threading.Lock()
        self.io = threading.Lock()
        self.current = None
        self.retiring = []
        self.n = 0
        self.waiting = 0
        self.last_sync = float("-inf")


def book_for(store: "LimitStore", plugin_id: str, grace: float, timeout: float) -> LeaseBook:
    """The store's lease book of ``plugin_id`` in this process (created on first use)."""
    books = store.lease_books()
    book = books.get(plugin_id)
    if book is None:
        with _CREATE:
            book = books.get(plugin_id)
            if book is None:
                book = books[plugin_id] = LeaseBook(store, plugin_id, grace, timeout)
        book.wake()
    else:
        _start_keeper()  # (a pid check) a forked child has its parent's books but no keeper yet
        if book.grace != grace or book.timeout != timeout:  # a config reload changed them
            book.configure(grace, timeout)
    return book


_BOOKS: "weakref.WeakSet[LeaseBook]" = weakref.WeakSet()
_CREATE = threading.Lock()
_WAKE = threading.Event()
_keeper: threading.Thread | None = None
_keeper_pid = 0


def _start_keeper() -> None:
    global _keeper, _keeper_pid
    if _keeper is not None and _keeper_pid == os.getpid():
        return
    with _CREATE:
        if _keeper is None or _keeper_pid != os.getpid():
            _keeper_pid = os.getpid()
            _keeper = threading.Thread(target=_keep, name="plugin-llm-limits-leases", daemon=True)
            _keeper.start()


def _keep() -> None:
    """The keeper: a pass over the active books when one of them needs it (``next_pass``), at most
    one per :data:`RENEW_INTERVAL` unless an admission's alarm wakes it. (It used to look every
    RENEW_INTERVAL: a thread wake-up costs 25-80 us of CPU on a loaded 2-core machine, ~1 us per
    call of a busy plugin, for passes that mostly had nothing to do.)"""
    logged = last = float("-inf")
    while True:
        books = [b for b in list(_BOOKS) if b.active() and not b.closed]
        if not books:
            _WAKE.wait(1.0)
            _WAKE.clear()
            continue
        now = time.monotonic()
        delay = max(last + RENEW_INTERVAL - now, min(b.next_pass(now) for b in books))
        if delay > 0:
            _WAKE.wait(min(delay, IDLE_RETURN))
        _WAKE.clear()
        last = time.monotonic()
        for book in books:
            try:
                book.tick()
            except StoreError as exc:  # the store is down: leases expire by themselves; say so once a minute
                if time.monotonic() - logged >= 60.0:
                    logged = time.monotonic()
                    _log.error("limits: %s store: lease of plugin '%s' not renewed yet (retrying): %s",
                               book.store.name, book.plugin_id, exc)
            except Exception:  # noqa: BLE001 - the keeper must survive a store defect
                _log.exception("limits: renewing a lease of plugin '%s' failed", book.plugin_id)


def _after_fork_in_child() -> None:
    global _keeper
    _keeper = None
    for book in list(_BOOKS):
        book.forget()


def _give_back_at_exit() -> None:
    for book in list(_BOOKS):
        if not book.closed:
            try:
                book.give_back(2.0)
            except StoreError as exc:  # the store is down: one line, the leases expire by the crash rule
                _log.warning("limits: leases of plugin '%s' not given back at exit (they expire): %s",
                             book.plugin_id, exc)
            except Exception:  # noqa: BLE001 - at exit, log and go
                _log.exception("limits: leases of plugin '%s' not given back at exit (they expire)", book.plugin_id)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_give_back_at_exit)
