"""The gateway as an HTTP service: a Starlette app over the one pipeline.

Every call endpoint authenticates the bearer token, takes its plugin key as the caller's identity
and calls ``PluginLlm(plugin_id=<that key>)`` - the same object ``ctx.llm`` is - on the event loop.
Gating, routing, limits and the audit record are the pipeline's; the service adds authentication,
request checks, JSON rendering and metrics. Routes: ``POST /v1/plugin-llm/complete``,
``POST /v1/plugin-llm/complete_structured``, ``POST /v1/chat/completions`` (``stream: true`` as
SSE), ``GET /v1/models[/{id}]`` and ``GET /v1/plugin-llm/limits`` (the token's plugin only), ``GET /healthz``
(also ``/health``), ``/health/ready`` and ``/metrics`` (no token needed); see docs/reference/http-api.md.

A valid token of a disabled plugin gets 403 ``plugin_disabled``. A refused token gets the same 401
and an audit event ``service.auth_denied`` (never the token; aggregated per address:
:mod:`.refusals`). After ``service.failed_auth.max_failures`` refusals from one address within its
window, that address gets 429 with ``Retry-After`` until its block ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from plugin_llm import telemetry
from plugin_llm.auditing import watch_config
from plugin_llm.service import discovery
from plugin_llm.service import requests as req
from plugin_llm.service.errors import (
    PLUGIN_DISABLED_MESSAGE,
    STORE_RETRY_AFTER,
    TOKEN_STORE_MESSAGE,
    TOO_MANY_FAILURES_MESSAGE,
    UNAUTHORIZED_MESSAGE,
    ApiError,
    error_for,
)
from plugin_llm.service.metrics import ServiceMetrics
from plugin_llm.service.refusals import EVENT_AUTH_DENIED, RefusalAudit
from plugin_llm.service.tokens import REASON_BLOCKED, TokenError, token_store_for

__all__ = ["create_app", "ServiceState", "EVENT_AUTH_DENIED", "FILE_CHECK_SECONDS"]

log = logging.getLogger("plugin_llm.service")

#: the refusal reason (audit, metrics, error code) of a valid token whose plugin is in plugins.disabled
REASON_PLUGIN_DISABLED = "plugin_disabled"
_JSON = "application/json"
_STATUS_BY_CODE = {"trust_denied": "denied", "quota_exceeded": "quota", "schema_mismatch": "schema_error",
                   "timeout": "timeout", "provider_error": "provider_error", "invalid_request": "bad_request",
                   "limits_store_unavailable": "store_error"}
#: the /metrics status of a request whose client hung up before its body was read (no call was made)
STATUS_CLIENT_CLOSED = "client_closed"
#: config.yaml and auth.json are looked at (one stat each) at most this often: a change takes effect within it
FILE_CHECK_SECONDS = 0.2
#: a store outage is logged (with the store's own error) at most once in this many seconds per app
_OUTAGE_LOG_SECONDS = 10.0
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(_ENCODER.encode(body).encode("utf-8", "surrogatepass"), status_code=status, media_type=_JSON,
                    headers=headers)


def _error_response(error: ApiError) -> Response:
    return _json(error.status, error.body(), error.headers)


class ServiceState:
    """What the app holds: the home, the token store, one ``PluginLlm`` per plugin, the metrics."""

    def __init__(self, home: Path, *, max_body: int = req.MAX_BODY_BYTES, llm_factory: Callable[[str], Any] | None = None) -> None:
        from plugin_llm.config import get_config_source

        from auth import get_store

        self.home = Path(home)
        self.config = get_config_source(self.home)
        self.config.set_check_interval(FILE_CHECK_SECONDS)  # not a stat of each file per call
        get_store(self.home).set_check_interval(FILE_CHECK_SECONDS)
        self.tokens = token_store_for(self.home, self.config.current())  # limits.store: redis -> tokens there too
        self.metrics = ServiceMetrics()
        self.metrics.watch_breakers(self.breaker_states)
        self.max_body = max_body
        self._llms: dict[str, Any] = {}
        self._factory = llm_factory
        self._outage_logged: dict[str, float] = {}
        self._routes: dict[str, tuple[Any, dict[str, str]]] = {}  # plugin -> (config snapshot, its route labels)
        self.refusals = RefusalAudit(self._write_event)  # one record per client address per window
        from plugin_llm.plugins.settings import SettingsSource

        self._plugins = SettingsSource(self.home)  # plugins.disabled, as the plugin manager reads it

    def plugin_disabled(self, plugin: str) -> bool:
        """``plugin`` is in ``plugins.disabled`` (by key, or by its bare name as the manager matches it)."""
        return self._plugins.current().is_disabled(plugin, plugin.rsplit("/", 1)[-1])

    def log_outage(self, store: str, detail: str) -> None:
        """Log a store's own error for the operator (never in a response), at most once per ``_OUTAGE_LOG_SECONDS``."""
        now = time.monotonic()
        last = self._outage_logged.get(store)
        if last is not None and now - last < _OUTAGE_LOG_SECONDS:
            return
        self._outage_logged[store] = now
        log.warning("service: the %s store is unavailable, requests that need it get 503 (logged at most every "
                    "%g s): %s", store, _OUTAGE_LOG_SECONDS, " ".join(detail.split())[:1000])

    def log_failure(self, code: str, level: int, message: str, *args: Any) -> None:
        """Log the cause of a 5xx (its answer is a fixed text), at most once per ``_OUTAGE_LOG_SECONDS`` per code
        (a plugin repeating a failing call cannot flood the log; every call's audit record has its cause)."""
        now = time.monotonic()
        last = self._outage_logged.get(f"failure:{code}")
        if last is not None and now - last < _OUTAGE_LOG_SECONDS:
            return
        self._outage_logged[f"failure:{code}"] = now
        log.log(level, message + " (logged at most every %g s)", *args, _OUTAGE_LOG_SECONDS)

    def breaker_states(self) -> dict[str, str]:
        """Each catalog route's breaker state (``closed`` unless the store says otherwise); {} when
        the store cannot tell (the scrape still answers)."""
        from plugin_llm.limits import breakers

        config = self.config.current()
        if not config.models or not config.llm.breaker.failures:
            return {}
        try:
            held = breakers.states(config.limits, config.home, time.time())
        except Exception:  # noqa: BLE001 - a broken store must not break the scrape
            return {}
        return {name: held[name].state if name in held else "closed" for name in config.models}

    def route_label(self, plugin: str, model: Any) -> str:
        """The metrics' ``model`` label of a call asking for ``model``: ``default``, one of the routes
        ``GET /v1/models`` lists for ``plugin``, or ``other`` (a client cannot grow the series)."""
        if model is None:
            return discovery.DEFAULT_ROUTE
        if not isinstance(model, str):
            return "other"
        if not model.strip():  # what chat_kwargs takes for the host's route
            return discovery.DEFAULT_ROUTE
        config = self.config.current()
        cached = self._routes.get(plugin)
        if cached is None or cached[0] is not config:  # once per plugin and config snapshot
            provider = (config.model.provider or "").lower()
            labels: dict[str, str] = {}
            for mid, _ in discovery.model_ids(config, plugin):
                labels[mid.strip().lower()] = mid
                if provider and "/" not in mid:
                    labels.setdefault(f"{provider}/{mid.strip().lower()}", mid)
            cached = self._routes[plugin] = (config, labels)
        return cached[1].get(model.strip().lower(), "other")

    def llm(self, plugin: str) -> Any:
        """The pipeline bound to ``plugin`` (built once per plugin and kept)."""
        llm = self._llms.get(plugin)
        if llm is None:
            if self._factory is not None:
                llm = self._factory(plugin)
            else:
                from plugin_llm.llm import PluginLlm

                llm = PluginLlm(plugin_id=plugin, home=self.home)
            self._llms[plugin] = llm
        return llm

    def _write_event(self, event: str, *, force: bool = False, **fields: Any) -> bool:
        from plugin_llm.auditing import write_spare_event

        return write_spare_event(self.home, event, force=force, **fields)  # never rotates the log

    def audit_refusal(self, request: Request, reason: str, info: Any, **extra: Any) -> None:
        """A refused request: recorded at once if it is its address's first in the window, else summarized."""
        client = request.client
        self.refusals.refused(f"{client.host}" if client else None, reason, path=request.url.path[:200],
                              token_id=getattr(info, "id", None), plugin_id=getattr(info, "plugin", None), **extra)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


