"""How one load chunk's rows reach the device: a move per chunk, chosen by `HostBlocks.load_move`.

    WholeBlock      the chunk is exactly one host block: the block is copied whole (a DMA)
                    inside the chunk's load program and unpacked there
    EarlyCopy       the same, from the device copy an early copy program made of that block
    Pieces          anything else: each piece (rows of one block, or their device copy made
                    ahead) is copied into the staging buffer, then the staging rows are
                    unpacked; or, once its program is compiled, all of them in one program

Host blocks are tuples of one pinned array per stored part of the row (`RowFormat.parts`).
"""
from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class WholeBlock:
    block: tuple[jax.Array, ...]        # pinned: [rows, part_elems] per part


@dataclasses.dataclass(frozen=True)
class EarlyCopy:
    rows: tuple[jax.Array, ...]         # the block's device copy, [rows, part_elems] per part


@dataclasses.dataclass(frozen=True)
class Piece:
    """`2**log2_rows` rows of `block` from row `row`, into staging rows from `staging_row`;
    `copied`: `block` is the device copy of just those rows (an early copy), `row` is 0."""

    block: tuple[jax.Array, ...]
    row: int
    log2_rows: int
    staging_row: int
    copied: bool = False

    @property
    def rows(self) -> int:
        return 1 << self.log2_rows


@dataclasses.dataclass(frozen=True)
class Pieces:
    pieces: tuple[Piece, ...]


Move = WholeBlock | EarlyCopy | Pieces
