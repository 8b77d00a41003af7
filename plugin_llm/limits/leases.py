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
import math
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable

from audit import records
from plugin_llm.limits.pricing import Estimate, actual_cost_nano, reports_a_cost, usage_count
from plugin_llm.limits.settings import MAX_CALL_NANO, MAX_CALL_TOKENS, MAX_TOTAL, NANO
from plugin_llm.limits.store import Buckets, Denial, LeaseGrant, LeaseOp, StoreError, buckets_at, new_reservation_id

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
_ZERO = (0, 0, 0, 0)
_BIG = 1 << 62  # the room under a limit the plugin does not have
_CLOSED = float("-inf")  # Lease.admit_until of a lease that admits nothing in memory


class LeasedTicket:
    """A call admitted under a lease: :class:`~plugin_llm.limits.Ticket`'s interface, settled in
    memory (the reservation leaves the lease, the actual usage waits in it for the keeper).

    The in-memory path's one object per call: it is also the lease's record of the call in
    flight (``Lease.inflight``), so admission builds nothing else. ``settle`` or ``release``
    exactly once (decided under the book's lock); later calls do nothing."""

    __slots__ = ("lease", "input_tokens", "output_tokens", "cost", "price", "expires_at", "done", "input_exact")

    metered = True
    store_error = None

    def __init__(self, lease: "Lease", input_tokens: int, output_tokens: int, cost: int | None, price,
                 expires_at: float) -> None:
        self.lease = lease
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cost = cost
        self.price = price
        self.expires_at = expires_at
        self.done = False
        self.input_exact = False  # set by admission when the input was counted exactly

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cost_nano(self) -> int:
        """What the call holds of the lease's money (0 when it is unpriced: no budget to count against)."""
        return self.cost or 0

    @property
    def plugin_id(self) -> str:
        return self.lease.book.plugin_id

    @property
    def estimate(self) -> Estimate:
        return Estimate(self.input_tokens, self.output_tokens, self.cost, self.price)

    def settle(self, usage=None, *, cost_usd: float | None = None, input_tokens: int | None = None,
               output_tokens: int | None = None) -> None:
        """As :meth:`Ticket.settle <plugin_llm.limits.Ticket.settle>`: the actual usage, in memory
        (a reply that reports no tokens and no positive cost is charged its worst case)."""
        if self.done:
            return
        if usage is not None:
            cost_usd = usage.cost_usd if cost_usd is None else cost_usd
            input_tokens = usage.input_tokens if input_tokens is None else input_tokens
            output_tokens = usage.output_tokens if output_tokens is None else output_tokens
        ins = (input_tokens if type(input_tokens) is int and 0 <= input_tokens <= MAX_CALL_TOKENS
               else usage_count(input_tokens))
        outs = (output_tokens if type(output_tokens) is int and 0 <= output_tokens <= MAX_CALL_TOKENS
                else usage_count(output_tokens))
        price = self.price
        if ins == 0 and outs == 0 and not reports_a_cost(cost_usd):  # nothing reported: its worst case
            self._finish(self.input_tokens + self.output_tokens, self.cost or 0)
        elif price is not None and price.operator:  # actual_cost_nano's first case, inlined (the usual one)
            self._finish(ins + outs, min(MAX_CALL_NANO, math.ceil(ins * price.input_nano + outs * price.output_nano)))
        else:
            self._finish(ins + outs, actual_cost_nano(price, cost_usd, ins, outs))

    def release(self) -> None:
        """Drop the reservation (the request still counts in its minute)."""
        if not self.done:
            self._finish(0, 0)

    def _finish(self, tokens: int, nano: int) -> None:
        """The reservation leaves the lease's room and calls in flight; the usage waits in ``u_*``
        for the keeper. Exactly once, decided under the book's lock."""
        lease = self.lease
        book = lease.book
        with book.lock:
            if self.done:
                return
            self.done = True
            lease.u_req += 1  # a finished request counts in its minute, failed or not
            lease.u_tok += tokens  # (non-negative ints)
            lease.u_nano += nano
            room = lease.room
            try:
                lease.inflight.remove(self)
            except KeyError:  # it expired (and stopped counting); its usage counts all the same
                room[1] -= 1
                room[2] -= tokens
                room[3] -= nano
            else:
                room[0] += 1
                room[2] += self.input_tokens + self.output_tokens - tokens
                room[3] += (self.cost or 0) - nano
            orphan = lease.dead
            if orphan:  # given back already: the keeper applies this usage with a final step
                lease.dead = False
                book.retiring.append(lease)
        if book.closed:
            book.flush_closed()
        elif orphan:
            book.wake()

    async def asettle(self, usage=None, **numbers) -> None:
        self.settle(usage, **numbers)

    async def arelease(self) -> None:
        self.release()

    def audit_fields(self) -> dict:
        return {records.LIMITS_RESERVED_USD: (self.cost or 0) / NANO,
                records.LIMITS_RESERVED_TOKENS: self.input_tokens + self.output_tokens,
                records.LIMITS_RESERVED_INPUT_TOKENS: self.input_tokens,
                records.LIMITS_INPUT_COUNT: "exact" if self.input_exact else "bound"}


