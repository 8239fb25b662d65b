"""Runs backend calls off the serving thread, bounds them, and degrades on failure.

Every L3 call runs on a small thread pool. A caller that must not block waits at most
`call_timeout_s`; a call that raises or overruns marks the store *degraded* for
`retry_after_s`: calls in that window are not sent at all (reason `unavailable`), so a
dead or stalled store costs the serving loop nothing but a counter and one log line. The
first call after the window is the probe; its success ends the degradation.

A Python thread cannot be cancelled, so a call that overran may still be running and may
still write into the buffers it was given: its `StorageOp.done()` stays False until it
returns, and the caller must not reuse those buffers before then. While such a call has
run longer than `call_timeout_s`, the store counts as stalled and no new call starts.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from hicache_jax.storage.objects import MissReason
from hicache_jax.storage.stats import StorageCounters

log = logging.getLogger("hicache_jax.storage")
R = TypeVar("R")


class StorageOp(Generic[R]):
    """One background L3 call. `done()`: it has returned and its buffers are free again."""

    def __init__(self, future: Future | None, fallback: Callable[[MissReason], R] | None = None,
                 value: R | None = None):
        self._future, self._fallback, self._value = future, fallback, value

    @classmethod
    def finished(cls, value: R) -> "StorageOp[R]":
        return cls(None, value=value)

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block up to `timeout_s` (None: until done); whether the call has returned."""
        if self._future is not None:
            try:
                self._future.exception(timeout=timeout_s)
            except TimeoutError:
                return False
            except CancelledError:
                pass
        return True

    def result(self) -> R:
        """The call's result; it must be done (`done()` or `wait()` returned True)."""
        if not self.done():
            raise RuntimeError("bug: StorageOp.result() before the call returned; wait() or poll done() first")
        if self._future is None:
            return self._value
        if self._future.cancelled():
            return self._fallback(MissReason.CANCELLED)
        return self._future.result()

    def cancel(self) -> bool:
        """Stop the call if it has not started; True when its buffers will never be touched
        (then its result is a `cancelled` miss)."""
        if self._future is not None:
            self._future.cancel()
        return self.done()


class Guard:
    """The pool of I/O threads plus the store's health; shared by every call of one tier."""

    def __init__(self, counters: StorageCounters, io_threads: int, call_timeout_s: float, retry_after_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.counters, self.call_timeout_s, self.retry_after_s, self.clock = counters, call_timeout_s, retry_after_s, clock
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="hicache-l3")
        self._lock = threading.Lock()
        self._down_until: float | None = None     # degraded until then (None: healthy)
        self._running: dict[int, float] = {}       # id of a running call -> its start time
        self._next_id = 0

    @property
    def degraded(self) -> bool:
        with self._lock:
            return self._down_until is not None

    def submit(self, op: str, fn: Callable[[], R], fallback: Callable[[MissReason], R]) -> StorageOp[R]:
        """Run `fn` on an I/O thread; `fallback(reason)` is the result when it is not run or raises."""
        if not self._admit(op):
            return StorageOp.finished(fallback(MissReason.UNAVAILABLE))
        with self._lock:
            call_id, self._next_id = self._next_id, self._next_id + 1
        return StorageOp(self._pool.submit(self._run, op, call_id, fn, fallback), fallback)

    def call(self, op: str, fn: Callable[[], R], fallback: Callable[[MissReason], R]) -> R:
        """`submit` and wait at most `call_timeout_s`; an overrun is a timeout and degrades."""
        pending = self.submit(op, fn, fallback)
        if pending.wait(self.call_timeout_s):
            return pending.result()
        self.failed(op, MissReason.TIMEOUT, f"no answer within {self.call_timeout_s} s")
        return fallback(MissReason.TIMEOUT)

    def failed(self, op: str, reason: MissReason, detail: str) -> None:
        """Count a failed call and degrade (the log line only on the way down)."""
        self.counters.failure(op, reason)
        with self._lock:
            was_up = self._down_until is None
            self._down_until = self.clock() + self.retry_after_s
        if was_up:
            log.warning("L3 storage degraded to host-only serving for %.0f s: %s %s: %s",
                        self.retry_after_s, op, reason, detail)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _admit(self, op: str) -> bool:
        now = self.clock()
        with self._lock:
            stalled = any(now - t > self.call_timeout_s for t in self._running.values())
            down = self._down_until is not None and now < self._down_until
        if stalled and not down:   # a call started in the background has overrun: that is the timeout
            self.failed(op, MissReason.TIMEOUT, f"a call has run for more than {self.call_timeout_s} s")
        elif stalled or down:
            self.counters.failure(op, MissReason.UNAVAILABLE)
        return not (stalled or down)

    def _run(self, op: str, call_id: int, fn: Callable[[], R], fallback: Callable[[MissReason], R]) -> R:
        with self._lock:
            self._running[call_id] = self.clock()
        try:
            value = fn()
        except Exception as e:   # any engine failure: counted, logged, degraded; never raised into serving
            self.failed(op, MissReason.ERROR, f"{type(e).__name__}: {e}")
            return fallback(MissReason.ERROR)
        finally:
            with self._lock:
                self._running.pop(call_id, None)
        with self._lock:
            recovered = self._down_until is not None and self.clock() >= self._down_until
            if recovered:
                self._down_until = None
        if recovered:
            log.warning("L3 storage is back: %s succeeded", op)
        return value
