"""Gather kernel: pack pages of several sources into contiguous staging rows.

Each program copies one block of one row (see `row_layout`): grid axis 0 walks the blocks
of a row, axis 1 the pages, so neighbouring programs write neighbouring staging bytes.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import _sources
from pallas_kernels.row_layout import DEFAULT_BLOCK_BYTES, RowLayout, padded_elems


def gather_pages(
    sources: Sequence[jax.Array],  # each [L_s, P, *page_shape_s], one dtype
    indices,                       # i32[n]: pages in [0, P), or PAD
    *,
    into: jax.Array | None = None,  # [C >= n, row_elems]: rows [0, n) overwritten in place
    impl: str = "pallas",
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    align_bytes: int = 1,
) -> jax.Array:                    # [n, row_elems], or the updated `into`
    """Row i of the result packs page `indices[i]` of every source (layout: `row_layout`).

    Reads the sources only. A PAD entry's row holds page 0. Rows are padded with zeros to
    a multiple of `align_bytes`. With `into`, the rows are written into that buffer
    (aliased: donate it in the enclosing jit for an in-place update) and rows >= n keep
    their contents. Concrete `indices` are checked here (ValueError before any device
    work); traced ones must have been checked by the caller with `check_indices`.
    """
    _sources.check_impl(impl)
    layout, num_pages = _sources.describe(sources, block_bytes, align_bytes)
    _sources.maybe_check(indices, num_pages, unique=False)
    n = int(indices.shape[0])
    dtype = sources[0].dtype
    if into is not None:
        _sources.check_staging(into, layout, dtype, n, "into")
    if n == 0:
        return into if into is not None else jnp.zeros((0, layout.row_elems), dtype)
    if impl == "pallas" and not _sources.triton_can_address([*sources, into]):
        impl = "reference"
    if impl == "reference":
        return gather_pages_reference(sources, indices, into=into, align_bytes=align_bytes)
    if n > _sources.MAX_PAGES_PER_CALL:
        raise ValueError(f"{n} pages in one call; at most {_sources.MAX_PAGES_PER_CALL}")
    indices = jnp.asarray(indices, jnp.int32)
    flat = [_sources.flat(s) for s in sources]
    rows = into.shape[0] if into is not None else n
    kernel = functools.partial(_gather_kernel, layout, len(flat))
    call = pl.pallas_call(
        kernel,
        grid=(layout.num_blocks, n),
        out_shape=jax.ShapeDtypeStruct((rows, layout.row_elems), dtype),
        input_output_aliases={1 + len(flat): 0} if into is not None else {},
        interpret=impl == "interpret",
        compiler_params=None if impl == "interpret" else _triton_params(),
    )
    args = (indices, *flat) + ((into,) if into is not None else ())
    out = call(*args)
    if layout.data_elems < layout.row_elems:  # the padding: a few bytes per row, written in place
        out = out.at[:n, layout.data_elems:].set(jnp.zeros((), dtype))
    return out


def _gather_kernel(layout: RowLayout, num_sources: int, idx_ref, *refs):
    # refs: the sources, then the aliased `into` buffer if given (never read), then the output
    src_refs, out_ref = refs[:num_sources], refs[-1]
    j, i = pl.program_id(0), pl.program_id(1)
    page = jnp.maximum(idx_ref[i], 0)  # PAD reads page 0
    for seg, src in zip(layout.segments, src_refs):
        @pl.when((j >= seg.first_block) & (j < seg.first_block + seg.num_blocks))
        def _copy(seg=seg, src=src):
            layer, off = seg.locate(j - seg.first_block, jnp.where)
            dst = seg.row_offset + layer * seg.page_elems + off
            out_ref[i, pl.ds(dst, seg.block_elems)] = src[layer, page, pl.ds(off, seg.block_elems)]


def gather_pages_reference(sources: Sequence[jax.Array], indices, *, into: jax.Array | None = None,
                           align_bytes: int = 1) -> jax.Array:
    """Plain-jnp twin of `gather_pages` (same result, XLA gathers and a transpose)."""
    indices = jnp.asarray(indices, jnp.int32)
    n = int(indices.shape[0])
    safe = jnp.maximum(indices, 0)
    rows = jnp.concatenate([jnp.swapaxes(s[:, safe], 0, 1).reshape(n, -1) for s in sources], axis=1)
    width = padded_elems(rows.shape[1], rows.dtype.itemsize, align_bytes)
    rows = jnp.pad(rows, ((0, 0), (0, width - rows.shape[1])))
    if into is None:
        return rows
    return jax.lax.dynamic_update_slice_in_dim(into, rows, 0, axis=0)


def _triton_params():
    from jax.experimental.pallas import triton as plgpu
    return plgpu.CompilerParams(num_warps=4, num_stages=1)
