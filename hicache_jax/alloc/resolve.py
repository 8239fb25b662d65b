"""The allocators of one tier, and the atomic multi-pool resolve.

`resolve({"kv": 3, "swa": 1})` takes pages from the anchor first, then from every
independent pool in sorted name order (the same order on every TP rank). If any is short,
everything this call took is returned, `reclaim(shortfall)` gets one chance to free pages
(host eviction), and the whole allocation is tried once more. Either every pool gets its
pages or none does.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from hicache_jax import validate
from hicache_jax.alloc.pages import PageAllocator
from hicache_jax.layout import PoolLayout


@dataclasses.dataclass(frozen=True)
class Resolved:
    """Pages taken by one resolve, per allocator (i32 arrays; absent = none asked)."""

    pages: Mapping[str, np.ndarray]

    def get(self, allocator: str) -> np.ndarray:
        return self.pages.get(allocator, np.zeros((0,), np.int32))


class TierAllocators:
    """Every page allocator of one tier (`"device"` or `"host"`) of a layout."""

    def __init__(self, layout: PoolLayout, tier: str, capacity: Mapping[str, int]):
        self.layout, self.tier = layout, tier
        owners = [p.name for p in layout.pools if p.has_allocator]
        unknown = sorted(set(capacity) - set(owners))
        if unknown:
            raise ValueError(f"{tier} page counts name {unknown}, which own no allocator (allocators: {owners})")
        missing = [n for n in owners if n not in capacity]
        if missing:
            raise ValueError(f"{tier} page count missing for {missing}")
        self._pages = {n: PageAllocator(n, tier, capacity[n]) for n in owners}
        anchor = layout.anchor.name
        # anchor first, then independents sorted by name: the order all ranks allocate in
        self.order = (anchor, *sorted(n for n in owners if n != anchor))

    def __getitem__(self, allocator: str) -> PageAllocator:
        try:
            return self._pages[allocator]
        except KeyError:
            raise KeyError(f"no {self.tier} allocator {allocator!r}") from None

    def __iter__(self):
        return iter(self._pages.values())

    def capacity(self, allocator: str) -> int:
        return self._pages[allocator].capacity

    def resolve(
        self,
        need: Mapping[str, int],
        reclaim: Callable[[dict[str, int]], None] | None = None,
    ) -> Resolved | None:
        """Allocate `need[allocator]` pages from every allocator, all or nothing.

        Mutates the allocators only on success. `reclaim` is called at most once, with the
        pages still missing per allocator, and may free pages (e.g. evict host leaves); it
        is not called for a request larger than an allocator's capacity, which no reclaim
        can satisfy.
        """
        for name, n in need.items():
            if name not in self._pages:
                raise ValueError(f"resolve names {name!r}, which has no {self.tier} allocator")
            if n.__class__ is not int or n < 0:   # a plain count passes; anything else is named
                validate.count(f"{self.tier} pages of {name!r}", n)
            if n > self._pages[name].capacity:
                return None
        for attempt in range(2):
            taken: dict[str, np.ndarray] = {}
            for name in self.order:
                n = need.get(name, 0)
                if n == 0:
                    continue
                pages = self._pages[name].alloc(n)
                if pages is None:
                    break
                taken[name] = pages
            else:
                return Resolved(taken)
            for name, pages in taken.items():   # roll back what this attempt took
                self._pages[name].free(pages)
            if attempt == 0 and reclaim is not None:
                reclaim({n: max(0, need.get(n, 0) - self._pages[n].available()) for n in self.order})
            else:
                return None
        return None
