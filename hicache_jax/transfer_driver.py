"""`TransferDriver`: starts, polls and ends the device <-> host transfers the tree committed.

The tree's `TransferBook` is the one registry of transfers in flight; for each backup or
load it holds, this attaches a `Moving` (the engine's handles, the plan, when it started),
tells the tree when a backup's last piece is dispatched (its device pages are read: the
engine's programs read them in device order, before any later program writes them), and
ends it exactly once: an ack or a finished load, or, when the engine raised, the
transfer timed out or the device reported an error, the tree's failure path (counted by
cause). Several loads may share one engine start (`start_many`): each keeps its own
`Moving` over the one handle and ends on its own, a landing is landed once, and a timeout
ends them all. Calls go down and results come back: the device pools are passed in and the
pools to use from then on are returned, and an ended transfer comes back as `Ended`.
"""
from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable, Mapping

import jax

from hicache_jax.layout import PoolLayout
from hicache_jax.metrics import FailureCause, TransferCounters
from hicache_jax.plan import Direction, TransferPlan, merge_plans, split_plan
from hicache_jax.transfer import Handle, TransferEngine
from hicache_jax.tree import NodeId, TransferId, TreeCore

log = logging.getLogger("hicache_jax")
Pools = Mapping[str, jax.Array]


@dataclasses.dataclass(eq=False)
class SharedStart:
    """One engine start that moves several loads (`start_many`): one handle, ended once per
    load. A timeout seen by one of them is theirs together, so none waits on a handle its
    siblings gave up on."""

    tids: tuple[TransferId, ...]
    timed_out: bool = False


@dataclasses.dataclass
class Moving:
    """What the data plane holds for one backup or load while it moves."""

    plan: TransferPlan
    started: float
    host_tokens: int = 0         # a load's prompt tokens served from the host, counted when it lands
    handles: list[Handle] = dataclasses.field(default_factory=list)      # its dispatched pieces
    rest: list[TransferPlan] = dataclasses.field(default_factory=list)   # a paced backup's pieces to come
    last_dispatch: float = 0.0   # when its latest piece went (the timeout counts from there)
    shared: SharedStart | None = None   # its one handle moves other loads too (`start_many`)

    def landed(self) -> bool:
        """Every piece dispatched and finished (never blocks; raises a piece's error)."""
        return not self.rest and all([h.done() for h in self.handles])

    def seconds(self) -> float | None:
        """The pieces' own transfer times, summed (None if one was not observed)."""
        times = [h.seconds for h in self.handles]
        return None if None in times else sum(times)

    def pending_landing(self):
        """The landing a deferred load left to a model step, while no step has landed it."""
        return next((h.landing for h in self.handles if _pending(h) is not None), None)


@dataclasses.dataclass(frozen=True)
class Ended:
    """A transfer that ended: `ok`, and for a backup the nodes whose host copies it made durable."""

    tid: TransferId
    ok: bool
    acked: tuple[NodeId, ...] = ()


