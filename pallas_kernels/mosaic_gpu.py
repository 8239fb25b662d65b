"""Pack/unpack on NVIDIA GPUs (Hopper and newer) through Mosaic GPU: bulk async copies.

A row is cut into blocks (`pack_layout` with a 16-byte granule: the bulk copy engine moves
multiples of 16 bytes between 16-byte aligned addresses). One *item* is one block of one
row; items are numbered row-major, so consecutive items touch consecutive staging bytes,
and a persistent grid of G blocks (CTAs) deals them out round-robin:

    item g = i * num_blocks + j      row i (page indices[i]), block j of the row
    CTA c moves items c, c + G, c + 2G, ...  (its t-th item is g = c + t * G)

Every copy goes GMEM -> SMEM -> GMEM through a ring of K shared-memory slots per CTA, so
that K copies are in flight at once (one in flight per CTA reached only ~860 GB/s):

    prologue:      load items 0..K-1 into slots 0..K-1           (each completes on its barrier)
    iteration t:   wait barrier[t % K]; store slot t % K to GMEM  (one bulk group)
                   wait until all but the newest LAG stores have read their slot
                   reload slot (t - LAG) % K with item t - LAG + K

A store keeps reading its slot after it is issued, so a slot is reloaded only once its
store has read it; LAG stores may still be reading while the loop goes on. Everything
is issued by one thread of the CTA; the others follow the same control flow.

The gather returns a new array or writes into `into` in place through a mutable ref; the
scatter always writes the pools in place through mutable refs (inside a jit that donates
them, no byte outside the named pages is copied). Addresses are 64-bit: no 2^31 limit.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.indices import PAD
from pallas_kernels.pack_layout import PackLayout

SMEM_BYTES_PER_CTA = 96 << 10   # two CTAs fit on one SM (227 KiB of shared memory on Hopper)
# One CTA per SM: in one H200 run (jax 0.12.0.1) it beat two per SM at the batch sizes the
# engine issues (a chunk's part: <= 256 kv or 32 SWA pages): unpack 1938 vs 1436 GB/s at
# 256 kv pages, 2389 vs 1906 at 64 SWA pages, pack 1788 vs 1621; two per SM were ahead
# only at unpacking 4096 pages at once (3102 vs 2897), which the engine never does.
CTAS_PER_SM = 1
MAX_SLOTS = 16
LAG = 2                          # stores allowed to be still reading their slot
INTERPRET_CTAS = 3               # interpreted runs: a few CTAs still exercise the dealing


class Plan(NamedTuple):
    slots: int        # K: SMEM slots per CTA
    slot_elems: int   # elements per slot (the largest block)
    ctas: int         # G: CTAs of the persistent grid
    lag: int          # stores that may still be reading their slot when the loop moves on


@functools.cache
def sm_count() -> int:
    """Streaming multiprocessors of the first GPU (a guess when jax does not say)."""
    device = jax.devices()[0]
    return int(getattr(device, "core_count", 0) or 132)


def plan(layout: PackLayout, itemsize: int, n: int, interpret: bool, slots: int | None = None,
         ctas: int | None = None, lag: int = LAG) -> Plan:
    """The ring and grid for `n` rows of `layout` (defaults: module constants)."""
    slot_elems = max(seg.block_elems for seg in layout.segments)
    if slots is None:
        slots = max(2, min(MAX_SLOTS, SMEM_BYTES_PER_CTA // (slot_elems * itemsize)))
    if ctas is None:
        ctas = INTERPRET_CTAS if interpret else CTAS_PER_SM * sm_count()
    if slots < 2 or ctas < 1 or lag < 0:
        raise ValueError(f"need slots >= 2, ctas >= 1 and lag >= 0, got {slots}, {ctas} and {lag}")
    return Plan(slots, slot_elems, max(1, min(ctas, n * layout.num_blocks)), min(lag, slots - 1))


def gather(layout: PackLayout, flat: list[jax.Array], indices: jax.Array, into: jax.Array | None,
           interpret: bool, **knobs) -> jax.Array:
    """Rows [0, n) of the result (or of `into`) pack pages `indices` (PAD reads page 0).
    `knobs`: `plan`'s slots, ctas, lag (benchmarks)."""
    n = int(indices.shape[0])
    dtype = flat[0].dtype
    shape = (n if into is None else into.shape[0], layout.row_elems)
    plan_ = plan(layout, jnp.dtype(dtype).itemsize, n, interpret, **knobs)

    def body(idx_ref, *refs):
        srcs, out, buf, bars = refs[:len(flat)], refs[len(flat)], refs[-2], refs[-1]
        page = lambda i: jnp.maximum(idx_ref[i], 0)  # PAD reads page 0
        _ring(layout, n, plan_, buf, bars,
              lambda i, j, seg, size: _page_block(srcs[seg.source], page(i), j, seg, size),
              lambda i, j, seg, size: _row_block(out, i, j, seg, size), lambda i: None)

    if into is None:
        return _call(body, plan_, dtype, jax.ShapeDtypeStruct(shape, dtype), interpret)(indices, *flat)
    out = jax.new_ref(into)
    _call(body, plan_, dtype, (), interpret)(indices, *flat, out)
    return jax.freeze(out)


