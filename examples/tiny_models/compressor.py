"""Gated token compressor (DeepSeek V4 style) and its C4 ring state.

Each compressed entry e of ratio r mixes the r tokens `r*e .. r*e + r-1` with per-channel
softmax weights over learned score projections (plus a per-offset bias `ape`). The ratio-4
compressor also overlaps: entry e mixes its own tokens (second half of each projection)
and the previous chunk's tokens (first half), 2r candidates in all:

    tokens  ... | 4e-4 .. 4e-1 | 4e .. 4e+3 | ...
    entry e       kv[:, :d]      kv[:, d:]        softmax over the 8 candidates, per channel

Chunks never straddle a page (r | page_size), so the only thing a page needs from the past
is, for r = 4, the previous chunk of its first entry: the last r tokens of the previous
page, kept as their projection rows `[kv (2d) | score (2d)]` in the ring state of the
previous page's SWA page (ring row = position % ring_rows).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from examples.tiny_models.layers import dense, normal, ones, rmsnorm, rope
from examples.tiny_models.paged import Chunk, PagedStore


def compressor_init(rng: np.random.Generator, dim: int, width: int, ratio: int) -> dict:
    coff = 2 if ratio == 4 else 1  # the overlapping compressor projects the previous chunk's half too
    return {"wkv": dense(rng, dim, coff * width), "wgate": dense(rng, dim, coff * width),
            "ape": normal(rng, (ratio, coff * width), 0.5), "norm": ones(width)}


def projections(p: dict, h, ratio: int):
    """(kv f32[P, coff*d], score f32[P, coff*d]) of every row; score includes ape[row % ratio]."""
    kv = h @ p["wkv"]
    ape = jnp.tile(p["ape"], (h.shape[0] // ratio, 1))  # row t gets ape[t % ratio]: start % ratio == 0
    return kv, h @ p["wgate"] + ape


def compress(p: dict, kv, score, ratio: int, chunk: Chunk, rope_dim: int, prev=None):
    """Entries f32[P / ratio, d] of one page (normed, rope at each entry's first position).

    kv, score f32[P, coff*d] from `projections`; prev: for ratio 4, (kv, score) f32[r, 2d]
    rows of the r positions before the page (ignored on page 0). Entries whose chunk
    holds padding rows are garbage: callers write and read only complete entries.
    """
    n = kv.shape[0] // ratio
    d = p["norm"].shape[0]
    if ratio == 4:
        cur_kv, cur_sc = kv[:, d:].reshape(n, ratio, d), score[:, d:].reshape(n, ratio, d)
        own_kv, own_sc = kv[:, :d].reshape(n, ratio, d), score[:, :d].reshape(n, ratio, d)
        # page 0 has no previous chunk: its candidates get weight exactly 0 (score -inf, kv 0)
        first_kv = jnp.where(chunk.has_prev, prev[0][:, :d], 0.0)
        first_sc = jnp.where(chunk.has_prev, prev[1][:, :d], -jnp.inf)
        prev_kv = jnp.concatenate([first_kv[None], own_kv[:-1]], axis=0)
        prev_sc = jnp.concatenate([first_sc[None], own_sc[:-1]], axis=0)
        kv_c = jnp.concatenate([prev_kv, cur_kv], axis=1)    # f32[n, 2r, d]
        sc_c = jnp.concatenate([prev_sc, cur_sc], axis=1)
    else:
        kv_c, sc_c = kv.reshape(n, ratio, d), score.reshape(n, ratio, d)
    entries = jnp.sum(jax.nn.softmax(sc_c, axis=1) * kv_c, axis=1)
    return rope(rmsnorm(entries, p["norm"]), chunk.pos[::ratio], rope_dim)


def complete_rows(chunk: Chunk, ratio: int, n: int):  # bool[n]: entries whose r tokens are all valid
    return (jnp.arange(n) + 1) * ratio <= chunk.valid


class RingState:
    """The ring of per-token projection rows `[kv | score]` kept on each SWA page (C4 layers).

    Ring row q of a page holds the last valid position of that page that is q mod R
    (R = ring rows, a divisor of the page size, so a page's first position is row 0).
    Once page p-1 is complete (s = its successor's start, R = 8, r = 4):

        ring row   0    1    2    3    4    5    6    7
        position  s-8  s-7  s-6  s-5  s-4  s-3  s-2  s-1    page p's first entry reads rows 4..7
    """

    def __init__(self, store: PagedStore, ratio: int, page_size: int):
        if store.rows < ratio or page_size % store.rows:
            raise ValueError(f"a ring of {store.rows} rows cannot hold a ratio-{ratio} chunk of "
                             f"{page_size}-token pages (needs rows >= ratio, page_size % rows == 0)")
        self.store, self.ratio, self.page_size = store, ratio, page_size

    def previous_chunk(self, pools: dict, layer: int, chunk: Chunk):
        """(kv, score) f32[r, coff*d] of positions start-r .. start-1 (garbage on page 0)."""
        rows = self.store.read(pools, layer, chunk.prev_swa_page[None])[0]   # f32[R, 4d]
        ring = self.store.rows
        picked = rows[jnp.asarray([(self.page_size - self.ratio + m) % ring for m in range(self.ratio)])]
        half = picked.shape[1] // 2
        return picked[:, :half], picked[:, half:]

    def write(self, pools: dict, layer: int, chunk: Chunk, kv, score) -> dict:
        """Write ring rows of the valid positions of this page (kv, score f32[P, coff*d])."""
        ring = self.store.rows
        q = jnp.arange(ring)
        # ring row q <- the last valid row j < valid with j % R == q (exists iff valid > q)
        last = q + ring * ((chunk.valid - 1 - q) // ring)
        rows = jnp.concatenate([kv, score], axis=-1)[jnp.clip(last, 0, kv.shape[0] - 1)]
        return self.store.write(pools, layer, chunk.swa_page, rows, chunk.valid > q)
