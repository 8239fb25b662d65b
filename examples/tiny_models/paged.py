"""Reading and writing pool pages from inside a jitted chunk forward.

`Chunk` holds the traced scalars of one `forward_chunk` call (which logical page, which
rows are valid, the current and previous device pages). `PagedStore` is one stored
quantity (compressed latent, indexer keys, ring state, SWA KV) in one pool, or in a
payload + scale pool pair, addressed by (model layer, device page).

A pool array is `[num_layers, num_pages, page_bytes]`; the model layer's row on the first
axis is `spec.layer_slot(layer)` (static), the page is a traced page-table entry.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hicache_jax import codecs
from hicache_jax.layout import PoolLayout, PoolSpec


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One aligned chunk of `rows` positions `start .. start + rows - 1`, the first `valid` real.

    `rows` divides the page size, so a chunk lies inside one page (the tiny models use
    whole pages: rows = page_size, offset 0). Built inside the traced forward; every
    field is a traced array.
    """

    page: jax.Array           # i32[]: logical page index, start // page_size
    start: jax.Array          # i32[]: first position of the chunk
    valid: jax.Array          # i32[]: real rows, 1..rows
    pos: jax.Array            # i32[rows]: absolute position of each row
    row_valid: jax.Array      # bool[rows]
    anchor_pages: jax.Array   # i32[max_pages]: logical page -> anchor device page
    swa_pages: jax.Array      # i32[max_pages]: logical page -> SWA device page
    has_prev: jax.Array       # bool[]: a previous page exists (page >= 1)
    offset: jax.Array         # i32[]: row of the page where the chunk starts, start - page * page_size

    @staticmethod
    def make(page_size: int, anchor_pages, swa_pages, start, valid, rows: int | None = None) -> "Chunk":
        rows = page_size if rows is None else rows
        page = start // page_size
        pos = start + jnp.arange(rows, dtype=jnp.int32)
        return Chunk(page, start, valid, pos, jnp.arange(rows) < valid, anchor_pages, swa_pages, page >= 1,
                     start - page * page_size)

    @property
    def anchor_page(self):  # i32[]: device page written in anchor-indexed pools
        return self.anchor_pages[self.page]

    @property
    def swa_page(self):  # i32[]: device page written in SWA-indexed pools
        return self.swa_pages[self.page]

    @property
    def prev_swa_page(self):  # i32[]: SWA device page of the previous logical page (any id on page 0)
        return self.swa_pages[jnp.maximum(self.page - 1, 0)]


@dataclasses.dataclass(frozen=True)
class PagedStore:
    """Rows of one quantity, `rows` per page, encoded with `codec`.

    Stored in `pool` (data and scale rows of one page), or, for a split fp4 indexer, data
    rows in `pool` and scale rows in `scale_pool` at the same (layer slot, page).
    """

    pool: PoolSpec
    scale_pool: PoolSpec | None
    codec: codecs.SlotCodec

    @staticmethod
    def of(layout: PoolLayout, name: str, scale_name: str | None = None) -> "PagedStore":
        spec = layout.pool(name)
        if scale_name is None:
            return PagedStore(spec, None, codecs.codec_for(spec.byte_format))
        scale = layout.pool(scale_name)
        if scale.layers != spec.layers or scale.rows_per_page != spec.rows_per_page:
            raise ValueError(f"pools {name!r} and {scale_name!r} do not pair: layers {spec.layers} vs {scale.layers}")
        return PagedStore(spec, scale, codecs.split_pair(spec.byte_format, scale.byte_format))

    @property
    def rows(self) -> int:
        return self.pool.rows_per_page

    @property
    def dim(self) -> int:
        return self.codec.dim

    def write(self, pools: dict, layer: int, page, x, row_mask) -> dict:
        """Pools with the rows of `row_mask` on device page `page` set to `x`; nothing else changes.

        x f32[rows, dim], row_mask bool[rows], page i32[].
        """
        pools = dict(pools)
        if self.scale_pool is None:
            slot = self.pool.layer_slot(layer)
            old = pools[self.pool.name][slot, page]
            pools[self.pool.name] = _put_page(pools[self.pool.name], slot, page,
                                              codecs.write_rows(self.codec, old, x, row_mask))
            return pools
        data, scale = self.codec.encode(x)
        keep = row_mask[:, None]
        for spec, rows in ((self.pool, data), (self.scale_pool, scale)):
            slot = spec.layer_slot(layer)
            old, _ = codecs.unpack_page(spec.byte_format, pools[spec.name][slot, page], self.rows)
            new = codecs.pack_page(spec.byte_format, jnp.where(keep, rows, old),
                                   jnp.zeros((self.rows, 0), jnp.uint8))
            pools[spec.name] = _put_page(pools[spec.name], slot, page, new)
        return pools

    def read(self, pools: dict, layer: int, pages):
        """f32[n, rows, dim] of device pages `pages` (i32[n]); garbage pages decode to garbage."""
        if self.scale_pool is None:
            raw = pools[self.pool.name][self.pool.layer_slot(layer)][pages]
            return codecs.decode_page(self.codec, raw, self.rows)
        data, _ = codecs.unpack_page(self.pool.byte_format,
                                     pools[self.pool.name][self.pool.layer_slot(layer)][pages], self.rows)
        scale, _ = codecs.unpack_page(self.scale_pool.byte_format,
                                      pools[self.scale_pool.name][self.scale_pool.layer_slot(layer)][pages], self.rows)
        return self.codec.decode(data, scale)


def _put_page(arr, slot: int, page, new):  # u8[L, N, B] with [slot, page] = new u8[B]; in place under donation
    return jax.lax.dynamic_update_slice(arr, new[None, None], (jnp.int32(slot), page.astype(jnp.int32), jnp.int32(0)))