async def _authenticate(state: ServiceState, request: Request) -> str | Response:
    """The plugin key of the request's token, or the refusal (401, 403, 429, 503; audited).

    A valid token of a plugin in ``plugins.disabled`` gets 403 ``plugin_disabled`` (its holder
    proved the token, so the answer may say why); ``plugins enable`` makes it work again.
    """
    info = await _token(state, request)
    if isinstance(info, Response):
        return info
    if not state.plugin_disabled(info.plugin):
        return info.plugin
    state.metrics.refused(REASON_PLUGIN_DISABLED)
    state.audit_refusal(request, REASON_PLUGIN_DISABLED, info)
    return _json(403, ApiError(403, "PluginLlmAuthError", PLUGIN_DISABLED_MESSAGE.format(plugin=info.plugin),
                               REASON_PLUGIN_DISABLED).body())


async def _token(state: ServiceState, request: Request) -> Any:
    """The request's active token (its ``TokenInfo``), or the refusal (401, 429, 503; audited).

    A token verified less than a second ago is answered from memory; otherwise the
    store (a file, or Redis) is asked on a worker thread, so a slow or stalled store
    never blocks the event loop and the calls of other plugins, once for all the
    concurrent requests with that token from one address. An address with too
    many refused tokens (``service.failed_auth``) gets 429 without its token being
    looked at: from memory once this worker has seen the block, else from the store.
    """
    tokens = state.tokens
    client = request.client.host if request.client else ""
    left = tokens.blocked_here(client)  # memory only; nothing at all while no address is blocked
    if left is not None:
        return _blocked(state, request, left)
    token = _bearer(request)
    problem: str | None = None
    if token is None:
        info, reason = None, "missing"
    else:
        cached = tokens.cached(token)
        if cached is not None:
            return cached
        brake = state.config.current().service.failed_auth
        try:  # the concurrent requests with this token from this address: one lookup (single-flight)
            info, reason, left = await tokens.aauthenticate(token, client, brake)
        except TokenError as exc:  # the store cannot answer: fail closed, and say it is the store
            info, reason, problem = None, "store_error", str(exc)
        token = None
        if reason == REASON_BLOCKED:
            return _blocked(state, request, left)
    if reason == "ok":
        return info
    if problem is not None:  # the store's error (its path or Redis address) is the operator's: log and audit only
        state.metrics.refused(reason)
        state.log_outage("token", problem)
        state.audit_refusal(request, reason, None, detail=problem[:500])
        return _json(503, ApiError(503, "PluginLlmConfigError", TOKEN_STORE_MESSAGE,
                                   "token_store_unavailable").body(), {"Retry-After": STORE_RETRY_AFTER})
    state.metrics.refused(reason)
    state.audit_refusal(request, reason, info)
    return _json(401, ApiError(401, "PluginLlmAuthError", UNAUTHORIZED_MESSAGE, "invalid_token").body(),
                 {"WWW-Authenticate": 'Bearer realm="plugin-llm"'})


