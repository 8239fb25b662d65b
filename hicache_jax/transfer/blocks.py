"""The engine's side of the host blocks: where a load chunk's rows are, rows read and
written outside any plan, and compaction.

Host pages live in pinned blocks (`HostTier`): a load chunk that is exactly one block
moves whole (`WholeBlock`), or from the device copy an early copy program of that block
started (`EarlyCopy`, early.py); any other chunk gathers its rows block by block (`Pieces`,
see moves.py), from early copies of its pieces where there are some.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
from pallas_kernels import PAD

from hicache_jax.pools import HostTier
from hicache_jax.pools.host_tier import NO_BLOCK, block_rows
from hicache_jax.pools.host_views import check_views
from hicache_jax.transfer import chunks as chunking
from hicache_jax.transfer.moves import EarlyCopy, Move, Piece, Pieces, WholeBlock
from hicache_jax.transfer.programs import AllocatorPrograms, Program
from hicache_jax.transfer.resident import ResidentIndices

# `TransferConfig.landing_buckets` (3): a deferred load leaves one whole
# anchor block to the model's step when its rows are one of that many largest powers of two
# of a chunk; the step compiles once per size, at warm-up (`TransferEngine.landing_examples`).


class HostBlocks:
    """Block-level moves of one engine: `programs` by allocator over `host`'s blocks
    (one-element indices from the engine's `ints`)."""

    def __init__(self, host: HostTier, programs: dict[str, AllocatorPrograms], ints: ResidentIndices,
                 landing_rows: dict[str, tuple[int, ...]], view_bytes: int | None = None):
        self.host, self._programs, self._ints = host, programs, ints
        self.landing_rows = landing_rows      # {allocator: block sizes (rows) a step may land}
        self.view_bytes = view_bytes          # `TransferConfig.view_bytes`
        if view_bytes is not None:
            for allocator in programs:
                check_views(host.sharding(allocator))

    # -- load chunks -------------------------------------------------------------------------
    def load_move(self, progs: AllocatorPrograms, part: chunking.Chunk, early: dict) -> Move:
        """How one load chunk moves (module docstring, moves.py); `early`: the load's early
        copies (`EarlyCopies.take`), of whole chunks and of pieces."""
        table = self.host.tables[progs.fmt.allocator]
        start = part.whole_run_host_start
        if start is not None and not progs.broadcast_load:
            block = table.whole(start, part.padded_pages)
            if block is not None:
                copied = early.get(id(block))
                return EarlyCopy(copied[1]) if copied is not None else WholeBlock(block)
            view = self._run_view(table, start, part.padded_pages, early)
            if view is not None:
                return WholeBlock(view)
        pieces = []
        for dst, host, length in part.host_runs():   # cut at blocks, not at the chunk's pieces: a whole
            for block, row, n in table.segments(host, length):   # block (a power of two) is one piece
                for piece, k in binary(n):
                    copied = _early_piece(early, table.arrays[block], row + piece, k) \
                        if block != NO_BLOCK else None
                    if block == NO_BLOCK:
                        pieces.append(Piece(self.host.zeros(progs.fmt.allocator, 1 << k), 0, k, dst + piece))
                    elif copied is not None:
                        pieces.append(Piece(copied[1], 0, k, dst + piece, copied=True))
                    else:
                        view = self._view(table, block, row + piece, 1 << k)
                        pieces.append(Piece(view, 0, k, dst + piece) if view is not None
                                      else Piece(table.arrays[block], row + piece, k, dst + piece))
                dst += n
        return Pieces(tuple(pieces))

    def defer(self, work, moves):
        """Split a load's chunk moves (`start`'s `work`, `moves`): of the whole host blocks it
        moves (a chunk that is one block, or a piece that is a whole block), the largest one
        whose rows are a landing size (`landing_rows`) is left to a model step; the rest moves
        now, the deferred staging rows masked (PAD). Returns (work, moves, [(programs, pool
        names, block, device pages of its rows)]) with at most one deferred block, so a step
        lands one of a few shapes."""
        deferred, kept_work, kept_moves = [], [], []
        for (progs, parts), chunk_moves in zip(work, moves):
            names = [s.name for s in progs.fmt.pools]
            sizes = () if progs.broadcast_load or deferred else self.landing_rows.get(progs.fmt.allocator, ())
            chosen = _largest_block(chunk_moves, sizes)
            rest = []
            for c, (part, move) in enumerate(zip(parts, chunk_moves)):
                match move:
                    case WholeBlock(block) if chosen == (c, None):
                        deferred.append((progs, names, block, part.device_pages))
                    case Pieces(pieces):
                        pages, now = part.device_pages.copy(), []
                        for i, piece in enumerate(pieces):
                            span = slice(piece.staging_row, piece.staging_row + piece.rows)
                            if chosen == (c, i):
                                deferred.append((progs, names, piece.block, pages[span].copy()))
                                pages[span] = PAD
                            else:
                                now.append(piece)
                        if now:
                            rest.append((dataclasses.replace(part, device_pages=pages), Pieces(tuple(now))))
                    case _:                     # a block not chosen, or replicated pools on a mesh
                        rest.append((part, move))
            if rest:
                kept_work.append((progs, [part for part, _ in rest]))
                kept_moves.append([move for _, move in rest])
        return kept_work, kept_moves, deferred

    def _run_view(self, table, start: int, n: int, early: dict) -> tuple[jax.Array, ...] | None:
        """`_view` of host pages `start .. start+n-1` (n a power of two) where one block holds
        them all and they were not copied early (an early copy moves as a piece), else None."""
        if self.view_bytes is None:
            return None
        (block, row, _), *more = table.segments(start, n)
        if more or block == NO_BLOCK or _early_piece(early, table.arrays[block], row, n.bit_length() - 1):
            return None
        return self._view(table, block, row, n)

    def _view(self, table, block: int, row: int, rows: int) -> tuple[jax.Array, ...] | None:
        """`rows` rows of `block` from `row` as a block of their own that shares its memory
        (moved by one DMA, where a slice of the block is read by a kernel), or None: all of
        the block (it moves as it is), or `block_view`'s None (too small, several devices)."""
        if rows == block_rows(table.arrays[block]):
            return None
        return table.view(block, row, rows, self.view_bytes)

    @staticmethod
    def load_keys(progs: AllocatorPrograms, part: chunking.Chunk, move: Move) -> list[tuple]:
        """Program keys a load chunk moving by `move` needs."""
        match move:
            case WholeBlock():
                return [(Program.LOAD_BLOCK, part.padded_pages, 0)]
            case EarlyCopy():
                return [(Program.LOAD_BLOCK, part.padded_pages, 1)]
            case Pieces():
                take = [(Program.TAKE, part.padded_pages)] if progs.broadcast_load else []
                return [*(key for key, _ in move.calls), *take, (Program.UNPACK, part.padded_pages)]

    # -- rows outside the plans (L3 storage, snapshots, tests) --------------------------------
    def read_rows(self, progs: AllocatorPrograms, pages: np.ndarray) -> np.ndarray:
        table = self.host.tables[progs.fmt.allocator]
        out = np.zeros((pages.size, progs.fmt.row_elems), progs.dtype)  # pages never written read as zeros
        for offset, start, log2 in pieces_of(pages, progs.chunk_pages):
            at = offset
            for block, row, n in table.segments(start, 1 << log2):
                if block != NO_BLOCK:
                    for piece, k in binary(n):
                        rows = self._read(progs, table.arrays[block], row + piece, k)
                        out[at + piece:at + piece + (1 << k)] = progs.fmt.from_parts([np.asarray(r) for r in rows])
                at += n
        return out

    def checked_pages(self, progs: AllocatorPrograms, host_pages) -> np.ndarray:
        """`host_pages` as i64, or ValueError unless they are integers in the allocator's tier."""
        pages, allocator = np.asarray(host_pages), progs.fmt.allocator
        limit = self.host.pages[allocator]
        if (pages.ndim != 1 or not (np.issubdtype(pages.dtype, np.integer) or pages.size == 0)
                or pages.dtype == np.bool_ or (pages.size and (pages.min() < 0 or pages.max() >= limit))):
            raise ValueError(f"host pages {pages.tolist()!r} of {allocator!r}: integers outside 0..{limit - 1}")
        return pages.astype(np.int64)

    def write_rows(self, progs: AllocatorPrograms, pages: np.ndarray, rows: np.ndarray) -> None:
        """Host rows `pages` (checked) become `rows`; ValueError for rows of the wrong shape
        or dtype, or a page named twice, before anything changes."""
        allocator = progs.fmt.allocator
        if rows.shape != (pages.size, progs.fmt.row_elems) or rows.dtype != progs.dtype:
            raise ValueError(f"rows for {pages.size} host pages of {allocator!r} must be "
                             f"{progs.dtype}[{pages.size}, {progs.fmt.row_elems}], got {rows.dtype}{list(rows.shape)}")
        if np.unique(pages).size != pages.size:
            raise ValueError(f"host pages {pages.tolist()!r} of {allocator!r} name a page twice")
        table = self.host.tables[allocator]
        table.release(pages)
        self.make_room(progs, pages.size)
        parts = progs.fmt.to_parts(rows)
        for offset, start, log2 in pieces_of(pages, progs.chunk_pages):
            table.add(start, jax.device_put(tuple(p[offset:offset + (1 << log2)] for p in parts), progs.host_sharding))

    def make_room(self, progs: AllocatorPrograms, pages: int) -> None:
        """Compact the sparsest blocks of `progs`' allocator until `pages` more rows fit in
        as many rows as the tier has pages: each live stretch of a block moves to a block
        of its own (read to the device, `device_put` back), and the emptied block goes."""
        table = self.host.tables[progs.fmt.allocator]
        if table.rows + pages <= table.capacity:
            return
        for block in table.sparsest():
            if table.rows + pages <= table.capacity:
                return
            array = table.arrays[block]
            for start, n in table.live_pages(block):
                row = start - table.start[block]
                for piece, k in binary(n):
                    rows = self._read(progs, array, row + piece, k)
                    table.release(np.arange(start + piece, start + piece + (1 << k)))
                    table.add(start + piece, jax.device_put(rows, progs.host_sharding))
                table.compacted += n

    def _read(self, progs: AllocatorPrograms, block: tuple[jax.Array, ...], row: int,
              log2_rows: int) -> tuple[jax.Array, ...]:
        """`2**log2_rows` rows of `block` (every part) from `row`, on the device."""
        return progs.compiled(Program.READ, block_rows(block), log2_rows)(block, self._ints.one(row))


def pieces_of(pages: np.ndarray, max_pages: int) -> list[tuple[int, int, int]]:
    """(offset in `pages`, first host page, log2 length) of the runs of consecutive pages,
    each cut into power-of-two pieces of at most `max_pages`, largest first (programs come
    in log2 shapes)."""
    out, i = [], 0
    while i < pages.size:
        j = i + 1
        while j < pages.size and pages[j] == pages[j - 1] + 1:
            j += 1
        for lo in range(i, j, max_pages):
            n = min(max_pages, j - lo)
            out += [(lo + offset, int(pages[lo]) + offset, k) for offset, k in binary(n)]
        i = j
    return out


def binary(n: int) -> list[tuple[int, int]]:
    """`(offset, log2 length)` of the power-of-two pieces of a stretch of `n`, largest first."""
    out, offset = [], 0
    for k in range(n.bit_length() - 1, -1, -1):
        if n >> k & 1:
            out.append((offset, k))
            offset += 1 << k
    return out


def _largest_block(chunk_moves: list[Move], sizes) -> tuple[int, int | None] | None:
    """The largest whole block among one allocator's chunk moves whose rows are in `sizes`
    (the first of equal ones), or None: `(chunk, None)` for a chunk that is one block,
    `(chunk, piece)` for a piece that is."""
    best, rows = None, 0
    for c, move in enumerate(chunk_moves):
        match move:
            case WholeBlock(block):
                found = [(block_rows(block), None)]
            case Pieces(pieces):
                found = [(p.rows, i) for i, p in enumerate(pieces)
                         if p.row == 0 and block_rows(p.block) == p.rows and not p.copied]
            case _:
                found = []
        for n, piece in found:
            if n in sizes and n > rows:
                best, rows = (c, piece), n
    return best


def _early_piece(early: dict, block, row: int, k: int):
    """The early copy of `2**k` rows of `block` from `row`: one made of just those rows, or
    of the whole block when they are all of it (a merged load's requests each copy theirs)."""
    copied = early.get((id(block), row, k))
    if copied is None and row == 0 and block_rows(block) == 1 << k:
        copied = early.get(id(block))
    return copied
