"""Page allocators: a run-based free list that hands out contiguous pages when it can.

Control plane: pure Python + numpy. Free pages are kept as maximal runs, so an allocation
of n pages is served from the smallest run that fits (one contiguous block: one DMA per
backup batch on the host tier); only when no run fits does it take the largest runs
first. Freed pages merge with their neighbours.

    free runs  [0..3] [8..8] [12..19]
    alloc(3) -> 0 1 2        (smallest run that fits: 0..3; leaves [3..3])
    alloc(9) -> 12..19, 3    (no run fits: largest runs first; two runs)
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class PageAllocator:
    """Pages `0 .. capacity-1` of one allocator on one tier.

    `alloc(n)` returns i32[n] distinct free pages or None (nothing changes) when fewer
    than n are free; `free(pages)` returns pages, which must be currently allocated.
    """

    def __init__(self, name: str, tier: str, capacity: int):
        if not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"{tier} pages of {name!r} must be a non-negative integer, got {capacity!r}")
        self.name, self.tier, self.capacity = name, tier, capacity
        self._run_len: dict[int, int] = {}      # start -> length of a free run
        self._run_at_end: dict[int, int] = {}   # end (exclusive) -> start
        self._by_len: dict[int, set[int]] = {}  # length -> starts of free runs of that length
        self._free = 0
        self._is_free = np.ones((capacity,), dtype=bool)  # O(1) double-free checks
        if capacity:
            self._add_run(0, capacity)

    def __repr__(self) -> str:
        return f"PageAllocator({self.name!r}, {self.tier}, {self._free}/{self.capacity} free)"

    @property
    def num_free(self) -> int:
        return self._free

    def available(self) -> int:
        return self._free

    def alloc(self, n: int) -> np.ndarray | None:
        if not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"cannot allocate {n!r} pages of {self.name!r}")
        if n > self._free:
            return None
        out, need = [], int(n)
        fit = [length for length in self._by_len if length >= need]
        if fit:
            start = self._take_from(min(fit), need)
            return np.arange(start, start + need, dtype=np.int32)
        while need:
            length = max(self._by_len)
            take = min(length, need)
            start = self._take_from(length, take)
            out.append(np.arange(start, start + take, dtype=np.int32))
            need -= take
        return np.concatenate(out) if out else np.zeros((0,), np.int32)

    def free(self, pages: Iterable[int]) -> None:
        arr = np.asarray(list(pages) if not isinstance(pages, np.ndarray) else pages, dtype=np.int64).reshape(-1)
        if arr.size == 0:
            return
        ordered = sorted(arr.tolist())
        if ordered[0] < 0 or ordered[-1] >= self.capacity or len(set(ordered)) != len(ordered):
            raise ValueError(f"free of {self.name!r} {self.tier} pages {ordered}: out of range or repeated")
        if self._is_free[arr].any():
            raise ValueError(f"double free of {self.name!r} {self.tier} pages {arr[self._is_free[arr]].tolist()}")
        start = prev = ordered[0]
        for p in ordered[1:]:                 # merge consecutive pages into runs
            if p != prev + 1:
                self._insert_merged(start, prev + 1)
                start = p
            prev = p
        self._insert_merged(start, prev + 1)
        self._is_free[arr] = True

    def free_pages(self) -> np.ndarray:
        """All free pages, ascending (for invariant checks; O(capacity))."""
        return np.flatnonzero(self._is_free).astype(np.int32)

    def num_runs(self) -> int:
        return len(self._run_len)

    # -- internals -------------------------------------------------------------------------
    def _add_run(self, start: int, length: int) -> None:
        self._run_len[start] = length
        self._run_at_end[start + length] = start
        self._by_len.setdefault(length, set()).add(start)
        self._free += length

    def _remove_run(self, start: int) -> int:
        length = self._run_len.pop(start)
        del self._run_at_end[start + length]
        starts = self._by_len[length]
        starts.discard(start)
        if not starts:
            del self._by_len[length]
        self._free -= length
        return length

    def _take_from(self, length: int, take: int) -> int:
        """Take `take` pages from the start of a free run of `length`; only they change state."""
        # Any run of this length; iteration order of an int set depends only on its history,
        # so every TP rank that replays the same calls gets the same pages.
        start = next(iter(self._by_len[length]))
        self._remove_run(start)
        if take < length:
            self._add_run(start + take, length - take)
        self._is_free[start:start + take] = False
        return start

    def _insert_merged(self, start: int, end: int) -> None:
        if end in self._run_len:                 # merge with the run that follows
            end += self._remove_run(end)
        if start in self._run_at_end:            # merge with the run that precedes
            prev = self._run_at_end[start]
            self._remove_run(prev)
            start = prev
        self._add_run(start, end - start)
