"""The three ways a replay runs: with HiCache, with a device-only prefix cache, with no cache.

All three serve the same jobs with the same model step, the same device pages and the same
scheduler; they differ only in what the cache is asked:

    hicache       HiCacheConfig(device_pages, host_pages, write_policy): prefixes are found
                  on device or loaded back from the host tier (`acquire_many(load_back=True)`)
    device_only   the same device pages and tree, and no host tier: `host_pages=0`, so
                  nothing is backed up (an evicted page is dropped) and nothing is loaded.
                  This is the device prefix cache a server has without offloading (a radix
                  cache on device)
    no_cache      the cache only hands out pages (`alloc` / `free`); nothing is matched or
                  inserted, every request computes its whole prompt, and a preempted one
                  computes everything again

`CacheCalls` makes the calls of one admission, in the order `run_cached`
(examples/serving_loop.py) makes them for a single request.
"""
from __future__ import annotations

import enum

import numpy as np

import hicache_jax as hc
from examples.batching.sequence import Placement, Sequence

class CacheKind(enum.Enum):
    HICACHE = "hicache"
    DEVICE_ONLY = "device_only"
    NO_CACHE = "no_cache"


def make_cache(kind: CacheKind, layout, device_pages: int, host_pages: int,
               write_policy: str = "write_through", transfer: hc.TransferConfig | None = None,
               load_cost: tuple[float, float] | None = None) -> hc.HiCache:
    """The cache a run of `kind` uses (module docstring); `transfer`: the HiCache run's
    `TransferConfig` (None: the default one); `load_cost`: its cost model, (recompute
    seconds per token, load overhead seconds), or None (every host hit is loaded)."""
    match kind:
        case CacheKind.HICACHE:
            recompute, overhead = load_cost or (None, 0.0)
            config = hc.HiCacheConfig(device_pages=device_pages, host_pages=host_pages, write_policy=write_policy,
                                      recompute_seconds_per_token=recompute, load_overhead_seconds=overhead,
                                      transfer=transfer or hc.TransferConfig())
        case CacheKind.DEVICE_ONLY | CacheKind.NO_CACHE:
            config = hc.HiCacheConfig(device_pages=device_pages, host_pages=0)
    return hc.HiCache(layout, config)


class CacheCalls:
    """The cache calls of a batched loop for one `CacheKind`.

    Per step the scheduler calls `room()` to reserve pages for admissions (not
    under eager admission); `alloc` + `grow` for running sequences' next
    chunks (`release` of the newest when it must preempt); `acquire` for the requests it
    admits (one call for all of them), then `alloc` + `place` for each one's first chunk
    (`refuse` for one that does not fit); the loop runs the model step on
    `cache.device_pools` / `set_device_pools`, then `step()` while the device runs it;
    `release` for each sequence that finished.
    """

    def __init__(self, kind: CacheKind, cache: hc.HiCache, window_policy: hc.WindowPolicy):
        self.kind, self.cache, self.window_policy = kind, cache, window_policy
        self.page_size = cache.layout.page_size

    def step(self) -> None:
        self.cache.step()

    def acquire(self, prompts: list[np.ndarray]) -> list:
        """The cached prefix of each prompt, pinned (`hc.Prefix`; None with no cache): one
        `acquire_many`, so the host loads of the whole step go as one transfer."""
        match self.kind:
            case CacheKind.NO_CACHE:
                return [None] * len(prompts)
            case _:
                return self.cache.acquire_many(prompts, load_back=self.kind is CacheKind.HICACHE, deferred=False)

    def room(self) -> int:
        """New logical pages `alloc` could grant now (each takes an anchor page, and an SWA
        page where the layout has one): `device_room()`, free pages and the tree's unpinned ones."""
        room = self.cache.device_room()
        swa = self.cache.swa_allocator
        return min(room[self.cache.anchor], room[swa]) if swa else room[self.cache.anchor]

    def alloc(self, pages: int) -> tuple[list[int], list[int]] | None:
        """(anchor pages, SWA pages) for `pages` new logical pages, or None: no room now."""
        swa = self.cache.swa_allocator
        grant = self.cache.alloc(pages, pages if swa else 0)
        if grant is None:
            return None
        return grant[self.cache.anchor].tolist(), grant[swa].tolist() if swa else []

    def place(self, seq: Sequence, prefix, pages: tuple[list[int], list[int]]) -> None:
        """Admit `seq` on its prefix (from `acquire`) and its first chunk's pages (from `alloc`)."""
        anchor, own_swa = pages
        if prefix is None:
            seq.place(Placement(list(anchor), dict(enumerate(own_swa)), list(own_swa), 0, None), 0)
            return
        first = prefix.length // self.page_size
        window = prefix.swa_pages.tolist()
        swa = {first - len(window) + i: p for i, p in enumerate(window)}
        swa.update({first + i: p for i, p in enumerate(own_swa)})
        seq.place(Placement(prefix.device_pages.tolist() + list(anchor), swa, list(own_swa), first, prefix.lock),
                  prefix.length)
        hits = seq.hits if seq.admissions == 1 else seq.resume_hits
        hits["device"] += prefix.device_tokens
        hits["host"] += prefix.host_tokens
        hits["storage"] += prefix.storage_tokens

    def refuse(self, prefix) -> None:
        """Give back a prefix acquired for a request that could not be admitted after all."""
        if prefix is not None:
            self.cache.unlock(prefix.lock)

    def grow(self, seq: Sequence, pages: tuple[list[int], list[int]]) -> None:
        anchor, swa = pages
        p = seq.placement
        for page, swa_page in zip(range(len(p.anchor), len(p.anchor) + len(anchor)), swa):
            p.swa[page] = swa_page
        p.anchor += anchor
        p.own_swa += swa

    def release(self, seq: Sequence) -> None:
        """`seq` leaves the batch: finished, its whole pages go to the tree (`insert`);
        preempted, they are kept for its return (`retract`); the rest is freed and the
        prefix unlocked. The SWA pages kept are the windows of the window policy's stop
        points (always the last whole page boundary: where a preempted request resumes)."""
        p, P = seq.unplace(), self.page_size
        n = seq.computed                        # positions computed (the last token never is)
        cache, swa_alloc = self.cache, self.cache.swa_allocator
        if self.kind is CacheKind.NO_CACHE or n // P <= p.cached_pages:
            keep, given = {}, p.cached_pages    # nothing new to give: free what it allocated
        else:
            pages = self.window_policy.keep_pages(n, P, cache.window_pages, p.cached_pages) if swa_alloc else ()
            keep = {q: p.swa[q] for q in sorted(pages)}
            tokens = seq.token_ids()
            if seq.finished:
                cache.insert(tokens[: n // P * P], p.anchor[: n // P], keep)
                given = n // P
            else:
                cache.retract(tokens[:n], p.anchor[: -(-n // P)], keep)   # frees the partial page
                given = -(-n // P)
        if p.anchor[given:]:
            cache.free(cache.anchor, p.anchor[given:])
        unused = [s for s in p.own_swa if s not in keep.values()]
        if unused and swa_alloc:
            cache.free(swa_alloc, unused)
        if p.lock is not None:
            cache.unlock(p.lock)
