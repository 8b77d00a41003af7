"""Lifecycle hooks: registration, keyword filtering, isolation and time limits.

Hooks are always called with keyword arguments, and each callback receives only
the keywords its signature accepts (``params`` is an alias of ``args``, so the
Hermes hello-world ``on_tool_call(tool_name, params, result)`` works). A callback
that raises or exceeds ``plugins.hook_timeout`` is isolated: the others still
run, and the error is logged once per distinct (plugin, hook, type, message).

Time limits, two ways:

* On the main thread (the CLI, ``chat``, a host's own loop), when no event loop
  runs there and nobody else uses ``SIGALRM``, callbacks run **inline** under an
  interval timer: when one overruns, ``SIGALRM`` raises inside it (sleeps, socket
  reads and lock waits are interrupted too) and it is recorded as timed out. This
  avoids a thread hand-off per invocation (about 70 µs on a small VM). A callback
  stuck inside C code that retries interrupted system calls by itself cannot be
  interrupted this way.
* Everywhere else, the callbacks of one invocation run, in registration order, on
  a worker of a small daemon thread pool while the caller waits. When a callback
  overruns, the caller stops waiting for it, records a timeout and continues with
  the next callbacks on a fresh worker. Python cannot stop a thread, so **a
  timed-out callback keeps running in the background** until it returns; its
  result is discarded. Worker threads are daemons, so a stuck callback never
  prevents the process from exiting.
"""

from __future__ import annotations

import contextvars
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

__all__ = ["VALID_HOOKS", "HookEntry", "HookOutcome", "HookTimeoutError", "HookRunner"]

_log = logging.getLogger("plugin_llm.plugins")

#: Hook names the host fires (SPEC §8). Unknown names are accepted with a warning.
VALID_HOOKS = frozenset(
    {
        "pre_tool_call",
        "post_tool_call",
        "pre_llm_call",
        "post_llm_call",
        "pre_api_request",
        "post_api_request",
        "on_session_start",
        "on_session_end",
        "on_session_finalize",
        "on_session_reset",
        "transform_tool_result",
        "transform_llm_output",
    }
)

_SIMPLE_RESULTS = (str, dict, list, tuple, int, float, bool)


class HookTimeoutError(TimeoutError):
    """A hook callback did not return within ``plugins.hook_timeout``."""


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
    """What one callback did: ``error`` is None on success (``value`` may be None)."""

    __slots__ = ("entry", "value", "error")

    def __init__(self, entry: HookEntry, value: Any = None, error: BaseException | None = None) -> None:
        self.entry = entry
        self.value = value
        self.error = error

    def __repr__(self) -> str:
        return f"HookOutcome(plugin={self.entry.plugin_key!r}, hook={self.entry.hook!r}, value={self.value!r}, error={self.error!r})"


def _call_one(entry: HookEntry, kwargs: dict[str, Any]) -> HookOutcome:
    try:
        value = entry.callback(**kwargs)
        if value is not None and not isinstance(value, _SIMPLE_RESULTS) and inspect.isawaitable(value):
            import asyncio  # deferred: most hosts never register an async hook

            value = asyncio.run(_await(value))  # async hook: a worker thread has no running loop
        return HookOutcome(entry, value)
    except BaseException as exc:  # isolation: nothing a plugin raises escapes (SystemExit included)
        return HookOutcome(entry, None, exc)


async def _await(awaitable: Any) -> Any:
    return await awaitable


# --- inline, under SIGALRM (main thread) ---------------------------------------------------


class _Alarm(BaseException):
    """Raised inside an overrunning inline callback (a BaseException: ``except Exception`` in
    plugin code does not swallow it)."""


class _InlineRunner:
    """Runs callbacks on the calling (main) thread with an ``ITIMER_REAL`` time limit each."""

    def __init__(self) -> None:
        self.active = False  # an inline invocation is running (nested ones use the pool)
        self.armed = False  # a callback is running under the timer

    def usable(self) -> bool:
        if self.active or not hasattr(signal, "setitimer"):
            return False
        if threading.current_thread() is not threading.main_thread():
            return False
        asyncio = sys.modules.get("asyncio")
        if asyncio is not None and asyncio.events._get_running_loop() is not None:
            return False  # async hooks need a thread without a running loop
        if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, self._on_alarm):
            return False  # the host uses SIGALRM itself
        return signal.getitimer(signal.ITIMER_REAL)[0] == 0.0

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.armed = False
            raise _Alarm()

    def run(self, calls: list[tuple[HookEntry, dict[str, Any]]], timeout: float) -> list[HookOutcome]:
        previous = signal.signal(signal.SIGALRM, self._on_alarm)
        self.active = True
        try:
            return [self._call(entry, kwargs, timeout) for entry, kwargs in calls]
        finally:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)  # once per invocation: each callback re-arms it
            self.active = False
            signal.signal(signal.SIGALRM, previous)

    def _call(self, entry: HookEntry, kwargs: dict[str, Any], timeout: float) -> HookOutcome:
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)  # replaces the previous callback's timer
            self.armed = True
            try:
                value = entry.callback(**kwargs)
                if value is not None and not isinstance(value, _SIMPLE_RESULTS) and inspect.isawaitable(value):
                    import asyncio

                    value = asyncio.run(_await(value))
            finally:
                self.armed = False  # an alarm arriving from here on is ignored
            return HookOutcome(entry, value)
        except _Alarm:
            return HookOutcome(entry, None, HookTimeoutError(
                f"did not return within {timeout:g}s (plugins.hook_timeout); it was interrupted"))
        except KeyboardInterrupt:  # the operator's Ctrl-C belongs to the host, not to the plugin
            raise
        except BaseException as exc:  # isolation: nothing a plugin raises escapes (SystemExit included)
            return HookOutcome(entry, None, exc)


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


