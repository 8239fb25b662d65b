"""The program shapes `TransferEngine.warmup` compiles ahead of use: per allocator, every
program a chunk of up to a given size can need; with several allocators on one device, the
one-program plans of a prefix's load-back and backup."""
from __future__ import annotations

from collections.abc import Callable, Mapping

from hicache_jax.transfer.moves import H2D_GROUP
from hicache_jax.transfer.programs import AllocatorPrograms, Program

MAX_CHUNK_PAGES = 1 << 15  # one kernel call handles at most 65535 pages


def pow2_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to `n`."""
    return [1 << i for i in range(n.bit_length())]


def chunk_keys(progs: AllocatorPrograms, limit: int, early: Callable[[int], bool]) -> list[tuple]:
    """Program keys of chunks of up to `limit` pages: pack and unpack of each padded size,
    the pieces a backup cuts (`pack_cut` from 2 pages, and the `slice` of each smaller size), a
    whole-block load of each size (when `early(pages)`, also its early copy, the load from
    it and its way into staging, alone or 2 to `H2D_GROUP` at a time), the copies of any piece of
    any block up to that size (L3 reads too), and of 2 to `H2D_GROUP` whole blocks of one
    size at once."""
    keys = []
    for pages in pow2_upto(limit):
        k = pages.bit_length() - 1
        many = [(Program.H2D_MANY, k, m) for m in range(2, H2D_GROUP + 1) if m * pages <= limit]
        keys += [(Program.PACK, pages), (Program.UNPACK, pages), *([(Program.PACK_CUT, pages)] if k >= 1 else []),
                 *((Program.SLICE, pages, j) for j in range(k)),
                 *((Program.H2D, pages, j) for j in range(k + 1)), *((Program.READ, pages, j) for j in range(k + 1)),
                 *many]
        if progs.broadcast_load:
            keys.append((Program.TAKE, pages))
        else:
            keys.append((Program.LOAD_BLOCK, pages, 0))
            if early(pages):
                keys += [(Program.COPY, pages), (Program.LOAD_BLOCK, pages, 1), (Program.H2D, pages, k, 1),
                         *(key + (1,) for key in many)]
    return keys


def plan_shapes(programs: Mapping[str, AllocatorPrograms], anchor: str, window_pages: int, max_chunk: int,
                max_pages: int | None) -> list[tuple[tuple[str, int], ...]]:
    """Whole-plan shapes when several allocators move bytes on one device: the anchor's
    power-of-two chunk lengths, each with every power-of-two length of the other
    allocators up to the trailing window (`window_pages`: what a prefix's load-back carries)."""
    if len(programs) < 2 or anchor not in programs:
        return []

    def lengths(a: str, cap: int) -> list[int]:
        return pow2_upto(min(programs[a].chunk_pages, cap if max_pages is None else min(cap, max_pages)))
    shapes = [()]
    for a in sorted(programs):
        sizes = lengths(a, max_chunk if a == anchor else window_pages)
        shapes = [s + ((a, n),) for s in shapes for n in sizes]
    return shapes