class Lease:
    """One lease row: what the store holds (``held``), the calls in flight under it
    (``inflight``), the usage of finished calls not yet handed to the store (``u_*``), and what
    admissions in memory may still take (``room``: ``held`` less the calls in flight and that
    usage, per limit; :data:`_BIG` where the plugin has no limit) until ``admit_until`` (the
    latest call expiry it covers; :data:`_CLOSED` while a step holds admissions up)."""

    # (what admission and settlement touch first: next to each other in memory)
    __slots__ = ("limits", "admit_until", "t0", "t1", "room", "inflight", "peak", "latest", "admitted", "alarm",
                 "u_req", "u_tok", "u_nano", "dead", "book", "id", "buckets", "capped", "held", "expires",
                 "renewing", "last_used", "near", "stepped", "sent")

    def __init__(self, book: "LeaseBook", buckets: Buckets, limits: "PluginLimits") -> None:
        self.book = book
        self.id = new_reservation_id()
        self.buckets = buckets
        self.t1 = buckets.minute_ends
        self.t0 = self.t1 - 60.0
        self.limits = limits
        self.capped = _capped(limits)
        self.held = _ZERO
        self.expires = 0.0
        self.latest = 0.0  # the latest expiry of a call admitted under this lease
        self.room = [0, 0, 0, 0]  # slots, requests, tokens, nano
        self.admit_until = _CLOSED
        self.u_req = self.u_tok = self.u_nano = 0
        self.inflight: set[LeasedTicket] = set()  # the calls admitted under it, not finished yet
        self.renewing = False
        self.admitted = 0  # admissions since the last renewal
        self.alarm = 0  # the admission (counted in ``admitted``) that wakes the keeper: half the slice used
        self.last_used = time.monotonic()  # of the last admission, as the keeper saw it (updated by steps)
        self.dead = False
        self.near = True  # until a step shows otherwise
        self.stepped = float("-inf")  # time.monotonic() of its last store step
        self.sent = [0, 0, 0]  # requests, tokens, nano its steps are known to have settled (LeaseOp.applied)
        self.peak = 0  # the most calls in flight at once since its last store step

    def in_flight(self) -> tuple[int, int, int, int]:
        """Slots, requests, tokens and nano-dollars the calls in flight hold (the lock is held)."""
        tokens = nano = 0
        for t in self.inflight:
            tokens += t.input_tokens + t.output_tokens
            nano += t.cost or 0
        n = len(self.inflight)
        return (n, n, tokens, nano)

    def pending(self) -> bool:
        return bool(self.u_req or self.u_tok or self.u_nano)


def _slots(n: int, peak: int) -> int:
    """The spare concurrency slots a lease wants: twice the most calls in flight at once lately
    (calls in flight, not calls per interval, use slots), at most the slice of ``n`` calls."""
    return min(n, max(1, 2 * peak))


def _capped(limits: "PluginLimits") -> tuple[bool, bool, bool, bool]:
    return (limits.max_concurrent is not None, limits.requests_per_minute is not None,
            limits.tokens_per_minute is not None,
            limits.budget_day_nano is not None or limits.budget_month_nano is not None)


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
                if lease is not None and lease.admit_until != _CLOSED:
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
    def _step(self, lease: Lease, *, give_back: bool, timeout: float, ask: tuple[int, int, int, int] = _ZERO,
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
            target = (_slots(n, lease.peak), n, n * self.want_tok, n * self.want_nano) if n else _ZERO
            lease.peak = r[0]
            if give_back or lease.near or any(ask):  # exact: hold only the calls in flight (+ this call + the
                keep, want = r, target  # slice); admissions wait
                lease.renewing = True
                lease.admit_until = _CLOSED
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
                lease.limits, lease.capped = limits, _capped(limits)
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
        lease.admit_until = lease.expires + self.slack if open_ else _CLOSED

    def _drop(self, lease: Lease) -> None:
        """Forget a lease the store holds nothing of (the lock is held)."""
        lease.dead = True
        lease.admit_until = _CLOSED
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
