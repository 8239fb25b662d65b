"""Slot codecs: one float vector per slot <-> its data row and scale row, per byte format.

Every `ByteFormat` of `hicache_jax.layout.formats` that can be decoded on its own has a
codec; the value width is derived from the format's byte counts, so the codec needs no
model config. Row layouts (little-endian, offsets in bytes):

    v4           data  | nope fp8 (N) | rope bf16 (2R) |      scale | ue8m0 per 64 nope (N/64) | 0 |
    v41          data  | latent fp8 (D) |                     scale | ue8m0 per 32 (D/32) |
    v41_fp4      data  | e2m1 packed (D/2) |                  scale | e4m3 per 16 (D/16) |
    indexer_fp8  data  | key fp8 (K) |                        scale | fp32 (4), a power of two |
    indexer_fp4  data  | e2m1 packed (K/2) |                  scale | ue8m0 per 32 (K/32) |
    state_fp32   data  | fp32 (4F) |

`indexer_fp4_payload` / `indexer_fp4_scale` are the two halves of `indexer_fp4` kept in two
pools: encode with `codec_for(indexer_fp4)` and store its data rows in the payload pool and
its scale rows in the scale pool (`split_pair`).

Scales: ue8m0 and the fp32 indexer scale are powers of two chosen as the smallest one with
`amax / scale <= q_max` (DeepSeek's act_quant with scale_fmt "ue8m0"); the V41_FP4 e4m3
scale is `amax / 6` rounded to nearest e4m3 (NVFP4 style, values then saturate at 6).
With power-of-two scales `decode(encode(decode(b))) == decode(b)` holds exactly.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp

from hicache_jax.codecs import numerics as nx
from hicache_jax.layout import formats
from hicache_jax.layout.formats import ByteFormat


@dataclasses.dataclass(frozen=True)
class SlotCodec:
    """Encode f32[..., dim] <-> (data u8[..., data_bytes], scale u8[..., scale_bytes]); jittable."""

    fmt: ByteFormat
    dim: int  # floats per slot
    _encode: Callable = dataclasses.field(repr=False, compare=False)
    _decode: Callable = dataclasses.field(repr=False, compare=False)

    def encode(self, x):  # f32[..., dim] -> (u8[..., data_bytes], u8[..., scale_bytes])
        if x.shape[-1] != self.dim:
            raise ValueError(f"{self.fmt.name} codec encodes {self.dim} floats per slot, got shape {tuple(x.shape)}")
        data, scale = self._encode(jnp.asarray(x, jnp.float32))
        return data, scale

    def decode(self, data, scale):  # (u8[..., data_bytes], u8[..., scale_bytes]) -> f32[..., dim]
        if data.shape[-1] != self.fmt.data_bytes or scale.shape[-1] != self.fmt.scale_bytes:
            raise ValueError(
                f"{self.fmt.name} rows are {self.fmt.data_bytes} data + {self.fmt.scale_bytes} scale bytes, "
                f"got {data.shape[-1]} + {scale.shape[-1]}"
            )
        return self._decode(data, scale)


def codec_for(fmt: ByteFormat) -> SlotCodec:
    """The codec of `fmt`; a split-indexer half or an unknown format raises ValueError."""
    builder = _BUILDERS.get(fmt.name)
    if builder is None:
        hint = " (encode with formats.indexer_fp4 and store the halves in two pools)" if fmt.name.startswith("indexer_fp4_") else ""
        raise ValueError(f"no slot codec for byte format {fmt.name!r}{hint}")
    return builder(fmt)


def split_pair(payload: ByteFormat, scale: ByteFormat) -> SlotCodec:
    """Codec of an fp4 indexer stored as a payload pool and a scale pool."""
    if (payload.name, scale.name) != ("indexer_fp4_payload", "indexer_fp4_scale") or payload.data_bytes != 16 * scale.data_bytes:
        raise ValueError(f"formats {payload.name!r} ({payload.data_bytes} B) and {scale.name!r} ({scale.data_bytes} B) "
                         f"are not the two halves of one fp4 indexer")
    return codec_for(formats.indexer_fp4(payload.data_bytes * 2))


def _empty(x):  # f32[..., n] -> u8[..., 0]
    return jnp.zeros((*x.shape[:-1], 0), jnp.uint8)


def _fp8_blocks(x, block: int):  # f32[..., n] -> (codes u8[..., n], scale bytes u8[..., n // block])
    sb, s = nx.ue8m0_scale(nx.block_amax(x, block), nx.E4M3_MAX)
    codes = nx.e4m3_bytes(nx.blocks(x, block) / s[..., None])
    return codes.reshape(x.shape), sb


def _fp8_blocks_values(codes, sb, block: int):  # inverse of _fp8_blocks
    v = nx.blocks(nx.e4m3_values(codes), block) * nx.ue8m0_values(sb)[..., None]
    return v.reshape(codes.shape)


def _fp4_blocks(x, block: int):  # f32[..., n] -> (packed u8[..., n/2], ue8m0 u8[..., n/block])
    sb, s = nx.ue8m0_scale(nx.block_amax(x, block), nx.E2M1_MAX)
    nib = nx.e2m1_nibbles(nx.blocks(x, block) / s[..., None]).reshape(x.shape)
    return nx.pack_nibbles(nib), sb


def _fp4_blocks_values(packed, sb, block: int):
    v = nx.blocks(nx.e2m1_values(nx.unpack_nibbles(packed)), block) * nx.ue8m0_values(sb)[..., None]
    return v.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _v4(fmt: ByteFormat) -> SlotCodec:
    nope = (fmt.scale_bytes - 1) * 64
    rope = (fmt.data_bytes - nope) // 2

    def enc(x):
        codes, sb = _fp8_blocks(x[..., :nope], 64)
        pad = jnp.zeros((*x.shape[:-1], 1), jnp.uint8)
        return jnp.concatenate([codes, nx.bf16_bytes(x[..., nope:])], -1), jnp.concatenate([sb, pad], -1)

    def dec(data, scale):
        nope_v = _fp8_blocks_values(data[..., :nope], scale[..., : nope // 64], 64)
        return jnp.concatenate([nope_v, nx.bf16_values(data[..., nope:])], -1)

    return SlotCodec(fmt, nope + rope, enc, dec)


def _v41(fmt: ByteFormat) -> SlotCodec:
    return SlotCodec(fmt, fmt.data_bytes, lambda x: _fp8_blocks(x, 32),
                     lambda d, s: _fp8_blocks_values(d, s, 32))


def _v41_fp4(fmt: ByteFormat) -> SlotCodec:
    def enc(x):
        s = nx.round_e4m3(nx.block_amax(x, 16) / nx.E2M1_MAX)
        safe = jnp.where(s > 0, s, 1.0)
        nib = nx.e2m1_nibbles(jnp.where(s[..., None] > 0, nx.blocks(x, 16) / safe[..., None], 0.0))
        return nx.pack_nibbles(nib.reshape(x.shape)), nx.e4m3_bytes(s)

    def dec(data, scale):
        v = nx.blocks(nx.e2m1_values(nx.unpack_nibbles(data)), 16) * nx.e4m3_values(scale)[..., None]
        return v.reshape(*data.shape[:-1], data.shape[-1] * 2)

    return SlotCodec(fmt, fmt.data_bytes * 2, enc, dec)


def _indexer_fp8(fmt: ByteFormat) -> SlotCodec:
    dim = fmt.data_bytes

    def enc(x):
        _, s = nx.ue8m0_scale(jnp.max(jnp.abs(x), -1), nx.E4M3_MAX)
        return nx.e4m3_bytes(x / s[..., None]), nx.f32_bytes(s[..., None])

    def dec(data, scale):
        return nx.e4m3_values(data) * nx.f32_values(scale)

    return SlotCodec(fmt, dim, enc, dec)


def _indexer_fp4(fmt: ByteFormat) -> SlotCodec:
    return SlotCodec(fmt, fmt.data_bytes * 2, lambda x: _fp4_blocks(x, 32),
                     lambda d, s: _fp4_blocks_values(d, s, 32))


def _state_fp32(fmt: ByteFormat) -> SlotCodec:
    return SlotCodec(fmt, fmt.data_bytes // 4, lambda x: (nx.f32_bytes(x), _empty(x)),
                     lambda d, s: nx.f32_values(d))


_BUILDERS: dict[str, Callable[[ByteFormat], SlotCodec]] = {
    "v4": _v4,
    "v41": _v41,
    "v41_fp4": _v41_fp4,
    "indexer_fp8": _indexer_fp8,
    "indexer_fp4": _indexer_fp4,
    "state_fp32": _state_fp32,
}

FORMAT_NAMES = tuple(_BUILDERS) + ("indexer_fp4_payload", "indexer_fp4_scale")
