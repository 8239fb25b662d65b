"""Page regions: a page's bytes <-> its slots' data rows and scale rows, and masked row writes.

    | data[0] ... data[slots-1] | scale[0] ... scale[slots-1] | zero pad |
    0                slots*data_bytes         slots*slot_bytes    page_bytes

All functions take any leading batch axes (e.g. pages gathered through a page table) and
are jittable; `slots` is static.
"""
from __future__ import annotations

import jax.numpy as jnp

from hicache_jax.codecs.slots import SlotCodec
from hicache_jax.layout.formats import ByteFormat


def _check_page(fmt: ByteFormat, page, slots: int) -> None:
    want = fmt.page_bytes(slots)
    if page.shape[-1] != want:
        raise ValueError(f"a {fmt.name} page of {slots} slots is {want} bytes, got last axis {page.shape[-1]}")


def unpack_page(fmt: ByteFormat, page, slots: int):
    """u8[..., page_bytes] -> (data u8[..., slots, data_bytes], scale u8[..., slots, scale_bytes])."""
    _check_page(fmt, page, slots)
    lead = page.shape[:-1]
    split = fmt.scale_offset(slots)
    data = page[..., :split].reshape(*lead, slots, fmt.data_bytes)
    scale = page[..., split: split + slots * fmt.scale_bytes].reshape(*lead, slots, fmt.scale_bytes)
    return data, scale


def pack_page(fmt: ByteFormat, data, scale):
    """(data u8[..., slots, data_bytes], scale u8[..., slots, scale_bytes]) -> u8[..., page_bytes].

    The padding after the scale region is written as zeros, so a page's bytes are a pure
    function of its rows.
    """
    slots = data.shape[-2]
    if data.shape[-1] != fmt.data_bytes or scale.shape[-1] != fmt.scale_bytes or scale.shape[-2] != slots:
        raise ValueError(f"{fmt.name} rows are {fmt.data_bytes} data + {fmt.scale_bytes} scale bytes; "
                         f"got data {tuple(data.shape)}, scale {tuple(scale.shape)}")
    lead = data.shape[:-2]
    pad = fmt.page_bytes(slots) - slots * fmt.slot_bytes
    parts = [data.reshape(*lead, -1), scale.reshape(*lead, -1), jnp.zeros((*lead, pad), jnp.uint8)]
    return jnp.concatenate([p.astype(jnp.uint8) for p in parts], axis=-1)


def encode_page(codec: SlotCodec, x):
    """f32[..., slots, dim] -> u8[..., page_bytes] in `codec.fmt`."""
    data, scale = codec.encode(x)
    return pack_page(codec.fmt, data, scale)


def decode_page(codec: SlotCodec, page, slots: int):
    """u8[..., page_bytes] -> f32[..., slots, dim]; garbage bytes decode to garbage (maybe NaN)."""
    data, scale = unpack_page(codec.fmt, page, slots)
    return codec.decode(data, scale)


def write_rows(codec: SlotCodec, page, x, row_mask):
    """Page with the rows where `row_mask` is set replaced by `x` encoded; other rows kept.

    page u8[page_bytes], x f32[slots, dim], row_mask bool[slots] -> u8[page_bytes].
    """
    slots = x.shape[-2]
    old_data, old_scale = unpack_page(codec.fmt, page, slots)
    data, scale = codec.encode(x)
    keep = row_mask[..., None]
    return pack_page(codec.fmt, jnp.where(keep, data, old_data), jnp.where(keep, scale, old_scale))
