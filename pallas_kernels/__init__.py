"""Page pack/unpack kernels for paged KV pools (Pallas: Triton on GPU, interpret on CPU).

Kernels take source arrays `[num_layers, num_pages, *page_shape]` and explicit int32 page
index arrays; they know nothing of plans, trees or tiers. Each has a plain-jnp
`*_reference` twin. This package imports nothing from `hicache_jax`.
"""
from pallas_kernels.gather import gather_pages, gather_pages_reference
from pallas_kernels.indices import PAD, check_indices
from pallas_kernels.row_layout import DEFAULT_BLOCK_BYTES, RowLayout, Segment, padded_elems, row_layout, source_dims
from pallas_kernels.scatter import scatter_pages, scatter_pages_reference
from pallas_kernels._sources import IMPLS

__all__ = [
    "DEFAULT_BLOCK_BYTES", "IMPLS", "PAD", "RowLayout", "Segment", "check_indices", "gather_pages",
    "gather_pages_reference", "padded_elems", "row_layout", "scatter_pages", "scatter_pages_reference", "source_dims",
]
