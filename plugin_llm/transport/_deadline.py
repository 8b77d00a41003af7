"""The call's total deadline on sync attempts: bounded socket operations, worker threads.

httpx's timeouts are per operation: a server that sends one byte every 0.2 s
never trips a read timeout. While an attempt runs on a thread
(``IO.deadline`` set), every httpcore socket operation of that thread
(connect, TLS handshake, each read and write) gets at most the time left
before the deadline (:func:`bound_httpcore_io`). That bounds a sync attempt to
a provider reached only through httpx (:data:`INLINE_PROVIDERS`, and the fast
path's own client), which therefore runs inline on the caller's thread. Any
other provider runs on a worker thread (:data:`WORKERS`) and the caller stops
waiting at the deadline; a late answer is discarded.
"""

from __future__ import annotations

import contextvars
import functools
import queue
import threading
import time
from typing import Any

from plugin_llm.routing import Route
from plugin_llm.transport._keys import Key, provider_call

__all__ = ["INLINE_PROVIDERS", "IO", "WORKERS", "Job", "DeadlineExpired", "bound_httpcore_io", "runs_inline"]

#: litellm providers whose sync calls do all their I/O through httpx with the key
#: we pass (no SDK credentials, no sleeps between polls): with every socket
#: operation bounded by the deadline, an attempt to them runs on the caller's
#: thread. Any provider not listed runs on a worker thread (always safe, a
#: little slower). ``local`` is the embedded model: in process, no I/O.
INLINE_PROVIDERS = frozenset({
    "local", "openai", "openrouter", "anthropic", "gemini", "groq", "mistral", "codestral", "deepseek",
    "together_ai", "perplexity", "fireworks_ai", "deepinfra", "cerebras", "sambanova", "nvidia_nim",
    "moonshot", "nebius", "hyperbolic", "dashscope", "cohere", "cohere_chat", "ollama", "ollama_chat",
    "lm_studio", "llamafile", "hosted_vllm", "litellm_proxy",
})


class DeadlineExpired(TimeoutError):
    """The caller stopped waiting for a sync attempt at the call's deadline."""


class Job:
    """One sync attempt handed to a worker thread."""

    __slots__ = ("fn", "kwargs", "key", "deadline", "context", "done", "response", "failure")

    def __init__(self, fn: Any, kwargs: dict[str, Any], key: Key, deadline: float) -> None:
        self.fn, self.kwargs, self.key, self.deadline = fn, kwargs, key, deadline
        self.context = contextvars.copy_context()
        self.done = threading.Lock()
        self.done.acquire()
        self.response: Any = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        IO.deadline = self.deadline  # a worker thread runs one attempt at a time
        try:
            if time.monotonic() >= self.deadline:  # a job that waited past its deadline is not started
                self.failure = DeadlineExpired("the call's deadline passed before the attempt could start")
            else:
                self.response = self.context.run(provider_call, self.fn, self.kwargs, self.key)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which maps it
            self.failure = exc
        finally:
            IO.deadline = None
            self.fn = self.kwargs = self.context = None  # an abandoned job keeps nothing alive
            self.done.release()


class Workers:
    """Daemon threads that run sync attempts, so that the caller can stop waiting at the deadline.

    Threads are reused (a thread start costs more than a hand-over), started
    when none is idle (an attempt never queues behind a stuck one) and leave
    after :attr:`idle_seconds` without work. Daemon threads: an attempt
    abandoned at its deadline never holds up interpreter exit.
    """

    idle_seconds = 30.0

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work that no submitter has claimed yet

    def run(self, job: Job) -> bool:
        """Run ``job`` on a worker; True when it finished before its deadline."""
        with self._lock:
            claimed = self._idle > 0
            if claimed:
                self._idle -= 1
        self._queue.put(job)
        if not claimed:
            threading.Thread(target=self._loop, name="plugin-llm-attempt", daemon=True).start()
        return job.done.acquire(timeout=max(job.deadline - time.monotonic(), 0.0))

    def _loop(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # no submitter counts on this thread: leave
                        self._idle -= 1
                        return
                continue  # a submitter claimed an idle thread: its job is on the way
            job.run()
            job = None  # type: ignore[assignment]
            with self._lock:
                self._idle += 1


WORKERS = Workers()

#: ``IO.deadline``: the monotonic deadline of the attempt running on this thread, if any
IO = threading.local()
IO_BOUNDED = False  # whether bound_httpcore_io found httpcore's sync backend


def bound_httpcore_io() -> None:
    """Bound every httpcore sync socket operation of a thread running an attempt by its deadline.

    httpx's timeouts are per operation: a server that sends one byte every
    0.2 s never trips a read timeout. On a thread running an attempt
    (``IO.deadline`` set) each read, write, connect and TLS handshake gets
    at most the time left, and fails with httpcore's own timeout error once
    the deadline has passed, which litellm maps to a Timeout for every
    provider it reaches through httpx. Other threads, and the process's
    other httpx users, are not affected. If httpcore's layout differs from
    the one known here, nothing is patched and every network attempt runs on
    a worker thread: the caller's deadline still holds, only an abandoned
    attempt may then run on until the provider's stack gives up.
    """
    global IO_BOUNDED
    try:
        import httpcore
        from httpcore._backends import sync as backend
    except ImportError:  # pragma: no cover - litellm always brings httpx/httpcore
        return
    targets = (
        (getattr(backend, "SyncStream", None), "read", 1, httpcore.ReadTimeout),
        (getattr(backend, "SyncStream", None), "write", 1, httpcore.WriteTimeout),
        (getattr(backend, "SyncStream", None), "start_tls", 2, httpcore.ConnectTimeout),
        (getattr(backend, "TLSinTLSStream", None), "read", 1, httpcore.ReadTimeout),
        (getattr(backend, "TLSinTLSStream", None), "write", 1, httpcore.WriteTimeout),
        (getattr(backend, "SyncBackend", None), "connect_tcp", 2, httpcore.ConnectTimeout),
    )
    if any(cls is None or not callable(getattr(cls, name, None)) for cls, name, _, _ in targets):
        return
    for cls, name, position, expired in targets:
        original = getattr(cls, name)
        if not getattr(original, "_plugin_llm_bounded", False):
            setattr(cls, name, _bounded(original, position, expired))
    IO_BOUNDED = True


def _bounded(original: Any, position: int, expired: type[Exception]) -> Any:
    """``original`` with its ``timeout`` argument (keyword, or positional at ``position``) capped."""

    @functools.wraps(original)
    def bounded(self: Any, *args: Any, **kwargs: Any) -> Any:
        deadline = getattr(IO, "deadline", None)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise expired("the call's total deadline passed")
            if len(args) > position:
                timeout = args[position]
                if timeout is None or timeout > left:
                    args = (*args[:position], left, *args[position + 1:])
            else:
                timeout = kwargs.get("timeout")
                if timeout is None or timeout > left:
                    kwargs["timeout"] = left
        return original(self, *args, **kwargs)

    bounded._plugin_llm_bounded = True  # type: ignore[attr-defined]
    return bounded


def runs_inline(route: Route) -> bool:
    """Whether a litellm sync attempt on ``route`` runs on the caller's thread (see :data:`INLINE_PROVIDERS`)."""
    provider = route.litellm_model.split("/", 1)[0]
    return provider == "local" or (IO_BOUNDED and provider in INLINE_PROVIDERS)
