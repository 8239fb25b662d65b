"""Tiny GQA model: paged causal attention over every earlier position through the anchor table.

The K/V of a layer live in pool `gqa_kv` as pages `[2 (K, V), kv_heads, page_size,
head_dim]` (bf16 by default) at the anchor page of their logical page. Attention walks the
logical pages 0 .. current with an online softmax (flash / paged-attention style): a
position on logical page p is always reduced over the same p + 1 pages in the same order,
so its result does not depend on `valid`, on later pages, or on table entries beyond p
(never visited). The model does not use `swa_pages` (there is no SWA pool).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hicache_jax.layout import PoolLayout, PoolName
from examples.tiny_models import layers as L
from examples.tiny_models.base import ChunkModel
from examples.tiny_models.paged import Chunk

MLP_FACTOR = 2
_NO_SCORE = -1e30  # running max before any key: finite, so fully masked (padding) rows stay finite


class GQAModel(ChunkModel):
    """Seeded random-weight GQA model over `layout` (model_type "gqa")."""

    def __init__(self, layout: PoolLayout, seed: int = 0, max_pages: int = 16):
        super().__init__(layout, max_pages)
        cfg = self.config
        self.q_heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.hidden = cfg.hidden_size
        if self.hidden <= 0 or self.q_heads <= 0 or self.q_heads % self.kv_heads:
            raise ValueError(f"config {cfg.name!r}: num_attention_heads {self.q_heads} must be a positive multiple "
                             f"of num_key_value_heads {self.kv_heads}, hidden_size {self.hidden} positive")
        self.kv = layout.pool(str(PoolName.GQA_KV))
        self.params = self._init(np.random.default_rng(seed))

    def _init(self, rng: np.random.Generator) -> dict:
        D, Hq, Hk, hd = self.hidden, self.q_heads, self.kv_heads, self.head_dim
        params = {"embed": L.normal(rng, (self.vocab_size, D)), "head": L.dense(rng, D, self.vocab_size),
                  "final_norm": L.ones(D), "layers": []}
        for _ in range(self.config.num_hidden_layers):
            params["layers"].append({
                "attn_norm": L.ones(D), "mlp_norm": L.ones(D),
                "wq": L.dense(rng, D, Hq * hd), "wk": L.dense(rng, D, Hk * hd), "wv": L.dense(rng, D, Hk * hd),
                "wo": L.dense(rng, Hq * hd, D, gain=0.5), "mlp": L.swiglu_init(rng, D, MLP_FACTOR * D),
            })
        return params

    def _chunk(self, params, pools, chunk: Chunk, tokens, schedule):
        x = params["embed"][tokens]
        pools = dict(pools)
        for layer, lp in enumerate(params["layers"]):
            if schedule is not None:                        # a deferred load: this layer's groups land
                pools, x = schedule.before_layer(layer, pools, x)
            pool, attn = self._attention(layer, lp, pools[self.kv.name], chunk, L.rmsnorm(x, lp["attn_norm"]))
            pools[self.kv.name] = pool
            x = x + attn
            x = x + L.swiglu(lp["mlp"], L.rmsnorm(x, lp["mlp_norm"]))
        return pools, L.rmsnorm(x, params["final_norm"]) @ params["head"]

    def _attention(self, layer: int, lp: dict, pool, chunk: Chunk, h):
        P, Hq, Hk, hd = self.page_size, self.q_heads, self.kv_heads, self.head_dim
        slot = self.kv.layer_slot(layer)
        q = L.rope((h @ lp["wq"]).reshape(P, Hq, hd), chunk.pos, hd)
        k = L.rope((h @ lp["wk"]).reshape(P, Hk, hd), chunk.pos, hd)
        v = (h @ lp["wv"]).reshape(P, Hk, hd)
        new = jnp.stack([k, v]).transpose(0, 2, 1, 3).astype(pool.dtype)       # [2, Hk, P, hd]
        old = pool[slot, chunk.anchor_page]
        page = jnp.where(chunk.row_valid[None, None, :, None], new, old)
        pool = jax.lax.dynamic_update_slice(pool, page[None, None], (slot, chunk.anchor_page, 0, 0, 0, 0))
        o = self._paged_attention(pool[slot], chunk, q.reshape(P, Hk, Hq // Hk, hd))
        return pool, o.reshape(P, Hq * hd) @ lp["wo"]

    def _paged_attention(self, kv_pages, chunk: Chunk, q):
        """q f32[P, Hk, G, hd] over kv_pages [num_pages, 2, Hk, P, hd] -> f32[P, Hk, G, hd]."""
        P = self.page_size
        scale = float(self.head_dim) ** -0.5

        def body(j, carry):
            m, l, acc = carry
            kv = kv_pages[chunk.anchor_pages[j]].astype(jnp.float32)          # [2, Hk, P, hd]
            kpos = j * P + jnp.arange(P)
            mask = (kpos[None, :] <= chunk.pos[:, None]) & chunk.row_valid[:, None]  # [P, P]
            real = jnp.any(mask, axis=0)[None, :, None]                       # keys some valid row admits
            k, v = jnp.where(real, kv[0], 0.0), jnp.where(real, kv[1], 0.0)
            s = jnp.einsum("tkgd,ksd->tkgs", q, k) * scale
            s = jnp.where(mask[:, None, None, :], s, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[..., None])
            alpha = jnp.exp(m - m_new)
            return m_new, l * alpha + jnp.sum(p, axis=-1), acc * alpha[..., None] + jnp.einsum("tkgs,ksd->tkgd", p, v)

        m0 = jnp.full(q.shape[:-1], _NO_SCORE, jnp.float32)
        init = (m0, jnp.zeros_like(m0), jnp.zeros(q.shape, jnp.float32))
        _, l, acc = jax.lax.fori_loop(0, chunk.page + 1, body, init)
        return acc / jnp.where(l > 0, l, 1.0)[..., None]
