"""`PrefixReads`: a prompt's cached prefix found, pinned and loaded back, for `HiCache`.

    match -> lock -> (storage prefetch) -> load back -> (wait)

`HiCache` checks its callers' arguments and then asks this; the tree core decides (match,
load plan, locks) and the data plane moves (`DataPlane`). A load is all or nothing: a
failed or refused one leaves the device part of the match, still pinned.
"""
from __future__ import annotations

import logging

import numpy as np

from hicache_jax.config import HiCacheConfig
from hicache_jax.data_plane import DataPlane
from hicache_jax.layout import PoolLayout
from hicache_jax.outcomes import LoadBack, Prefix
from hicache_jax.plan import Direction
from hicache_jax.tree import LoadJob, MatchResult, Refusal, TransferId, TreeCore

_EMPTY = np.zeros((0,), np.int32)
log = logging.getLogger("hicache_jax")


class PrefixReads:
    def __init__(self, layout: PoolLayout, config: HiCacheConfig, core: TreeCore, data: DataPlane):
        self.layout, self.config, self._core, self._data = layout, config, core, data
        self._anchor = core.anchor
        self._swa = layout.swa_pool.name if layout.swa_pool is not None else None
        # On NVIDIA GPUs a step that lands a load stored in several layer groups computed other
        # logits than the same step with no landing, though every landed byte was right
        # (README, "Limits"): there, deferred loads of a grouped host tier move as blocking ones.
        self._defer = config.transfer.layer_groups == 1 or data.engine.devices.device.platform != "gpu"
        if not self._defer:
            log.warning("layer_groups=%d on a GPU: deferred load-backs move as blocking ones here "
                        "(a step landing grouped parts is not bit-identical on this backend yet)",
                        config.transfer.layer_groups)

    def match(self, tokens: np.ndarray) -> MatchResult:
        """The tree's match of `tokens`, counted as a request for them."""
        m = self._core.match_prefix(tokens)
        self._data.counters.requested_tokens += len(tokens)
        self._data.counters.device_hit_tokens += m.device_len
        return m

    def load_back(self, match: MatchResult, patient: bool, deferred: bool = False) -> LoadBack:
        """Start loading `match`'s host part (see `HiCache.load_back`); when `patient`,
        transfers in flight that pin the room it needs are waited for rather than refused."""
        deferred = deferred and self._defer
        if not deferred:   # a large block starts its copy while the tree plans
            self._data.engine.copy_early(self._anchor, match.host_len // self.layout.page_size,
                                         lambda: self._core.anchor_host_pages(match))
        job = self._core.start_load(match)
        self._data.flush_demotions()
        while job is Refusal.NO_DEVICE_SPACE and patient and self._data.land_in_flight(loads=True):
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

    def acquire(self, tokens: np.ndarray, load_back: bool, deferred: bool) -> Prefix:
        """`HiCache.acquire` for checked arguments."""
        m = self.match(tokens)
        if load_back and m.pending_len and self._data.land_in_flight():
            # the host copies it stopped at have landed: match again (the device part, and so
            # the hit tallies, cannot have changed: landing a backup moves no device page)
            m = self._core.match_prefix(tokens)
        fetched = (0, 0)              # pages just prefetched from storage: [first, end)
        storage = self._data.storage
        if load_back and storage is not None:
            tid = storage.prefetch(tokens)
            got = None if tid is None else storage.finish(tid, self.config.storage.prefetch_wait_s(len(tokens)))
            if got is not None and got[1] > got[0]:
                fetched = got
                m = self._core.match_prefix(tokens)
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

    def wait(self, load: LoadBack) -> bool:
        """Block until `load` lands; True if its pages are valid, False if it failed."""
        if not load.started:
            return False
        tid = TransferId(Direction.LOAD, load.load_id)
        if tid in self._core.in_flight():
            self._data.complete(tid, blocking=True)
        return not self._data.transfers.take_failure(load.load_id)

    @staticmethod
    def _refused(match: MatchResult, why: Refusal) -> LoadBack:
        return LoadBack(None, why, match.device_len, 0, match.device_pages, match.swa_pages, match.device_node)
