"""One provider request of a call: its transport request, its output bound, its settlement."""

from __future__ import annotations

import dataclasses
import time

from audit import records
from plugin_llm import limits
from plugin_llm.call.steps import Admitted, Run
from plugin_llm.config import HostConfig
from plugin_llm.credentials import key_source
from plugin_llm.errors import PluginLlmTimeoutError
from plugin_llm.transport import TransportRequest

__all__ = ["with_current_limits", "settle_failed", "bounded_output", "transport_request"]


def with_current_limits(admitted: Admitted, config: HostConfig) -> Admitted:
    """``admitted`` with the limits of ``config`` (a reload since the call began may have lowered a
    cap); its trust decision and route stay the call's."""
    if config.limits is admitted.config.limits:
        return admitted
    return dataclasses.replace(admitted, config=dataclasses.replace(admitted.config, limits=config.limits))


def settle_failed(ticket: limits.Ticket, failure: BaseException, *, replied: bool) -> None:
    """A request that ended in no usable reply: released when the provider refused it (an error
    reply, no connection: nothing billed), else charged its reservation, the worst case -- a reply
    came but was unusable, or a stream was cut short, or the request timed out or was cancelled
    while out: the provider may have billed it, and how much is unknown."""
    if replied or isinstance(failure, PluginLlmTimeoutError) or not isinstance(failure, Exception):
        ticket.settle()
    else:
        ticket.release()


def bounded_output(run: Run, params: dict) -> dict:
    """``params`` with ``max_tokens`` set to the output bound the limits reserved when they count
    output and the plugin set none (or a larger one): the reservation is then a ceiling the
    provider keeps (litellm names it per provider: max_completion_tokens, max_output_tokens ...)."""
    admitted, plugin_id = run.admitted, run.call.plugin_id
    settings = admitted.config.limits
    if settings.for_plugin(plugin_id).empty:
        return params
    route = admitted.route
    bound = limits.output_bound(settings, admitted.config.home, plugin_id, route.provider, route.model,
                                params.get("max_tokens"))
    if bound is None:
        return params
    run.tally.add_limits({records.LIMITS_MAX_TOKENS_SENT: bound})
    return {**params, "max_tokens": bound}


def transport_request(admitted: Admitted, messages: list, params: dict) -> TransportRequest:
    """The transport request of one provider request, with the operator's price of the route when
    ``limits.prices`` has one (the transport then reports that cost: ``TransportResponse.priced``)."""
    route, config = admitted.route, admitted.config
    prices = config.limits.prices
    deadline = admitted.deadline
    if admitted.chain and route.attempt_timeout is not None and route is not admitted.chain[-1]:
        deadline = min(deadline, time.monotonic() + route.attempt_timeout)  # leaves time for the next route
    return TransportRequest(
        route=route,
        messages=messages,
        keys=key_source(config.home, route.provider, route.profile),
        deadline=deadline,
        params=params,
        cost=limits.operator_cost(route.provider, route.model, prices) if prices else None,
    )