class HookRunner:
    """Registered callbacks per hook and their isolated, time-limited invocation.

    ``timeout`` is called on every invocation (it reads ``plugins.hook_timeout``
    from the current config); ``on_error(entry, error)`` is called once per
    distinct error (the manager writes the audit ``hook_error`` event).
    """

    _MAX_REPORTED = 1024

    def __init__(
        self,
        timeout: Callable[[], float],
        on_error: Callable[[HookEntry, BaseException], None] | None = None,
    ) -> None:
        self._timeout = timeout
        self._on_error = on_error
        self._hooks: dict[str, tuple[HookEntry, ...]] = {}  # replaced, never mutated: lock-free reads
        self._lock = threading.Lock()
        self._reported: set[tuple[str, str, str, str]] = set()

    # registration ---------------------------------------------------------------------

    def register(self, hook: str, plugin_key: str, callback: Callable[..., Any]) -> HookEntry:
        if not isinstance(hook, str) or not hook.strip():
            raise ValueError(f"hook name must be a non-empty string, got {hook!r}")
        if not callable(callback):
            raise TypeError(f"hook {hook!r}: callback must be callable, got {type(callback).__name__}")
        hook = hook.strip()
        if hook not in VALID_HOOKS:
            _log.warning(
                "plugin %s registered unknown hook %r (kept; the host fires: %s)",
                plugin_key, hook, ", ".join(sorted(VALID_HOOKS)),
            )
        entry = HookEntry.create(hook, plugin_key, callback)
        with self._lock:
            self._hooks[hook] = self._hooks.get(hook, ()) + (entry,)
        return entry

    def remove_plugin(self, plugin_key: str) -> None:
        with self._lock:
            self._hooks = {
                hook: kept
                for hook, entries in self._hooks.items()
                if (kept := tuple(e for e in entries if e.plugin_key != plugin_key))
            }

    def clear(self) -> None:
        with self._lock:
            self._hooks = {}

    def entries(self, hook: str) -> tuple[HookEntry, ...]:
        return self._hooks.get(hook, ())

    def has_hook(self, hook: str) -> bool:
        return bool(self._hooks.get(hook))

    def hooks_of(self, plugin_key: str) -> list[str]:
        return [e.hook for entries in self._hooks.values() for e in entries if e.plugin_key == plugin_key]

    # invocation -----------------------------------------------------------------------

    def run(self, hook: str, kwargs: dict[str, Any]) -> list[HookOutcome]:
        """Every callback's outcome, in registration order (errors and timeouts included)."""
        entries = self._hooks.get(hook)
        if not entries:
            return []
        timeout = min(float(self._timeout()), threading.TIMEOUT_MAX)
        calls = [(entry, entry.select_kwargs(kwargs)) for entry in entries]
        if _INLINE.usable():
            outcomes = _INLINE.run(calls, timeout)
        else:
            outcomes = self._run_on_pool(calls, timeout)
        for outcome in outcomes:
            if outcome.error is not None:
                self._report(outcome.entry, outcome.error)
        return outcomes

    def _run_on_pool(self, calls: list[tuple[HookEntry, dict[str, Any]]], timeout: float) -> list[HookOutcome]:
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
            start = self._wait(batch, timeout)
        return outcomes

    @staticmethod
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
                batch.outcomes[index] = HookOutcome(
                    entry,
                    None,
                    HookTimeoutError(
                        f"did not return within {timeout:g}s (plugins.hook_timeout); "
                        "it keeps running in the background"
                    ),
                )
            return index + 1
        return len(batch.calls)

    def results(self, hook: str, kwargs: dict[str, Any]) -> list[Any]:
        """Non-None return values of the callbacks that succeeded, in registration order."""
        return [o.value for o in self.run(hook, kwargs) if o.error is None and o.value is not None]

    def _report(self, entry: HookEntry, error: BaseException) -> None:
        signature = (entry.plugin_key, entry.hook, type(error).__name__, str(error))
        with self._lock:
            if signature in self._reported:
                return
            if len(self._reported) >= self._MAX_REPORTED:
                self._reported.clear()
            self._reported.add(signature)
        _log.warning(
            "hook %s of plugin %s failed: %s: %s (further identical errors are not logged)",
            entry.hook, entry.plugin_key, type(error).__name__, error,
        )
        if not isinstance(error, HookTimeoutError):
            _log.debug("hook %s of plugin %s traceback", entry.hook, entry.plugin_key, exc_info=error)
        if self._on_error is not None:
            try:
                self._on_error(entry, error)
            except Exception:  # reporting must never break the host
                _log.debug("hook error reporter failed", exc_info=True)
