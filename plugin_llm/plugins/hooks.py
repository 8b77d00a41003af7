"""Lifecycle hooks: registration, keyword filtering, isolation and time limits.

Hooks are always called with keyword arguments, and each callback receives only the keywords its
signature accepts (``params`` is an alias of ``args``). A callback that raises or exceeds
``plugins.hook_timeout`` is isolated: the others still run, and the error is logged once per
distinct (plugin, hook, type, message).

The time limit runs inline under ``SIGALRM`` on a main thread without an event loop, else on a
worker of a small daemon pool. On the pool **a timed-out callback keeps running in the
background** (Python cannot stop a thread); its result is discarded. Everything a callback returns
or raises is read through :mod:`.untrusted` while its limit still runs. A ``KeyboardInterrupt`` a
plugin raises is isolated; the operator's Ctrl-C stops the invocation and propagates.
:func:`call_limited` runs any plugin callable (import + ``register(ctx)``) the same way.
What cannot be interrupted, and why two paths: docs/design.md, "Hooks, middleware".
"""

from __future__ import annotations

import _signal  # signal's C functions: signal.signal/getsignal add an enum conversion costing µs
import _thread
import contextvars
import functools
import inspect
import logging
import os
import queue
import signal
import sys
import threading
from dataclasses import dataclass, field
from time import monotonic
from typing import Any, Callable

from .untrusted import SIGINT_WATCH, HostInterrupt, UnusableValue, error_text, exact_str, plain, shown, type_name

__all__ = ["VALID_HOOKS", "NEVER_FIRED", "CALLBACK_TIMEOUT_HOOKS", "FAIL_CLOSED_HOOKS", "SUPPRESSION_SECONDS",
           "TELEMETRY_SCHEMA_VERSION", "HookEntry", "HookOutcome", "HookTimeoutError", "HookSuppressedError",
           "HookRunner", "call_limited"]

_log = logging.getLogger("plugin_llm.plugins")

#: Hermes 0.21.3's hook names. Unknown names are accepted with a warning. Where this host fires
#: each one: :data:`NEVER_FIRED` (never) and docs/plugin-authors.md.
VALID_HOOKS = frozenset(
    {
        "pre_tool_call", "post_tool_call", "transform_terminal_output", "transform_tool_result",
        "transform_llm_output", "pre_llm_call", "post_llm_call",
        "on_stream_start", "on_stream_delta", "on_stream_end", "on_interim_message",
        "pre_verify", "pre_api_request", "post_api_request", "api_request_error",
        "transform_api_error_classification",
        "on_session_start", "on_session_end", "on_session_finalize", "on_session_reset",
        "on_skill_lifecycle", "subagent_start", "subagent_stop", "pre_gateway_dispatch",
        "agent_loop_stopped", "pre_approval_request", "post_approval_response",
        "on_room_member_activity", "pre_transcription",
        "kanban_task_claimed", "kanban_task_completed", "kanban_task_blocked",
        "on_kanban_worker_spawned", "on_kanban_worker_exited", "on_kanban_worker_stale_claim",
        "on_kanban_task_updated", "on_kanban_dispatch_tick",
        "gateway_platform_event", "pre_command",
    }
)
#: Hooks accepted for compatibility that this host has no point to fire: no subagents, no
#: messaging gateway, no approval prompts, no terminal (shell) tool, no skills lifecycle, no
#: rooms, no transcription, no kanban board.
NEVER_FIRED = frozenset(
    {"subagent_start", "subagent_stop", "pre_gateway_dispatch", "pre_approval_request", "post_approval_response",
     "transform_terminal_output", "on_interim_message", "on_skill_lifecycle", "agent_loop_stopped",
     "on_room_member_activity", "pre_transcription", "kanban_task_claimed", "kanban_task_completed",
     "kanban_task_blocked", "on_kanban_worker_spawned", "on_kanban_worker_exited",
     "on_kanban_worker_stale_claim", "on_kanban_task_updated", "on_kanban_dispatch_tick",
     "gateway_platform_event"}
)
#: Hermes's hot-path hooks bounded by ``plugins.hook_callback_timeout`` (timeout = skipped, fail-open).
CALLBACK_TIMEOUT_HOOKS = frozenset(
    {"post_tool_call", "transform_terminal_output", "transform_tool_result", "transform_llm_output",
     "pre_llm_call", "post_llm_call", "pre_api_request", "post_api_request", "api_request_error",
     "pre_verify", "on_session_start", "on_session_end"}
)
#: Policy hooks: a callback that times out, is suppressed or raises blocks (fail-closed).
FAIL_CLOSED_HOOKS = frozenset({"pre_tool_call"})
#: Seconds a callback that timed out and keeps running is skipped for (a hung hook cannot pile up threads).
SUPPRESSION_SECONDS = 60.0
#: Added to every hook's keywords (Hermes's observer schema) except ``gateway_platform_event``.
TELEMETRY_SCHEMA_VERSION = "hermes.observer.v1"
#: The time limit of the hook invocation running on this thread/context (an isolated plugin's
#: process call uses it as its budget); None outside one.
CURRENT_LIMIT: contextvars.ContextVar[float | None] = contextvars.ContextVar("plugin_hook_limit", default=None)
#: The config key that set that limit (named in timeout errors).
_LIMIT_SETTING: contextvars.ContextVar[str] = contextvars.ContextVar("plugin_hook_setting",
                                                                     default="plugins.hook_timeout")

