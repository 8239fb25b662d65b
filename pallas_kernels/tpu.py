"""Pack/unpack on TPUs through Pallas TPU: one DMA per row, segment and layer, HBM to HBM.

Not run on TPU hardware: tested bit-exact against the jnp references in TPU interpret
mode on the CPU only (README, limits).

Every ref stays in HBM (`memory_space=pl.ANY`); the page indices are scalar-prefetched
into SMEM so the kernel can address pages with them. A page of one layer is contiguous on
both sides, so each (row, segment, layer) is one DMA, with no trip through VMEM:

    src[seg.source][seg.first_layer + layer, page, :]  --DMA-->  staging[i, row_offset + layer * E : ... + E]

Grid step s moves rows [s * R, s * R + R): it starts the DMAs of all its rows (they run
concurrently, all signalling one DMA semaphore), then waits for each; R rows of a V4 kv
batch put R x 62 DMAs in flight. Steps are independent (megacore may split them).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.indices import PAD
from pallas_kernels.pack_layout import PackLayout

ROWS_PER_STEP = 8


def gather(layout: PackLayout, flat: list[jax.Array], indices: jax.Array, into: jax.Array | None,
           interpret: bool) -> jax.Array:
    """Rows [0, n) of the result (or of `into`) pack pages `indices` (PAD reads page 0)."""
    n = int(indices.shape[0])
    dtype = flat[0].dtype
    rows = n if into is None else into.shape[0]

    def copies(idx_ref, srcs, out, sem, i):
        page = jnp.maximum(idx_ref[i], 0)
        return [pltpu.make_async_copy(srcs[seg.source].at[seg.first_layer + layer, page],
                                      out.at[i, pl.ds(seg.row_offset + layer * seg.page_elems, seg.page_elems)], sem)
                for seg in layout.segments for layer in range(seg.num_layers)]

    def kernel(idx_ref, *refs):
        srcs, out, sem = refs[:len(flat)], refs[-2], refs[-1]  # an aliased `into` sits before `out`: never read
        _move_rows(n, lambda i: copies(idx_ref, srcs, out, sem, i), lambda i: True)

    call = _call(kernel, n, len(flat) + (into is not None), jax.ShapeDtypeStruct((rows, layout.row_elems), dtype),
                 {1 + len(flat): 0} if into is not None else {}, interpret)
    return call(indices, *flat, *(() if into is None else (into,)))


def scatter(layout: PackLayout, flat: list[jax.Array], staging: jax.Array, indices: jax.Array,
            interpret: bool) -> tuple[jax.Array, ...]:
    """The sources with row i of `staging` written to page `indices[i]` (PAD: nothing)."""
    n = int(indices.shape[0])

    def copies(idx_ref, rows, dsts, sem, i):
        page = idx_ref[i]
        return [pltpu.make_async_copy(rows.at[i, pl.ds(seg.row_offset + layer * seg.page_elems, seg.page_elems)],
                                      dsts[seg.source].at[seg.first_layer + layer, page], sem)
                for seg in layout.segments for layer in range(seg.num_layers)]

    def kernel(idx_ref, rows, *refs):
        dsts, sem = refs[len(flat):-1], refs[-1]  # refs[:len(flat)] are the aliased inputs: never read
        _move_rows(n, lambda i: copies(idx_ref, rows, dsts, sem, i), lambda i: idx_ref[i] != PAD)

    out_type = tuple(jax.ShapeDtypeStruct(f.shape, f.dtype) for f in flat)
    call = _call(kernel, n, 1 + len(flat), out_type, {2 + k: k for k in range(len(flat))}, interpret)
    return tuple(call(indices, staging, *flat))


def _move_rows(n: int, copies_of, wanted) -> None:
    """Start every DMA of this step's rows, then wait for each (rows past n or not
    `wanted` move nothing)."""
    first = pl.program_id(0) * ROWS_PER_STEP

    def each_row(fn):
        def one(r, carry):
            i = first + r
            pl.when((i < n) & wanted(jnp.minimum(i, n - 1)))(functools.partial(fn, i))
            return carry
        jax.lax.fori_loop(0, ROWS_PER_STEP, one, 0)

    def start(i):
        for c in copies_of(i):
            c.start()

    def wait(i):
        for c in copies_of(i):
            c.wait()

    each_row(start)
    each_row(wait)


def _call(kernel, n: int, num_inputs: int, out_type, aliases: dict[int, int], interpret: bool):
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(pl.cdiv(n, ROWS_PER_STEP),),
        in_specs=[any_spec] * num_inputs,
        out_specs=jax.tree.map(lambda _: any_spec, out_type),
        scratch_shapes=[pltpu.SemaphoreType.DMA(())])
    return pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=out_type, input_output_aliases=aliases,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=pltpu.InterpretParams() if interpret else False)
