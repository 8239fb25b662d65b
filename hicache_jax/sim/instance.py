"""`Instance`: one simulated serving instance, a real `TreeCore` serving requests one prefill at a time.

A request goes through the calls `HiCache.acquire` and the example serving loop
(`examples/serving_loop.run_cached`) make, in the same order, on the same tree:

    begin:  step -> match (land backups and match again if the match stopped at host
            copies still being written) -> storage prefetch (lookup, reserve, read, wait
            per policy; match again if pages were attached) -> lock -> load back the
            host part (land backups and retry once when the device is full) -> alloc
            the pages to compute (same) -> prefill, which ends at the first token
    end:    insert the prompt's whole pages with the SWA pages the window policy keeps
            -> free the rest -> unlock -> step

What is not simulated: the bytes, the model, and decode. Generated tokens are not in a
trace (a later turn's prompt carries them under its own hash ids), so only the prompt's
pages are inserted, and decode is assumed to run beside other requests' prefill without
delaying it: an instance's queue is a prefill queue.
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from hicache_jax.layout import PoolLayout
from hicache_jax.sim.config import SimConfig
from hicache_jax.sim.store import SharedStore
from hicache_jax.sim.transfers import Transfers
from hicache_jax.storage.keys import page_hashes
from hicache_jax.tree import LoadCost, LoadJob, LockId, Refusal, TreeCore

_EMPTY = np.zeros((0,), np.int32)


@dataclasses.dataclass(eq=False)
class SimRequest:
    """A request as the fleet serves it: `tokens` i32[n], arrival in seconds."""

    index: int
    arrival_s: float
    tokens: np.ndarray
    _hashes: list | None = None

    def page_hashes(self, page_size: int) -> list:
        """Chained page hashes of the prompt's whole pages (computed once)."""
        if self._hashes is None:
            self._hashes = page_hashes(self.tokens, page_size)
        return self._hashes


@dataclasses.dataclass(frozen=True)
class RequestOutcome:
    """Where one request's prompt came from and when its first token came out.
    Token counts are disjoint: `host` excludes what storage brought in for this request."""

    index: int
    instance: int
    input_tokens: int
    device: int
    host: int
    storage: int
    arrival_s: float
    start_s: float
    first_token_s: float

    @property
    def computed(self) -> int:
        return self.input_tokens - self.device - self.host - self.storage

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


@dataclasses.dataclass
class _Running:
    req: SimRequest
    start_s: float
    first_token_s: float
    lock: LockId
    table: np.ndarray        # anchor device pages of the usable prefix
    window: np.ndarray       # SWA device pages of its trailing window
    grant: dict              # allocator -> the pages allocated to compute the rest
    hit: tuple[int, int, int]   # device, host (storage excluded), storage tokens


