"""Page pack/unpack kernels for paged KV pools: Mosaic GPU, Pallas TPU, Triton, jnp reference.

Kernels take source arrays `[num_layers, num_pages, *page_shape]` and explicit int32 page
index arrays; they know nothing of plans, trees or tiers. Each backend lives in its own
module (`mosaic_gpu`, `tpu`, `triton`) over the shared `row_layout`; `gather_pages` /
`scatter_pages` pick one by `impl=` (`IMPLS`; "auto" = `auto_impl`), and each has a
plain-jnp `*_reference` twin. This package imports nothing from `hicache_jax`.
"""
from pallas_kernels.gather import gather_pages, gather_pages_reference
from pallas_kernels.indices import PAD, check_indices
from pallas_kernels.row_layout import RowLayout, Segment, padded_elems, row_layout, source_dims
from pallas_kernels.scatter import scatter_pages, scatter_pages_reference
from pallas_kernels._sources import BACKENDS, DEFAULT_BLOCK_BYTES, GRANULE_BYTES, IMPLS, auto_impl, resolve

__all__ = [
    "BACKENDS", "DEFAULT_BLOCK_BYTES", "GRANULE_BYTES", "IMPLS", "PAD", "RowLayout", "Segment", "auto_impl",
    "check_indices", "gather_pages", "gather_pages_reference", "padded_elems", "resolve", "row_layout",
    "scatter_pages", "scatter_pages_reference", "source_dims",
]
