"""Plugin code under a time limit, isolated: how hook callbacks (and any plugin callable) run.

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
import weakref
from time import monotonic
from typing import Any, Callable

from .hook_entries import HookEntry, HookOutcome, HookTimeoutError
from .untrusted import SIGINT_WATCH, HostInterrupt, UnusableValue, error_text, plain, type_name

__all__ = ["CURRENT_LIMIT", "call_limited", "mark_self_limited"]

_log = logging.getLogger("plugin_llm.plugins")

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
#: Extra seconds the runner waits on a callback that enforces the limit itself (an isolated
#: plugin's proxy stops its process a little under the limit): on a loaded host the runner's
#: own timer must not win that race, or the outcome would depend on scheduling.
_SELF_LIMITED_SLACK = 2.0
_SELF_LIMITED: "weakref.WeakSet[Callable[..., Any]]" = weakref.WeakSet()


def mark_self_limited(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as enforcing the current hook limit itself (see :data:`_SELF_LIMITED_SLACK`)."""
    _SELF_LIMITED.add(fn)
    return fn


def _limit_for(entry: HookEntry, timeout: float) -> float:
    """The runner's own limit for ``entry``: the hook's, or past it for a self-limited callback."""
    if entry.callback in _SELF_LIMITED:
        return min(timeout + _SELF_LIMITED_SLACK, threading.TIMEOUT_MAX)
    return timeout


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
            signal.setitimer(signal.ITIMER_REAL, _limit_for(entry, timeout))  # replaces the previous timer
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
            limit = _limit_for(batch.calls[index][0], timeout)
            if elapsed < limit:
                wait = limit - elapsed
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
