"""`PrefixReads`: a prompt's cached prefix found, pinned and loaded back, for `HiCache`.

    match -> lock -> (storage prefetch) -> load back -> (wait)

`acquire_many` does this for a step's requests in order, and starts all their loads as one
engine start (one merged plan), then waits for them together.

`HiCache` checks its callers' arguments and then asks this; the tree core decides (match,
load plan, locks) and the data plane moves (`DataPlane`). A load is all or nothing: a
failed or refused one leaves the device part of the match, still pinned.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hicache_jax.config import HiCacheConfig
from hicache_jax.data_plane import DataPlane
from hicache_jax.layout import PoolLayout
from hicache_jax.outcomes import LoadBack, Prefix
from hicache_jax.plan import Direction
from hicache_jax.tree import LoadJob, LockId, MatchResult, Refusal, TransferId, TreeCore

_EMPTY = np.zeros((0,), np.int32)


@dataclasses.dataclass(frozen=True)
class _Planned:
    """A request of `acquire_many` whose load the tree committed, not yet started."""

    index: int                   # its place in the call's requests
    match: MatchResult
    lock: LockId                 # the pin on its device part
    job: LoadJob
    fetched: tuple[int, int]     # pages just prefetched from storage: [first, end)


class PrefixReads:
    def __init__(self, layout: PoolLayout, config: HiCacheConfig, core: TreeCore, data: DataPlane):
        self.layout, self.config, self._core, self._data = layout, config, core, data
        self._anchor = core.anchor
        self._swa = layout.swa_pool.name if layout.swa_pool is not None else None

    def match(self, tokens: np.ndarray) -> MatchResult:
        """The tree's match of `tokens`, counted as a request for them."""
        return self._counted(tokens, self._core.match_prefix(tokens))

    def _counted(self, tokens: np.ndarray, m: MatchResult) -> MatchResult:
        self._data.counters.requested_tokens += len(tokens)
        self._data.counters.device_hit_tokens += m.device_len
        return m

    def load_back(self, match: MatchResult, patient: bool, deferred: bool = False) -> LoadBack:
        """Start loading `match`'s host part (see `HiCache.load_back`); when `patient`,
        transfers in flight that pin the room it needs are waited for rather than refused."""
        if not deferred:   # a large block starts its copy while the tree plans
            self._copy_early(match)
        job = self._core.start_load(match)
        self._data.flush_demotions()
        while job is Refusal.NO_DEVICE_SPACE and patient and self._data.free_room():
            job = self._core.start_load(match)
            self._data.flush_demotions()
        if not isinstance(job, LoadJob):
            return self._refused(match, job)
        if not self._data.start(job.transfer, job.plan, host_tokens=job.length - match.device_len, deferred=deferred):
            self._core.unlock(job.lock)
            return self._refused(match, Refusal.FAILED)
        return LoadBack(job.load_id, None, job.length, job.loaded_tokens, job.device_pages,
                        job.window_pages.get(self._swa, _EMPTY), job.node, job.lock,
                        self._data.transfers.landing(job.transfer))

    def _copy_early(self, match: MatchResult) -> None:
        self._data.engine.copy_early(self._anchor, match.host_len // self.layout.page_size,
                                     lambda: self._core.anchor_host_pages(match))

    def _copy_early_many(self, seqs: list[np.ndarray]) -> None:
        """Start copying the anchor's host blocks of every request of `seqs` (as the tree
        holds them now, looked ahead: `anchor_pages_ahead`) in one program: they cross the
        link while the requests are planned."""
        loads = []
        for tokens in seqs:
            pages = self._core.anchor_pages_ahead(tokens)
            if pages is not None:
                loads.append((pages.size, lambda pages=pages: pages))
        if loads:
            self._data.engine.copy_early_many(self._anchor, loads)

    def acquire(self, tokens: np.ndarray, load_back: bool, deferred: bool) -> Prefix:
        """`HiCache.acquire` for checked arguments."""
        m, fetched = self._settled_match(tokens, self.match(tokens), load_back)
        lock = self._core.lock(m.device_node)
        refused = None
        if load_back and m.host_len:
            lb = self.load_back(m, patient=True, deferred=deferred)
            # nothing left to a step (no landing): the whole load moved now, so wait as a blocking one does
            if lb.started and ((deferred and lb.landing is not None) or self.wait(lb)):
                self._core.unlock(lock)
                page = self.layout.page_size
                from_storage = max(0, min(lb.length, fetched[1] * page) - fetched[0] * page)
                self._data.counters.storage_hit_tokens += from_storage
                return Prefix(lb.length, lb.device_pages, lb.swa_pages, lb.lock, m.device_len,
                              lb.length - m.device_len, storage_tokens=from_storage, landing=lb.landing)
            if lb.started:
                self._core.unlock(lb.lock)
            refused = lb.refused or Refusal.FAILED
        return Prefix(m.device_len, m.device_pages, m.swa_pages, lock, m.device_len, 0, refused)

    def _settled_match(self, tokens: np.ndarray, m: MatchResult, load_back: bool
                       ) -> tuple[MatchResult, tuple[int, int]]:
        """`m` again once what it stopped at has landed or come from storage, and the pages
        just prefetched from storage, [first, end)."""
        if load_back and m.pending_len and self._data.land_in_flight(m.pending_writes):
            # the host copies it stopped at have landed: match again (the device part, and so
            # the hit tallies, cannot have changed: landing a backup moves no device page)
            m = self._core.match_prefix(tokens)
        fetched = (0, 0)
        storage = self._data.storage
        if load_back and storage is not None:
            tid = storage.prefetch(tokens)
            got = None if tid is None else storage.finish(tid, self.config.storage.prefetch_wait_s(len(tokens)))
            if got is not None and got[1] > got[0]:
                fetched = got
                m = self._core.match_prefix(tokens)
        return m, fetched

    def acquire_many(self, seqs: list[np.ndarray], load_back: bool, deferred: bool) -> list[Prefix]:
        """`HiCache.acquire_many` for checked arguments.

        First (unless `deferred`) every request's large host block starts copying to the
        device, as one program (`copy_early_many`), while the rest runs. Then each request
        in order: match, pin, plan its load with the tree (patient for device room, as
        `acquire` is); the planned loads start together, as one engine start, once
        every request is planned. A request whose path holds nodes that a planned load fills
        starts and waits for those planned so far first, then matches again, so it finds
        them on the device as it would after one `acquire` each. With `deferred`, only the
        last start may leave a block to the model's step: its `Landing` is every one of its
        requests' `Prefix.landing`."""
        out: list[Prefix | None] = [None] * len(seqs)
        planned: list[_Planned] = []
        if load_back and not deferred:
            self._copy_early_many(seqs)
        for i, tokens in enumerate(seqs):
            m = self._core.match_prefix(tokens)
            if planned and self._core.loads_along(tokens) & {p.job.load_id for p in planned}:
                self._start_planned(planned, out, deferred=False)
                planned = []
                m = self._core.match_prefix(tokens)
            m, fetched = self._settled_match(tokens, self._counted(tokens, m), load_back)
            lock = self._core.lock(m.device_node)
            if not (load_back and m.host_len):
                out[i] = Prefix(m.device_len, m.device_pages, m.swa_pages, lock, m.device_len, 0)
                continue
            job = self._core.start_load(m)
            self._data.flush_demotions()
            if job is Refusal.NO_DEVICE_SPACE and planned:
                # the loads planned so far go first, as if each request had been acquired alone
                self._start_planned(planned, out, deferred=False)
                planned = []
            while job is Refusal.NO_DEVICE_SPACE and self._data.free_room():
                job = self._core.start_load(m)
                self._data.flush_demotions()
            if isinstance(job, LoadJob):
                planned.append(_Planned(i, m, lock, job, fetched))
            else:
                out[i] = Prefix(m.device_len, m.device_pages, m.swa_pages, lock, m.device_len, 0, job)
        if planned:
            self._start_planned(planned, out, deferred)
        return out

    def _start_planned(self, planned: list[_Planned], out: list, deferred: bool) -> None:
        """Start `planned` as one engine start, wait for it (unless a block of it is left to
        the model's step), and put each request's `Prefix` in `out`."""
        jobs = [p.job for p in planned]
        started = self._data.start_many([j.transfer for j in jobs], [j.plan for j in jobs],
                                        [j.length - p.match.device_len for j, p in zip(jobs, planned)], deferred)
        landing = self._data.transfers.landing(jobs[0].transfer) if started and deferred else None
        page = self.layout.page_size
        for p in planned:
            m, job = p.match, p.job
            # nothing left to a step (no landing): the whole load moved now, so wait as a blocking one does
            if started and (landing is not None or self._wait_load(job.load_id)):
                self._core.unlock(p.lock)
                from_storage = max(0, min(job.length, p.fetched[1] * page) - p.fetched[0] * page)
                self._data.counters.storage_hit_tokens += from_storage
                out[p.index] = Prefix(job.length, job.device_pages, job.window_pages.get(self._swa, _EMPTY),
                                      job.lock, m.device_len, job.length - m.device_len,
                                      storage_tokens=from_storage, landing=landing)
            else:
                self._core.unlock(job.lock)
                out[p.index] = Prefix(m.device_len, m.device_pages, m.swa_pages, p.lock, m.device_len, 0,
                                      Refusal.FAILED)

    def wait(self, load: LoadBack) -> bool:
        """Block until `load` lands; True if its pages are valid, False if it failed."""
        return load.started and self._wait_load(load.load_id)

    def _wait_load(self, load_id: int) -> bool:
        tid = TransferId(Direction.LOAD, load_id)
        if self._core.is_in_flight(tid):
            self._data.complete(tid, blocking=True)
        return not self._data.transfers.take_failure(load_id)

    @staticmethod
    def _refused(match: MatchResult, why: Refusal) -> LoadBack:
        return LoadBack(None, why, match.device_len, 0, match.device_pages, match.swa_pages, match.device_node)
