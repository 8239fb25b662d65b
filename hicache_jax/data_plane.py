"""`DataPlane`: the one owner of a cache's device pools, and of when its transfers start and end.

`HiCache` decides what to do (its API, through the tree core); this carries it out on the
device: it holds the pools the model reads and writes, dispatches the backups the tree
queued and the loads it committed (`TransferDriver`), and applies their ends. Everything
that changes the pools goes through here, so no one else keeps a copy of them.

Timing rules (SYSTEM.md §3-§4): queued backups are merged into one transfer dispatched at
`step()`, except write-back demotions, whose device pages are already free and go at once
(`flush_demotions`), before anything can write those pages again. Completions are applied
only here (`step`, `complete`, `land_in_flight`, `free_room`, `drain`), the one place where in-flight
state ends.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping

import jax

from hicache_jax.config import HiCacheConfig
from hicache_jax.layout import PoolLayout
from hicache_jax.metrics import TransferCounters
from hicache_jax.outcomes import StepReport
from hicache_jax.plan import Direction, TransferPlan
from hicache_jax.pools.host_tier import NO_BLOCK
from hicache_jax.storage_link import StorageLink
from hicache_jax.transfer import TransferEngine
from hicache_jax.transfer_driver import Ended, TransferDriver
from hicache_jax.tree import Tier, TransferId, TreeCore


class DataPlane:
    def __init__(self, layout: PoolLayout, config: HiCacheConfig, core: TreeCore, engine: TransferEngine,
                 clock: Callable[[], float], storage: StorageLink | None):
        self.config, self._core, self.engine, self.storage = config, core, engine, storage
        self.pools: dict[str, jax.Array] = engine.init_device_pools()
        self.counters = TransferCounters()
        self.transfers = TransferDriver(layout, core, engine, self.counters, clock, config.transfer.timeout_s)
        core.ledger.host_freed = engine.host.freed   # a host page the tree frees is dead in its block

    # -- the pools ---------------------------------------------------------------------------
    def adopt(self, pools: Mapping[str, jax.Array], landed=None) -> None:
        """Take the pools a model step returned; `landed`: the `Landing` that step landed.
        Wrong pools raise ValueError and nothing changes."""
        self.engine.check_device_pools(pools)
        if landed is not None:
            self.transfers.landed(landed, next(iter(pools.values())))
        self.pools = dict(pools)

    def warm_landings(self) -> None:
        self.pools = self.engine.warm_landings(self.pools)

    def warm_runs(self) -> None:
        self.pools = self.engine.warm_runs(self.pools)

    # -- transfers -----------------------------------------------------------------------------
    def start(self, tid: TransferId, plan: TransferPlan, host_tokens: int = 0, piece_bytes: int | None = None,
              deferred: bool = False) -> bool:
        """Dispatch a transfer the tree committed; False if it failed to start (the tree took it back)."""
        self.pools, started = self.transfers.start(tid, plan, self.pools, host_tokens, piece_bytes, deferred)
        return started

    def start_many(self, tids: list[TransferId], plans: list[TransferPlan], host_tokens: list[int],
                   deferred: bool = False) -> bool:
        """Dispatch loads the tree committed as one engine start (`TransferDriver.start_many`);
        False if it failed to start (the tree took every one of them back)."""
        self.pools, started = self.transfers.start_many(tids, plans, self.pools, host_tokens, deferred)
        return started

    def complete(self, tid: TransferId, blocking: bool) -> Ended | None:
        """End `tid` if it has ended (waiting for it when `blocking`): its `Ended`, or None;
        a backup's durable host copies go on to the storage tier."""
        self.pools, ended = self.transfers.complete(tid, self.pools, blocking)
        if ended is not None and ended.acked and self.storage is not None:
            self.storage.written(list(ended.acked))
        return ended

    def dispatch_backups(self) -> int | None:
        """Start queued backups: their tokens (0 if they failed to start); None if none was queued."""
        # a queued demotion's device pages are free already: its batch goes whole, now
        pieces = None if self._core.needs_flush else self.config.transfer.backup_bytes_per_step
        if (batch := self._core.take_backup_batch()) is None:
            return None
        return batch.tokens if self.start(batch.transfer, batch.plan, piece_bytes=pieces) else 0

    def flush_demotions(self) -> None:
        """Dispatch a queued write-back demotion before its freed device pages can be written."""
        if self._core.needs_flush:
            self.dispatch_backups()

    def land_in_flight(self, acks: Collection[int]) -> bool:
        """Dispatch queued backups and wait for those of `acks` in flight (the host copies
        of a prefix, still landing); False when nothing was queued or waited for."""
        queued = self.dispatch_backups() is not None
        waited = self._wait([t for t in self.transfers.ids() if t.direction is Direction.BACKUP and t.number in acks],
                            "pending_write")
        return queued or waited

    def free_room(self) -> bool:
        """One move toward device pages for a call short of them, cheapest first: dispatch the
        queued backups (their pages are evictable once read, before the copies land); with
        none queued, wait for the transfers that pin device pages (`TransferDriver.pinning`:
        loads, and backups not read yet; a backup read already frees nothing by landing).
        False when there was nothing to do."""
        return self.dispatch_backups() is not None or self._wait(self.transfers.pinning(), "room")

    def _wait(self, tids: list[TransferId], reason: str) -> bool:
        """Wait for `tids` to end, counting the wait under `reason` (`metrics.WAITS`); False if none."""
        for tid in tids:
            self.complete(tid, blocking=True)
        if tids:
            self.counters.waits[reason] += 1
        return bool(tids)

    def step(self) -> StepReport:
        """Dispatch this step's backups (paced: `backup_bytes_per_step`); apply every transfer that ended."""
        tokens = self.dispatch_backups() or 0
        self.transfers.pump(self.config.transfer.backup_bytes_per_step, self.pools)
        completed, failed = [], []
        for tid in self.transfers.ids():
            ended = self.complete(tid, blocking=False)
            if ended is not None:
                (completed if ended.ok else failed).append(tid)
        for tid in self.storage.in_flight() if self.storage is not None else ():
            if self.storage.finish(tid) is not None:
                completed.append(tid)
        return StepReport(tokens, tuple(completed), tuple(failed))

    def drain(self) -> None:
        """Dispatch what is queued and wait for every transfer in flight."""
        self.dispatch_backups()
        for tid in self.transfers.ids():
            self.complete(tid, blocking=True)
        if self.storage is not None:
            self.storage.drain()

    def check(self) -> None:
        """The pools are placed as the engine expects; every transfer in flight is moving; the
        host blocks add up, and no page the tree has free lives in one."""
        self.engine.check_device_pools(self.pools)
        for allocator, table in self.engine.host.tables.items():
            table.check_invariants()
            free = self._core.ledger.allocators(Tier.HOST)[allocator].free_pages()
            mapped = free[table.block_of[free] != NO_BLOCK]
            assert not mapped.size, f"free host pages {mapped.tolist()} of {allocator} still live in a block"
        unmoved = sorted(str(t) for t in self._core.in_flight() if self._core.carrier(t) is None)
        if unmoved:
            raise AssertionError(f"bug: transfers in flight with nothing moving them: {unmoved}")


def time_phases(core: TreeCore, data: DataPlane) -> dict[str, float]:
    """Wrap the tree's match and load planning, the engine's start and the driver's
    completion with timers adding up in the returned dict (`HiCache.time_phases`)."""
    spent: dict[str, float] = {}
    for name, owner, method in (("match", core, "match_prefix"), ("plan", core, "start_load"),
                                ("dispatch", data.engine, "start"), ("wait", data.transfers, "complete")):
        setattr(owner, method, _timed(spent, name, getattr(owner, method)))
    return spent


def _timed(spent: dict[str, float], name: str, fn: Callable) -> Callable:
    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
    return timed
