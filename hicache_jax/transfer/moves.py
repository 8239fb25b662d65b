"""How one load chunk's rows reach the device: a move per chunk, chosen by `HostBlocks.load_move`.

    WholeBlock      the chunk is exactly one host block: the block is copied whole (a DMA)
                    inside the chunk's load program and unpacked there
    EarlyCopy       the same, from the device copy an early copy program made of that block
    Pieces          anything else: each piece (rows of one block, or their device copy made
                    ahead) is copied into the staging buffer, then the staging rows are
                    unpacked; or, once its program is compiled, all of them in one program.
                    Pieces that are whole blocks of one size go up to `H2D_GROUP` per
                    program (`Pieces.calls`)

Host blocks are tuples of one pinned array per stored part of the row (`RowFormat.parts`).
"""
from __future__ import annotations

import dataclasses
import functools

import jax

from hicache_jax.pools.host_tier import block_rows
from hicache_jax.transfer.programs import Program

H2D_GROUP = 4     # whole-block pieces of one size copied into staging by one `h2d_many` call


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

    @functools.cached_property
    def calls(self) -> list[tuple[tuple, list[Piece]]]:
        """`staging_calls(pieces)`, worked out once: the engine compiles their programs
        before dispatching, then calls them."""
        return staging_calls(self.pieces)


Move = WholeBlock | EarlyCopy | Pieces


def staging_calls(pieces) -> list[tuple[tuple, list[Piece]]]:
    """The calls that copy a chunk's host pieces into staging: `(program key, pieces)` with key
    `(h2d_many, log2 rows, count)` for 2 to `H2D_GROUP` pieces that are whole host blocks of
    one size, else `(h2d, block rows, log2 rows)` for one piece; the same keys ending in 1
    for pieces' early copies (already on the device: copied within it). Their staging rows
    never overlap, so the order of the calls does not matter."""
    calls, whole = [], {}
    for p in pieces:
        if p.copied or block_rows(p.block) == p.rows:
            whole.setdefault((p.log2_rows, int(p.copied)), []).append(p)
        else:
            calls.append(((Program.H2D, block_rows(p.block), p.log2_rows), [p]))
    for (k, copied), group in whole.items():
        on_device = (1,) if copied else ()
        for lo in range(0, len(group), H2D_GROUP):
            some = group[lo:lo + H2D_GROUP]
            key = (Program.H2D_MANY, k, len(some)) if len(some) > 1 else (Program.H2D, 1 << k, k)
            calls.append((key + on_device, some))
    return calls
