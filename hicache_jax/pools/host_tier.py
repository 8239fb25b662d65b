"""The host tier: pinned-host *blocks* of packed rows, and a page table per allocator.

Every write to the host tier (a backup's host run, rows restored from L3 or a snapshot)
becomes its own pinned *block* of `2**k` consecutive host pages, made by `jax.device_put`
of rows packed on the device: a tuple of arrays `[2**k, part_elems]`, one per stored part
of the row (`RowFormat.parts`: one, unless the layers are grouped). Host page `p` of
an allocator lives at row `p - start` of the block that wrote it last:

    host pages   0 ........ 63 64 .. 67 68 .............. 99
    blocks       [ block 3, 64 rows ][ 7 ][ block 9, 32 rows ]     (-1: never written: zeros)

Why blocks and not one buffer: a whole pinned array is moved by the copy engines (DMA),
both ways, outside or inside a jit; rows sliced out of a larger pinned buffer are read
by a kernel on the SMs, slower and on the compute stream (BENCHMARKS.md, "A host hit
through the public API"). A load of a prefix that was backed up as one run moves whole
blocks; any other load slices the blocks it touches.

Host pages are counted by the tree's allocators as before; this table only follows where
their bytes are. A page that is written again, or that the tree frees (`freed`), leaves its
old block; a block that holds no page is dropped. Blocks whose pages were partly rewritten
or freed hold dead rows, so the rows held may exceed the pages: the engine compacts the
sparsest blocks (`sparsest`, `HostBlocks.make_room`) before a write would hold more rows
than the tier has pages.
Pinned memory is claimed once, at start (`prewarm`: XLA's pinned allocator keeps it for
later blocks); pinning is what a start costs, about 0.5 s per GiB on the H200 machine
(BENCHMARKS.md, "Host tier start-up").
"""
from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from hicache_jax.layout import PoolLayout
from hicache_jax.pools.device_pools import checked_page_counts
from hicache_jax.pools.host_views import block_view, viewable
from hicache_jax.layout.rows import RowFormat
from hicache_jax.pools.placement import HOST_MEMORY, Devices, is_single_device, single_device

NO_BLOCK = -1