def scatter(layout: PackLayout, flat: list[jax.Array], staging: jax.Array, indices: jax.Array,
            interpret: bool, **knobs) -> tuple[jax.Array, ...]:
    """The sources with row i of `staging` written to page `indices[i]` (PAD: nothing).

    A PAD row's store is skipped and an empty bulk group committed in its place, so the
    count of groups in flight stays one per item. The interpreter does not model empty
    groups (it would see a slot reloaded too early), so interpreted runs wait for every
    store's read (lag 0)."""
    n = int(indices.shape[0])
    dtype = flat[0].dtype
    if interpret:
        knobs.setdefault("lag", 0)
    plan_ = plan(layout, jnp.dtype(dtype).itemsize, n, interpret, **knobs)

    def body(idx_ref, rows, *refs):
        dsts, buf, bars = refs[:len(flat)], refs[-2], refs[-1]
        page = lambda i: jnp.maximum(idx_ref[i], 0)  # a PAD row is never stored
        _ring(layout, n, plan_, buf, bars,
              lambda i, j, seg, size: _row_block(rows, i, j, seg, size),
              lambda i, j, seg, size: _page_block(dsts[seg.source], page(i), j, seg, size),
              lambda i: idx_ref[i] != PAD)

    pools = [jax.new_ref(f) for f in flat]
    _call(body, plan_, dtype, (), interpret)(indices, staging, *pools)
    return tuple(jax.freeze(p) for p in pools)


def _page_block(pool, page, j, seg, size):
    """Block j of the row (in segment `seg`) inside page `page` of its pool `[L, P, E]`."""
    layer, off = seg.locate(j - seg.first_block, jnp.where)
    return pool.at[seg.first_layer + layer, page, pl.ds(off, size)]


def _row_block(rows, i, j, seg, size):
    """Block j of row i of a staging array `[C, row_elems]`."""
    layer, off = seg.locate(j - seg.first_block, jnp.where)
    return rows.at[i, pl.ds(seg.row_offset + layer * seg.page_elems + off, size)]


def _call(body, plan_: Plan, dtype, out_type, interpret: bool):
    slots, slot_elems, ctas, _ = plan_
    return plgpu.kernel(
        body, out_type=out_type, grid=(ctas,), grid_names=("cta",),
        scratch_types=[plgpu.SMEM((slots, slot_elems), dtype), plgpu.Barrier(num_arrivals=1, num_barriers=slots)],
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else False)


def _ring(layout: PackLayout, n: int, plan_: Plan, buf, bars, src_of, dst_of, keep) -> None:
    """Move this CTA's items through the slot ring (module docstring).

    `src_of(i, j, seg, size)` / `dst_of(...)`: GMEM refs of item (row i, block j in
    segment `seg`, `size` elements);
    `keep(i)`: whether row i is stored (None: always).
    """
    slots, _, ctas, lag = plan_
    total = n * layout.num_blocks
    c = jax.lax.axis_index("cta")
    count = jax.lax.div(total - c + ctas - 1, ctas)      # items of this CTA, >= 1

    def each_segment(t, fn):
        """Run fn(i, j, seg, size) in the branch of the segment that item t's block
        falls in; `size` (static) is the block's length, shorter for a page's last block."""
        g = c + t * ctas
        i, j = jax.lax.div(g, layout.num_blocks), jax.lax.rem(g, layout.num_blocks)
        for seg in layout.segments:
            inside = (j >= seg.first_block) & (j < seg.first_block + seg.num_blocks)
            if seg.last_elems == seg.block_elems:
                pl.when(inside)(functools.partial(fn, i, j, seg, seg.block_elems))
                continue
            last = jax.lax.rem(j - seg.first_block, seg.blocks_per_page) == seg.blocks_per_page - 1
            pl.when(inside & ~last)(functools.partial(fn, i, j, seg, seg.block_elems))
            pl.when(inside & last)(functools.partial(fn, i, j, seg, seg.last_elems))

    def load(t):
        slot = jax.lax.rem(t, slots)

        def issue(i, j, seg, size):
            plgpu.copy_gmem_to_smem(src_of(i, j, seg, size), buf.at[slot, pl.ds(0, size)], bars.at[slot],
                                    oob_mode=plgpu.OOBFillMode.PROMISE_IN_BOUNDS)
        each_segment(t, issue)

    def store(t):
        slot = jax.lax.rem(t, slots)

        def issue(i, j, seg, size):
            copy = lambda: plgpu.copy_smem_to_gmem(buf.at[slot, pl.ds(0, size)], dst_of(i, j, seg, size))
            wanted = keep(i)
            if wanted is None:
                copy()
                return
            pl.when(wanted)(copy)
            # an empty group keeps the count of groups in flight that the waits below rely on
            pl.when(jnp.logical_not(wanted))(plgpu.commit_smem_to_gmem_group)
        each_segment(t, issue)

    for t in range(slots):
        pl.when(t < count)(functools.partial(load, t))

    def step(t, carry):
        plgpu.barrier_wait(bars.at[jax.lax.rem(t, slots)])
        store(t)
        plgpu.wait_smem_to_gmem(lag, wait_read_only=True)
        r = t - lag
        pl.when((r >= 0) & (r + slots < count))(lambda: load(r + slots))
        return carry

    jax.lax.fori_loop(0, count, step, 0)
    plgpu.wait_smem_to_gmem(0)

