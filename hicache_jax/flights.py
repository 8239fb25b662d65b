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
import weakref
from collections.abc import Callable, Mapping

import jax

from hicache_jax.layout import PoolLayout
from hicache_jax.metrics import FailureCause, TransferCounters
from hicache_jax.plan import Direction, TransferPlan, split_plan
from hicache_jax.transfer import Handle, TransferEngine
from hicache_jax.tree import NodeId, TransferId, TreeCore

log = logging.getLogger("hicache_jax")


@dataclasses.dataclass
class _Flight:
    plan: TransferPlan
    started: float
    host_tokens: int = 0         # a load's prompt tokens served from the host, counted when it lands
    handles: list[Handle] = dataclasses.field(default_factory=list)      # its dispatched pieces
    rest: list[TransferPlan] = dataclasses.field(default_factory=list)   # a paced backup's pieces to come
    last_dispatch: float = 0.0   # when its latest piece went (the timeout counts from there)

    def landed(self) -> bool:
        """Every piece dispatched and finished (never blocks; raises a piece's error)."""
        return not self.rest and all([h.done() for h in self.handles])

    def seconds(self) -> float | None:
        """The pieces' own transfer times, summed (None if one was not observed)."""
        times = [h.seconds for h in self.handles]
        return None if None in times else sum(times)