#: Seconds a callback that caught its timeout gets to unwind before every check point raises.
_GRACE = 0.1
#: Interval of the timer while a callback is being forced out (interrupts blocking calls).
_FORCE_INTERVAL = 0.01


class HookTimeoutError(TimeoutError):
    """A hook callback did not return within its time limit (``plugins.hook_callback_timeout`` /
    ``plugins.hook_timeout``)."""


class HookSuppressedError(HookTimeoutError):
    """A callback skipped because it timed out less than :data:`SUPPRESSION_SECONDS` ago."""


@dataclass(frozen=True)
class HookEntry:
    """One registered callback. ``accepts`` is None when it takes ``**kwargs``."""

    hook: str
    plugin_key: str
    callback: Callable[..., Any]
    accepts: frozenset[str] | None
    wants_params: bool = False  # declares ``params`` (alias of ``args``)
    wants_args: bool = False  # declares ``args`` (alias of ``params``)
    _plans: dict = field(default_factory=dict, repr=False, compare=False)  # keyword set -> selection

    @classmethod
    def create(cls, hook: str, plugin_key: str, callback: Callable[..., Any]) -> "HookEntry":
        try:
            parameters = inspect.signature(callback).parameters.values()
        except (TypeError, ValueError):  # some builtins have no signature: pass everything
            return cls(hook, plugin_key, callback, None, True, True)
        accepts: set[str] = set()
        for p in parameters:
            if p.kind is p.VAR_KEYWORD:
                return cls(hook, plugin_key, callback, None, True, True)
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                accepts.add(p.name)
        return cls(hook, plugin_key, callback, frozenset(accepts), "params" in accepts, "args" in accepts)

    def select_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments this callback accepts, with the args/params alias applied."""
        keys = tuple(kwargs)
        plan = self._plans.get(keys)
        if plan is None:
            plan = self._plan(keys)
            if len(self._plans) < 64:  # hosts call each hook with a fixed set of keywords
                self._plans[keys] = plan
        return {target: kwargs[source] for target, source in plan}

    def _plan(self, keys: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        """(argument name, source keyword) pairs for a given set of offered keywords."""
        accepts = self.accepts
        pairs = [(k, k) for k in keys if accepts is None or k in accepts]
        names = {k for k, _ in pairs}
        if self.wants_params and "params" not in names and "args" in keys:
            pairs.append(("params", "args"))
        if self.wants_args and "args" not in names and "params" in keys:
            pairs.append(("args", "params"))
        return tuple(pairs)


class HookOutcome:
    """What one callback did: ``error`` is None on success (``value`` may be None).

    ``value`` is plain data (see :func:`.untrusted.plain`) or an opaque object;
    ``error_text`` is ``Type: message``, bounded, read under the time limit.
    """

    __slots__ = ("entry", "value", "error", "error_text")

    def __init__(self, entry: HookEntry, value: Any = None, error: BaseException | None = None,
                 text: str | None = None) -> None:
        self.entry = entry
        self.value = value
        self.error = error
        self.error_text = text if text is not None or error is None else error_text(error)

    @property
    def timed_out(self) -> bool:
        return isinstance(self.error, HookTimeoutError)

    @property
    def unreadable(self) -> bool:
        """It returned a value that could not be read (in process, or in its own process)."""
        return isinstance(self.error, UnusableValue) or getattr(type(self.error), "remote_type", None) == "UnusableValue"

    def __repr__(self) -> str:
        value = type_name(self.value) if self.value is not None else None
        return (f"HookOutcome(plugin={self.entry.plugin_key!r}, hook={self.entry.hook!r}, "
                f"value={value}, error={self.error_text!r})")


def _settle(value: Any) -> Any:
    """A callback's return value, awaited if needed, as plain data (runs under the time limit)."""
    if type(value) is not str and type(value) is not dict and inspect.isawaitable(value):
        import asyncio  # deferred: most hosts never register an async hook

        value = asyncio.run(_await(value))  # callers guarantee no loop runs on this thread
        if value is None:
            return None
    try:
        return plain(value)
    except UnusableValue as exc:
        raise UnusableValue(f"it returned a {type_name(value)} that cannot be used: {exc}") from None


