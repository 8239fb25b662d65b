"""`TransferHandle`: one in-flight transfer, polled or waited on by the caller."""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import jax

from hicache_jax.plan import TransferPlan

# A blocking wait first polls this long: a short transfer (a one-page hit's 9 MB moves in
# about 0.2 ms) is seen done without waking a sleeping thread (0.00-0.10 ms off a one-page
# hit on the H200, never slower in 10 paired runs); a long one then sleeps, having burnt at
# most this.
POLL_BEFORE_SLEEP_S = 0.5e-3


class Handle(Protocol):
    """What the cache needs of a transfer in flight: `TransferHandle`, or a stand-in."""

    @property
    def seconds(self) -> float | None:
        """Start to observed completion; None until `done()` or `wait()` has seen it."""

    def done(self) -> bool:
        """True once finished; never blocks; raises the transfer's error."""

    def wait(self) -> None:
        """Block until finished; raises the transfer's error."""


class TransferHandle:
    """A transfer started by `TransferEngine.start`.

    The transfer is complete when every program it dispatched has finished on its device;
    `tokens` are small outputs of the last programs (outputs of one program become ready
    together, when it ends). `done()` polls without blocking, `wait()` blocks; both raise
    the transfer's error, if it failed, every time they are called.

    A deferred load's `landing` (`transfer/landing.py`) is moved by a model step: until
    `landed(token)` names an output of that step, the transfer is not done, and `wait()`
    refuses (its owner lands it first: `TransferEngine.land`).
    """

    def __init__(self, plan: TransferPlan, nbytes: int, started: float, tokens: Sequence[jax.Array] = (),
                 error: BaseException | None = None, landing=None):
        self.plan = plan
        self.nbytes = nbytes      # bytes moved, all pools and ranks
        self._started = started   # time.perf_counter() at start
        self._tokens = list(tokens)
        self._error = error
        self.landing = landing    # a deferred load's part no step has landed yet
        self._seconds: float | None = None
        if not self._tokens and error is None and landing is None:
            self._seconds = time.perf_counter() - started

    def landed(self, token: jax.Array) -> None:
        """The step that produced `token` lands this load's `landing`."""
        if self.landing is None:
            raise RuntimeError("bug: this transfer has no landing left")
        self.landing = None
        self._tokens.append(token)

    @property
    def seconds(self) -> float | None:
        """Start to observed completion (None until `done()` or `wait()` has seen it)."""
        return self._seconds

    def done(self) -> bool:
        """True once the transfer has finished; never blocks. Raises the transfer's error."""
        self._raise()
        if self._seconds is not None:
            return True
        if self.landing is not None or not poll_until_ready(self._tokens, 0.0):
            return False
        self._finish()
        return True

    def wait(self) -> None:
        """Block until the transfer has finished. Raises the transfer's error."""
        self._raise()
        if self.landing is not None:
            raise RuntimeError("bug: waiting for a deferred load that no step has landed")
        if self._seconds is None:
            self._finish()

    def _finish(self) -> None:
        try:
            poll_until_ready(self._tokens, POLL_BEFORE_SLEEP_S)
            jax.block_until_ready(self._tokens)
        except Exception as e:  # the device reported a failure: keep and re-raise it
            self._error = e
            self._raise()
        self._seconds = time.perf_counter() - self._started
        self._tokens = []

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"transfer of {self.plan.direction} plan failed: {self._error}") from self._error

    def __repr__(self) -> str:
        state = "failed" if self._error else ("done" if self._seconds is not None else "in flight")
        return f"TransferHandle({self.plan.direction}, {self.nbytes:,} B, {state})"


def poll_until_ready(tokens: Sequence, seconds: float) -> bool:
    """Poll `tokens` (each with `is_ready()`) for up to `seconds`; True once all are ready.
    Errors of `is_ready` propagate; a token that failed on the device counts as ready
    (`jax.block_until_ready` then raises its error)."""
    deadline = time.perf_counter() + seconds
    while True:
        if all(t.is_ready() for t in tokens):
            return True
        if time.perf_counter() >= deadline:
            return False
