"""JAX codecs of the layout's byte formats (data plane: imports jax).

`codec_for(fmt)` gives the slot codec of a `ByteFormat` (float rows <-> data and scale
bytes); `pages` packs slots into a page's bytes and back. Deterministic and bit-exact on
every backend (see `numerics`), vectorised over any leading axes, jittable.
"""
from __future__ import annotations

from hicache_jax.codecs.pages import decode_page, encode_page, pack_page, unpack_page, write_rows
from hicache_jax.codecs.slots import FORMAT_NAMES, SlotCodec, codec_for, split_pair

__all__ = [
    "FORMAT_NAMES", "SlotCodec", "codec_for", "decode_page", "encode_page", "pack_page", "split_pair",
    "unpack_page", "write_rows",
]
