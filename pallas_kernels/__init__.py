"""Page pack/unpack kernels for paged KV pools: Mosaic GPU, Pallas TPU, Triton, jnp reference.

Kernels take source arrays `[num_layers, num_pages, *page_shape]` and explicit int32 page
index arrays; they know nothing of plans, trees or tiers. Each backend lives in its own
module (`mosaic_gpu`, `tpu`, `triton`) over the shared `pack_layout`; `gather_pages` /
`scatter_pages` pick one by `impl=` (`IMPLS`; "auto" = `auto_impl`), and each has a
plain-jnp `*_reference` twin. This package imports nothing from `hicache_jax`.
"""
from pallas_kernels.gather import gather_pages, gather_pages_reference
from pallas_kernels.indices import PAD, check_indices
from pallas_kernels.pack_layout import PackLayout, PackSegment, padded_elems, pack_layout, source_dims
from pallas_kernels.scatter import scatter_pages, scatter_pages_reference
from pallas_kernels.backends import BACKENDS, DEFAULT_BLOCK_BYTES, GRANULE_BYTES, IMPLS, auto_impl, resolve
from pallas_kernels._triton_offsets import ensure_wide_offsets as ensure_triton_wide_offsets

__all__ = [
    "BACKENDS", "DEFAULT_BLOCK_BYTES", "GRANULE_BYTES", "IMPLS", "PAD", "PackLayout", "PackSegment", "auto_impl",
    "check_indices", "ensure_triton_wide_offsets", "gather_pages", "gather_pages_reference", "pack_layout",
    "padded_elems", "resolve", "scatter_pages", "scatter_pages_reference", "source_dims",
]
