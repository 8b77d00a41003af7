"""Streamed completions: ``ctx.llm.stream(...)`` / ``astream(...)``.

A :class:`PluginLlmStream` is an iterator of text deltas (``str``) and a
context manager; :class:`PluginLlmAsyncStream` is its async twin (``async
for``, ``async with``, or ``await`` to open it). Both drive the *same*
pipeline as ``complete`` (``plugin_llm.call.pipeline``); only the steps
differ: open the provider stream, read a delta, hand it out. When the stream
ends, ``.result`` is the ``PluginLlmCompleteResult``.

Exactly one audit record per stream, written when it ends, fails, or is
abandoned (``close()``, leaving the ``with`` block, dropping it: the
collector's record is written by a helper thread or the stream's event loop,
never from inside the collector).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any, Callable

from plugin_llm.call.steps import Emit, Flow, StreamOpen, StreamProgress, StreamRead

__all__ = ["PluginLlmStream", "PluginLlmAsyncStream", "StreamOpen", "StreamRead", "Emit", "StreamProgress"]


class _Driver:
    """Runs one stream's pipeline generator: performs its steps, stops at each delta.

    ``lock`` is held while the generator runs (``send``, ``throw``, ``close``), never while a step
    is performed: ``close()`` from another thread than the reader's waits for the pipeline to reach
    its next step, then closes it there (the reader's step then ends the stream quietly)."""

    __slots__ = ("flow", "perform", "result", "done", "text", "progress", "loop", "lock", "__weakref__")

    def __init__(self, flow: Flow, perform: Callable[[Any], Any], progress: StreamProgress) -> None:
        self.flow = flow
        self.perform = perform
        self.result: Any = None
        self.done = False
        self.text: list[str] = []
        self.progress = progress
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()

    @property
    def call_id(self) -> str | None:
        return self.progress.call_id

    def _step(self, value: Any, failure: BaseException | None) -> Any:
        with self.lock:
            if self.done:  # closed by another thread while this one performed the step: nothing to say
                return None
            try:
                if failure is not None:
                    return self.flow.throw(failure)
                return self.flow.send(value)
            except StopIteration as end:
                self.done = True
                self.result = end.value
                return None
            except BaseException:
                self.done = True
                raise

    def next_sync(self) -> str | None:
        """The next delta, or None at the end (the result is then set)."""
        step = self._step(None, None)
        while not self.done:
            if type(step) is Emit:
                self.text.append(step.text)
                return step.text
            failure: BaseException | None = None
            try:
                value = self.perform(step)
            except BaseException as exc:  # noqa: BLE001 - audited and re-raised by the flow
                failure, value = exc, None
            try:
                step = self._step(value, failure)
            finally:
                failure = None
        return None

    async def next_async(self) -> str | None:
        step = self._step(None, None)
        while not self.done:
            if type(step) is Emit:
                self.text.append(step.text)
                return step.text
            failure: BaseException | None = None
            try:
                value = await self.perform(step)
            except asyncio.CancelledError:  # the consumer's task was cancelled mid-stream: abandoned
                self.abandon()
                raise
            except BaseException as exc:  # noqa: BLE001 - audited and re-raised by the flow
                failure, value = exc, None
            try:
                step = self._step(value, failure)
            finally:
                failure = None
        return None

    def abandon(self) -> None:
        """Close the pipeline where it stands: it records the stream as abandoned (once)."""
        if self.done:
            return
        with self.lock:
            if not self.done:
                self.done = True
                self.flow.close()


#: whether the cyclic garbage collector is running (its finalizers must not write records)
_collecting = False


def _gc_phase(phase: str, info: Any) -> None:
    global _collecting
    _collecting = phase == "start"


gc.callbacks.append(_gc_phase)


def _abandon_later(driver: _Driver) -> None:
    """An unfinished stream was dropped: record it and give its slot back. Dropped by its last
    reference, at once on this thread (the slot is free when the plugin's code returns); found by
    the collector, not from inside it (an audit write there could wait on a lock this thread
    holds): on a helper thread."""
    if driver.done:
        return
    loop = driver.loop
    if loop is not None:
        try:
            loop.call_soon_threadsafe(driver.abandon)
            return
        except RuntimeError:  # the loop is closed: the connection went with it
            pass
    if not _collecting:
        driver.abandon()
        return
    if threading.main_thread().is_alive():
        try:
            threading.Thread(target=driver.abandon, name="plugin-llm-stream-abandoned", daemon=True).start()
            return
        except RuntimeError:
            pass
    driver.abandon()  # interpreter exit (atexit): no collector on the stack


class _Common:
    _driver: _Driver

    @property
    def result(self) -> Any:
        """The :class:`~plugin_llm.types.PluginLlmCompleteResult` once the stream has ended, else None."""
        return self._driver.result

    @property
    def text(self) -> str:
        """The text delivered so far."""
        return "".join(self._driver.text)

    @property
    def call_id(self) -> str | None:
        """The call's id (the ``call_id`` of its audit record)."""
        return self._driver.call_id

    @property
    def model(self) -> str | None:
        """The model answering (as the provider reports it, once it has), None before the stream is open."""
        result = self._driver.result
        if result is not None:
            return result.model
        stream = self._driver.progress.stream
        return getattr(stream, "model", None)

    @property
    def finish_reason(self) -> str | None:
        """Why the provider ended the reply (``stop``, ``length``, ...), once it has."""
        return getattr(self._driver.progress.stream, "finish_reason", None)

    @property
    def deadline(self) -> float | None:
        """The call's deadline (``time.monotonic()``), once it has been admitted."""
        return self._driver.progress.deadline

    def _abandon(self, why: str) -> None:
        """End the stream now, recorded as abandoned by the host for ``why`` (``stream.abandoned_by``)."""
        if not self._driver.done:
            self._driver.progress.abandoned_by = why
        self._driver.abandon()

    @property
    def finished(self) -> bool:
        """True once the stream ended, failed or was closed."""
        return self._driver.done

    def __repr__(self) -> str:
        state = "finished" if self._driver.done else "open"
        return f"<{type(self).__name__} call_id={self._driver.call_id} {state}, {len(self.text):,} characters>"


class PluginLlmStream(_Common):
    """The text deltas of one streamed completion (``for delta in llm.stream(messages)``).

    Use it as a context manager (or call :meth:`close`) to end it early: the
    provider connection is dropped and the call is recorded as abandoned with
    the number of characters delivered.
    """

    def __init__(self, driver: _Driver, first: str | None) -> None:
        self._driver = driver
        self._first = first
        weakref.finalize(self, _abandon_later, driver)

    def __iter__(self) -> "PluginLlmStream":
        return self

    def __next__(self) -> str:
        first, self._first = self._first, None
        if first is not None:
            return first
        if self._driver.done:
            raise StopIteration
        text = self._driver.next_sync()
        if text is None:
            raise StopIteration
        return text

    def close(self) -> None:
        """End the stream now (abandoned if it had not ended)."""
        self._first = None
        self._driver.abandon()

    def __enter__(self) -> "PluginLlmStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PluginLlmAsyncStream(_Common):
    """Async twin of :class:`PluginLlmStream`: ``async for delta in llm.astream(messages)``.

    ``await llm.astream(...)`` opens the stream (trust, limits and the
    provider's first answer are checked then) and returns it; ``async with``
    and ``async for`` open it on entry. :meth:`aclose` ends it early.
    """

    def __init__(self, driver: _Driver) -> None:
        self._driver = driver
        self._first: str | None = None
        self._opened = False
        weakref.finalize(self, _abandon_later, driver)

    async def _open(self) -> None:
        if not self._opened:
            self._opened = True
            try:
                self._driver.loop = asyncio.get_running_loop()
            except RuntimeError:  # pragma: no cover - always awaited in a loop
                pass
            self._first = await self._driver.next_async()

    def __await__(self):
        return self._opened_self().__await__()

    async def _opened_self(self) -> "PluginLlmAsyncStream":
        await self._open()
        return self

    def __aiter__(self) -> "PluginLlmAsyncStream":
        return self

    async def __anext__(self) -> str:
        if not self._opened:
            await self._open()
        first, self._first = self._first, None
        if first is not None:
            return first
        if self._driver.done:
            raise StopAsyncIteration
        text = await self._driver.next_async()
        if text is None:
            raise StopAsyncIteration
        return text

    def close(self) -> None:
        """End the stream now (abandoned if it had not ended); no I/O to wait for."""
        self._first = None
        self._driver.abandon()

    async def aclose(self) -> None:
        """End the stream now (abandoned if it had not ended)."""
        self.close()

    async def __aenter__(self) -> "PluginLlmAsyncStream":
        await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
