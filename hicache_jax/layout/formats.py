"""Byte formats of one slot (one compressed row) and the page padding rule.

A page of a byte-formatted pool stores its `slots` data rows, then its `slots` scale rows,
then zero padding up to a multiple of `align`:

    | data[0] data[1] ... data[slots-1] | scale[0] ... scale[slots-1] | pad |
    0                    slots*data_bytes                                   page_bytes

`page_bytes = ceil(slots * slot_bytes / align) * align`.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ByteFormat:
    name: str
    data_bytes: int   # bytes of one slot's data row
    scale_bytes: int  # bytes of one slot's scale row (0: no scale region)
    align: int        # page bytes are padded up to a multiple of this

    @property
    def slot_bytes(self) -> int:
        return self.data_bytes + self.scale_bytes

    def page_bytes(self, slots: int) -> int:
        raw = slots * self.slot_bytes
        return -(-raw // self.align) * self.align

    def scale_offset(self, slots: int) -> int:
        """Byte offset of the scale region inside a page of `slots` slots."""
        return slots * self.data_bytes


def _require_multiple(what: str, value: int, of: int) -> None:
    if value <= 0 or value % of:
        raise ValueError(f"{what} must be a positive multiple of {of}, got {value}")


def v4(nope_dim: int, rope_dim: int) -> ByteFormat:
    """fp8-e4m3 nope + bf16 rope + one ue8m0 scale per 64 nope values + 1 pad byte."""
    _require_multiple("nope head dim", nope_dim, 64)
    data = nope_dim + 2 * rope_dim
    return ByteFormat("v4", data, nope_dim // 64 + 1, align=data)


def v41(latent_dim: int) -> ByteFormat:
    """fp8 latent (rope quantised too) + one ue8m0 scale per 32 values."""
    _require_multiple("latent head dim", latent_dim, 32)
    return ByteFormat("v41", latent_dim, latent_dim // 32, align=latent_dim)


def v41_fp4(latent_dim: int) -> ByteFormat:
    """e2m1 latent packed two per byte + one e4m3 scale per 16 values."""
    _require_multiple("latent head dim", latent_dim, 16)
    return ByteFormat("v41_fp4", latent_dim // 2, latent_dim // 16, align=latent_dim // 2)


def indexer_fp8(index_dim: int) -> ByteFormat:
    """fp8 indexer key + one fp32 scale per row."""
    return ByteFormat("indexer_fp8", index_dim, 4, align=1)


def indexer_fp4(index_dim: int) -> ByteFormat:
    """e2m1 indexer key packed two per byte + one ue8m0 scale per 32 values, one pool."""
    _require_multiple("index head dim", index_dim, 32)
    return ByteFormat("indexer_fp4", index_dim // 2, index_dim // 32, align=1)


def indexer_fp4_payload(index_dim: int) -> ByteFormat:
    """The payload half of a split fp4 indexer (scales in a pool of their own)."""
    _require_multiple("index head dim", index_dim, 32)
    return ByteFormat("indexer_fp4_payload", index_dim // 2, 0, align=1)


def indexer_fp4_scale(index_dim: int) -> ByteFormat:
    """The scale half of a split fp4 indexer: one ue8m0 per 32 values."""
    _require_multiple("index head dim", index_dim, 32)
    return ByteFormat("indexer_fp4_scale", index_dim // 32, 0, align=1)


def state_fp32(floats_per_row: int) -> ByteFormat:
    """Compressor rolling state: fp32 rows, no scales, no padding."""
    return ByteFormat("state_fp32", 4 * floats_per_row, 0, align=1)
