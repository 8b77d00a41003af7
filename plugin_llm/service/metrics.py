"""Prometheus metrics of the service (``GET /metrics``), per plugin and status.

Label values come from the operator (the plugin key a token names, the model
routes it may use; any other model is ``other``) and from a fixed set
(endpoint, status, reason), never from request input, so a client cannot grow
the series. With ``--workers N`` each worker counts its own calls;
``plugin-llm serve`` then points ``PROMETHEUS_MULTIPROC_DIR`` at a directory of
its own, and ``/metrics`` on any worker reports the sum over all of them.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ServiceMetrics"]

#: latency buckets (seconds): sub-millisecond gateway answers up to long model calls
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ServiceMetrics:
    """The service's counters and histogram, in a registry of their own (one per app)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

        disable_created_metrics()  # no *_created series: half the scrape, nothing an operator reads

        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry(auto_describe=True)
        kw: dict[str, Any] = {"registry": None if self.multiprocess else self.registry}
        self.calls = Counter("plugin_llm_service_calls", "Calls through the service by plugin, endpoint, status and "
                             "model (route)", ("plugin", "endpoint", "status", "model"), **kw)
        self.denials = Counter("plugin_llm_service_denials", "Refused requests by plugin (empty when the token was "
                               "not valid) and reason", ("plugin", "reason"), **kw)
        self.latency = Histogram("plugin_llm_service_latency_seconds", "Time from request to answer by plugin, "
                                 "status and model", ("plugin", "status", "model"), buckets=_BUCKETS, **kw)
        self.tokens = Counter("plugin_llm_service_tokens", "Tokens used by plugin, direction (input, output) and model",
                              ("plugin", "direction", "model"), **kw)
        self._children: dict[tuple[str, str, str, str], tuple] = {}
        self._breakers: _BreakerCollector | None = None
        self.cost = Counter("plugin_llm_service_cost_usd", "Cost in USD by plugin and model (priced calls only)",
                            ("plugin", "model"), **kw)

    def _series(self, plugin: str, endpoint: str, status: str, model: str) -> tuple:
        """The labelled children of one (plugin, endpoint, status, model), looked up once (labels() is not free)."""
        key = (plugin, endpoint, status, model)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = (
                self.calls.labels(plugin, endpoint, status, model), self.latency.labels(plugin, status, model),
                self.denials.labels(plugin, status) if status in ("denied", "quota") else None,
                self.tokens.labels(plugin, "input", model), self.tokens.labels(plugin, "output", model),
                self.cost.labels(plugin, model))
        return series

    def observe(self, plugin: str, endpoint: str, status: str, seconds: float, usage: Any = None,
                model: str = "default") -> None:
        """``model`` is a route label (``ServiceState.route_label``): a bounded set, never the request's text."""
        calls, latency, denials, tokens_in, tokens_out, cost = self._series(plugin, endpoint, status, model)
        calls.inc()
        latency.observe(seconds)
        if denials is not None:
            denials.inc()
        if usage is not None:
            if usage.input_tokens:
                tokens_in.inc(usage.input_tokens)
            if usage.output_tokens:
                tokens_out.inc(usage.output_tokens)
            if usage.cost_usd:
                cost.inc(usage.cost_usd)

    def watch_breakers(self, states: Any) -> None:
        """Export ``states()`` (route -> its breaker state, the catalog's routes only) as the gauge
        ``plugin_llm_route_breaker_state{route, state}``: 1 for each route's current state."""
        self._breakers = _BreakerCollector(states)
        if not self.multiprocess:
            self.registry.register(self._breakers)

    def refused(self, reason: str) -> None:
        self.denials.labels("", reason).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if self.multiprocess:
            from prometheus_client import CollectorRegistry
            from prometheus_client.multiprocess import MultiProcessCollector

            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            if self._breakers is not None:
                registry.register(self._breakers)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _BreakerCollector:
    """The routes' circuit breakers, read from the store at each scrape."""

    STATES = ("closed", "open", "half_open")

    def __init__(self, states: Any) -> None:
        self._states = states

    def describe(self) -> list:
        return []  # states() reads the store: never at registration

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        gauge = GaugeMetricFamily("plugin_llm_route_breaker_state", "Circuit breaker state of each route of the "
                                  "model catalog (1 for its current state)", labels=("route", "state"))
        for route, state in sorted(self._states().items()):
            for name in self.STATES:
                gauge.add_metric((route, name), 1.0 if state == name else 0.0)
        yield gauge
