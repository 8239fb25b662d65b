"""`PoolSpec` (one pool) and `PoolLayout` (all pools of one model), both immutable.

Index spaces: every pool is addressed in *pages of its allocator*. The anchor (`kv`) and
each independent pool (`swa`) own a page allocator per tier; a kv-sidecar's page p is
anchor page p (its rows `p * rows_per_page ...` are `slot // ratio` of the anchor's slots),
and an swa-state pool's page p holds the ring rows of SWA page p. So one page id per
allocator names the bytes of every pool that follows it.
"""
from __future__ import annotations

import dataclasses
import functools
import math

from hicache_jax.config import ModelConfig
from hicache_jax.layout.formats import ByteFormat
from hicache_jax.layout.names import HitPolicy, Placement, PoolKind

_ITEMSIZE = {"uint8": 1, "bfloat16": 2, "float16": 2, "float32": 4}


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """One registered pool.

    A pool's device array is `[num_layers, num_pages, *page_shape]` of `dtype`, where
    `num_pages` is the page count of its allocator (`index_source`, or itself).
    """

    name: str
    kind: PoolKind
    index_source: str | None          # None for anchor/independent pools
    hit_policy: HitPolicy
    layers: tuple[int, ...]           # model layers that own storage here, ascending
    rows_per_page: int                # rows (slots) of this pool per allocator page
    byte_format: ByteFormat | None    # None for the anchor and for typed (bf16) pools
    page_shape: tuple[int, ...]       # elements of one page of one layer
    dtype: str                        # element type of page_shape
    sharding: Placement
    shard_axis: int | None = None     # axis of page_shape split across TP ranks
    ratio: int = 1                    # source tokens per row (kv sidecars)

    @functools.cached_property
    def num_layers(self) -> int:
        return len(self.layers)

    @functools.cached_property
    def page_bytes(self) -> int:
        """Bytes of one page of one layer (whole pool, all TP ranks together)."""
        return math.prod(self.page_shape) * _ITEMSIZE[self.dtype] if self.page_shape else 0

    @functools.cached_property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @functools.cached_property
    def holds_bytes(self) -> bool:
        return self.kind is not PoolKind.ANCHOR

    @functools.cached_property
    def has_allocator(self) -> bool:
        return self.kind in (PoolKind.ANCHOR, PoolKind.INDEPENDENT)

    @functools.cached_property
    def allocator(self) -> str:
        """The pool whose page allocator indexes this pool."""
        return self.index_source if self.index_source is not None else self.name

    def layer_slot(self, layer: int) -> int:
        """Position of model layer `layer` on this pool's layer axis."""
        try:
            return self.layers.index(layer)
        except ValueError:
            raise ValueError(f"layer {layer} owns no storage in pool {self.name!r} (owners: {list(self.layers)})") from None

    def shard_page_shape(self, tp: int) -> tuple[int, ...]:
        """page_shape of one TP rank's shard."""
        if self.shard_axis is None or tp == 1:
            return self.page_shape
        n = self.page_shape[self.shard_axis]
        if n % tp:
            raise ValueError(f"pool {self.name!r}: axis of size {n} cannot be split over tp={tp} ranks")
        shape = list(self.page_shape)
        shape[self.shard_axis] = n // tp
        return tuple(shape)


@dataclasses.dataclass(frozen=True)
class LayerInfo:
    """What one model layer reads: its ratio and the layers whose storage serves it."""

    layer: int
    ratio: int                 # 0 = sliding-window only
    kv_source: int | None      # layer owning the compressed KV this layer reads
    index_source: int | None   # layer whose indexer query picks this layer's top-k
    index_keys: int | None     # layer owning the indexer keys that query scores


@dataclasses.dataclass(frozen=True)
class PoolLayout:
    """The registered pools of one model, anchor first, in registration order."""

    model: ModelConfig
    pools: tuple[PoolSpec, ...]
    layers: tuple[LayerInfo, ...]

    @functools.cached_property
    def page_size(self) -> int:
        return self.model.page_size

    @property
    def sliding_window(self) -> int | None:
        return self.model.sliding_window

    @functools.cached_property
    def _by_name(self) -> dict[str, PoolSpec]:
        return {p.name: p for p in self.pools}

    def pool(self, name: str) -> PoolSpec:
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise KeyError(f"no pool {name!r} in this layout (pools: {[p.name for p in self.pools]})") from None

    def has_pool(self, name: str) -> bool:
        try:
            return name in self._by_name
        except TypeError:
            return False

    @functools.cached_property
    def anchor(self) -> PoolSpec:
        return self.pools[0]

    @functools.cached_property
    def allocator_pools(self) -> tuple[PoolSpec, ...]:
        """Pools that own a page allocator (anchor + independent), sorted by name.

        Sorted order is the allocation order on every TP rank, so all ranks agree.
        """
        return tuple(sorted((p for p in self.pools if p.has_allocator), key=lambda p: p.name))

    def moving_with(self, allocator: str) -> tuple[PoolSpec, ...]:
        """Pools that hold bytes and are addressed by `allocator`'s pages, in registration order."""
        try:
            return self._moving[allocator]
        except (KeyError, TypeError):
            return ()

    @functools.cached_property
    def moving_names(self) -> dict[str, tuple[str, ...]]:
        """`{allocator: names of the pools that move with it}`, for every pool that owns an allocator."""
        return {a.name: tuple(p.name for p in self.moving_with(a.name)) for a in self.pools if a.has_allocator}

    @functools.cached_property
    def _moving(self) -> dict[str, tuple[PoolSpec, ...]]:
        return {a.name: tuple(p for p in self.pools if p.holds_bytes and p.allocator == a.name)
                for a in self.pools}

    @functools.cached_property
    def byte_pools(self) -> tuple[PoolSpec, ...]:
        return tuple(p for p in self.pools if p.holds_bytes)

    @functools.cached_property
    def swa_pool(self) -> PoolSpec | None:
        return next((p for p in self.pools if p.kind is PoolKind.INDEPENDENT), None)

    def page_bytes_of(self, allocator: str) -> int:
        """Bytes of one `allocator` page over every pool and layer that follows it."""
        return sum(p.num_layers * p.page_bytes for p in self.moving_with(allocator))

    def bytes_per_token(self) -> float:
        """Bytes per context token over all layers of the kv-derived pools (global KV)."""
        return self.page_bytes_of(self.anchor.name) / self.page_size

    def window_bytes_per_token(self) -> float:
        """Bytes per window-resident token over the SWA pool and its state pools."""
        swa = self.swa_pool
        return self.page_bytes_of(swa.name) / self.page_size if swa else 0.0

    def window_pages(self) -> int:
        """SWA pages a prefix boundary needs: the trailing window, page-aligned."""
        w = self.sliding_window
        return -(-w // self.page_size) if w else 0
