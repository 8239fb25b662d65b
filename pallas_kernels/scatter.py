"""Scatter kernel: unpack staging rows into pages of several sources, in place.

The inverse of `gather_pages`. The sources are aliased to the outputs
(`input_output_aliases`), so inside a jit that donates them only the named pages are
written; every other page keeps its bytes without being copied.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import _sources
from pallas_kernels.gather import _triton_params
from pallas_kernels.indices import PAD
from pallas_kernels.row_layout import DEFAULT_BLOCK_BYTES, RowLayout


def scatter_pages(
    sources: Sequence[jax.Array],  # each [L_s, P, *page_shape_s], one dtype; donate them
    staging: jax.Array,            # [C >= n, row_elems]; rows [0, n) are read
    indices,                       # i32[n]: unique pages in [0, P), or PAD
    *,
    impl: str = "pallas",
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    align_bytes: int = 1,
) -> tuple[jax.Array, ...]:        # the sources, updated
    """Write row i of `staging` to page `indices[i]` of every source.

    PAD entries write nothing; pages not named keep their contents; the rows' end padding
    (to `align_bytes`, as `gather_pages` wrote it) is not read. Concrete `indices` are
    checked here (range, uniqueness: ValueError before any device work); traced ones
    must have been checked by the caller with `check_indices(..., unique=True)`.
    """
    _sources.check_impl(impl)
    layout, num_pages = _sources.describe(sources, block_bytes, align_bytes)
    _sources.maybe_check(indices, num_pages, unique=True)
    n = int(indices.shape[0])
    _sources.check_staging(staging, layout, sources[0].dtype, n, "staging")
    if n == 0:
        return tuple(sources)
    if impl == "pallas" and not _sources.triton_can_address([*sources, staging]):
        impl = "reference"
    if impl == "reference":
        return scatter_pages_reference(sources, staging, indices)
    if n > _sources.MAX_PAGES_PER_CALL:
        raise ValueError(f"{n} pages in one call; at most {_sources.MAX_PAGES_PER_CALL}")
    indices = jnp.asarray(indices, jnp.int32)
    flat = [_sources.flat(s) for s in sources]
    call = pl.pallas_call(
        functools.partial(_scatter_kernel, layout, len(flat)),
        grid=(layout.num_blocks, n),
        out_shape=tuple(jax.ShapeDtypeStruct(f.shape, f.dtype) for f in flat),
        input_output_aliases={2 + k: k for k in range(len(flat))},
        interpret=impl == "interpret",
        compiler_params=None if impl == "interpret" else _triton_params(),
    )
    out = call(indices, staging, *flat)
    return tuple(o.reshape(s.shape) for o, s in zip(out, sources))


def _scatter_kernel(layout: RowLayout, num_sources: int, idx_ref, staging_ref, *refs):
    out_refs = refs[num_sources:]  # refs[:num_sources] are the aliased inputs: never read
    j, i = pl.program_id(0), pl.program_id(1)
    page = idx_ref[i]
    for seg, dst in zip(layout.segments, out_refs):
        @pl.when((page != PAD) & (j >= seg.first_block) & (j < seg.first_block + seg.num_blocks))
        def _copy(seg=seg, dst=dst):
            layer, off = seg.locate(j - seg.first_block, jnp.where)
            src = seg.row_offset + layer * seg.page_elems + off
            dst[layer, page, pl.ds(off, seg.block_elems)] = staging_ref[i, pl.ds(src, seg.block_elems)]


def scatter_pages_reference(sources: Sequence[jax.Array], staging: jax.Array, indices) -> tuple[jax.Array, ...]:
    """Plain-jnp twin of `scatter_pages` (XLA scatters with dropped PAD entries)."""
    indices = jnp.asarray(indices, jnp.int32)
    n = int(indices.shape[0])
    out = []
    offset = 0
    for s in sources:
        layers, pages = s.shape[0], s.shape[1]
        width = math.prod(s.shape[2:]) * layers
        target = jnp.where(indices == PAD, pages, indices)  # out of range: dropped
        vals = staging[:n, offset:offset + width].reshape(n, layers, *s.shape[2:])
        out.append(s.at[:, target].set(jnp.swapaxes(vals, 0, 1), mode="drop", unique_indices=True))
        offset += width
    return tuple(out)
