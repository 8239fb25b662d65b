"""`scatter_pages`: unpack staging rows into pages of several sources, in place (any backend).

The inverse of `gather_pages`. Every backend writes the sources in place (aliased or
mutable refs), so inside a jit that donates them only the named pages are written; every
other page keeps its bytes without being copied.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from pallas_kernels import backends
from pallas_kernels._triton_offsets import triton_can_address
from pallas_kernels.indices import PAD
from pallas_kernels.pack_layout import layer_ranges


def scatter_pages(
    sources: Sequence[jax.Array],  # each [L_s, P, *page_shape_s], one dtype; donate them
    staging: jax.Array,            # [C >= n, row_elems]; rows [0, n) are read
    indices,                       # i32[n]: unique pages in [0, P), or PAD
    *,
    impl: str = "auto",
    block_bytes: int | None = None,
    align_bytes: int = 1,
    layers: Sequence[tuple[int, int, int]] | None = None,  # (source, first layer, number of layers) per segment
) -> tuple[jax.Array, ...]:        # the sources, updated
    """Write row i of `staging` to page `indices[i]` of every source.

    PAD entries write nothing; pages not named keep their contents; the rows' end padding
    (to `align_bytes`, as `gather_pages` wrote it) is not read. `layers` as for
    `gather_pages`, and no layer of a source may be in two segments: only the layers in
    a segment are written (the pages of other layers, and sources in no segment, keep
    their bytes). `impl` and `block_bytes` as for `gather_pages`. Concrete `indices`
    (range, uniqueness) and `layers` are checked here (ValueError before any device
    work); traced indices must have been checked by the caller with
    `check_indices(..., unique=True)`.
    """
    backend, interpret = backends.resolve(impl)
    layout, num_pages = backends.describe(sources, backend, block_bytes, align_bytes, layers, disjoint=True)
    backends.maybe_check(indices, num_pages, unique=True)
    n = int(indices.shape[0])
    backends.check_staging(staging, layout, sources[0].dtype, n, "staging")
    if n == 0:
        return tuple(sources)
    layout, used, which = backends.used_only(layout, sources)
    if backend == "triton" and not interpret and not triton_can_address([*used, staging]):
        backend = "reference"
    if backend == "reference":
        return scatter_pages_reference(sources, staging, indices, layers=layers)
    flat = [backends.flat(s) for s in used]
    out = backends.backend_module(backend).scatter(layout, flat, staging, jnp.asarray(indices, jnp.int32), interpret)
    result = list(sources)
    for k, o in zip(which, out):
        result[k] = o.reshape(sources[k].shape)
    return tuple(result)


def scatter_pages_reference(sources: Sequence[jax.Array], staging: jax.Array, indices, *,
                            layers: Sequence[tuple[int, int, int]] | None = None) -> tuple[jax.Array, ...]:
    """Plain-jnp twin of `scatter_pages` (XLA scatters with dropped PAD entries)."""
    ranges = layer_ranges([s.shape[0] for s in sources], layers, disjoint=True)
    indices = jnp.asarray(indices, jnp.int32)
    n = int(indices.shape[0])
    out = list(sources)
    offset = 0
    for k, first, count in ranges:
        s = out[k]
        width = math.prod(s.shape[2:]) * count
        target = jnp.where(indices == PAD, s.shape[1], indices)  # out of range: dropped
        vals = staging[:n, offset:offset + width].reshape(n, count, *s.shape[2:])
        out[k] = s.at[first:first + count, target].set(jnp.swapaxes(vals, 0, 1), mode="drop", unique_indices=True)
        offset += width
    return tuple(out)
