"""`PageObjects`: the storage objects of one allocator page, where each lies in a packed row.

A host row (`hicache_jax.layout.rows.RowFormat`) holds one allocator page of every pool
that moves with that allocator; a `tp` allocator's row is the ranks' rows side by side,
each padded to `ROW_ALIGN_BYTES`:

    rank 0: | pool A, all layers | pool B, all layers | pad | rank 1: | pool A | pool B | pad |

Each (pool, rank) run is contiguous, so it is one object's payload as it lies: a put reads
it and a get writes it in place. The runs come from the row format itself
(`RowFormat.pool_runs`), so the storage tier and the host tier cannot disagree.
"""
from __future__ import annotations

import dataclasses

from hicache_jax.layout import PoolLayout, PoolSpec
from hicache_jax.layout.rows import RowFormat
from hicache_jax.storage.keys import KeySpace


@dataclasses.dataclass(frozen=True)
class ObjectSpan:
    """One object's payload in a row: `nbytes` bytes at byte `offset`."""

    pool: str
    rank: int | None     # None: a replicated pool (one object for every TP size)
    offset: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class PageObjects:
    """The objects of one `allocator` page, in the order `KeySpace.page_keys` gives their keys."""

    allocator: str
    pools: tuple[PoolSpec, ...]
    spans: tuple[ObjectSpan, ...]
    row_bytes: int

    @classmethod
    def create(cls, keys: KeySpace, allocator: str) -> "PageObjects":
        if not keys.layout.moving_with(allocator):
            raise ValueError(f"allocator {allocator!r} carries no byte-holding pool "
                             f"(allocators with bytes: {byte_allocators(keys.layout)})")
        fmt = RowFormat.create(keys.layout, allocator, keys.tp)
        return cls(allocator, fmt.pools, tuple(ObjectSpan(*run) for run in fmt.pool_runs(keys.ranks)), fmt.row_bytes)

    @property
    def data_bytes(self) -> int:
        """Payload bytes of one page (the rows' padding is not stored)."""
        return sum(s.nbytes for s in self.spans)


def byte_allocators(layout: PoolLayout) -> list[str]:
    """Allocators whose pages carry bytes (the anchor and each independent pool), sorted."""
    return [p.name for p in layout.allocator_pools if layout.moving_with(p.name)]
