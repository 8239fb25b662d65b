"""`gather_pages`: pack pages of several sources into contiguous staging rows (any backend)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from pallas_kernels import backends
from pallas_kernels._triton_offsets import triton_can_address
from pallas_kernels.pack_layout import layer_ranges, padded_elems


def gather_pages(
    sources: Sequence[jax.Array],  # each [L_s, P, *page_shape_s], one dtype
    indices,                       # i32[n]: pages in [0, P), or PAD
    *,
    into: jax.Array | None = None,  # [C >= n, row_elems]: rows [0, n) overwritten in place
    impl: str = "auto",
    block_bytes: int | None = None,
    align_bytes: int = 1,
    layers: Sequence[tuple[int, int, int]] | None = None,  # (source, first layer, number of layers) per segment
) -> jax.Array:                    # [n, row_elems], or the updated `into`
    """Row i of the result packs page `indices[i]` of every source (layout: `pack_layout`).

    Reads the sources only. A PAD entry's row holds page 0. Rows are padded with zeros to
    a multiple of `align_bytes`. With `into`, the rows are written into that buffer
    (in place when the enclosing jit donates it) and rows >= n keep their contents.
    `layers` gives the row's segments in order, each `(source, first layer, n)`: the page
    of layers first .. first + n - 1 of that source (a source may be in several segments
    or none); None: every source whole, in order. Each range must lie inside its source.
    `impl` is one of `IMPLS` ("auto": see `auto_impl`); `block_bytes` caps the bytes one
    copy moves (default: the backend's). Concrete `indices` and `layers` are checked here
    (ValueError before any device work); traced indices must have been checked with
    `check_indices`.
    """
    backend, interpret = backends.resolve(impl)
    layout, num_pages = backends.describe(sources, backend, block_bytes, align_bytes, layers)
    backends.maybe_check(indices, num_pages, unique=False)
    n = int(indices.shape[0])
    dtype = sources[0].dtype
    if into is not None:
        backends.check_staging(into, layout, dtype, n, "into")
    if n == 0:
        return into if into is not None else jnp.zeros((0, layout.row_elems), dtype)
    layout, used, _ = backends.used_only(layout, sources)
    if backend == "triton" and not interpret and not triton_can_address([*used, into]):
        backend = "reference"
    if backend == "reference":
        return gather_pages_reference(sources, indices, into=into, align_bytes=align_bytes, layers=layers)
    flat = [backends.flat(s) for s in used]
    out = backends.backend_module(backend).gather(layout, flat, jnp.asarray(indices, jnp.int32), into, interpret)
    if layout.data_elems < layout.row_elems:  # the padding: a few bytes per row, written in place
        if into is None:  # keeps XLA's GPU compiler from fusing the kernel into the update (it fails to)
            out = jax.lax.optimization_barrier(out)
        out = out.at[:n, layout.data_elems:].set(jnp.zeros((), dtype))
    return out


def gather_pages_reference(sources: Sequence[jax.Array], indices, *, into: jax.Array | None = None,
                           align_bytes: int = 1, layers: Sequence[tuple[int, int, int]] | None = None) -> jax.Array:
    """Plain-jnp twin of `gather_pages` (same result, XLA gathers and a transpose)."""
    ranges = layer_ranges([s.shape[0] for s in sources], layers)
    indices = jnp.asarray(indices, jnp.int32)
    n = int(indices.shape[0])
    safe = jnp.maximum(indices, 0)
    rows = jnp.concatenate([
        jnp.swapaxes(sources[k][first:first + count, safe], 0, 1).reshape(n, count * math.prod(sources[k].shape[2:]))
        for k, first, count in ranges], axis=1)
    width = padded_elems(rows.shape[1], rows.dtype.itemsize, align_bytes)
    rows = jnp.pad(rows, ((0, 0), (0, width - rows.shape[1])))
    if into is None:
        return rows
    return jax.lax.dynamic_update_slice_in_dim(into, rows, 0, axis=0)
