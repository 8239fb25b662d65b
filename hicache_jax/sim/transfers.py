"""`Transfers`: what `HiCache`'s data plane (engine, transfer driver) and storage link do for one simulated
instance, with time instead of bytes.

Every transfer the tree commits gets a time when it has landed: its bytes (the plan's,
every pool that moves with each allocator) over the rate of its link direction, queued
behind the transfers before it (`Link`). Completions are applied where `HiCache` applies
them, and only there:

    step(now)          dispatch the queued backups; ack every backup landed by `now`
                       (under write-through storage, store its host copy); attach every
                       prefetch landed by `now`
    land_backups(now)  a blocked acquire or alloc: dispatch, wait for every backup in
                       flight, ack them all; returns the time it waited until
    load(job, now)     a load-back, waited for (`acquire` blocks on its own load)
    prefetch(...)      `StorageLink.prefetch` + `finish`: lookup, reserve, read, and wait
                       as the prefetch policy says; what has not landed stays in flight
    drain(now)         everything in flight lands (the serial mode's step boundary)
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from hicache_jax.config import HiCacheConfig, StorageWritePolicy
from hicache_jax.layout import PoolLayout
from hicache_jax.sim.config import Rates
from hicache_jax.sim.links import Link
from hicache_jax.sim.store import SharedStore
from hicache_jax.storage.keys import page_hashes
from hicache_jax.tree import AckId, HostCopy, LoadJob, PrefetchJob, TreeCore
from hicache_jax.tree.match import cap_tokens


@dataclasses.dataclass
class _Prefetch:
    job: PrefetchJob
    done_at: float      # when its reads have landed
    served: int         # leading pages that arrived whole (window at the stop included)


class Transfers:
    """The transfers of one instance's tree (see the module docstring)."""

    def __init__(self, layout: PoolLayout, core: TreeCore, cache: HiCacheConfig, rates: Rates,
                 store: SharedStore | None):
        self._layout, self._core, self._cache, self._rates, self._store = layout, core, cache, rates, store
        self._page = layout.page_size
        self._anchor = layout.anchor.name
        self._page_bytes = {a.name: layout.page_bytes_of(a.name) for a in layout.allocator_pools}
        self.links = {name: Link(name, rate) for name, rate in (
            ("device_to_host", rates.host_link_bytes_per_s), ("host_to_device", rates.host_link_bytes_per_s),
            ("host_to_storage", rates.storage_write_bytes_per_s), ("storage_to_host", rates.storage_read_bytes_per_s))}
        self._backups: dict[AckId, float] = {}       # ack id -> when its copy has landed
        self._prefetches: list[_Prefetch] = []
        self.wakeups: list[float] = []               # landing times not yet handed to the fleet's clock
        self.now = 0.0                               # the time of the call in progress (for the eviction hook)
        self.prefetched_pages = 0                    # pages attached from storage
        if store is not None and cache.storage.write_policy is StorageWritePolicy.WRITE_BACK:
            core.on_host_evict(lambda copy: self.store_copy(copy, self.now))

    # -- device <-> host --------------------------------------------------------------------
    def dispatch_backups(self, now: float) -> None:
        """Close the queued backups into one transfer on the device -> host link."""
        batch = self._core.take_backup_batch()
        if batch is not None:
            done = self.links["device_to_host"].transfer(now, batch.plan.nbytes(self._layout))
            self._backups[batch.ack_id] = done
            self.wakeups.append(done)

    def flush_demotions(self, now: float) -> None:
        """A write-back demotion's device pages are free already: its copy goes now."""
        if self._core.needs_flush:
            self.dispatch_backups(now)

    def step(self, now: float) -> None:
        """`HiCache.step`: dispatch, then apply every backup and prefetch landed by `now`."""
        self.now = now
        self.dispatch_backups(now)
        for ack, done in sorted(self._backups.items()):
            if done <= now:
                self._ack(ack, now)
        landed = [p for p in self._prefetches if p.done_at <= now]
        for p in landed:
            self._prefetches.remove(p)
            self._attach(p)

    def land_backups(self, now: float) -> tuple[float, bool]:
        """Wait for every backup in flight (queued ones dispatched first) and ack them;
        (the time that took until, whether there were any)."""
        self.dispatch_backups(now)
        if not self._backups:
            return now, False
        now = max(now, max(self._backups.values()))
        self.now = now
        for ack in sorted(self._backups):
            self._ack(ack, now)
        return now, True

    def _ack(self, ack: AckId, now: float) -> None:
        del self._backups[ack]
        nodes = self._core.ack_backup(ack)
        if self._store is not None and self._cache.storage.write_policy is StorageWritePolicy.WRITE_THROUGH:
            for node in nodes:
                copy = self._core.host_copy(node)
                if copy is not None:
                    self.store_copy(copy, now)

    def load(self, job: LoadJob, now: float) -> float:
        """A started load-back, waited for: when its pages have landed (the tree is told)."""
        done = self.links["host_to_device"].transfer(now, job.plan.nbytes(self._layout))
        self._core.finish_load(job.load_id)
        return done

    @property
    def backups_in_flight(self) -> int:
        return len(self._backups)

    # -- host <-> storage ---------------------------------------------------------------------
    def store_copy(self, copy: HostCopy | None, now: float) -> None:
        """Write a host copy's pages the store lacks (`StorageLink.write`), one transfer on
        the host -> storage link; they become visible when it has crossed."""
        if copy is None:
            return
        hashes = page_hashes(copy.tokens, self._page)
        todo = {}
        for allocator, host_pages in copy.host_pages.items():
            if host_pages.size and self._page_bytes.get(allocator):
                todo[allocator] = self._store.missing(allocator, [hashes[i] for i in copy.logical_pages[allocator]])
        nbytes = sum(len(pages) * self._page_bytes[a] for a, pages in todo.items())
        done = self.links["host_to_storage"].transfer(now, nbytes)
        for allocator, pages in todo.items():
            self._store.put(allocator, pages, done)

    def prefetch(self, tokens: np.ndarray, hashes: Callable[[], list], now: float
                 ) -> tuple[float, tuple[int, int] | None]:
        """`StorageLink.prefetch` then `finish` with the policy's wait: (the time the request
        goes on at, the pages attached (first, end) or None). `hashes()`: the prompt's page
        hashes (asked for only when the tree does not cover the prompt)."""
        page = self._page
        usable = tokens[: cap_tokens(len(tokens), page)]
        start = self._core.coverage(usable)
        if start * page >= len(usable):
            return now, None
        now += self._rates.storage_lookup_s
        self.now = now
        hashes = hashes()
        found = self._store.usable_prefix(hashes[start: len(usable) // page], now)
        if not found:
            return now, None
        job = self._core.start_prefetch(usable, start, found)
        if not isinstance(job, PrefetchJob):
            return now, None
        served, nbytes, window_short = job.pages, 0, False
        for allocator, logical in job.logical_pages.items():
            if logical.size == 0 or not self._page_bytes.get(allocator):
                continue
            got = self._store.get(allocator, [hashes[i] for i in logical], now)
            if allocator == self._anchor:
                served = got
            elif got < logical.size:
                window_short = True
            nbytes += logical.size * self._page_bytes[allocator]
        if window_short:                         # the stop's window is incomplete
            served = min(served, job.pages - 1)
        p = _Prefetch(job, self.links["storage_to_host"].transfer(now, nbytes), served)
        wait = self._cache.storage.prefetch_wait_s(len(tokens))
        if wait is None:                         # wait_complete: up to the call timeout
            wait = self._cache.storage.call_timeout_s
        if p.done_at <= now + wait:
            return max(now, p.done_at), self._attach(p)
        self._prefetches.append(p)               # lands at a later step
        self.wakeups.append(p.done_at)
        return now + wait, None

    def _attach(self, p: _Prefetch) -> tuple[int, int]:
        first, end = self._core.finish_prefetch(p.job.prefetch_id, p.served)
        self.prefetched_pages += end - first
        return first, end

    # -- the serial mode's boundary ------------------------------------------------------------
    def drain(self, now: float) -> float:
        """Land everything in flight: backups (and the storage writes they start), then
        prefetches. Returns when the last of it, storage writes included, has landed."""
        now, _ = self.land_backups(now)
        for p in sorted(self._prefetches, key=lambda p: p.done_at):
            now = max(now, p.done_at)
            self._attach(p)
        self._prefetches.clear()
        return max(now, self.links["host_to_storage"].free_at)

    def bytes_moved(self) -> dict[str, int]:
        return {name: link.bytes_moved for name, link in self.links.items()}


__all__ = ["Transfers"]
