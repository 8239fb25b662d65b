"""Lightning indexer: score complete compressed entries per row, keep the top k.

score(t, e) = sum_h w[t, h] * relu(q[t, h] . key[e])      (DeepSeek V3.2 / V4 indexer)

Only entries whose tokens all lie at or before row t's position are candidates; the rest
score -inf and, if top-k has to take some (fewer than k candidates), come back with their
`selected` flag off so attention masks them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from examples.tiny_models.layers import dense, rope


def indexer_init(rng: np.random.Generator, dim: int, q_rank: int, heads: int, head_dim: int) -> dict:
    return {"wq": dense(rng, q_rank, heads * head_dim), "ww": dense(rng, dim, heads)}


def entry_mask(pos, row_valid, ratio: int, num_entries: int):
    """bool[P, E]: entry e (tokens ratio*e .. ratio*e + ratio-1, global) is complete at row t.

    Padding rows admit nothing: an entry complete only for a padding row was never
    written and may hold anything.
    """
    complete = (jnp.arange(num_entries)[None, :] + 1) * ratio <= pos[:, None] + 1
    return complete & row_valid[:, None]


def index_query(p: dict, qr, h, pos, heads: int, head_dim: int, rope_dim: int):
    """(q f32[P, heads, head_dim], w f32[P, heads]) of the rows (qr: low-rank query, h: normed input)."""
    q = rope((qr @ p["wq"]).reshape(qr.shape[0], heads, head_dim), pos, rope_dim)
    w = (h @ p["ww"]) * np.float32(heads ** -0.5 * head_dim ** -0.5)
    return q, w


def top_k(q, w, entry_keys, mask, k: int):
    """Selection (idx i32[P, k], selected bool[P, k]) over entries entry_keys f32[E, head_dim].

    Keys no row admits are zeroed first, so garbage keys cannot turn into NaN scores of
    admitted entries; masked scores are -inf before the top-k.
    """
    entry_keys = jnp.where(jnp.any(mask, axis=0)[:, None], entry_keys, 0.0)
    s = jnp.einsum("phd,ed->phe", q, entry_keys)
    scores = jnp.einsum("phe,ph->pe", jax.nn.relu(s), w)
    _, idx = jax.lax.top_k(jnp.where(mask, scores, -jnp.inf), k)
    return idx, jnp.take_along_axis(mask, idx, axis=1)
