"""`Flights`: the engine's handles of the transfers the tree committed, by `TransferId`.

The tree's `TransferBook` says which transfers are in flight and what they change; this
holds, under the same ids, what the engine returned for each (its handle, its plan, when
it started), polls or waits on them, and applies each end to the tree exactly once: an
ack or a finished load, or, when the engine raised, the transfer timed out or the device
reported an error, the tree's failure path (counted by cause).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

import jax

from hicache_jax.layout import PoolLayout
from hicache_jax.metrics import FailureCause, Tally
from hicache_jax.plan import Direction, TransferPlan, split_plan
from hicache_jax.transfer import Handle, TransferEngine
from hicache_jax.tree import NodeId, TransferId, TreeCore

log = logging.getLogger("hicache_jax")


@dataclasses.dataclass
class _Flight:
    plan: TransferPlan
    handle: Handle
    started: float
    host_tokens: int = 0         # a load's prompt tokens served from the host, counted when it lands
    rest: list[TransferPlan] = dataclasses.field(default_factory=list)  # a paced backup's pieces to come
    piece_started: float = 0.0   # when the piece now in flight was dispatched (the timeout's origin)
    busy_s: float = 0.0          # a paced backup's pieces' own times, summed


class Flights:
    def __init__(self, layout: PoolLayout, core: TreeCore, engine: TransferEngine, tally: Tally,
                 clock: Callable[[], float], timeout_s: float, on_acked: Callable[[list[NodeId]], None],
                 pools: Callable[[], Mapping[str, jax.Array]]):
        self._layout, self._core, self._engine, self._tally = layout, core, engine, tally
        self._clock, self._timeout_s, self._on_acked, self._pools = clock, timeout_s, on_acked, pools
        self._flights: dict[TransferId, _Flight] = {}
        self.failed_loads: set[int] = set()     # started loads that failed, until `wait` reports them

    def ids(self) -> set[TransferId]:
        return set(self._flights)

    def __contains__(self, tid: TransferId) -> bool:
        return tid in self._flights

    def start(self, tid: TransferId, plan: TransferPlan, pools: Mapping[str, jax.Array],
              host_tokens: int = 0, piece_bytes: int | None = None) -> tuple[Mapping[str, jax.Array], bool]:
        """Dispatch a transfer the tree has committed: (the pools to use from now on, started?).
        If the engine raises, the transfer ends as failed and the pools are unchanged.
        `piece_bytes` (backups only) paces it: the first piece of at most that many bytes
        goes now, each later one when `complete` finds the previous one landed."""
        pieces = [plan]
        if piece_bytes is not None and tid.direction is Direction.BACKUP:
            pieces = split_plan(plan, self._layout, piece_bytes)
        try:
            pools, handle = self._engine.start(pieces[0], pools)
        except Exception:
            log.exception("%s failed to start", tid)
            self._fail(tid, FailureCause.START)
            return pools, False
        now = self._clock()
        self._flights[tid] = _Flight(plan, handle, now, host_tokens, pieces[1:], now)
        return pools, True

    def complete(self, tid: TransferId, blocking: bool) -> bool | None:
        """Apply `tid`'s end if it has one: True done, False failed, None still in flight."""
        flight = self._flights[tid]
        cause = None
        try:
            done = self._advance(flight, blocking)
            if not done and self._clock() - flight.piece_started > self._timeout_s:
                cause = FailureCause.TIMEOUT
        except Exception as e:
            log.error("%s failed: %s", tid, e)
            cause = FailureCause.COMPLETION
        if cause is None and not done:
            return None
        del self._flights[tid]
        if cause is not None:
            self._fail(tid, cause)
            return False
        if tid.direction is Direction.BACKUP:
            self._on_acked(self._core.ack_backup(tid.number))
        else:
            self._core.finish_load(tid.number)
        seconds = flight.handle.seconds
        seconds = flight.busy_s + (seconds if seconds is not None else self._clock() - flight.piece_started)
        self._tally.record(tid.direction, flight.plan, self._layout, flight.host_tokens, seconds)
        return True

    def _advance(self, flight: _Flight, blocking: bool) -> bool:
        """True once every piece of `flight` has landed; a landed piece starts the next one
        (all of them, one after another, when `blocking`). Raises a piece's error."""
        while True:
            if blocking:
                flight.handle.wait()
            elif not flight.handle.done():
                return False
            if not flight.rest:
                return True
            flight.busy_s += flight.handle.seconds or 0.0
            _, flight.handle = self._engine.start(flight.rest.pop(0), self._pools())
            flight.piece_started = self._clock()
            if not blocking:
                return False

    def _fail(self, tid: TransferId, cause: FailureCause) -> None:
        """The tree takes the transfer back (its nodes return to a consistent state); counted."""
        (self._core.fail_backup if tid.direction is Direction.BACKUP else self._core.fail_load)(tid.number)
        self._tally.failures[(tid.direction.value, cause.value)] += 1
        if tid.direction is Direction.LOAD and cause is not FailureCause.START:
            self.failed_loads.add(tid.number)