def _call_one(entry: HookEntry, kwargs: dict[str, Any]) -> HookOutcome:
    try:
        value = entry.callback(**kwargs)
        if value is not None:
            value = _settle(value)
        return HookOutcome(entry, value)
    except BaseException as exc:  # isolation: nothing a plugin raises escapes (a worker never gets a real Ctrl-C)
        return HookOutcome(entry, None, exc, error_text(exc))


async def _await(awaitable: Any) -> Any:
    return await awaitable


# --- inline, under SIGALRM (main thread) ---------------------------------------------------


class _Alarm(HostInterrupt):
    """Raised inside an overrunning inline callback (a BaseException: ``except Exception`` in
    plugin code does not swallow it)."""


class _ForcedAlarm(_Alarm):
    """Raised at every check point of a callback that caught its :class:`_Alarm`.

    Creating it re-trips SIGALRM (``__init__`` is ``interrupt_main(SIGALRM)``,
    a C call). ``raise _ForcedAlarm`` creates it inside the interpreter after the
    handler's last check point, so the trip is not consumed by the handler itself
    but by the plugin's next check point, which raises again: a ``try`` cannot
    hold on to control, the code around it runs into the next raise.
    """

    __init__ = staticmethod(functools.partial(_thread.interrupt_main, signal.SIGALRM))


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # plugin_llm/


