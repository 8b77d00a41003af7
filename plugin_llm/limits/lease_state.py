"""A lease in memory: the row the store holds, and the calls admitted under it.

A :class:`Lease` is this process's view of one lease row: what the store holds, the calls in
flight under it, the usage of finished calls not yet handed to the store, and the room left for
admissions in memory. A :class:`LeasedTicket` is one call admitted under it, settled in memory
(under its book's lock, exactly once). The book that keeps them, and the keeper thread that
hands their usage to the store, are in :mod:`.leases`.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from audit import records
from plugin_llm.limits.pricing import Estimate, actual_cost_nano, reports_a_cost, usage_count
from plugin_llm.limits.settings import MAX_CALL_NANO, MAX_CALL_TOKENS, NANO
from plugin_llm.limits.store import Buckets, new_reservation_id

if TYPE_CHECKING:
    from plugin_llm.limits.leases import LeaseBook
    from plugin_llm.limits.settings import PluginLimits

__all__ = ["Lease", "LeasedTicket", "capped_dims", "ZERO", "CLOSED"]

ZERO = (0, 0, 0, 0)
CLOSED = float("-inf")  # Lease.admit_until of a lease that admits nothing in memory


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
    usage, per limit; ``leases._BIG`` where the plugin has no limit) until ``admit_until`` (the
    latest call expiry it covers; :data:`CLOSED` while a step holds admissions up)."""

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
        self.capped = capped_dims(limits)
        self.held = ZERO
        self.expires = 0.0
        self.latest = 0.0  # the latest expiry of a call admitted under this lease
        self.room = [0, 0, 0, 0]  # slots, requests, tokens, nano
        self.admit_until = CLOSED
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


def capped_dims(limits: "PluginLimits") -> tuple[bool, bool, bool, bool]:
    return (limits.max_concurrent is not None, limits.requests_per_minute is not None,
            limits.tokens_per_minute is not None,
            limits.budget_day_nano is not None or limits.budget_month_nano is not None)
