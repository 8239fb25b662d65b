"""Shared building blocks of the tiny models: init, RMSNorm, RoPE, SwiGLU, sink attention.

Everything is f32 and row-wise: row t of an output depends only on row t of its inputs
(and on the keys its mask admits), which is what lets a position's result be the same
whatever the padding rows hold.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

ROPE_THETA = 10000.0
NORM_EPS = 1e-6


# Weights are drawn with numpy's seeded generator: the same bits on every platform and no
# per-shape XLA compilation at model construction.

def dense(rng: np.random.Generator, fan_in: int, fan_out: int, gain: float = 1.0):
    """f32[fan_in, fan_out] with variance gain^2 / fan_in."""
    return jnp.asarray(rng.standard_normal((fan_in, fan_out), np.float32) * np.float32(gain / np.sqrt(fan_in)))


def normal(rng: np.random.Generator, shape, scale: float = 1.0):  # -> f32[*shape]
    return jnp.asarray(rng.standard_normal(shape, np.float32) * np.float32(scale))


def ones(n: int):  # -> f32[n]: norm weights
    return jnp.ones((n,), jnp.float32)


def rmsnorm(x, w):  # f32[..., n], f32[n] -> f32[..., n]
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + NORM_EPS) * w


def rope(x, pos, rope_dim: int, inverse: bool = False):
    """Rotate the last `rope_dim` features of x f32[n, ..., d] by positions pos i32[n].

    Half-split pairs: feature j pairs with j + rope_dim / 2 inside the rope slice.
    """
    half = rope_dim // 2
    inv_freq = 1.0 / (ROPE_THETA ** (np.arange(half, dtype=np.float32) * 2.0 / rope_dim))
    ang = pos.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)  # f32[n, half]
    ang = ang.reshape(ang.shape[0], *([1] * (x.ndim - 2)), half)
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    if inverse:
        sin = -sin
    keep, r = x[..., : x.shape[-1] - rope_dim], x[..., x.shape[-1] - rope_dim:]
    a, b = r[..., :half], r[..., half:]
    return jnp.concatenate([keep, a * cos - b * sin, a * sin + b * cos], axis=-1)


def swiglu_init(rng: np.random.Generator, dim: int, hidden: int) -> dict:
    return {"w1": dense(rng, dim, hidden), "w3": dense(rng, dim, hidden), "w2": dense(rng, hidden, dim)}


def swiglu(p: dict, x):  # f32[n, dim] -> f32[n, dim]
    return (jax.nn.silu(x @ p["w1"]) * (x @ p["w3"])) @ p["w2"]


def sink_attention(q, groups, sink, scale: float):
    """Softmax attention with a per-head sink logit, keys and values shared (K = V).

    q f32[P, H, d]; groups: list of (kv, mask) with kv f32[S, d] (keys shared by all rows)
    or f32[P, S, d] (keys chosen per row), mask bool[P, S]; sink f32[H] -> f32[P, H, d].

    Masked keys get probability exactly 0 and their values are replaced by 0 before use,
    so garbage (even NaN) in a masked key never reaches the result. Shared keys are zeroed
    where no row admits them; callers' masks admit only keys that were written (padding
    rows admit nothing), so a key some row admits is finite and adds exactly 0 elsewhere.
    """
    scores, values = [], []
    for kv, mask in groups:
        if kv.ndim == 2:
            kv = jnp.where(jnp.any(mask, axis=0)[:, None], kv, 0.0)
            s = jnp.einsum("phd,sd->phs", q, kv)
        else:
            kv = jnp.where(mask[..., None], kv, 0.0)
            s = jnp.einsum("phd,psd->phs", q, kv)
        scores.append(jnp.where(mask[:, None, :], s * scale, -jnp.inf))
        values.append(kv)
    logits = jnp.concatenate(scores, axis=-1)                     # f32[P, H, S_total]
    m = jnp.maximum(jnp.max(logits, axis=-1), sink[None, :])      # f32[P, H], finite thanks to the sink
    e = jnp.exp(logits - m[..., None])
    w = e / (jnp.sum(e, axis=-1) + jnp.exp(sink[None, :] - m))[..., None]
    out, at = 0.0, 0
    for kv, (_, mask) in zip(values, groups):
        ws = w[..., at: at + mask.shape[1]]
        at += mask.shape[1]
        out = out + (jnp.einsum("phs,sd->phd", ws, kv) if kv.ndim == 2 else jnp.einsum("phs,psd->phd", ws, kv))
    return out