class Instance:
    """One instance of the fleet (see the module docstring). `queue` holds the requests
    routed here and not started; `running` the one in prefill."""

    def __init__(self, index: int, layout: PoolLayout, config: SimConfig, store: SharedStore | None):
        cache = config.cache
        device, host = cache.page_counts(layout)
        self.index, self.layout, self.config = index, layout, config
        self.core = TreeCore(layout, device_pages=device, host_pages=host, write_policy=cache.write_policy,
                             write_threshold=cache.write_through_threshold,
                             load_back_threshold=cache.load_back_threshold,
                             load_cost=LoadCost(cache.recompute_seconds_per_token, cache.link_bytes_per_second,
                                                cache.load_overhead_seconds),
                             prefetch_share=cache.storage.prefetch_share)
        self.transfers = Transfers(layout, self.core, cache, config.rates, store)
        self._store = store
        self._page = layout.page_size
        self._swa = layout.swa_pool.name if layout.swa_pool is not None else None
        self._window_pages = layout.window_pages() if self._swa else 0
        self.queue: collections.deque[SimRequest] = collections.deque()
        self.running: _Running | None = None

    @property
    def load(self) -> int:
        """Requests routed here and not done: the router's load measure."""
        return len(self.queue) + (self.running is not None)

    def coverage(self, tokens: np.ndarray) -> int:
        """Leading pages of `tokens` (capped as a match is) this instance's tree holds on
        any tier: the router's measure of affinity. Changes nothing."""
        page = self._page
        return self.core.coverage(tokens[: max(0, (len(tokens) - 1) // page * page)])

    def begin(self, req: SimRequest, now: float) -> float:
        """Start `req` at `now`: acquire its prefix, allocate the rest; returns when its
        prefill ends (its first token)."""
        core, xfer, page = self.core, self.transfers, self._page
        start, tokens = now, req.tokens
        xfer.step(now)
        m = core.match_prefix(tokens)
        if m.pending_len:
            now, landed = xfer.land_backups(now)
            if landed:
                m = core.match_prefix(tokens)
        fetched = (0, 0)
        if self._store is not None:
            now, got = xfer.prefetch(tokens, lambda: req.page_hashes(page), now)
            if got is not None and got[1] > got[0]:
                fetched = got
                m = core.match_prefix(tokens)
        xfer.now = now
        lock = core.lock(m.device_node)
        length, table, window, hit = m.device_len, m.device_pages, m.swa_pages, (m.device_len, 0, 0)
        if m.host_len:
            job = core.start_load(m)
            xfer.flush_demotions(now)
            if job is Refusal.NO_DEVICE_SPACE:
                now, landed = xfer.land_backups(now)
                if landed:
                    job = core.start_load(m)
                    xfer.flush_demotions(now)
            if isinstance(job, LoadJob):
                now = xfer.load(job, now)
                core.unlock(lock)
                lock, length, table = job.lock, job.length, job.device_pages
                window = job.window_pages.get(self._swa, _EMPTY) if self._swa else _EMPTY
                storage = max(0, min(job.length, fetched[1] * page) - fetched[0] * page)
                hit = (m.device_len, job.length - m.device_len - storage, storage)
        first, total = length // page, -(-len(tokens) // page)
        need = {core.anchor: total - first}
        if self._swa:
            need[self._swa] = total - first
        grant = core.alloc_device(need)
        xfer.flush_demotions(now)
        if grant is None:
            now, landed = xfer.land_backups(now)
            if landed:
                grant = core.alloc_device(need)
                xfer.flush_demotions(now)
        if grant is None:
            raise RuntimeError(f"instance {self.index}: no device room for request {req.index} "
                               f"({total - first} pages) even after every transfer landed: the device tier is "
                               f"smaller than one request")
        done = now + (len(tokens) - length) / self.config.rates.prefill_tokens_per_s
        self.running = _Running(req, start, done, lock, table, window, grant, hit)
        self._checked()
        return done

    def end(self, now: float) -> RequestOutcome:
        """The running request's prefill has ended at `now`: its pages go to the tree."""
        r, core, page = self.running, self.core, self._page
        self.running = None
        self.transfers.now = now
        tokens = r.req.tokens
        first = len(r.table)
        anchor = np.concatenate([r.table, r.grant[core.anchor]]).astype(np.int32)
        whole = len(tokens) // page
        windows = None
        unused_swa = ()
        if self._swa:
            new_swa = r.grant[self._swa]
            swa = {first - len(r.window) + i: int(p) for i, p in enumerate(r.window)}
            swa.update({first + i: int(p) for i, p in enumerate(new_swa)})
            keep_pages = self.config.window_policy.keep_pages(len(tokens), page, self._window_pages, first)
            keep = {q: swa[q] for q in sorted(keep_pages)}
            windows = {self._swa: keep}
            kept = set(keep.values())
            unused_swa = [int(p) for p in new_swa if int(p) not in kept]
        core.insert(tokens[: whole * page], anchor[:whole], windows)
        if anchor.size > whole:
            core.free_device(core.anchor, anchor[whole:])
        if unused_swa:
            core.free_device(self._swa, unused_swa)
        core.unlock(r.lock)
        self.transfers.step(now)
        self._checked()
        if any(core.held_pages(a) for a in r.grant):
            raise AssertionError(f"bug: instance {self.index} still holds device pages after request {r.req.index}")
        device, host, storage = r.hit
        return RequestOutcome(r.req.index, self.index, len(tokens), device, host, storage, r.req.arrival_s,
                              r.start_s, r.first_token_s)

    def _checked(self) -> None:
        """`HiCacheConfig.check_invariants`: recompute every law of the tree after each call (tests)."""
        if self.config.cache.check_invariants:
            self.core.check_invariants()


__all__ = ["Instance", "RequestOutcome", "SimRequest"]
