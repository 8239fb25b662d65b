"""Paged K/V of one Gemma 3 layer: write a chunk's rows, read what its rows may attend to.

A page of one layer is `[2 (K, V), kv_heads, page_size, head_dim]`. A chunk of C rows at
row `offset` of logical page q writes rows offset .. offset + C - 1 of its page (only the
valid ones) and then attends to stored bytes only, so a row sees the same (bf16) K/V
whether they were computed now, earlier, or restored from the host.

Global (full-attention) layers read logical pages 0 .. max_pages - 1 through the anchor
table and admit key positions <= the row's. Sliding layers read the SWA pages of the
window before the chunk and of the chunk itself (W = sliding_window, P = page_size,
window_pages = ceil(W / P) = 2 for Gemma 3):

    logical page   q-2              q-1              q
    keys           (q-2)P ...       (q-1)P ...       qP ... row t        admitted: t-W < pos <= t

Pages before 0 and keys no row admits are zeroed before use, so garbage (even NaN) in a
page a row does not admit never reaches it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

_NO_SCORE = -1e30  # running max floor: finite, so a row that admits nothing (padding) stays finite


def write_rows(pool, slot: int, page, offset, k, v, row_valid):
    """`pool` with the valid rows of k, v f32[C, kv_heads, head_dim] at (slot, page, offset ...).

    pool: [layers, pages, 2, kv_heads, P, head_dim]; page, offset: i32[]; row_valid: bool[C].
    Rows past `valid` keep their old bytes (a later call with a larger `valid` writes them).
    """
    C, Hk, hd = k.shape
    at = (jnp.int32(slot), page.astype(jnp.int32), jnp.int32(0), jnp.int32(0), offset.astype(jnp.int32), jnp.int32(0))
    new = jnp.stack([k, v]).transpose(0, 2, 1, 3).astype(pool.dtype)            # [2, Hk, C, hd]
    old = jax.lax.dynamic_slice(pool, at, (1, 1, 2, Hk, C, hd))[0, 0]
    rows = jnp.where(row_valid[None, None, :, None], new, old)
    return jax.lax.dynamic_update_slice(pool, rows[None, None], at)


def _keys(pool, slot: int, device_pages):
    """(K, V) f32[n * P, kv_heads, head_dim] of device pages i32[n], in page order."""
    pages = pool[slot][device_pages].astype(jnp.float32)                         # [n, 2, Hk, P, hd]
    kv = pages.transpose(1, 0, 3, 2, 4)                                           # [2, n, P, Hk, hd]
    n, P = pages.shape[0], pages.shape[3]
    return kv[0].reshape(n * P, *kv.shape[3:]), kv[1].reshape(n * P, *kv.shape[3:])


def global_keys(pool, slot: int, chunk):
    """(K, V, admitted bool[C, S]) over every logical page of the anchor table."""
    k, v = _keys(pool, slot, chunk.anchor_pages)
    kpos = jnp.arange(k.shape[0], dtype=jnp.int32)
    admit = (kpos[None, :] <= chunk.pos[:, None]) & chunk.row_valid[:, None]
    return k, v, admit


def window_keys(pool, slot: int, chunk, window: int, window_pages: int, page_size: int):
    """(K, V, admitted bool[C, S]) over logical pages page - window_pages .. page of the SWA table."""
    logical = chunk.page + jnp.arange(-window_pages, 1, dtype=jnp.int32)
    k, v = _keys(pool, slot, chunk.swa_pages[jnp.maximum(logical, 0)])
    kpos = (chunk.page - window_pages) * page_size + jnp.arange(k.shape[0], dtype=jnp.int32)
    pos = chunk.pos[:, None]
    admit = (kpos[None, :] >= 0) & (kpos[None, :] <= pos) & (kpos[None, :] > pos - window) & chunk.row_valid[:, None]
    return k, v, admit


def attend(q, k, v, admit, scale: float):
    """Softmax attention of q f32[C, Hq, d] over k, v f32[S, Hk, d] (Hq a multiple of Hk).

    Keys no row admits are zeroed, admitted-elsewhere keys get probability exactly 0, so a
    row's result depends only on the keys it admits (not on `valid`, nor on other pages).
    """
    C, Hq, d = q.shape
    Hk = k.shape[1]
    real = jnp.any(admit, axis=0)[:, None, None]
    k, v = jnp.where(real, k, 0.0), jnp.where(real, v, 0.0)
    s = jnp.einsum("ckgd,skd->ckgs", q.reshape(C, Hk, Hq // Hk, d), k) * scale
    s = jnp.where(admit[:, None, None, :], s, -jnp.inf)
    m = jnp.maximum(jnp.max(s, axis=-1, keepdims=True), _NO_SCORE)
    p = jnp.exp(s - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("ckgs,skd->ckgd", p, v) / jnp.where(denom > 0, denom, 1.0)
    return o.reshape(C, Hq, d)