class Flights:
    def __init__(self, layout: PoolLayout, core: TreeCore, engine: TransferEngine, counters: TransferCounters,
                 clock: Callable[[], float], timeout_s: float, on_acked: Callable[[list[NodeId]], None],
                 pools: Callable[[], Mapping[str, jax.Array]],
                 set_pools: Callable[[Mapping[str, jax.Array]], None]):
        self._layout, self._core, self._engine, self._counters = layout, core, engine, counters
        self._clock, self._timeout_s, self._on_acked, self._pools = clock, timeout_s, on_acked, pools
        self._set_pools = set_pools
        self._flights: dict[TransferId, _Flight] = {}
        self._failed_loads: set[int] = set()    # started loads that failed, until `take_failure` reports them
        self._cache_landed = weakref.WeakSet()  # landings the cache landed itself: a step's `landed=` is a no-op

    def ids(self) -> set[TransferId]:
        return set(self._flights)

    def __contains__(self, tid: TransferId) -> bool:
        return tid in self._flights

    def start(self, tid: TransferId, plan: TransferPlan, pools: Mapping[str, jax.Array],
              host_tokens: int = 0, piece_bytes: int | None = None,
              deferred: bool = False) -> tuple[Mapping[str, jax.Array], bool]:
        """Dispatch a transfer the tree has committed: (the pools to use from now on, started?).
        If the engine raises, the transfer ends as failed and the pools are unchanged.
        With `piece_bytes` (backups only) it is only registered, cut into pieces of at most
        that many bytes, which `pump` dispatches as each step's budget allows."""
        now = self._clock()
        if piece_bytes is not None and tid.direction is Direction.BACKUP:
            self._flights[tid] = _Flight(plan, now, rest=split_plan(plan, self._layout, piece_bytes), last_dispatch=now)
            return pools, True
        try:
            # (an engine stand-in without deferred loads still serves every other transfer)
            pools, handle = self._engine.start(plan, pools, **({"deferred": True} if deferred else {}))
        except Exception:
            log.exception("%s failed to start", tid)
            self._fail(tid, FailureCause.START)
            return pools, False
        self._flights[tid] = _Flight(plan, now, host_tokens, [handle], last_dispatch=now)
        return pools, True

    def landing(self, tid: TransferId):
        """The `Landing` a deferred load left to a model step, while no step has landed it."""
        flight = self._flights.get(tid)
        return None if flight is None else next((h.landing for h in flight.handles
                                                  if _pending(h) is not None), None)

    def landed(self, landing, token: jax.Array) -> None:
        """A step's output `token` lands `landing`; ValueError if no load in flight waits for it
        (unless the cache landed it itself meanwhile: the step wrote the same bytes again)."""
        if landing in self._cache_landed:
            return
        for flight in self._flights.values():
            for h in flight.handles:
                if _pending(h) is landing:
                    h.landed(token)
                    self._counters.landings["step"] += 1
                    return
        raise ValueError("landed= names no deferred load waiting for a step (already landed, failed, or "
                         "not from this cache)")

    def _land_now(self, flight: _Flight) -> None:
        """Land what no step took of a deferred load, before waiting for it."""
        for h in flight.handles:
            if _pending(h) is not None:
                pools = self._engine.land(h.landing, self._pools())
                self._set_pools(pools)
                self._cache_landed.add(h.landing)
                h.landed(next(iter(pools.values())))
                self._counters.landings["cache"] += 1

    def take_failure(self, load_id: int) -> bool:
        """True, once, if the started load `load_id` failed."""
        failed = load_id in self._failed_loads
        self._failed_loads.discard(load_id)
        return failed

    def pump(self, budget: int | None) -> int:
        """Dispatch paced pieces, oldest transfer first, up to `budget` bytes (at least one
        piece when any waits; None: pacing is off); returns the bytes dispatched."""
        if budget is None:
            return 0
        used = 0
        for tid, flight in list(self._flights.items()):
            while flight.rest and (used == 0 or used + flight.rest[0].nbytes(self._layout) <= budget):
                size = flight.rest[0].nbytes(self._layout)
                if not self._dispatch_piece(tid, flight):
                    break
                used += size
            if used >= budget:
                break
        return used

    def _dispatch_piece(self, tid: TransferId, flight: _Flight) -> bool:
        try:
            _, handle = self._engine.start(flight.rest[0], self._pools())
        except Exception:
            log.exception("%s: a piece failed to start", tid)
            self._settle(flight)
            del self._flights[tid]
            self._fail(tid, FailureCause.START)
            return False
        flight.rest.pop(0)
        flight.handles.append(handle)
        flight.last_dispatch = self._clock()
        return True

    @staticmethod
    def _settle(flight: _Flight) -> None:
        """Wait out every dispatched piece, errors ignored: before a transfer fails because a
        piece raised, its other pieces must stop writing into pages the failure path frees."""
        for h in flight.handles:
            try:
                if _pending(h) is None:
                    h.wait()
            except Exception:
                pass

    def complete(self, tid: TransferId, blocking: bool) -> bool | None:
        """Apply `tid`'s end if it has one: True done, False failed, None still in flight.
        Blocking, a paced transfer's remaining pieces all go at once."""
        flight = self._flights[tid]
        cause = None
        try:
            if blocking:
                while flight.rest:
                    if not self._dispatch_piece(tid, flight):
                        return False
                self._land_now(flight)
                for h in flight.handles:
                    h.wait()
                done = True
            else:
                done = flight.landed()
            # a deferred load waits for the loop's step as long as it takes: never timed out
            busy = any(not h.done() and _pending(h) is None for h in flight.handles) \
                if not done else False
            if busy and self._clock() - flight.last_dispatch > self._timeout_s:
                cause = FailureCause.TIMEOUT
        except Exception as e:
            log.error("%s failed: %s", tid, e)
            cause = FailureCause.COMPLETION
        if cause is None and not done:
            return None
        del self._flights[tid]
        if cause is not None:
            if cause is not FailureCause.TIMEOUT:   # a timed-out piece may never end: do not wait on it
                self._settle(flight)
            self._fail(tid, cause)
            return False
        if tid.direction is Direction.BACKUP:
            self._on_acked(self._core.ack_backup(tid.number))
        else:
            self._core.finish_load(tid.number)
        seconds = flight.seconds()
        self._counters.record(tid.direction, flight.plan, self._layout, flight.host_tokens,
                           seconds if seconds is not None else self._clock() - flight.started)
        return True

    def _fail(self, tid: TransferId, cause: FailureCause) -> None:
        """The tree takes the transfer back (its nodes return to a consistent state); counted."""
        (self._core.fail_backup if tid.direction is Direction.BACKUP else self._core.fail_load)(tid.number)
        self._counters.failures[(tid.direction.value, cause.value)] += 1
        if tid.direction is Direction.LOAD and cause is not FailureCause.START:
            self._failed_loads.add(tid.number)


def _pending(handle) -> object | None:
    """A handle's landing no step has landed yet (stand-in handles have none)."""
    return getattr(handle, "landing", None)
