"""Pack/unpack through the Pallas Triton lowering (deprecated since jax 0.11; see the README
for where it is still the faster kernel).

Each program copies one block of one row (see `pack_layout`: power-of-two blocks): grid
axis 0 walks the blocks of a row, axis 1 the rows, so neighbouring programs touch
neighbouring staging bytes. The gather writes `into` through `input_output_aliases`;
the scatter aliases the sources to its outputs, so inside a jit that donates them only
the named pages are written.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.indices import PAD
from pallas_kernels.pack_layout import PackLayout

MAX_PAGES_PER_CALL = 65535  # CUDA caps the second grid axis (one program per row) at 65535


def gather(layout: PackLayout, flat: list[jax.Array], indices: jax.Array, into: jax.Array | None,
           interpret: bool) -> jax.Array:
    """Rows [0, n) of the result (or of `into`) pack pages `indices` (PAD reads page 0)."""
    n = _check_rows(indices)
    dtype = flat[0].dtype
    rows = into.shape[0] if into is not None else n
    call = pl.pallas_call(
        functools.partial(_gather_kernel, layout, len(flat)),
        grid=(layout.num_blocks, n),
        out_shape=jax.ShapeDtypeStruct((rows, layout.row_elems), dtype),
        input_output_aliases={1 + len(flat): 0} if into is not None else {},
        interpret=interpret,
        compiler_params=None if interpret else _params(),
    )
    return call(indices, *flat, *(() if into is None else (into,)))


def scatter(layout: PackLayout, flat: list[jax.Array], staging: jax.Array, indices: jax.Array,
            interpret: bool) -> tuple[jax.Array, ...]:
    """The sources with row i of `staging` written to page `indices[i]` (PAD: nothing)."""
    n = _check_rows(indices)
    call = pl.pallas_call(
        functools.partial(_scatter_kernel, layout, len(flat)),
        grid=(layout.num_blocks, n),
        out_shape=tuple(jax.ShapeDtypeStruct(f.shape, f.dtype) for f in flat),
        input_output_aliases={2 + k: k for k in range(len(flat))},
        interpret=interpret,
        compiler_params=None if interpret else _params(),
    )
    return tuple(call(indices, staging, *flat))


def _check_rows(indices) -> int:
    n = int(indices.shape[0])
    if n > MAX_PAGES_PER_CALL:
        raise ValueError(f"{n} pages in one call; the triton kernels take at most {MAX_PAGES_PER_CALL}")
    return n


def _gather_kernel(layout: PackLayout, num_sources: int, idx_ref, *refs):
    # refs: the sources, then the aliased `into` buffer if given (never read), then the output
    src_refs, out_ref = refs[:num_sources], refs[-1]
    j, i = pl.program_id(0), pl.program_id(1)
    page = jnp.maximum(idx_ref[i], 0)  # PAD reads page 0
    for seg in layout.segments:
        @pl.when((j >= seg.first_block) & (j < seg.first_block + seg.num_blocks))
        def _copy(seg=seg, src=src_refs[seg.source]):
            layer, off = seg.locate(j - seg.first_block, jnp.where)
            dst = seg.row_offset + layer * seg.page_elems + off
            out_ref[i, pl.ds(dst, seg.block_elems)] = src[seg.first_layer + layer, page, pl.ds(off, seg.block_elems)]


def _scatter_kernel(layout: PackLayout, num_sources: int, idx_ref, staging_ref, *refs):
    out_refs = refs[num_sources:]  # refs[:num_sources] are the aliased inputs: never read
    j, i = pl.program_id(0), pl.program_id(1)
    page = idx_ref[i]
    for seg in layout.segments:
        @pl.when((page != PAD) & (j >= seg.first_block) & (j < seg.first_block + seg.num_blocks))
        def _copy(seg=seg, dst=out_refs[seg.source]):
            layer, off = seg.locate(j - seg.first_block, jnp.where)
            src = seg.row_offset + layer * seg.page_elems + off
            block = staging_ref[i, pl.ds(src, seg.block_elems)]
            dst[seg.first_layer + layer, page, pl.ds(off, seg.block_elems)] = block


def _params():
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams(num_warps=4, num_stages=1)
