"""Element codecs: fp8-e4m3, e2m1 (fp4), ue8m0 and fp32/bf16 bytes, bit-exact on every backend.

Rounding is done here with exact float arithmetic (division by a power of two, `round`
half-to-even), so the result never depends on how a backend converts f32 to a narrow type
(XLA may go through f16 and round twice). The final cast to `float8_e4m3fn` only ever sees
values that are exactly representable, so it cannot round.

    e4m3:  s eeee mmm   bias 7, no inf, 0x7f/0xff = NaN, max 448, min subnormal 2^-9
    e2m1:  s ee m       bias 1, values 0 .5 1 1.5 2 3 4 6, packed two per byte (low nibble first)
    ue8m0: eeeeeeee     2^(b - 127), 0xff = NaN
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

E4M3_MAX = 448.0
E2M1_MAX = 6.0
AMAX_FLOOR = 1e-4  # blocks quieter than this share one scale (DeepSeek's act_quant clamp)

_E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def _exponent(a):  # f32[...] (>= 0) -> i32[...]: floor(log2 a) for normals, -127 for 0/subnormals
    bits = jax.lax.bitcast_convert_type(a.astype(jnp.float32), jnp.uint32)
    return ((bits >> 23) & 0xFF).astype(jnp.int32) - 127


def pow2(e):  # i32[...] in [-126, 127] -> f32[...] = 2^e, built from bits (exact)
    return jax.lax.bitcast_convert_type(((e + 127).astype(jnp.uint32) << 23), jnp.float32)


def ceil_log2(s):  # f32[...] (positive normal) -> i32[...]: smallest e with 2^e >= s
    bits = jax.lax.bitcast_convert_type(s.astype(jnp.float32), jnp.uint32)
    e = ((bits >> 23) & 0xFF).astype(jnp.int32) - 127
    return e + ((bits & 0x7FFFFF) != 0).astype(jnp.int32)


def _round_to_grid(x, max_value: float, min_normal_exp: int, mantissa_bits: int):
    """Nearest value (ties to even) of a small float format, saturating at +-max_value."""
    x = x.astype(jnp.float32)
    a = jnp.minimum(jnp.abs(x), max_value)
    step = pow2(jnp.maximum(_exponent(a), min_normal_exp) - mantissa_bits)
    q = jnp.round(a / step) * step  # a / step and q are exact: step is a power of two
    return jnp.where(x < 0, -q, q)


def round_e4m3(x):  # f32[...] -> f32[...] holding e4m3 values
    return _round_to_grid(x, E4M3_MAX, -6, 3)


def round_e2m1(x):  # f32[...] -> f32[...] holding e2m1 values
    return _round_to_grid(x, E2M1_MAX, 0, 1)


def e4m3_bytes(x):  # f32[...] -> u8[...]; nearest e4m3, saturating, +0 for zero
    q = round_e4m3(x)
    q = jnp.where(q == 0, 0.0, q)  # no -0 bytes: equal values give equal bytes
    return jax.lax.bitcast_convert_type(q.astype(jnp.float8_e4m3fn), jnp.uint8)


def e4m3_values(b):  # u8[...] -> f32[...] (exact; 0x7f/0xff give NaN)
    return jax.lax.bitcast_convert_type(b.astype(jnp.uint8), jnp.float8_e4m3fn).astype(jnp.float32)


def e2m1_nibbles(x):  # f32[...] -> u8[...] in 0..15; nearest e2m1, saturating, +0 for zero
    q = round_e2m1(x)
    mag = jnp.abs(q)
    code = jnp.sum(mag[..., None] >= jnp.asarray(_E2M1_VALUES[1:]), axis=-1).astype(jnp.uint8)
    return jnp.where(q < 0, code | 0x8, code).astype(jnp.uint8)


def e2m1_values(nibbles):  # u8[...] in 0..15 -> f32[...]
    table = jnp.asarray(np.concatenate([_E2M1_VALUES, -_E2M1_VALUES]))
    return jnp.take(table, nibbles.astype(jnp.int32) & 0xF)


def pack_nibbles(n):  # u8[..., 2k] -> u8[..., k]: element 2i in the low nibble, 2i+1 in the high
    pairs = n.reshape(*n.shape[:-1], n.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(jnp.uint8)


def unpack_nibbles(b):  # u8[..., k] -> u8[..., 2k]
    b = b.astype(jnp.uint8)
    pairs = jnp.stack([b & 0xF, b >> 4], axis=-1)
    return pairs.reshape(*b.shape[:-1], b.shape[-1] * 2)


def ue8m0_scale(amax, q_max: float):
    """Power-of-two scale for a block: (byte u8[...], scale f32[...]), scale >= amax / q_max."""
    s = jnp.maximum(amax.astype(jnp.float32), AMAX_FLOOR) / q_max
    e = jnp.clip(ceil_log2(s), -126, 127)
    return (e + 127).astype(jnp.uint8), pow2(e)


def ue8m0_values(b):  # u8[...] -> f32[...] = 2^(b - 127); 0 -> 2^-127, 0xff -> NaN
    b = b.astype(jnp.uint32)
    normal = jax.lax.bitcast_convert_type(b << 23, jnp.float32)
    return jnp.where(b == 0, np.float32(2.0 ** -127), jnp.where(b == 0xFF, np.float32(np.nan), normal))


def f32_bytes(x):  # f32[..., n] -> u8[..., 4n], little-endian (every XLA backend)
    b = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint8)
    return b.reshape(*x.shape[:-1], x.shape[-1] * 4)


def f32_values(b):  # u8[..., 4n] -> f32[..., n]
    b = b.astype(jnp.uint8)
    return jax.lax.bitcast_convert_type(b.reshape(*b.shape[:-1], b.shape[-1] // 4, 4), jnp.float32)


def bf16_bytes(x):  # f32[..., n] -> u8[..., 2n] (round to nearest even)
    b = jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint8)
    return b.reshape(*x.shape[:-1], x.shape[-1] * 2)


def bf16_values(b):  # u8[..., 2n] -> f32[..., n]
    b = b.astype(jnp.uint8)
    pairs = b.reshape(*b.shape[:-1], b.shape[-1] // 2, 2)
    return jax.lax.bitcast_convert_type(pairs, jnp.bfloat16).astype(jnp.float32)


def blocks(x, size: int):  # [..., n] -> [..., n // size, size]
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)


def block_amax(x, size: int):  # f32[..., n] -> f32[..., n // size]
    return jnp.max(jnp.abs(blocks(x.astype(jnp.float32), size)), axis=-1)
