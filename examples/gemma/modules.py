"""Gemma 3 (text) as flax NNX modules that compute one chunk over paged K/V pools.

    x = embed(tokens) * sqrt(hidden)
    per layer:  x += post_attn_norm(attention(input_norm(x)))       q, k: per-head RMSNorm, then RoPE
                x += post_ffn_norm(down(gelu_tanh(gate(h)) * up(h)))  h = pre_ffn_norm(x)
    logits = final_norm(x[valid - 1]) @ embed^T                       (tied head, one row only)

Sliding layers use RoPE base `rope_local_base_freq` and their window; full-attention
layers use `rope_theta` and every earlier token. Everything is f32 and row-wise except
attention, which reads the pools (see `attention.py`), so row t's result does not depend
on the other rows of the chunk. The RMSNorm scale is stored as the multiplier itself
(Gemma's `1 + weight`, as GGUF files hold it).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hicache_jax.layout import PoolLayout, PoolName
from examples.gemma import attention as A


@dataclasses.dataclass(frozen=True)
class KVStore:
    """Where one layer's K/V live: pool, its layer slot, and the window (None: global)."""

    pool: str
    slot: int
    window: int | None
    window_pages: int
    page_size: int
    rope_theta: float


def kv_stores(layout: PoolLayout) -> list[KVStore]:
    cfg, P = layout.model, layout.page_size
    out = []
    for info in layout.layers:
        local = info.ratio == 0
        spec = layout.pool(str(PoolName.GEMMA3_SWA_KV if local else PoolName.GEMMA3_GLOBAL_KV))
        out.append(KVStore(spec.name, spec.layer_slot(info.layer), cfg.sliding_window if local else None,
                           layout.window_pages(), P, cfg.rope_local_base_freq if local else cfg.rope_theta))
    return out


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x):  # f32[..., dim]
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.scale[...]


def rope(x, pos, theta: float):
    """Rotate x f32[C, H, d] by positions i32[C]: feature j pairs with j + d/2 (NeoX halves)."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (np.arange(half, dtype=np.float32) * 2.0 / x.shape[-1]))
    ang = pos.astype(jnp.float32)[:, None, None] * jnp.asarray(inv_freq, jnp.float32)
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def _linear(n_in: int, n_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(n_in, n_out, use_bias=False, rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, cfg, store: KVStore, rngs: nnx.Rngs):
        D, hd = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = _linear(D, self.heads * hd, rngs)
        self.k_proj = _linear(D, self.kv_heads * hd, rngs)
        self.v_proj = _linear(D, self.kv_heads * hd, rngs)
        self.o_proj = _linear(self.heads * hd, D, rngs)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.store = store
        self.scale = float(cfg.query_pre_attn_scalar) ** -0.5

    def __call__(self, pools: dict, chunk, h):
        C, s = h.shape[0], self.store
        q = rope(self.q_norm(self.q_proj(h).reshape(C, self.heads, self.head_dim)), chunk.pos, s.rope_theta)
        k = rope(self.k_norm(self.k_proj(h).reshape(C, self.kv_heads, self.head_dim)), chunk.pos, s.rope_theta)
        v = self.v_proj(h).reshape(C, self.kv_heads, self.head_dim)
        page = chunk.anchor_page if s.window is None else chunk.swa_page
        pool = A.write_rows(pools[s.pool], s.slot, page, chunk.offset, k, v, chunk.row_valid)
        if s.window is None:
            keys, values, admit = A.global_keys(pool, s.slot, chunk)
        else:
            keys, values, admit = A.window_keys(pool, s.slot, chunk, s.window, s.window_pages, s.page_size)
        o = A.attend(q, keys, values, admit, self.scale)
        return {**pools, s.pool: pool}, self.o_proj(o.reshape(C, self.heads * self.head_dim))


class MLP(nnx.Module):
    def __init__(self, dim: int, hidden: int, rngs: nnx.Rngs):
        self.gate, self.up, self.down = _linear(dim, hidden, rngs), _linear(dim, hidden, rngs), _linear(hidden, dim, rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.gate(x), approximate=True) * self.up(x))


class Block(nnx.Module):
    def __init__(self, cfg, store: KVStore, rngs: nnx.Rngs):
        D, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_norm, self.post_attn_norm = RMSNorm(D, eps), RMSNorm(D, eps)
        self.pre_ffn_norm, self.post_ffn_norm = RMSNorm(D, eps), RMSNorm(D, eps)
        self.attn = Attention(cfg, store, rngs)
        self.mlp = MLP(D, cfg.intermediate_size, rngs)

    def __call__(self, pools: dict, chunk, x):
        pools, a = self.attn(pools, chunk, self.input_norm(x))
        x = x + self.post_attn_norm(a)
        return pools, x + self.post_ffn_norm(self.mlp(self.pre_ffn_norm(x)))


class Gemma3(nnx.Module):
    """The whole text model over `layout` (model_type "gemma3_text")."""

    def __init__(self, layout: PoolLayout, rngs: nnx.Rngs):
        cfg = layout.model
        self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs)
        # nnx.List since flax 0.12 (which requires it); a plain list before
        self.layers = getattr(nnx, "List", list)([Block(cfg, store, rngs) for store in kv_stores(layout)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.embed_scale = math.sqrt(cfg.hidden_size)

    def __call__(self, pools: dict, chunk, tokens, want_logits):
        """(pools, f32[vocab] logits of row chunk.valid - 1, zeros unless `want_logits`).

        tokens i32[C] in range; want_logits bool[] (traced: one program either way).
        """
        x = self.embed(tokens) * self.embed_scale
        for block in self.layers:
            pools, x = block(pools, chunk, x)
        last = jax.lax.dynamic_index_in_dim(x, chunk.valid - 1, axis=0, keepdims=False)
        table = self.embed.embedding[...]
        # table [vocab, hidden] @ h, not h @ table^T: XLA on CPU would transpose the table
        # on every call (7x slower)
        logits = jax.lax.cond(want_logits, lambda h: table @ self.final_norm(h),
                              lambda h: jnp.zeros(table.shape[:1], jnp.float32), last)
        return pools, logits
