"""Execution middleware (``ctx.register_middleware``): plugins wrapping the host's model and tool calls.

Request middleware (``llm_request``, ``tool_request``) may return ``{"request": {...}}`` /
``{"args": {...}}`` to replace what is about to run (``tool_request`` runs before the
``pre_tool_call`` guards). Execution middleware (``llm_execution``, ``tool_execution``, Hermes's
``hermes_cli.middleware``) wraps the call: ``next_call(payload=None)`` runs the rest of the chain
once and returns its result; the first registered is outermost.

Each callback is isolated like a hook under ``plugins.hook_timeout``, counting its own time only,
never the time downstream in ``next_call``. A callback that raises, overruns or returns something
unusable is reported and skipped; an error of the downstream call reaches the host unchanged; an
abandoned callback that calls ``next_call`` later is refused. Payloads and results are read as
plain data (:func:`.untrusted.plain`). Signatures: docs/plugin-authors.md.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from time import monotonic
from typing import Any, Callable

from .hooks import HookEntry, TELEMETRY_SCHEMA_VERSION, call_limited
from .tracebacks import frames_text
from .untrusted import SIGINT_WATCH, error_text

__all__ = [
    "LLM_EXECUTION",
    "TOOL_EXECUTION",
    "LLM_REQUEST",
    "TOOL_REQUEST",
    "VALID_MIDDLEWARE",
    "MIDDLEWARE_SCHEMA_VERSION",
    "OBSERVER_SCHEMA_VERSION",
    "MiddlewareEntry",
    "MiddlewareError",
    "run_chain",
    "apply_requests",
]

_log = logging.getLogger("plugin_llm.plugins")

LLM_EXECUTION = "llm_execution"
TOOL_EXECUTION = "tool_execution"
LLM_REQUEST = "llm_request"
TOOL_REQUEST = "tool_request"
#: Hermes's middleware kinds (all four are run by this host)
VALID_MIDDLEWARE = frozenset({LLM_EXECUTION, TOOL_EXECUTION, LLM_REQUEST, TOOL_REQUEST})
RUN_KINDS = frozenset({LLM_EXECUTION, TOOL_EXECUTION})
REQUEST_KINDS = frozenset({LLM_REQUEST, TOOL_REQUEST})
OBSERVER_SCHEMA_VERSION = TELEMETRY_SCHEMA_VERSION
MIDDLEWARE_SCHEMA_VERSION = "hermes.middleware.v1"


class MiddlewareError(RuntimeError):
    """A middleware callback misused ``next_call`` (called twice, or after it was abandoned)."""


@dataclass(frozen=True)
class MiddlewareEntry:
    kind: str
    plugin_key: str
    callback: Callable[..., Any]
    _hook: HookEntry

    @classmethod
    def create(cls, kind: str, plugin_key: str, callback: Callable[..., Any]) -> "MiddlewareEntry":
        return cls(kind, plugin_key, callback, HookEntry.create(kind, plugin_key, callback))


class _Downstream(Exception):
    """The downstream call's own error, carried through a callback to the host unchanged."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(type(original).__name__))
        self.original = original


