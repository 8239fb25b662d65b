"""Tiny DeepSeek V4 / V4.1: sliding-window + compressed sparse attention over paged pools.

Per layer (see `plan.py` for which pools): a low-rank query, one shared latent per token
(K = V, rope on its last `qk_rope_head_dim` features, stored in the SWA pool), and, on
compressed layers, attention over compressed latents picked by the lightning indexer
(ratio 4, 1, 2) or over all of them (ratio 128), in one softmax with the window and a
per-head sink. Then a SwiGLU MLP. Everything the layer attends to is read back from the
pools after this chunk's rows were written, so attention always sees the stored
(quantised) bytes, whether they were computed now, earlier, or restored from a copy.

Window keys of row t (W = sliding_window <= page_size):

    previous SWA page: last W rows      current SWA page: rows 0 .. t
    positions start-W .. start-1         positions start .. start+t      admitted iff pos > pos_t - W
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hicache_jax.layout import PoolLayout, PoolName
from examples.tiny_models import layers as L
from examples.tiny_models.base import ChunkModel
from examples.tiny_models.compressor import complete_rows, compress, compressor_init, projections
from examples.tiny_models.indexer import entry_mask, index_query, indexer_init, top_k
from examples.tiny_models.paged import Chunk, PagedStore
from examples.tiny_models.plan import LayerPlan, plan_layers

Q_RANK = 64       # low-rank query width
MLP_FACTOR = 2    # SwiGLU hidden = MLP_FACTOR * hidden_size


class DeepSeekModel(ChunkModel):
    """Seeded random-weight V4 (`deepseek_v4`) or V4.1 (`deepseek_v41`) model over `layout`."""

    def __init__(self, layout: PoolLayout, seed: int = 0, max_pages: int = 16):
        super().__init__(layout, max_pages)
        cfg = self.config
        if cfg.sliding_window > self.page_size:
            raise ValueError(f"sliding_window {cfg.sliding_window} exceeds page_size {self.page_size}: "
                             f"the window must fit in the previous page")
        self.heads, self.head_dim, self.rope_dim = cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
        self.window, self.hidden = cfg.sliding_window, cfg.hidden_size
        if self.heads <= 0 or self.hidden <= 0:
            raise ValueError(f"config {cfg.name!r}: num_attention_heads and hidden_size must be positive")
        self.swa = PagedStore.of(layout, str(PoolName.SWA))
        self.plans = plan_layers(layout)
        for plan in self.plans:
            if plan.topk_layer is not None and cfg.index_topk > max_pages * plan.latent.rows:
                raise ValueError(f"index_topk {cfg.index_topk} exceeds the {max_pages * plan.latent.rows} "
                                 f"ratio-{plan.ratio} entries of {max_pages} pages")
        self.params = self._init(np.random.default_rng(seed))

    def _init(self, rng: np.random.Generator) -> dict:
        cfg, D, H, d = self.config, self.hidden, self.heads, self.head_dim
        params = {"embed": L.normal(rng, (self.vocab_size, D)), "head": L.dense(rng, D, self.vocab_size),
                  "final_norm": L.ones(D), "layers": []}
        for plan in self.plans:
            lp = {
                "attn_norm": L.ones(D), "mlp_norm": L.ones(D), "q_norm": L.ones(Q_RANK), "kv_norm": L.ones(d),
                "wq_a": L.dense(rng, D, Q_RANK), "wq_b": L.dense(rng, Q_RANK, H * d),
                "wkv": L.dense(rng, D, d), "wo": L.dense(rng, H * d, D, gain=0.5),
                "sink": L.normal(rng, (H,)), "mlp": L.swiglu_init(rng, D, MLP_FACTOR * D),
            }
            if plan.writes:
                lp["comp"] = compressor_init(rng, D, d, plan.ratio)
                if plan.keys is not None:
                    lp["icomp"] = compressor_init(rng, D, cfg.index_head_dim, plan.ratio)
            if plan.queries:
                lp["index"] = indexer_init(rng, D, Q_RANK, cfg.index_n_heads, cfg.index_head_dim)
            params["layers"].append(lp)
        return params

    def _chunk(self, params, pools, chunk: Chunk, tokens, schedule):
        x = params["embed"][tokens]                       # f32[P, D]
        topk: dict[int, tuple] = {}                       # index-source layer -> (idx, selected)
        for plan, lp in zip(self.plans, params["layers"]):
            if schedule is not None:                        # a deferred load: this layer's groups land
                pools, x = schedule.before_layer(plan.layer, pools, x)
            pools, attn = self._attention(plan, lp, pools, chunk, L.rmsnorm(x, lp["attn_norm"]), topk)
            x = x + attn
            x = x + L.swiglu(lp["mlp"], L.rmsnorm(x, lp["mlp_norm"]))
        return pools, L.rmsnorm(x, params["final_norm"]) @ params["head"]

    def _attention(self, plan: LayerPlan, lp: dict, pools: dict, chunk: Chunk, h, topk: dict):
        P, H, d, rd = self.page_size, self.heads, self.head_dim, self.rope_dim
        qr = L.rmsnorm(h @ lp["wq_a"], lp["q_norm"])
        q = L.rope((qr @ lp["wq_b"]).reshape(P, H, d), chunk.pos, rd)
        kv = L.rope(L.rmsnorm(h @ lp["wkv"], lp["kv_norm"]), chunk.pos, rd)
        pools = self.swa.write(pools, plan.layer, chunk.swa_page, kv, chunk.row_valid)
        groups = [self._window(pools, plan.layer, chunk)]
        if plan.writes:
            pools = self._compress_and_store(plan, lp, pools, chunk, h)
        if plan.queries:
            topk[plan.layer] = self._select(plan, lp, pools, chunk, qr, h)
        if plan.ratio:
            groups.append(self._compressed(plan, pools, chunk, topk))
        o = L.sink_attention(q, groups, lp["sink"], float(d) ** -0.5)
        o = L.rope(o, chunk.pos, rd, inverse=True)  # values carry rotated rope features: undo them
        return pools, o.reshape(P, H * d) @ lp["wo"]

    def _window(self, pools, layer: int, chunk: Chunk):
        P, W = self.page_size, self.window
        pages = jnp.stack([chunk.prev_swa_page, chunk.swa_page])
        kv = self.swa.read(pools, layer, pages)                               # f32[2, P, d]
        keys = jnp.concatenate([kv[0, P - W:], kv[1]], axis=0)                # f32[W + P, d]
        kpos = jnp.concatenate([chunk.start - W + jnp.arange(W), chunk.pos])  # i32[W + P]
        from_prev = jnp.arange(W + P) < W
        qpos = chunk.pos[:, None]
        mask = (kpos[None, :] <= qpos) & (kpos[None, :] > qpos - W) & (chunk.has_prev | ~from_prev)[None, :]
        return keys, mask & chunk.row_valid[:, None]

    def _compress_and_store(self, plan: LayerPlan, lp: dict, pools, chunk: Chunk, h):
        r, rows = plan.ratio, self.page_size // plan.ratio
        done = complete_rows(chunk, r, rows)
        streams = [(lp["comp"], plan.latent, 0)]
        if plan.keys is not None:
            streams.append((lp["icomp"], plan.keys, 1))
        for p, store, which in streams:
            kvp, scp = projections(p, h, r)
            prev = plan.rings[which].previous_chunk(pools, plan.layer, chunk) if plan.rings else None
            entries = compress(p, kvp, scp, r, chunk, self.rope_dim, prev)
            pools = store.write(pools, plan.layer, chunk.anchor_page, entries, done)
            if plan.rings:
                pools = plan.rings[which].write(pools, plan.layer, chunk, kvp, scp)
        return pools

    def _select(self, plan: LayerPlan, lp: dict, pools, chunk: Chunk, qr, h):
        cfg = self.config
        keys = plan.keys.read(pools, plan.keys_layer, chunk.anchor_pages)       # f32[max_pages, R, di]
        keys = keys.reshape(-1, keys.shape[-1])
        mask = entry_mask(chunk.pos, chunk.row_valid, plan.ratio, keys.shape[0])
        q, w = index_query(lp["index"], qr, h, chunk.pos, cfg.index_n_heads, cfg.index_head_dim, self.rope_dim)
        return top_k(q, w, keys, mask, cfg.index_topk)

    def _compressed(self, plan: LayerPlan, pools, chunk: Chunk, topk: dict):
        lat = plan.latent.read(pools, plan.latent_layer, chunk.anchor_pages)   # f32[max_pages, R, d]
        lat = lat.reshape(-1, lat.shape[-1])
        if plan.topk_layer is None:                                            # ratio 128: every entry
            return lat, entry_mask(chunk.pos, chunk.row_valid, plan.ratio, lat.shape[0])
        idx, selected = topk[plan.topk_layer]
        return lat[idx], selected                                              # f32[P, k, d], bool[P, k]