def _in_host_code(frame: Any) -> bool:
    """Whether ``frame`` runs the host's own code (plugin_llm, audit, auth), not a plugin's."""
    filename = frame.f_code.co_filename
    if filename.startswith(_PACKAGE_DIR):
        return True
    for name in ("audit", "auth"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path and filename.startswith(os.path.dirname(os.path.abspath(path)) + os.sep):
            return True
    return False


class _InlineRunner:
    """Runs callbacks on the calling (main) thread with an ``ITIMER_REAL`` time limit each."""

    def __init__(self) -> None:
        self.active = False  # an inline invocation is running (nested ones use the pool)
        self.armed = False  # a callback is running under the timer
        self.fired = False  # its time is up and it was interrupted once
        self.forced = False  # it caught that: every check point raises until it is left
        self._handler = self._on_alarm  # one bound method: ``getsignal() is`` works

    def usable(self) -> bool:
        if self.active or not hasattr(signal, "setitimer"):
            return False
        if threading.current_thread() is not threading.main_thread():
            return False
        asyncio = sys.modules.get("asyncio")
        if asyncio is not None and asyncio.events._get_running_loop() is not None:
            return False  # async hooks need a thread without a running loop
        current = _signal.getsignal(signal.SIGALRM)
        if current is not self._handler and current != signal.SIG_DFL:
            return False  # the host uses SIGALRM itself
        return signal.getitimer(signal.ITIMER_REAL)[0] == 0.0

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if not self.armed:
            return  # a late or periodic alarm after the callback returned
        if not self.fired:
            self.fired = True
            signal.setitimer(signal.ITIMER_REAL, _GRACE, _FORCE_INTERVAL)  # in case it is caught
            raise _Alarm()
        self.forced = True
        if frame is not None and _in_host_code(frame):
            return  # never break the host's own invariants (a lock, a chained log); the timer fires again
        raise _ForcedAlarm  # the class, not an instance: see _ForcedAlarm

    def run(self, calls: list[tuple[HookEntry, dict[str, Any]]], timeout: float) -> list[HookOutcome]:
        previous = _signal.signal(signal.SIGALRM, self._handler)
        sigint = SIGINT_WATCH.enter()
        self.active = True
        try:
            outcomes = []
            for entry, kwargs in calls:
                outcomes.append(self._call(entry, kwargs, timeout))
                if SIGINT_WATCH.raised != sigint:  # the operator's Ctrl-C, whatever the plugin did with it
                    raise KeyboardInterrupt
            return outcomes
        finally:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)  # once per invocation: each callback re-arms it
            self.active = False
            SIGINT_WATCH.leave(sigint)
            _signal.signal(signal.SIGALRM, previous)  # pending alarms were handled (as no-ops) before this

    def _call(self, entry: HookEntry, kwargs: dict[str, Any], timeout: float) -> HookOutcome:
        self.fired = self.forced = False
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)  # replaces the previous callback's timer (and interval)
            self.armed = True
            try:
                value = entry.callback(**kwargs)
                if value is not None:
                    value = _settle(value)  # still under the limit: reading it runs plugin code
                outcome = HookOutcome(entry, value)
            except _Alarm:
                raise
            except BaseException as exc:  # isolation: SystemExit, the plugin's own KeyboardInterrupt, ...
                outcome = HookOutcome(entry, None, exc, error_text(exc))  # a hanging __str__ is interrupted too
            finally:
                self.armed = False  # first thing once the callback is left: no alarm raises from here on
        except _Alarm:
            forced = " (it caught the interruption and was forced out)" if self.forced else ""
            error = HookTimeoutError(
                f"did not return within {timeout:g}s ({_LIMIT_SETTING.get()}); it was interrupted{forced}")
            return HookOutcome(entry, None, error, f"HookTimeoutError: {error}")
        return outcome


_INLINE = _InlineRunner()


# --- daemon worker pool ------------------------------------------------------------------


