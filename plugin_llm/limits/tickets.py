"""The ticket of one admitted request: settled or released exactly once, and its audit fields.

:class:`Ticket` is what the store path of admission hands out (a call admitted in memory under a
lease gets a :class:`~plugin_llm.limits.leases.LeasedTicket`, the same interface);
:data:`UNLIMITED` is the ticket of a plugin without limits.
"""

from __future__ import annotations

import logging
from typing import Any

from audit import records
from plugin_llm.limits.pricing import Estimate, actual_cost_nano, reports_a_cost, usage_count
from plugin_llm.limits.settings import NANO
from plugin_llm.limits.store import Admission, LimitStore, StoreError, iso_utc

__all__ = ["Ticket", "UNLIMITED"]

log = logging.getLogger("plugin_llm.limits")


class Ticket:
    """One admitted request. ``settle`` or ``release`` exactly once; later calls do nothing.

    ``audit_fields()`` are the fields to add to the call's audit record.
    Settlement never raises and costs the caller no store round trip: under
    a lease it is in memory (the lease keeper hands it to the store within
    250 ms); otherwise it is queued and applied with this process's next
    admission (or by a background flush a few ms later); until then the
    reservation, never less than the actual, keeps counting. A store failure is logged, and the
    reservation then counts until it expires (the call's deadline plus the
    grace period).
    """

    __slots__ = ("_store", "_admission", "_price", "_once", "estimate", "store_error", "input_exact")

    def __init__(self, store: LimitStore | None, admission: Admission | None, estimate: Estimate | None,
                 store_error: str | None = None) -> None:
        self._store = store
        self._admission = admission
        self._price = estimate.price if estimate is not None else None
        # settle/release take the admission out of this list: one atomic list.pop, so exactly one
        # of several racing threads gets it (no lock object per ticket, nothing to contend for)
        self._once = [admission] if admission is not None else []
        self.estimate = estimate
        self.store_error = store_error
        self.input_exact = False  # the input counted exactly (limits.tokens), not by the byte bound

    @property
    def metered(self) -> bool:
        return self._admission is not None

    def _finish(self) -> Admission | None:
        once = self._once
        if not once:
            return None
        try:
            return once.pop()
        except IndexError:  # another thread took it between the check and the pop
            return None

    def settle(self, usage: Any = None, *, cost_usd: float | None = None, input_tokens: int | None = None,
               output_tokens: int | None = None) -> None:
        """Replace the reservation by what the request used (a ``PluginLlmUsage`` or the numbers).

        A request that succeeded but reports neither tokens nor a positive cost
        is charged its reservation (the worst case): unknown is never free."""
        once = self._once  # _finish(), inlined: this runs once per limited call
        if not once:
            return
        try:
            admission = once.pop()
        except IndexError:
            return
        if usage is not None:
            cost_usd = usage.cost_usd if cost_usd is None else cost_usd
            input_tokens = usage.input_tokens if input_tokens is None else input_tokens
            output_tokens = usage.output_tokens if output_tokens is None else output_tokens
        ins, outs = usage_count(input_tokens), usage_count(output_tokens)
        if ins == 0 and outs == 0 and not reports_a_cost(cost_usd):
            self._apply(admission, admission.cost_nano, admission.tokens)
            return
        cost_nano = actual_cost_nano(self._price, cost_usd, ins, outs)
        try:  # _apply(), inlined for the common case
            self._store.settle_later(admission, cost_nano, ins + outs)
        except Exception as exc:  # noqa: BLE001 - a finished call never fails because its bookkeeping did
            _settle_failed(admission, exc)

    def release(self) -> None:
        """Drop the reservation (the request failed before using anything known)."""
        admission = self._finish()
        if admission is not None:
            self._apply(admission, 0, 0)

    async def asettle(self, usage: Any = None, **numbers: Any) -> None:
        """:meth:`settle` for async code (it only queues, so it never blocks the event loop)."""
        self.settle(usage, **numbers)

    async def arelease(self) -> None:
        """:meth:`release` for async code."""
        self.release()

    def _apply(self, admission: Admission, cost_nano: int, tokens: int) -> None:
        try:
            self._store.settle_later(admission, cost_nano, tokens)  # rides along with the next admission
        except Exception as exc:  # noqa: BLE001 - a finished call never fails because its bookkeeping did
            _settle_failed(admission, exc)

    def audit_fields(self) -> dict[str, Any]:
        if self._admission is None and self.store_error is None:
            return {}
        fields: dict[str, Any] = {}
        if self._admission is not None:
            fields[records.LIMITS_RESERVED_USD] = self._admission.cost_nano / NANO
            fields[records.LIMITS_RESERVED_TOKENS] = self._admission.tokens
            if self.estimate is not None:
                fields[records.LIMITS_RESERVED_INPUT_TOKENS] = self.estimate.input_tokens
            fields[records.LIMITS_INPUT_COUNT] = "exact" if self.input_exact else "bound"
        if self.store_error is not None:
            fields[records.LIMITS_STORE_ERROR] = self.store_error
        return fields


def _settle_failed(admission: Admission, exc: Exception) -> None:
    """Log a settlement the store did not take (called in its ``except`` block: the traceback of a defect)."""
    if isinstance(exc, StoreError):
        log.error("limits: could not settle call of plugin '%s' (its reservation counts until %s): %s",
                  admission.plugin_id, iso_utc(admission.expires_at), exc)
    else:
        log.exception("limits: settling a call of plugin '%s' failed (its reservation counts until %s)",
                      admission.plugin_id, iso_utc(admission.expires_at))


#: the ticket of a plugin without limits: settling it does nothing
UNLIMITED = Ticket(None, None, None)