def _blocked(state: ServiceState, request: Request, left: float | None) -> Response:
    """429 for an address with too many refused tokens (audited, counted; its token was not looked at)."""
    retry = max(1, math.ceil(left or 1))
    state.metrics.refused(REASON_BLOCKED)
    state.audit_refusal(request, REASON_BLOCKED, None, retry_after=retry)
    return _json(429, ApiError(429, "PluginLlmAuthError", TOO_MANY_FAILURES_MESSAGE.format(seconds=retry),
                               "too_many_failed_authentications").body(), {"Retry-After": str(retry)})


async def _read_body(state: ServiceState, request: Request) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > state.max_body:
        raise req.BadRequest(f"the body is {int(length):,} bytes; at most {state.max_body:,} are accepted",
                             status=413)
    chunks: list[bytes] = []
    size = 0
    receive = request.receive  # the ASGI messages themselves: request.stream()'s generator costs more than a body
    while True:
        message = await receive()
        if message["type"] != "http.request":  # http.disconnect: what request.stream() raises for it
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > state.max_body:
            raise req.BadRequest(f"the body is over {state.max_body:,} bytes; at most {state.max_body:,} are accepted",
                                 status=413)
        if not message.get("more_body", False):
            if not chunks:
                return chunk
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


def _bad_request(exc: req.BadRequest) -> Response:
    code = "body_too_large" if exc.status == 413 else "invalid_request"
    return _error_response(ApiError(exc.status, "ValueError", str(exc), code, param=exc.param))


def _usage_dict(usage: Any) -> dict[str, Any]:
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens, "total_tokens": usage.total_tokens,
            "cache_read_tokens": usage.cache_read_tokens, "cache_write_tokens": usage.cache_write_tokens,
            "cost_usd": usage.cost_usd}


