"""`RowFormat`: the packed row of one allocator, one page of every pool that moves with it.

Pure Python and numpy (no jax): the kernels pack and unpack rows in this format (its
`kernel_layers` are their `layers` argument), the host tier stores them (as `parts`), and
the storage tier cuts them into objects (`pool_runs`).

A host row holds, for one allocator page, every byte-holding pool addressed by that
allocator (`layout.moving_with`, registration order), each pool's layers in order, each
page flattened. It is exactly the staging row the gather kernel packs, so a contiguous
run of host pages is one contiguous block and moves in one DMA:

    row (one rank):  | pool A: layer 0 | layer 1 | ... | pool B: layer 0 | ... |

`tp` allocators split each page over the ranks; the global row is the ranks' rows side
by side (rank r owns columns [r * rank_row_elems, (r + 1) * rank_row_elems)), so a buffer
sharded `P(None, "tp")` gives each rank exactly its own shard's pages.

Each rank's row ends with zero padding up to a multiple of `ROW_ALIGN_BYTES`, so every
host page starts at an aligned address: the DMAs of a run then run at the link's speed
(64-byte aligned host addresses cost a tenth of it on the H200; see BENCHMARKS.md).

With layer groups (`layout/groups.py`) the host tier stores a row as *parts*, one per
group that holds any layer of these pools: part g packs, per rank, the group's layers of
each pool, padded the same way. The row above stays the format rows are read and written
in (L3 storage, snapshots); `to_parts` / `from_parts` convert. One group: one part, the row.

    row:     | A: l0 l1 l2 l3 | B: l0 l1 l2 l3 | pad |
    parts:   | A: l0 l1 | B: l0 l1 | pad |    | A: l2 l3 | B: l2 l3 | pad |
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import numpy as np

from hicache_jax.layout import groups as layer_groups
from hicache_jax.layout.names import Placement
from hicache_jax.layout.pool import PoolLayout, PoolSpec

ROW_ALIGN_BYTES = 512


@dataclasses.dataclass(frozen=True)
class RowPart:
    """The layers of one layer group in a stored row: `segments` are the kernels' row
    segments `(pool index, first slot, slots)`, in pool order."""

    group: int
    segments: tuple[tuple[int, int, int], ...]
    rank_data_elems: int
    rank_row_elems: int       # with the padding


@dataclasses.dataclass(frozen=True)
class RowFormat:
    """Packed row of `allocator` (one page of every pool in `pools`)."""

    allocator: str
    pools: tuple[PoolSpec, ...]
    dtype: str
    ranks: int                                  # ranks that each hold a slice of the row
    rank_page_shapes: tuple[tuple[int, ...], ...]  # per pool: one rank's page shape
    parts: tuple[RowPart, ...] = ()              # how the host tier stores a row (module docstring)

    @classmethod
    def create(cls, layout: PoolLayout, allocator: str, tp: int = 1, groups: int = 1) -> "RowFormat":
        """The row of `allocator` on `tp` ranks (a `tp` pool's page is split over them when
        tp > 1), stored as one part per layer group of `groups`."""
        pools = layout.moving_with(allocator)
        if not pools:
            raise RuntimeError(f"bug: allocator {allocator!r} carries no byte-holding pool")
        dtypes = {p.dtype for p in pools}
        placements = {tp > 1 and split_over_ranks(p) for p in pools}
        if len(dtypes) != 1 or len(placements) != 1:
            raise ValueError(
                f"pools of allocator {allocator!r} must share one dtype and one placement to pack into one "
                f"host row; got {[(p.name, p.dtype, str(p.sharding)) for p in pools]}")
        sharded = placements.pop()
        ranks = tp if sharded else 1
        shapes = tuple(p.shard_page_shape(ranks) for p in pools)
        dtype = dtypes.pop()
        bounds = layer_groups.bounds(layout, groups)
        parts = []
        for g in range(groups):
            segments = tuple((i, *layer_groups.slots(p, bounds[g], bounds[g + 1])) for i, p in enumerate(pools))
            segments = tuple(s for s in segments if s[2])
            if segments:
                data = sum(n * math.prod(shapes[i]) for i, _, n in segments)
                parts.append(RowPart(g, segments, data,
                                     padded_elems(data, pools[0].itemsize, ROW_ALIGN_BYTES)))
        return cls(allocator, pools, dtype, ranks, shapes, tuple(parts))

    @functools.cached_property
    def sharded(self) -> bool:
        return self.ranks > 1

    @functools.cached_property
    def itemsize(self) -> int:
        return self.pools[0].itemsize

    @functools.cached_property
    def rank_data_elems(self) -> int:
        """Elements of one rank's pages in a row, before the padding."""
        return sum(p.num_layers * math.prod(s) for p, s in zip(self.pools, self.rank_page_shapes))

    @functools.cached_property
    def rank_row_elems(self) -> int:
        return padded_elems(self.rank_data_elems, self.itemsize, ROW_ALIGN_BYTES)

    @functools.cached_property
    def row_elems(self) -> int:
        return self.ranks * self.rank_row_elems

    @functools.cached_property
    def row_bytes(self) -> int:
        """Bytes of one host row (all ranks): the allocator's page over every pool and layer."""
        return self.row_elems * self.itemsize

    @functools.cached_property
    def rank_row_bytes(self) -> int:
        return self.rank_row_elems * self.itemsize

    def part_elems(self, part: int) -> int:
        """Elements of one stored part of a row (all ranks)."""
        return self.ranks * self.parts[part].rank_row_elems

    @functools.cached_property
    def stored_row_bytes(self) -> int:
        """Bytes the host tier stores per page: its parts, each padded."""
        return sum(self.part_elems(i) for i in range(len(self.parts))) * self.itemsize

    @functools.cached_property
    def whole(self) -> bool:
        """One part, exactly the row."""
        return len(self.parts) == 1 and self.parts[0].rank_row_elems == self.rank_row_elems

    def kernel_layers(self, part: int) -> tuple[tuple[int, int, int], ...] | None:
        """The kernels' `layers` argument for `part` (None: every pool whole)."""
        return None if self.whole else self.parts[part].segments

    def to_parts(self, rows: np.ndarray) -> list[np.ndarray]:
        """Rows `[n, row_elems]` as the stored parts `[n, part_elems(i)]` (padding zero)."""
        if self.whole:
            return [rows]
        out = []
        for i in range(len(self.parts)):
            part = np.zeros((rows.shape[0], self.part_elems(i)), rows.dtype)
            src, dst = self._columns(i)
            part[:, dst] = rows[:, src]
            out.append(part)
        return out

    def from_parts(self, parts: list[np.ndarray]) -> np.ndarray:
        """The inverse of `to_parts`."""
        if self.whole:
            return parts[0]
        rows = np.zeros((parts[0].shape[0], self.row_elems), parts[0].dtype)
        for i, part in enumerate(parts):
            src, dst = self._columns(i)
            rows[:, src] = part[:, dst]
        return rows

    def _columns(self, part: int) -> tuple[np.ndarray, np.ndarray]:
        """(columns in the row, columns in the part) of the part's data, all ranks."""
        elems = [math.prod(s) for s in self.rank_page_shapes]
        starts = np.cumsum([0] + [p.num_layers * e for p, e in zip(self.pools, elems)])
        src, dst = [], []
        for rank in range(self.ranks):
            at = rank * self.parts[part].rank_row_elems
            for i, first, n in self.parts[part].segments:
                lo = rank * self.rank_row_elems + starts[i] + first * elems[i]
                src.append(np.arange(lo, lo + n * elems[i]))
                dst.append(np.arange(at, at + n * elems[i]))
                at += n * elems[i]
        return np.concatenate(src), np.concatenate(dst)

    def source_dims(self) -> list[tuple[int, int]]:
        """(num_layers, page elements of one rank) per pool: the kernels' source dims."""
        return [(p.num_layers, math.prod(s)) for p, s in zip(self.pools, self.rank_page_shapes)]

    def encode(self, pages: Mapping[str, np.ndarray]) -> np.ndarray:
        """One row `[row_elems]` from `{pool: [num_layers, *page_shape]}` (whole pages, all ranks)."""
        names = [p.name for p in self.pools]
        if sorted(pages) != sorted(names):
            raise ValueError(f"a page of allocator {self.allocator!r} needs exactly pools {names}, got {sorted(pages)}")
        ranks = []
        for r in range(self.ranks):
            parts = []
            for spec, shape in zip(self.pools, self.rank_page_shapes):
                page = np.asarray(pages[spec.name])
                want = (spec.num_layers, *spec.page_shape)
                if page.shape != want or str(page.dtype) != spec.dtype:
                    raise ValueError(f"page of pool {spec.name!r} must be {spec.dtype}{list(want)}, "
                                     f"got {page.dtype}{list(page.shape)}")
                parts.append(self._rank_slice(spec, shape, page, r).reshape(-1))
            parts.append(np.zeros(self.rank_row_elems - self.rank_data_elems, parts[0].dtype))
            ranks.append(np.concatenate(parts))
        return np.concatenate(ranks)

    def decode(self, row: np.ndarray) -> dict[str, np.ndarray]:
        """`{pool: [num_layers, *page_shape]}` from one row `[row_elems]` (inverse of `encode`)."""
        row = np.asarray(row)
        if row.shape != (self.row_elems,):
            raise RuntimeError(f"bug: host row of {row.shape}, expected ({self.row_elems},)")
        per_rank: dict[str, list[np.ndarray]] = {p.name: [] for p in self.pools}
        for r in range(self.ranks):
            offset = r * self.rank_row_elems
            for spec, shape in zip(self.pools, self.rank_page_shapes):
                size = spec.num_layers * math.prod(shape)
                per_rank[spec.name].append(row[offset:offset + size].reshape(spec.num_layers, *shape))
                offset += size
        if not self.sharded:
            return {name: parts[0] for name, parts in per_rank.items()}
        return {spec.name: np.concatenate(per_rank[spec.name], axis=1 + spec.shard_axis) for spec in self.pools}

    def _rank_slice(self, spec: PoolSpec, shape: tuple[int, ...], page: np.ndarray, rank: int) -> np.ndarray:
        if not self.sharded:
            return page
        axis = 1 + spec.shard_axis
        width = shape[spec.shard_axis]
        return np.take(page, np.arange(rank * width, (rank + 1) * width), axis=axis)

    def pool_runs(self, ranks_of) -> tuple[tuple[str, int | None, int, int], ...]:
        """`(pool, rank, byte offset, bytes)` of each pool's run in a row, per rank of
        `ranks_of(pool spec)` (`(None,)`: one run for every rank, a replicated pool): the
        storage tier's objects of one page, in pool order."""
        starts = np.cumsum([0] + [p.num_layers * math.prod(s) for p, s in zip(self.pools, self.rank_page_shapes)])
        return tuple((p.name, r, ((r or 0) * self.rank_row_elems + int(starts[i])) * self.itemsize,
                      p.num_layers * math.prod(s) * self.itemsize)
                     for i, (p, s) in enumerate(zip(self.pools, self.rank_page_shapes)) for r in ranks_of(p))


def split_over_ranks(spec: PoolSpec) -> bool:
    """Whether `spec`'s pages differ per TP rank (a `tp` pool with a shard axis)."""
    return spec.sharding is Placement.TP and spec.shard_axis is not None


def padded_elems(elems: int, itemsize: int, align_bytes: int) -> int:
    """`elems` rounded up so that `elems * itemsize` is a multiple of `align_bytes` (the
    kernels' `pallas_kernels.padded_elems`, which pads their staging rows the same way)."""
    step = max(1, align_bytes // itemsize)
    return -(-elems // step) * step
