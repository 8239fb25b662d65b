"""Where each L3 object of a page lies inside a packed host row.

A host row (`hicache_jax.pools.host_rows.HostRowFormat`) holds one allocator page of every
pool that moves with that allocator; a `tp` allocator's row is the ranks' rows side by
side, each padded to `ROW_ALIGN_BYTES`:

    rank 0: | pool A, all layers | pool B, all layers | pad | rank 1: | pool A | pool B | pad |

Each (pool, rank) run is contiguous, so it is one object's payload as it lies: a put reads
it and a get writes it in place. This module recomputes the arithmetic of
`HostRowFormat` without jax (a test checks the two agree).
"""
from __future__ import annotations

import dataclasses
import math

from hicache_jax.layout import PoolLayout, PoolSpec
from hicache_jax.storage.keys import KeySpace

ROW_ALIGN_BYTES = 512   # = hicache_jax.pools.host_rows.ROW_ALIGN_BYTES


@dataclasses.dataclass(frozen=True)
class Segment:
    """One object's payload in a row: `nbytes` bytes at byte `offset`."""

    pool: str
    rank: int | None     # None: a replicated pool (one object for every TP size)
    offset: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """The objects of one `allocator` page, in the order `KeySpace.page_keys` gives their keys."""

    allocator: str
    pools: tuple[PoolSpec, ...]
    segments: tuple[Segment, ...]
    row_bytes: int

    @classmethod
    def create(cls, keys: KeySpace, allocator: str) -> "RowLayout":
        pools = keys.layout.moving_with(allocator)
        if not pools:
            raise ValueError(f"allocator {allocator!r} carries no byte-holding pool "
                             f"(allocators with bytes: {byte_allocators(keys.layout)})")
        sharded = {keys.sharded(p) for p in pools}
        if len(sharded) != 1 or len({p.dtype for p in pools}) != 1:
            raise ValueError(f"pools of allocator {allocator!r} must share one dtype and one placement, got "
                             f"{[(p.name, p.dtype, str(p.sharding)) for p in pools]}")
        ranks = keys.tp if sharded.pop() else 1
        sizes = [p.num_layers * math.prod(p.shard_page_shape(ranks)) * p.itemsize for p in pools]
        itemsize = pools[0].itemsize
        rank_bytes = _padded(sum(sizes), itemsize)
        starts = [sum(sizes[:i]) for i in range(len(pools))]
        segments = tuple(Segment(p.name, r, (r or 0) * rank_bytes + start, size)
                         for p, start, size in zip(pools, starts, sizes) for r in keys.ranks(p))
        return cls(allocator, pools, segments, ranks * rank_bytes)

    @property
    def data_bytes(self) -> int:
        """Payload bytes of one page (the rows' padding is not stored)."""
        return sum(s.nbytes for s in self.segments)


def byte_allocators(layout: PoolLayout) -> list[str]:
    """Allocators whose pages carry bytes (the anchor and each independent pool), sorted."""
    return [p.name for p in layout.allocator_pools if layout.moving_with(p.name)]


def _padded(nbytes: int, itemsize: int) -> int:
    # The row is padded in whole elements to a multiple of ROW_ALIGN_BYTES (pallas_kernels.padded_elems).
    step = max(1, ROW_ALIGN_BYTES // itemsize) * itemsize
    return -(-nbytes // step) * step