def _result_dict(result: Any) -> dict[str, Any]:
    """A result dataclass as JSON fields (by hand: ``dataclasses.asdict`` deep-copies every value)."""
    data = {"text": result.text, "provider": result.provider, "model": result.model, "agent_id": result.agent_id,
            "usage": _usage_dict(result.usage), "audit": result.audit,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments, "raw_arguments": c.raw_arguments}
                           for c in result.tool_calls]}
    if hasattr(result, "parsed"):
        data["parsed"] = result.parsed
        data["content_type"] = result.content_type
    return data


def _openai_completion(result: Any, created: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text if result.text or not result.tool_calls else None}
    if result.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments}}
                                 for c in result.tool_calls]
    usage = result.usage
    return {
        "id": f"chatcmpl-{result.audit['call_id']}",
        "object": "chat.completion",
        "created": created,
        "model": result.model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if result.tool_calls else "stop"}],
        "usage": {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
                  "total_tokens": usage.total_tokens or usage.input_tokens + usage.output_tokens},
        "plugin_llm": {"call_id": result.audit["call_id"], "provider": result.provider, "cost_usd": usage.cost_usd},
    }


def _outcome(state: ServiceState, plugin: str, endpoint: str, started: float, exc: BaseException | None,
             usage: Any, fields: frozenset[str], model: str = "default") -> Response | None:
    """Count the call (``model``: its route label); for a failure, the error answer."""
    if exc is None:
        state.metrics.observe(plugin, endpoint, "ok", time.perf_counter() - started, usage, model)
        return None
    error = error_for(exc, fields)
    if error.code == "limits_store_unavailable":  # the answer names no store: the log does (the gateway's text)
        state.log_outage("limits", str(exc))
    elif error.status >= 500:  # the answer is a fixed text: the cause (paths, addresses) is the operator's
        state.log_failure(error.code, logging.ERROR if error.code == "internal_error" else logging.WARNING,
                          "service: %s for plugin %s failed (%d %s): %s: %s", endpoint, plugin, error.status,
                          error.code, type(exc).__name__, _detail(exc))
    usage = getattr(exc, "usage", None)
    state.metrics.observe(plugin, endpoint, _STATUS_BY_CODE.get(error.code, "error"), time.perf_counter() - started,
                          usage if dataclasses.is_dataclass(usage) else None, model)
    return _error_response(error)


def _detail(exc: BaseException) -> str:
    """An exception's text for the service's log: one line, bounded, every known secret hidden."""
    from auth.redaction import redact

    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that raises: the type says enough
        return "(no text)"
    return redact(" ".join(text[:4000].split()))[:1000]


def _client_closed(state: ServiceState, plugin: str, endpoint: str, started: float) -> Response:
    """A client that hung up before its request body arrived: no call was made, nothing failed. Counted as
    ``client_closed``, not logged; the answer is never sent (uvicorn drops it for a closed connection)."""
    state.metrics.observe(plugin, endpoint, STATUS_CLIENT_CLOSED, time.perf_counter() - started)
    return Response(status_code=400)