class _WorkerPool:
    """Daemon threads fed from one queue; a new thread is started whenever none is idle.

    Each submitted job is guaranteed a worker of its own (a stuck callback never
    delays another invocation, and nested invocations cannot deadlock).
    """

    def __init__(self, max_idle: int = 8) -> None:
        self._max_idle = max_idle
        self._reset()

    def _reset(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0

    def submit(self, fn: Callable[[Any], Callable[[], Any] | None], arg: Any) -> None:
        """Run ``fn(arg)`` on a worker; a callable it returns is called once the worker is idle again.

        Raises RuntimeError (nothing queued) when no thread can be started, e.g. at shutdown.
        """
        with self._lock:
            if self._idle:
                self._idle -= 1  # reserve an idle worker for this job
                self._jobs.put((fn, arg))
                return
            self._started += 1
            number = self._started
        thread = threading.Thread(target=self._work, args=((fn, arg),), name=f"plugin-hooks-{number}", daemon=True)
        try:
            thread.start()  # a new worker takes this job directly, never from the queue
        except RuntimeError:
            with self._lock:
                self._started -= 1
            raise

    def _work(self, job: tuple[Callable[[Any], Any], Any]) -> None:
        jobs, lock = self._jobs, self._lock
        while True:
            fn, arg = job
            finish = None
            try:
                finish = fn(arg)
            except BaseException:  # pragma: no cover - _run_batch never raises
                _log.exception("hook worker crashed")
            # Count this worker idle *before* the caller learns the job is done, so that the
            # caller's next submit reuses it instead of starting a thread.
            with lock:
                stale = jobs is not self._jobs  # the pool was reset (fork): this thread is stale
                leave = stale or self._idle >= self._max_idle
                if not leave:
                    self._idle += 1
            if finish is not None:
                finish()
            if leave:
                return
            job = jobs.get()


_POOL = _WorkerPool()
if hasattr(os, "register_at_fork"):  # worker threads do not survive fork(); forget them in the child
    os.register_at_fork(after_in_child=_POOL._reset)


class _Batch:
    """The callbacks of one invocation from ``start`` on, run in order by one worker."""

    __slots__ = ("calls", "outcomes", "start", "current", "started", "abandoned", "lock", "done", "context")

    def __init__(self, calls: list[tuple[HookEntry, dict[str, Any]]], outcomes: list[Any], start: int) -> None:
        self.calls = calls
        self.outcomes = outcomes
        self.start = start
        self.current = start
        self.started = monotonic()
        self.abandoned = False
        self.lock = threading.Lock()
        self.done = threading.Lock()
        self.done.acquire()  # released by the worker when every callback has finished
        self.context = contextvars.copy_context()  # callbacks see the caller's context variables


def _run_batch(batch: _Batch) -> Callable[[], Any] | None:
    """Run the batch's callbacks; returns the release of ``done`` (None when abandoned)."""
    return batch.context.run(_run_batch_in_context, batch)


def _run_batch_in_context(batch: _Batch) -> Callable[[], Any] | None:
    calls, outcomes, lock = batch.calls, batch.outcomes, batch.lock
    outcome = None
    for index in range(batch.start, len(calls)):
        with lock:  # one critical section per callback: publish the last result, claim the next
            if batch.abandoned:  # the caller gave up on the previous callback: drop its late result
                return None
            if outcome is not None:
                outcomes[index - 1] = outcome
            batch.current = index
            batch.started = monotonic()
        outcome = _call_one(*calls[index])
    with lock:
        if batch.abandoned:
            return None
        if outcome is not None:
            outcomes[len(calls) - 1] = outcome
    return batch.done.release


def _run_on_pool(calls: list[tuple[HookEntry, dict[str, Any]]], timeout: float) -> list[HookOutcome]:
    outcomes: list[Any] = [None] * len(calls)
    start = 0
    while start < len(calls):
        batch = _Batch(calls, outcomes, start)
        try:
            _POOL.submit(_run_batch, batch)
        except RuntimeError:  # no new threads (interpreter shutdown): run inline, without a time limit
            finish = _run_batch(batch)
            if finish is not None:
                finish()
        start = _wait(batch, timeout)
    return outcomes


def _wait(batch: _Batch, timeout: float) -> int:
    """Wait for the batch; returns where the next batch starts (len(calls) when all done)."""
    wait = timeout
    while not batch.done.acquire(timeout=wait):
        with batch.lock:
            index = batch.current
            if batch.outcomes[index] is not None:  # finished just now; the worker moves on
                wait = timeout
                continue
            elapsed = monotonic() - batch.started
            if elapsed < timeout:
                wait = timeout - elapsed
                continue
            batch.abandoned = True
            entry = batch.calls[index][0]
            error = HookTimeoutError(
                f"did not return within {timeout:g}s ({_LIMIT_SETTING.get()}); it keeps running in the background"
            )
            error.abandoned = True  # type: ignore[attr-defined]  # still running: suppressed (HookRunner.run)
            batch.outcomes[index] = HookOutcome(entry, None, error, f"HookTimeoutError: {error}")
        return index + 1
    return len(batch.calls)


def _run_limited(calls: list[tuple[HookEntry, dict[str, Any]]], timeout: float) -> list[HookOutcome]:
    if _INLINE.usable():
        return _INLINE.run(calls, timeout)
    return _run_on_pool(calls, timeout)


def call_limited(what: str, plugin_key: str, fn: Callable[[], Any], timeout: float) -> HookOutcome:
    """Run ``fn()`` (plugin code) under a hook's time limit and isolation; its outcome.

    Inline under SIGALRM on the main thread, else on a daemon worker that is
    abandoned on timeout. Only the operator's Ctrl-C propagates.
    """
    entry = HookEntry(what, plugin_key, fn, frozenset())
    return _run_limited([(entry, {})], min(float(timeout), threading.TIMEOUT_MAX))[0]


class HookRunner:
    """Registered callbacks per hook and their isolated, time-limited invocation.

    ``timeout`` is called on every invocation (it reads ``plugins.hook_timeout``
    from the current config); ``callback_timeout`` (``plugins.hook_callback_timeout``,
    None when unset or disabled) replaces it for :data:`CALLBACK_TIMEOUT_HOOKS` and
    :data:`FAIL_CLOSED_HOOKS`. A callback that timed out and was left running is
    skipped for :data:`SUPPRESSION_SECONDS`. ``on_error(entry, error, text)`` is called once per
    distinct error with its safe ``Type: message`` text (the manager writes the
    audit ``hook_error`` event).
    """

    _MAX_REPORTED = 1024

    def __init__(
        self,
        timeout: Callable[[], float],
        on_error: Callable[[HookEntry, BaseException, str], None] | None = None,
        callback_timeout: Callable[[], float | None] | None = None,
    ) -> None:
        self._timeout = timeout
        self._callback_timeout = callback_timeout
        self._on_error = on_error
        self._hooks: dict[str, tuple[HookEntry, ...]] = {}  # replaced, never mutated: lock-free reads
        self._lock = threading.Lock()
        self._reported: set[tuple[str, str, str, str]] = set()
        self._suppressed: dict[int, tuple[HookEntry, float]] = {}  # id(entry) -> (entry, until)

    # registration ---------------------------------------------------------------------

    def register(self, hook: str, plugin_key: str, callback: Callable[..., Any]) -> HookEntry:
        if not issubclass(type(hook), str) or not exact_str(hook).strip():
            raise ValueError(f"hook name must be a non-empty string, got {shown(hook)}")
        hook = exact_str(hook).strip()
        if not callable(callback):
            raise TypeError(f"hook {shown(hook)}: callback must be callable, got {type_name(callback)}")
        if hook not in VALID_HOOKS:
            _log.warning(
                "plugin %s registered unknown hook %s (kept; the host fires: %s)",
                plugin_key, shown(hook), ", ".join(sorted(VALID_HOOKS)),
            )
        entry = HookEntry.create(hook, plugin_key, callback)
        with self._lock:
            self._hooks[hook] = self._hooks.get(hook, ()) + (entry,)
        return entry

    def unregister(self, entry: HookEntry) -> None:
        """Drop this one registration (a disposed handle); the plugin's other callbacks stay."""
        with self._lock:
            kept = tuple(e for e in self._hooks.get(entry.hook, ()) if e is not entry)
            self._hooks = {**self._hooks, entry.hook: kept} if kept else {
                h: e for h, e in self._hooks.items() if h != entry.hook}
            self._suppressed.pop(id(entry), None)

    def remove_plugin(self, plugin_key: str) -> None:
        with self._lock:
            self._hooks = {
                hook: kept
                for hook, entries in self._hooks.items()
                if (kept := tuple(e for e in entries if e.plugin_key != plugin_key))
            }
            self._suppressed = {k: v for k, v in self._suppressed.items() if v[0].plugin_key != plugin_key}

    def clear(self) -> None:
        with self._lock:
            self._hooks = {}
            self._suppressed = {}

    def entries(self, hook: str) -> tuple[HookEntry, ...]:
        return self._hooks.get(hook, ())

    def has_hook(self, hook: str) -> bool:
        return bool(self._hooks.get(hook))

    def hooks_of(self, plugin_key: str) -> list[str]:
        return [e.hook for entries in self._hooks.values() for e in entries if e.plugin_key == plugin_key]

    # invocation -----------------------------------------------------------------------

    def limit(self, hook: str) -> tuple[float, str]:
        """(seconds, config key) bounding one callback of ``hook``."""
        if self._callback_timeout is not None and (hook in CALLBACK_TIMEOUT_HOOKS or hook in FAIL_CLOSED_HOOKS):
            seconds = self._callback_timeout()
            if seconds is not None:
                return min(float(seconds), threading.TIMEOUT_MAX), "plugins.hook_callback_timeout"
        return min(float(self._timeout()), threading.TIMEOUT_MAX), "plugins.hook_timeout"

    def run(self, hook: str, kwargs: dict[str, Any]) -> list[HookOutcome]:
        """Every callback's outcome, in registration order (errors, timeouts and skips included)."""
        entries = self._hooks.get(hook)
        if not entries:
            return []
        if hook != "gateway_platform_event" and "telemetry_schema_version" not in kwargs:
            kwargs = {**kwargs, "telemetry_schema_version": TELEMETRY_SCHEMA_VERSION}
        timeout, setting = self.limit(hook)
        outcomes: list[Any] = [None] * len(entries)
        calls, slots = [], []
        now = monotonic()
        for index, entry in enumerate(entries):
            held = self._suppressed.get(id(entry))
            if held is not None and held[0] is entry and held[1] > now:
                error = HookSuppressedError(
                    f"skipped: it timed out less than {SUPPRESSION_SECONDS:g}s ago ({setting})")
                outcomes[index] = HookOutcome(entry, None, error, f"HookSuppressedError: {error}")
                continue
            calls.append((entry, entry.select_kwargs(kwargs)))
            slots.append(index)
        if calls:
            tokens = CURRENT_LIMIT.set(timeout), _LIMIT_SETTING.set(setting)
            try:
                ran = _run_limited(calls, timeout)
            finally:
                _LIMIT_SETTING.reset(tokens[1])
                CURRENT_LIMIT.reset(tokens[0])
            for index, outcome in zip(slots, ran):
                outcomes[index] = outcome
                if outcome.timed_out and getattr(outcome.error, "abandoned", False):
                    self._suppress(outcome.entry)  # an interrupted callback or a stopped process is not
        for outcome in outcomes:
            if outcome.error is not None:
                self.report(outcome)
        return outcomes

    def _suppress(self, entry: HookEntry) -> None:
        with self._lock:
            now = monotonic()
            if len(self._suppressed) >= self._MAX_REPORTED:
                self._suppressed = {k: v for k, v in self._suppressed.items() if v[1] > now}
            self._suppressed[id(entry)] = (entry, now + SUPPRESSION_SECONDS)

    def results(self, hook: str, kwargs: dict[str, Any]) -> list[Any]:
        """Non-None return values of the callbacks that succeeded, in registration order."""
        return [o.value for o in self.run(hook, kwargs) if o.error is None and o.value is not None]

    def report(self, outcome: HookOutcome) -> None:
        """Log and audit (once per distinct text) a failed outcome, or one its caller could not use."""
        entry, error, text = outcome.entry, outcome.error, outcome.error_text or ""
        signature = (entry.plugin_key, entry.hook, text)
        with self._lock:
            if signature in self._reported:
                return
            if len(self._reported) >= self._MAX_REPORTED:
                self._reported.clear()
            self._reported.add(signature)
        _log.warning(
            "hook %s of plugin %s failed: %s (further identical errors are not logged)",
            entry.hook, entry.plugin_key, text,
        )
        if not outcome.timed_out and _log.isEnabledFor(logging.DEBUG):
            _log.debug("hook %s of plugin %s failed:%s", entry.hook, entry.plugin_key, _frames_text(error))
        if self._on_error is not None:
            try:
                self._on_error(entry, error, text)
            except Exception:  # reporting must never break the host
                _log.debug("hook error reporter failed", exc_info=True)


def _frames_text(error: BaseException | None) -> str:
    from .tracebacks import frames_text  # the plugin's own frames, not the host's internals

    return frames_text(error)