class _Frame:
    """One callback's run: its own time (downstream excluded), whether it was abandoned."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.started = monotonic()
        self.downstream_since: float | None = None
        self.downstream_total = 0.0
        self.done = False
        self.abandoned = False
        self.next_called = False
        self.next_ok = False
        self.next_result: Any = None
        self.result: Any = None
        self.error: BaseException | None = None

    def own_time(self) -> float:
        now = monotonic()
        inside = now - self.downstream_since if self.downstream_since is not None else 0.0
        return now - self.started - self.downstream_total - inside


#: ``on_error(entry, what, error)``: a callback failed (``error``: what it raised, None for a
#: timeout or an unusable result). The manager logs and audits it (``hook_error``, with the
#: plugin's frames, once per distinct failure: see :class:`.tracebacks.FailureReporter`).
OnError = Callable[[MiddlewareEntry, str, "BaseException | None"], None]


def _report(entry: MiddlewareEntry, what: str, on_error: OnError | None, error: BaseException | None = None) -> None:
    if on_error is None:  # no reporter: the log still says it, with the plugin's frames at DEBUG

        _log.warning("middleware %s of plugin %s %s", entry.kind, entry.plugin_key, what)
        if error is not None:
            _log.debug("middleware %s of plugin %s failed:%s", entry.kind, entry.plugin_key, frames_text(error))
        return
    try:
        on_error(entry, what, error)
    except Exception:  # reporting never breaks the call
        pass


def run_chain(
    kind: str,
    entries: list[MiddlewareEntry],
    terminal: Callable[[Any], Any],
    payload: Any,
    *,
    payload_key: str,
    context: dict[str, Any],
    timeout: float,
    accept_payload: Callable[[Any], Any],
    accept_result: Callable[[Any], Any],
    on_error: OnError | None = None,
) -> Any:
    """Run ``terminal(payload)`` through ``entries`` (see the module docstring).

    ``accept_payload(value)`` / ``accept_result(value)`` return the value to use
    or raise ``ValueError`` (the callback is then treated as failed).
    """

    def call_at(index: int, current: Any) -> Any:
        if index >= len(entries):
            return terminal(current)
        entry = entries[index]
        frame = _Frame()

        def next_call(next_payload: Any = None) -> Any:
            with frame.cond:
                if frame.abandoned:
                    raise MiddlewareError(f"middleware {kind} of plugin {entry.plugin_key}: next_call() after its "
                                          "time limit; the call went on without it")
                if frame.next_called:
                    raise MiddlewareError(f"middleware {kind} of plugin {entry.plugin_key} called next_call() twice; "
                                          "downstream execution is single-use")
                frame.next_called = True
            use = current if next_payload is None else accept_payload(next_payload)
            with frame.cond:
                frame.downstream_since = monotonic()
                frame.cond.notify_all()
            try:
                result = call_at(index + 1, use)
            except BaseException as exc:
                raise _Downstream(exc) from None
            finally:
                with frame.cond:
                    frame.downstream_total += monotonic() - (frame.downstream_since or monotonic())
                    frame.downstream_since = None
                    frame.cond.notify_all()
            frame.next_ok, frame.next_result = True, result
            return result

        kwargs = {
            **context,
            "telemetry_schema_version": OBSERVER_SCHEMA_VERSION,
            "middleware_schema_version": MIDDLEWARE_SCHEMA_VERSION,
            payload_key: current,
            f"original_{payload_key}": payload,
            "next_call": next_call,
        }
        kwargs = entry._hook.select_kwargs(kwargs)

        def run() -> None:
            try:
                value = entry.callback(**kwargs)
            except BaseException as exc:  # isolation: the worker never lets anything out
                value, error = None, exc
            else:
                error = None
            with frame.cond:
                frame.result, frame.error, frame.done = value, error, True
                frame.cond.notify_all()

        thread = threading.Thread(target=run, name=f"plugin-middleware-{kind}", daemon=True)
        sigint = SIGINT_WATCH.enter()
        try:
            thread.start()
            with frame.cond:
                while not frame.done:
                    if frame.downstream_since is not None:
                        frame.cond.wait()  # downstream has its own limits
                        continue
                    remaining = timeout - frame.own_time()
                    if remaining <= 0:
                        frame.abandoned = True
                        break
                    frame.cond.wait(remaining)
        finally:
            if SIGINT_WATCH.leave(sigint):
                raise KeyboardInterrupt
        if frame.abandoned:
            _report(entry, f"did not return within {timeout:g}s (plugins.hook_timeout); skipped", on_error)
            return frame.next_result if frame.next_ok else call_at(index + 1, current)
        if type(frame.error) is _Downstream:
            raise frame.error.original
        if frame.error is not None:
            _report(entry, f"raised {error_text(frame.error)}; skipped", on_error, frame.error)
            if frame.next_ok:
                return frame.next_result
            if frame.next_called:  # its downstream failed inside, then it raised something else
                raise frame.error if isinstance(frame.error, MiddlewareError) else MiddlewareError(
                    f"middleware {kind} of plugin {entry.plugin_key} failed after calling next_call()")
            return call_at(index + 1, current)
        try:
            return accept_result(frame.result)
        except ValueError as exc:
            _report(entry, f"returned an unusable result ({exc}); skipped", on_error)
            return frame.next_result if frame.next_ok else call_at(index + 1, current)

    return call_at(0, payload)


def apply_requests(
    kind: str,
    entries: list[MiddlewareEntry],
    payload: Any,
    *,
    payload_key: str,
    context: dict[str, Any],
    timeout: float,
    accept_payload: Callable[[Any], Any],
    on_error: OnError | None = None,
) -> Any:
    """Request middleware: each callback may replace the payload (``{payload_key: new}``)."""
    original = payload
    for entry in entries:
        kwargs = entry._hook.select_kwargs({
            **context,
            "telemetry_schema_version": OBSERVER_SCHEMA_VERSION,
            "middleware_schema_version": MIDDLEWARE_SCHEMA_VERSION,
            payload_key: payload,
            f"original_{payload_key}": original,
        })
        outcome = call_limited(kind, entry.plugin_key, lambda: entry.callback(**kwargs), timeout)
        if outcome.error is not None:
            _report(entry, f"failed ({outcome.error_text}); skipped", on_error,
                    None if outcome.timed_out else outcome.error)
            continue
        value = outcome.value  # plain data, read under the time limit
        if type(value) is not dict or payload_key not in value:
            continue
        try:
            payload = accept_payload(value[payload_key])
        except ValueError as exc:
            _report(entry, f"returned an unusable {payload_key} ({exc}); ignored", on_error)
    return payload