class TransferDriver:
    def __init__(self, layout: PoolLayout, core: TreeCore, engine: TransferEngine, counters: TransferCounters,
                 clock: Callable[[], float], timeout_s: float):
        self._layout, self._core, self._engine, self._counters = layout, core, engine, counters
        self._clock, self._timeout_s = clock, timeout_s
        self._failed_loads: set[int] = set()    # started loads that failed, until `take_failure` reports them
        self._cache_landed = weakref.WeakSet()  # landings the cache landed itself: a step's `landed=` is a no-op

    def ids(self) -> list[TransferId]:
        """The backups and loads in flight (from the tree's registry)."""
        return sorted((t for t in self._core.in_flight() if t.direction is not Direction.PREFETCH),
                      key=lambda t: (t.direction.value, t.number))

    def pinning(self) -> list[TransferId]:
        """The transfers in flight that keep device pages from eviction: loads (the pages they
        fill) and backups with pieces still to dispatch (pages not read yet)."""
        return [t for t in self.ids() if t.direction is not Direction.BACKUP or self.moving(t).rest]

    def moving(self, tid: TransferId) -> Moving | None:
        return self._core.carrier(tid)

    def start(self, tid: TransferId, plan: TransferPlan, pools: Pools, host_tokens: int = 0,
              piece_bytes: int | None = None, deferred: bool = False) -> tuple[Pools, bool]:
        """Dispatch a transfer the tree has committed: (the pools to use from now on, started?).
        If the engine raises, the transfer ends as failed and the pools are unchanged.
        With `piece_bytes` (backups only) it is only registered, cut into pieces of at most
        that many bytes, which `pump` dispatches as each step's budget allows."""
        now = self._clock()
        if piece_bytes is not None and tid.direction is Direction.BACKUP:
            self._core.attach(tid, Moving(plan, now, rest=split_plan(plan, self._layout, piece_bytes),
                                          last_dispatch=now))
            return pools, True
        try:
            # (an engine stand-in without deferred loads still serves every other transfer)
            pools, handle = self._engine.start(plan, pools, **({"deferred": True} if deferred else {}))
        except Exception:
            log.exception("%s failed to start", tid)
            self._fail(tid, FailureCause.START)
            return pools, False
        self._core.attach(tid, Moving(plan, now, host_tokens, [handle], last_dispatch=now))
        if tid.direction is Direction.BACKUP:
            self._core.backup_read(tid.number)
        return pools, True

    def start_many(self, tids: list[TransferId], plans: list[TransferPlan], pools: Pools,
                   host_tokens: list[int], deferred: bool = False) -> tuple[Pools, bool]:
        """Dispatch several loads the tree committed as one engine start of their merged plan
        (`merge_plans`): (the pools to use from now on, started?). Each load keeps its own
        plan and host tokens (counted as it ends) and shares the one handle, so each ends
        through `complete` as a lone load does; a deferred landing is landed once for all.
        If the engine raises, every one of them ends as failed, once each."""
        if len(tids) == 1:
            return self.start(tids[0], plans[0], pools, host_tokens[0], deferred=deferred)
        now = self._clock()
        try:
            merged = merge_plans(plans)
            pools, handle = self._engine.start(merged, pools, **({"deferred": True} if deferred else {}))
        except Exception:
            log.exception("%s failed to start", ", ".join(map(str, tids)))
            for tid in tids:
                self._fail(tid, FailureCause.START)
            return pools, False
        shared = SharedStart(tuple(tids))
        for tid, plan, tokens in zip(tids, plans, host_tokens, strict=True):
            self._core.attach(tid, Moving(plan, now, tokens, [handle], last_dispatch=now, shared=shared))
        return pools, True

    def landing(self, tid: TransferId):
        """The `Landing` a deferred load left to a model step, while no step has landed it."""
        moving = self.moving(tid) if self._core.is_in_flight(tid) else None
        return None if moving is None else moving.pending_landing()

    def landed(self, landing, token: jax.Array) -> None:
        """A step's output `token` lands `landing`; ValueError if no load in flight waits for it
        (unless the cache landed it itself meanwhile: the step wrote the same bytes again)."""
        if landing in self._cache_landed:
            return
        for tid in self.ids():
            for h in self.moving(tid).handles:
                if _pending(h) is landing:
                    h.landed(token)
                    self._counters.landings["step"] += 1
                    return
        raise ValueError("landed= names no deferred load waiting for a step (already landed, failed, or "
                         "not from this cache)")

    def _land_now(self, moving: Moving, pools: Pools) -> Pools:
        """Land what no step took of a deferred load, before waiting for it."""
        for h in moving.handles:
            if _pending(h) is not None:
                pools = self._engine.land(h.landing, pools)
                self._cache_landed.add(h.landing)
                h.landed(next(iter(pools.values())))
                self._counters.landings["cache"] += 1
        return pools

    def take_failure(self, load_id: int) -> bool:
        """True, once, if the started load `load_id` failed."""
        failed = load_id in self._failed_loads
        self._failed_loads.discard(load_id)
        return failed

    def pump(self, budget: int | None, pools: Pools) -> int:
        """Dispatch paced pieces, oldest transfer first, up to `budget` bytes (at least one
        piece when any waits; None: pacing is off); returns the bytes dispatched."""
        if budget is None:
            return 0
        used = 0
        for tid in self.ids():
            moving = self.moving(tid)
            while moving is not None and moving.rest and \
                    (used == 0 or used + moving.rest[0].nbytes(self._layout) <= budget):
                size = moving.rest[0].nbytes(self._layout)
                if not self._dispatch_piece(tid, moving, pools):
                    break
                used += size
            if used >= budget:
                break
        return used

    def _dispatch_piece(self, tid: TransferId, moving: Moving, pools: Pools) -> bool:
        try:
            _, handle = self._engine.start(moving.rest[0], pools)
        except Exception:
            log.exception("%s: a piece failed to start", tid)
            self._settle(moving)
            self._fail(tid, FailureCause.START)
            return False
        moving.rest.pop(0)
        moving.handles.append(handle)
        moving.last_dispatch = self._clock()
        if not moving.rest:
            self._core.backup_read(tid.number)
        return True

    @staticmethod
    def _settle(moving: Moving) -> None:
        """Wait out every dispatched piece, errors ignored: before a transfer fails because a
        piece raised, its other pieces must stop writing into pages the failure path frees."""
        for h in moving.handles:
            try:
                if _pending(h) is None:
                    h.wait()
            except Exception:
                pass

    def complete(self, tid: TransferId, pools: Pools, blocking: bool) -> tuple[Pools, Ended | None]:
        """Apply `tid`'s end if it has one: (the pools to use from now on, its `Ended`, or None
        while it is still in flight). Blocking, a paced transfer's remaining pieces all go at
        once, and a deferred load no step took is landed here."""
        moving = self.moving(tid)
        if moving is None:
            raise RuntimeError(f"bug: {tid} is in flight with nothing moving it")
        if moving.shared is not None and moving.shared.timed_out:   # a sibling of its start timed out: so did it
            self._fail(tid, FailureCause.TIMEOUT)
            return pools, Ended(tid, False)
        cause = None
        try:
            if blocking:
                while moving.rest:
                    if not self._dispatch_piece(tid, moving, pools):
                        return pools, Ended(tid, False)
                pools = self._land_now(moving, pools)
                for h in moving.handles:
                    h.wait()
                done = True
            else:
                done = moving.landed()
            # a deferred load waits for the loop's step as long as it takes: never timed out
            busy = any(not h.done() and _pending(h) is None for h in moving.handles) if not done else False
            if busy and self._clock() - moving.last_dispatch > self._timeout_s:
                cause = FailureCause.TIMEOUT
                if moving.shared is not None:
                    moving.shared.timed_out = True
        except Exception as e:
            log.error("%s failed: %s", tid, e)
            cause = FailureCause.COMPLETION
        if cause is None and not done:
            return pools, None
        if cause is not None:
            if cause is not FailureCause.TIMEOUT:   # a timed-out piece may never end: do not wait on it
                self._settle(moving)
            self._fail(tid, cause)
            return pools, Ended(tid, False)
        acked = ()
        if tid.direction is Direction.BACKUP:
            acked = tuple(self._core.ack_backup(tid.number))
        else:
            self._core.finish_load(tid.number)
        seconds = moving.seconds()
        self._counters.record(tid.direction, moving.plan, self._layout, moving.host_tokens,
                              seconds if seconds is not None else self._clock() - moving.started)
        return pools, Ended(tid, True, acked)

    def _fail(self, tid: TransferId, cause: FailureCause) -> None:
        """The tree takes the transfer back (its nodes return to a consistent state); counted."""
        (self._core.fail_backup if tid.direction is Direction.BACKUP else self._core.fail_load)(tid.number)
        self._counters.failures[(tid.direction.value, cause.value)] += 1
        if tid.direction is Direction.LOAD and cause is not FailureCause.START:
            self._failed_loads.add(tid.number)


def _pending(handle) -> object | None:
    """A handle's landing no step has landed yet (stand-in handles have none)."""
    return getattr(handle, "landing", None)
