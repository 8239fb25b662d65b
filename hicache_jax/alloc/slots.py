"""Token-slot views of the allocators: the page-aligned anchor, and pools with no allocator.

The anchor (`kv`) owns token slots but hands them out only in whole pages: slot `s` lies in
page `s // page_size`. A misaligned request raises; it is never rounded, because a rounded
free would release slots another request still owns.
"""
from __future__ import annotations

import numpy as np

from hicache_jax.alloc.pages import PageAllocator


class AnchorAllocator:
    """Slot-level front of the anchor's `PageAllocator` (page-aligned only)."""

    def __init__(self, pages: PageAllocator, page_size: int):
        self.pages, self.page_size = pages, page_size

    def alloc(self, num_tokens: int) -> np.ndarray | None:
        """i64[num_tokens] slots of whole pages, or None when too few pages are free."""
        if num_tokens < 0 or num_tokens % self.page_size:
            raise ValueError(f"anchor alloc of {num_tokens} tokens must be page-aligned (page_size {self.page_size})")
        pages = self.pages.alloc(num_tokens // self.page_size)
        return None if pages is None else slots_of(pages, self.page_size)

    def free(self, slots: np.ndarray) -> None:
        self.pages.free(pages_of(slots, self.page_size))

    def available(self) -> int:
        """Free slots (a multiple of page_size)."""
        return self.pages.available() * self.page_size


def slots_of(pages: np.ndarray, page_size: int) -> np.ndarray:
    """i64[len(pages) * page_size]: every slot of each page, in page order."""
    pages = np.asarray(pages, dtype=np.int64)
    return (pages[:, None] * page_size + np.arange(page_size)).reshape(-1)


def pages_of(slots: np.ndarray, page_size: int) -> np.ndarray:
    """i32 pages of whole-page slot runs; raises on any misaligned or partial page."""
    slots = np.asarray(slots, dtype=np.int64)
    if slots.size % page_size:
        raise ValueError(f"{slots.size} slots are not a whole number of pages (page_size {page_size})")
    rows = slots.reshape(-1, page_size)
    starts = rows[:, 0]
    if np.any(starts % page_size) or np.any(rows != starts[:, None] + np.arange(page_size)):
        bad = rows[(starts % page_size != 0) | np.any(rows != starts[:, None] + np.arange(page_size), axis=1)][0]
        raise ValueError(f"slots {bad[:4].tolist()}... are not one aligned page (page_size {page_size})")
    return (starts // page_size).astype(np.int32)


class NoAllocator:
    """Stands for a pool that owns no slots: its rows follow another pool's pages.

    kv sidecars reuse the anchor's pages (`row = slot // ratio`); swa-state pools reuse the
    SWA pool's pages (its ring rows). Keeping a free list of their own would make two
    sources of truth, so every allocator entry point raises.
    """

    def __init__(self, pool: str, source: str):
        self.pool, self.source = pool, source

    def _refuse(self, *_args, **_kwargs):
        raise TypeError(f"pool {self.pool!r} reuses {self.source!r} transfer indices and has no allocator")

    alloc = free = available = _refuse