def create_app(home: Path | str | None = None, *, llm_factory: Callable[[str], Any] | None = None,
               max_body: int = req.MAX_BODY_BYTES, warm: bool = True) -> Starlette:
    """The service's ASGI app for ``home`` (default ``$HERMES_HOME``).

    ``llm_factory(plugin) -> PluginLlm`` is a seam for tests; the default builds
    ``PluginLlm(plugin_id=plugin, home=home)``. ``warm`` loads litellm at start-up
    (in a daemon thread, from start-up) so the first call pays little or nothing for the import.
    """
    from plugin_llm.config import hermes_home

    state = ServiceState(Path(home) if home is not None else hermes_home(), max_body=max_body, llm_factory=llm_factory)
    watch_config(state.config)  # telemetry (and its trace context) from the first request on

    async def native(request: Request, api: str) -> Response:
        started = time.perf_counter()
        plugin = await _authenticate(state, request)
        if isinstance(plugin, Response):
            return plugin
        endpoint = "complete" if api == "complete" else "complete_structured"
        fields = req.ALL_FIELDS
        model = "default"
        try:
            body = req.parse_body(await _read_body(state, request))
            model = state.route_label(plugin, body.get("model"))
            llm = state.llm(plugin)
            if api == "complete":
                messages, kwargs = req.complete_kwargs(body)
                result = await llm.acomplete(messages, **kwargs)
            else:
                result = await llm.acomplete_structured(**req.structured_kwargs(body))
        except req.BadRequest as exc:
            _outcome(state, plugin, endpoint, started, exc, None, fields, model)
            return _bad_request(exc)
        except ClientDisconnect:  # the client hung up while sending the body
            return _client_closed(state, plugin, endpoint, started)
        except Exception as exc:  # noqa: BLE001 - every failure becomes its stable error body
            return _outcome(state, plugin, endpoint, started, exc, None, fields, model)
        _outcome(state, plugin, endpoint, started, None, result.usage, fields, model)
        return _json(200, _result_dict(result))

    async def complete(request: Request) -> Response:
        return await native(request, "complete")

    async def complete_structured(request: Request) -> Response:
        return await native(request, "structured")

    async def chat_completions(request: Request) -> Response:
        started = time.perf_counter()
        plugin = await _authenticate(state, request)
        if isinstance(plugin, Response):
            return plugin
        model = "default"
        try:
            body = req.parse_body(await _read_body(state, request))
            model = state.route_label(plugin, body.get("model"))
            messages, kwargs, stream = req.chat_kwargs(body)
            if stream:  # real SSE as the deltas arrive (plugin_llm/service/streaming.py)
                from plugin_llm.service.streaming import chat_stream

                return await chat_stream(
                    state.llm(plugin), messages, kwargs, body.get("stream_options"), metrics=state.metrics,
                    plugin=plugin, started=started, fields=req.ALL_FIELDS, model=model,
                    refuse=lambda exc: _outcome(state, plugin, "chat", started, exc, None, req.ALL_FIELDS, model))
            result = await state.llm(plugin).acomplete(messages, **kwargs)
        except req.BadRequest as exc:
            _outcome(state, plugin, "chat", started, exc, None, req.ALL_FIELDS, model)
            return _bad_request(exc)
        except ClientDisconnect:  # the client hung up while sending the body
            return _client_closed(state, plugin, "chat", started)
        except Exception as exc:  # noqa: BLE001
            return _outcome(state, plugin, "chat", started, exc, None, req.ALL_FIELDS, model)
        _outcome(state, plugin, "chat", started, None, result.usage, req.ALL_FIELDS, model)
        return _json(200, _openai_completion(result, int(time.time())))

    async def healthz(request: Request) -> Response:
        from plugin_llm.transport._loading import loaded_litellm

        # ready: litellm is loaded, so a call pays no import (until then calls wait for it)
        return _json(200, {"status": "ok", "ready": loaded_litellm() is not None, "pid": os.getpid()})

    async def health_ready(request: Request) -> Response:
        from plugin_llm.transport._loading import loaded_litellm

        ready = loaded_litellm() is not None
        return _json(200 if ready else 503, {"status": "ok" if ready else "starting", "ready": ready,
                                             "pid": os.getpid()})

    created = int(time.time())

    async def list_models(request: Request) -> Response:
        plugin = await _authenticate(state, request)
        if isinstance(plugin, Response):
            return plugin
        return _json(200, {"object": "list", "data": discovery.models_for(state.config.current(), plugin, created)})

    async def get_model(request: Request) -> Response:
        plugin = await _authenticate(state, request)
        if isinstance(plugin, Response):
            return plugin
        wanted = request.path_params["id"]
        for model in discovery.models_for(state.config.current(), plugin, created):
            if model["id"] == wanted:
                return _json(200, model)
        shown = wanted[:200]
        return _error_response(ApiError(404, "NotFound", f"the model {shown!r} does not exist or this plugin may not "
                                        "use it; GET /v1/models lists the ones it may", "model_not_found",
                                        param="model"))

    async def plugin_limits(request: Request) -> Response:
        plugin = await _authenticate(state, request)
        if isinstance(plugin, Response):
            return plugin
        body, problem = await asyncio.to_thread(discovery.limits_for, state.config.current(), plugin)
        if problem is not None:
            state.log_outage("limits", problem)
        return _json(200, body)

    async def metrics(request: Request) -> Response:
        data, content_type = await asyncio.to_thread(state.metrics.render)  # the breakers' store, off the loop
        return Response(data, media_type=content_type.split(";")[0], headers={"Content-Type": content_type})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = ("no such endpoint: the service has POST /v1/plugin-llm/complete, /v1/plugin-llm/complete_structured, "
                   "/v1/chat/completions and GET /v1/models, /v1/models/{id}, /v1/plugin-llm/limits, /healthz, /health, "
                   "/health/ready, /metrics") if status == 404 else "method not allowed here"
        return _error_response(ApiError(status, "NotFound" if status == 404 else "MethodNotAllowed", message,
                                        "not_found" if status == 404 else "method_not_allowed"))

    async def server_error(request: Request, exc: Exception) -> Response:
        return _error_response(error_for(RuntimeError()))

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: Starlette):
        if warm:  # litellm's import (seconds) on a daemon thread: the service answers at once, the
            import threading  # first call waits for the import; a stop before then does not

            from plugin_llm.transport._loading import load_litellm

            threading.Thread(target=_quietly, args=(load_litellm,), name="plugin-llm-warm", daemon=True).start()
        try:
            yield
        finally:
            _shutdown(state)

    from plugin_llm.auditpage.app import service_mount  # the auditor's page, with the admin token only

    audit_page = service_mount(state.home, lambda request: state.audit_refusal(request, "invalid_admin_token", None))
    app = _Service(
        {("POST", "/v1/plugin-llm/complete"): complete, ("POST", "/v1/plugin-llm/complete_structured"): complete_structured,
         ("POST", "/v1/chat/completions"): chat_completions},
        server_error,
        routes=[
            Route("/v1/plugin-llm/complete", complete, methods=["POST"]),
            Route("/v1/plugin-llm/complete_structured", complete_structured, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/health", healthz, methods=["GET"]),
            Route("/health/ready", health_ready, methods=["GET"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{id:path}", get_model, methods=["GET"]),
            Route("/v1/plugin-llm/limits", plugin_limits, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            *([audit_page] if audit_page is not None else []),
        ],
        exception_handlers={404: not_found, 405: not_found, 500: server_error},
        lifespan=lifespan,
    )
    app.state.service = state
    return app


class _Service(Starlette):
    """The Starlette app, with the call endpoints dispatched straight from the ASGI call.

    An exact (method, path) match of a hot route runs its handler as Starlette's ``Route`` would - a
    ``Request`` over the scope, the response sent, an unexpected exception answered by the 500 handler
    and re-raised for uvicorn to log - without the middleware and routing layers around it (about a
    tenth of the service's own CPU per call). Everything else (other paths and methods, a trailing
    slash, a ``root_path``, lifespan) goes through Starlette unchanged.
    """

    def __init__(self, hot: dict[tuple[str, str], Callable[[Request], Any]], on_error: Callable[..., Any],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hot = hot
        self._on_error = on_error

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not telemetry.active() or scope["type"] != "http":
            await self._dispatch(scope, receive, send)
            return
        token = telemetry.continue_trace(scope.get("headers"))  # the caller's W3C traceparent, if any
        try:
            await self._dispatch(scope, receive, send)
        finally:
            telemetry.end_trace(token)

    async def _dispatch(self, scope: Any, receive: Any, send: Any) -> None:
        handler = self._hot.get((scope.get("method"), scope.get("path"))) if scope["type"] == "http" else None
        if handler is None or scope.get("root_path"):
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        started = False

        async def sent(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        request = Request(scope, receive, sent)
        try:
            response = await handler(request)
            await response(scope, receive, sent)
        except Exception as exc:
            if not started:
                await (await self._on_error(request, exc))(scope, receive, send)
            raise


def _quietly(function: Callable[[], Any]) -> None:
    try:
        function()
    except Exception:  # noqa: BLE001 - the first call reports the failure with its own error
        pass


def _shutdown(state: ServiceState) -> None:
    """Flush queued limit settlements and refusal counts, close the token file and the audit logs."""
    try:
        state.refusals.close()
    except Exception as exc:  # noqa: BLE001 - shutting down must finish
        log.error("service: writing the refusal summaries failed: %s", type(exc).__name__)
    try:
        from plugin_llm import limits

        limits.close_stores()
    except Exception as exc:  # noqa: BLE001 - shutting down must finish
        log.error("service: closing the limits stores failed: %s", type(exc).__name__)
    state.tokens.close()
    writer = __import__("sys").modules.get("audit.writer")
    if writer is not None:
        writer.close_all()


def app_from_env() -> Starlette:
    """Factory for uvicorn workers (``plugin_llm.service.app:app_from_env``): home from ``$HERMES_HOME``;
    ``PLUGIN_LLM_SERVICE_WARM=0`` skips loading litellm at start-up (for tools and tests that make no call)."""
    fmt = os.environ.get("PLUGIN_LLM_LOG_FORMAT")
    if fmt:  # `plugin-llm --log-format json serve`: each worker's own lines in the same format
        from plugin_llm import oplog

        if fmt in oplog.FORMATS:
            oplog.install(fmt)
    return create_app(warm=os.environ.get("PLUGIN_LLM_SERVICE_WARM", "1").strip() != "0")
