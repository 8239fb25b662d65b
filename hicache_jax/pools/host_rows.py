"""The packed host row of one allocator: one page of every pool that moves with it.

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
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np

import pallas_kernels as pk
from hicache_jax.layout import PoolLayout, PoolSpec
from hicache_jax.pools.placement import Devices

ROW_ALIGN_BYTES = 512


@dataclasses.dataclass(frozen=True)
class HostRowFormat:
    """Packed row of `allocator` (one page of every pool in `pools`)."""

    allocator: str
    pools: tuple[PoolSpec, ...]
    dtype: str
    ranks: int                                  # ranks that each hold a slice of the row
    rank_page_shapes: tuple[tuple[int, ...], ...]  # per pool: one rank's page shape

    @classmethod
    def create(cls, layout: PoolLayout, allocator: str, devices: Devices) -> "HostRowFormat":
        pools = layout.moving_with(allocator)
        if not pools:
            raise RuntimeError(f"bug: allocator {allocator!r} carries no byte-holding pool")
        dtypes = {p.dtype for p in pools}
        placements = {devices.sharded(p) for p in pools}
        if len(dtypes) != 1 or len(placements) != 1:
            raise ValueError(
                f"pools of allocator {allocator!r} must share one dtype and one placement to pack into one "
                f"host row; got {[(p.name, p.dtype, str(p.sharding)) for p in pools]}")
        sharded = placements.pop()
        ranks = devices.tp if sharded else 1
        shapes = tuple(p.shard_page_shape(ranks) for p in pools)
        return cls(allocator, pools, dtypes.pop(), ranks, shapes)

    @property
    def sharded(self) -> bool:
        return self.ranks > 1

    @property
    def itemsize(self) -> int:
        return jnp.dtype(self.dtype).itemsize

    @property
    def rank_data_elems(self) -> int:
        """Elements of one rank's pages in a row, before the padding."""
        return sum(p.num_layers * math.prod(s) for p, s in zip(self.pools, self.rank_page_shapes))

    @property
    def rank_row_elems(self) -> int:
        return pk.padded_elems(self.rank_data_elems, self.itemsize, ROW_ALIGN_BYTES)

    @property
    def row_elems(self) -> int:
        return self.ranks * self.rank_row_elems

    @property
    def row_bytes(self) -> int:
        """Bytes of one host row (all ranks): the allocator's page over every pool and layer."""
        return self.row_elems * self.itemsize

    @property
    def rank_row_bytes(self) -> int:
        return self.rank_row_elems * self.itemsize

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
                if page.shape != want or page.dtype != jnp.dtype(spec.dtype):
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