class BlockTable:
    """Where the host pages `0 .. capacity-1` of one allocator live (pure bookkeeping)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.block_of = np.full(capacity, NO_BLOCK, np.int64)  # block id of each page
        self.arrays: dict[int, tuple[jax.Array, ...]] = {}   # one array per stored part
        self.start: dict[int, int] = {}  # first host page of each block
        self.live: dict[int, int] = {}   # pages that still live in each block
        self.rows = 0                    # rows of every block held
        self.views: dict[int, dict[tuple[int, int], tuple]] = {}  # block -> (row, rows) -> its view
        self.compacted = 0               # pages moved to new blocks to drop dead rows
        self._next = 0

    def release(self, pages: np.ndarray) -> None:
        """`pages` no longer live where they were (they are about to be written)."""
        ids, counts = np.unique(self.block_of[pages], return_counts=True)
        for block, n in zip(ids.tolist(), counts.tolist()):
            if block == NO_BLOCK:
                continue
            self.live[block] -= n
            if self.live[block] == 0:
                self._drop(block)
        self.block_of[pages] = NO_BLOCK

    def add(self, start: int, array: tuple[jax.Array, ...]) -> None:
        """Register `array` (rows of host pages `start ..`) as their home; they must be released."""
        n = block_rows(array)
        if (self.block_of[start:start + n] != NO_BLOCK).any():
            raise RuntimeError(f"bug: host pages {start}..{start + n - 1} written while they live in a block")
        block, self._next = self._next, self._next + 1
        self.arrays[block], self.start[block], self.live[block] = array, start, n
        self.block_of[start:start + n] = block
        self.rows += n

    def segments(self, start: int, n: int) -> list[tuple[int, int, int]]:
        """`(block, row, length)` of the maximal stretches of host pages `start .. start+n-1`
        that live in one block (block NO_BLOCK: never written), in page order."""
        ids = self.block_of[start:start + n]
        cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
        out = []
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
            block = int(ids[lo])
            row = start + lo - self.start[block] if block != NO_BLOCK else 0
            out.append((block, row, hi - lo))
        return out

    def whole(self, start: int, n: int) -> tuple[jax.Array, ...] | None:
        """The block that is exactly host pages `start .. start+n-1`, if there is one."""
        block = int(self.block_of[start])
        if block == NO_BLOCK or self.start[block] != start or block_rows(self.arrays[block]) != n:
            return None
        return self.arrays[block] if self.live[block] == n else None

    def view(self, block: int, row: int, rows: int, min_bytes: int | None) -> tuple[jax.Array, ...] | None:
        """Rows [row, row + rows) of `block` as a block of their own that shares its memory
        (`host_views.block_view`), or None where it gives none (`viewable`: nothing is kept
        for those). Made once and kept until the block is dropped: making one costs 0.1-0.2 ms
        on a GPU, and a block is never written after it is added, so a repeated hit reuses it."""
        arrays = self.arrays[block]
        if not viewable(arrays, rows, min_bytes):
            return None
        kept = self.views.setdefault(block, {})
        if (row, rows) not in kept:
            kept[row, rows] = block_view(arrays, row, rows, min_bytes)
        return kept[row, rows]

    def sparsest(self) -> list[int]:
        """Blocks holding dead rows, the most dead first."""
        dead = [(block_rows(self.arrays[b]) - live, b) for b, live in self.live.items()
                if live < block_rows(self.arrays[b])]
        return [b for _, b in sorted(dead, reverse=True)]

    def live_pages(self, block: int) -> list[tuple[int, int]]:
        """`(first host page, length)` of the runs of pages that still live in `block`."""
        start, n = self.start[block], block_rows(self.arrays[block])
        mine = np.flatnonzero(self.block_of[start:start + n] == block)
        runs = np.split(mine, np.flatnonzero(np.diff(mine) != 1) + 1) if mine.size else []
        return [(start + int(r[0]), len(r)) for r in runs]

    def check_invariants(self) -> None:
        """Every page lives in at most one block, inside it; live counts and rows add up."""
        ids, counts = np.unique(self.block_of[self.block_of != NO_BLOCK], return_counts=True)
        assert dict(zip(ids.tolist(), counts.tolist())) == self.live, "live counts"
        assert self.rows == sum(block_rows(a) for a in self.arrays.values()), "rows held"
        assert self.views.keys() <= self.arrays.keys(), "views of a dropped block"
        for block, array in self.arrays.items():
            assert len({int(a.shape[0]) for a in array}) == 1, f"block {block}: parts of different lengths"
            inside = self.block_of[self.start[block]:self.start[block] + block_rows(array)]
            assert (inside == block).sum() == self.live[block] > 0, f"block {block} outside its pages"

    def _drop(self, block: int) -> None:
        self.rows -= block_rows(self.arrays.pop(block))
        del self.start[block], self.live[block]
        self.views.pop(block, None)


class HostTier:
    """The pinned host blocks of every allocator that carries bytes.

    Replicated allocators keep one copy, on the first device's pinned memory; `tp`
    allocators keep each rank's shard (`P(None, "tp")`). Raises ValueError at
    construction, before allocating, when the pages would exceed `memory_limit_bytes`.
    """

    def __init__(self, layout: PoolLayout, host_pages: Mapping[str, int], devices: Devices, memory_limit_bytes: int,
                 layer_groups: int = 1):
        self.devices = devices
        self.pages = checked_page_counts(layout, host_pages, "host_pages", minimum=0)
        self.formats = {a: RowFormat.create(layout, a, devices.tp, layer_groups) for a in self.pages}
        sizes = {a: self.pages[a] * f.stored_row_bytes for a, f in self.formats.items()}
        total = sum(sizes.values())
        if total > memory_limit_bytes:
            detail = ", ".join(f"{a}: {self.pages[a]} pages x {self.formats[a].stored_row_bytes:,} B = {b / 2**30:.2f} GiB"
                               for a, b in sizes.items())
            raise ValueError(
                f"host pools need {total / 2**30:.2f} GiB of pinned memory ({detail}), more than "
                f"host_memory_limit_bytes = {memory_limit_bytes / 2**30:.2f} GiB (XLA's pinned pool is capped "
                f"by XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB, 64 GiB by default); ask for fewer host pages")
        self.nbytes = total
        self.tables = {a: BlockTable(self.pages[a]) for a in self.formats}
        self._zeros: dict[tuple[str, int], jax.Array] = {}
        self.prewarm()

    def sharding(self, allocator: str) -> jax.sharding.Sharding:
        return self.devices.row_sharding(self.formats[allocator].sharded, HOST_MEMORY)

    def freed(self, allocator: str, pages: np.ndarray) -> None:
        """The tree freed host `pages` of `allocator`: their rows are dead (a block none of
        whose pages lives any more is dropped, and compaction never copies them)."""
        if allocator in self.tables:
            self.tables[allocator].release(np.asarray(pages, np.int64))

    def block_counts(self) -> dict[str, tuple[int, int]]:
        """Per allocator: (rows its blocks hold, at most its host pages after a write; pages
        compaction has moved)."""
        return {a: (t.rows, t.compacted) for a, t in self.tables.items()}

    def zeros(self, allocator: str, rows: int) -> tuple[jax.Array, ...]:
        """A pinned block of `rows` zero rows: what pages never written read as."""
        key = (allocator, rows)
        if key not in self._zeros:
            self._zeros[key] = self.block(allocator, rows)
        return self._zeros[key]

    def prewarm(self) -> None:
        """Claim the tier's pinned memory now, so that blocks made while serving reuse it
        instead of pinning fresh pages (about 0.5 s per GiB on the H200 machine)."""
        built = [self.block(a, self.pages[a]) for a in self.formats if self.pages[a]]
        jax.block_until_ready(built)
        for array in jax.tree.leaves(built):
            array.delete()

    def block(self, allocator: str, rows: int) -> tuple[jax.Array, ...]:
        """A new pinned block of `rows` zero rows of `allocator` (every part), not registered anywhere."""
        fmt = self.formats[allocator]
        return tuple(self._zero_rows(allocator, (rows, fmt.part_elems(i))) for i in range(len(fmt.parts)))

    def _zero_rows(self, allocator: str, shape: tuple[int, int]) -> jax.Array:
        fmt = self.formats[allocator]
        # Built from numpy shard by shard: no device memory is used, and np.zeros pages
        # are only touched as they are copied into pinned memory. (make_array_from_callback
        # would lose the host memory space from the array's type.)
        sharding = self.sharding(allocator)
        shards = [jax.device_put(np.zeros(_shard_shape(shape, index), jnp.dtype(fmt.dtype)),
                                 single_device(device, HOST_MEMORY))
                  for device, index in sharding.addressable_devices_indices_map(shape).items()]
        if is_single_device(sharding):
            return shards[0]
        return jax.make_array_from_single_device_arrays(shape, sharding, shards)


def block_rows(block: tuple[jax.Array, ...]) -> int:
    """Rows (host pages) of a block."""
    return int(block[0].shape[0])


def _shard_shape(shape: tuple[int, ...], index: tuple[slice, ...]) -> tuple[int, ...]:
    return tuple(len(range(*s.indices(n))) for s, n in zip(index, shape))
