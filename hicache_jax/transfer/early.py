"""`EarlyCopies`: a large load's host rows start for the device before the load is planned.

The Python of a host hit (the tree's match and planning, the engine's checks, the program
call) takes about a millisecond at 256 V4-Flash pages on the H200; a copy started before
it runs on the copy engines meanwhile. An early copy starts when the tree is about to plan a
load (`copy_early`, for the anchor's host pages; `copy_early_many` for all of `acquire_many`'s
requests before it plans any, the whole blocks of one size in one `copy_many` program, so
the copies run under the rest of the step's Python) or first thing in the load's `start`
(`take`, for every allocator), and the load unpacks it:

    a whole block      the copy program `copy` (a DMA, no index to hand over); the chunk then
                       moves as `EarlyCopy` by `load_block(S, 1)`, or, in a merged load's
                       chunk, as a copied piece (`Piece.copied`, as below)
    rows of a block    `read(B, k)` of each power-of-two piece of a run inside a block (with
                       `TransferConfig.view_bytes`, `copy(2**k)` of a view of its rows); the
                       chunk's `Pieces` then name the copies (`Piece.copied`): the chunk's
                       fused program takes them (`PlanPrograms.ready_load`), else they go into
                       the staging buffer by `h2d` / `h2d_many` from the device (keys ending in 1)

A copy holds device memory until its load unpacks it; the next load's `take` drops every
copy it does not use. Only pieces of at least `early_copy_bytes` are copied: on the H200 a
12-16 MiB block gained 0.15-0.22 ms (16 V4-Flash / 32 V4.1-Flash pages), while an 8 MB one
(a V4-Flash SWA page) lost 0.13-0.16 ms, the copy program's call outweighing the overlap;
copying a load's smaller blocks together (one program) lost too, 0.09-0.22 ms at one page.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hicache_jax.plan import Direction, TransferPlan, coalesce
from hicache_jax.pools import HostTier
from hicache_jax.pools.host_tier import NO_BLOCK, block_rows
from hicache_jax.transfer.blocks import binary
from hicache_jax.transfer.programs import AllocatorPrograms, Program
from hicache_jax.transfer.resident import ResidentIndices

# The copies of one load: `{id(block): (block, its device copy)}` for whole blocks and
# `{(id(block), row, log2 rows): (block, the rows' device copy)}` for pieces; holding the
# block keeps its id from being reused.
Copies = dict


class EarlyCopies:
    def __init__(self, host: HostTier, programs: dict[str, AllocatorPrograms], ints: ResidentIndices,
                 early_copy_bytes: int, view_bytes: int | None = None):
        self.host, self._programs, self._ints = host, programs, ints
        self.early_bytes = early_copy_bytes
        self.view_bytes = view_bytes        # `TransferConfig.view_bytes`: rows of a block this large copy as a view
        self._pending: Copies = {}

    def early(self, progs: AllocatorPrograms, pages: int) -> bool:
        """Whether `pages` rows of `progs`' allocator are worth an early copy."""
        return not progs.broadcast_load and pages * progs.fmt.row_bytes >= self.early_bytes

    def copy_early(self, allocator: str, num_pages: int, host_pages: Callable[[], np.ndarray | None]) -> bool:
        """Start copying `allocator`'s host pages to the device ahead of the load that will
        move them: `num_pages` says how many the load will move (a load too small for any
        copy returns at once), `host_pages()` which (None: none). True if a copy is under way."""
        progs = self._programs.get(allocator)
        if progs is None or not self.early(progs, num_pages) or (pages := host_pages()) is None:
            return False
        pages = np.asarray(pages)
        if pages.ndim != 1 or pages.size != num_pages or not np.issubdtype(pages.dtype, np.integer):
            return False
        if (np.diff(pages) == 1).all():   # one run, the usual hit: no sort (this is the copy's latency)
            return self._copy_runs(progs, [(int(pages[0]), pages.size)], self._pending)
        pages = np.unique(pages)
        if pages.size != num_pages or pages[0] < 0 or pages[-1] >= self.host.pages[allocator]:
            return False
        return self._copy_runs(progs, [(r.host_start, r.length) for r in coalesce(pages)], self._pending)

    def copy_early_many(self, allocator: str, loads: list[tuple[int, Callable[[], np.ndarray | None]]]) -> None:
        """`copy_early` for loads that will be planned together (`acquire_many`'s requests),
        `loads` = [(num_pages, host_pages)]: the whole blocks they read, those of one size
        together, copy as one program (`copy_many`, one dispatch instead of one per block)
        once it is compiled (on the background thread, the first time a count is seen);
        until then, and for any other load, each copies as `copy_early` copies it."""
        progs = self._programs.get(allocator)
        if progs is None:
            return
        table, groups, rest = self.host.tables[allocator], {}, []
        for num_pages, host_pages in loads:
            pages = host_pages() if self.early(progs, num_pages) else None
            if pages is None:
                continue
            pages, whole = np.asarray(pages), None
            if pages.ndim == 1 and pages.size == num_pages <= progs.chunk_pages and (np.diff(pages) == 1).all() \
                    and 0 <= int(pages[0]) <= self.host.pages[allocator] - num_pages:
                whole = table.whole(int(pages[0]), num_pages)
            if whole is None:
                rest.append(pages)
            elif id(whole) not in self._pending:
                groups.setdefault(num_pages, {})[id(whole)] = (whole, pages)
        for rows, by_id in groups.items():
            program = progs.compiled(Program.COPY_MANY, rows, len(by_id), background=True) if len(by_id) > 1 else None
            if program is None:
                rest += [pages for _, pages in by_id.values()]
                continue
            arrays = tuple(block for block, _ in by_id.values())
            self._pending.update((id(a), (a, copy)) for a, copy in zip(arrays, program(arrays)))
        for pages in rest:
            self.copy_early(allocator, pages.size, lambda pages=pages: pages)

    def take(self, plan: TransferPlan) -> Copies:
        """The early copies a load plan may use: those `copy_early` started, and new ones for
        each allocator whose pages are one large host run (a merged plan of several runs, a
        step's hits, starts none: each copy would be one more dispatch). A plan that would
        not pass the checks starts nothing new (`check_plan` names it)."""
        if getattr(plan, "direction", None) is not Direction.LOAD:
            return {}
        copies, self._pending = self._pending, {}
        try:
            for batch in plan.batches:
                progs = self._programs.get(batch.allocator)
                if progs is not None and len(batch.host_runs) == 1 and self.early(progs, batch.num_pages):
                    self._copy_runs(progs, [(r.host_start, r.length) for r in batch.host_runs], copies)
        except (IndexError, TypeError, ValueError, AttributeError):
            pass
        return copies

    def _copy_runs(self, progs: AllocatorPrograms, runs: list[tuple[int, int]], into: Copies) -> bool:
        """Copy the large parts of `runs` (host page, length) as `HostBlocks.load_move` will
        cut them: a run that is one whole block as that block, a run inside one block as
        the power-of-two pieces of it; at most `MAX_COPIES` copies (each is a program call
        on the path it should shorten). True if any copy is under way."""
        allocator = progs.fmt.allocator
        table, calls = self.host.tables[allocator], 0
        for start, n in runs:
            if not 0 <= start <= self.host.pages[allocator] - n:
                return bool(calls)
            array = table.whole(start, n)     # the usual hit: one whole block (no segments to cut)
            if array is not None:
                block, row, length = int(table.block_of[start]), 0, n
            else:
                segments = table.segments(start, n)
                if len(segments) != 1 or segments[0][0] == NO_BLOCK:
                    continue                    # across blocks: pieces the copies would not match
                block, row, length = segments[0]
                array = table.arrays[block]
            if row == 0 and length == block_rows(array) <= progs.chunk_pages:
                wanted = [(id(array), lambda: progs.compiled(Program.COPY, length)(array))] \
                    if self.early(progs, length) else []
            else:
                wanted = [((id(array), row + offset, k),
                           lambda offset=offset, k=k: self._rows(progs, table, block, row + offset, k))
                          for offset, k in chunk_pieces(length, progs.chunk_pages) if self.early(progs, 1 << k)]
            for key, copy in wanted:
                if calls == MAX_COPIES:
                    return True
                if key not in into:
                    into[key] = (array, copy())
                calls += 1
        return bool(calls)

    def _rows(self, progs: AllocatorPrograms, table, block: int, row: int, k: int):
        """The device copy of `2**k` rows of `block` from `row`: a view of them copied whole
        (`copy`, one DMA) where they hold `view_bytes`, else read out of the block (`read`)."""
        view = table.view(block, row, 1 << k, self.view_bytes)
        if view is not None:
            return progs.compiled(Program.COPY, 1 << k)(view)
        array = table.arrays[block]
        return progs.compiled(Program.READ, block_rows(array), k)(array, self._ints.one(row))


MAX_COPIES = 2


def chunk_pieces(n: int, chunk_pages: int) -> list[tuple[int, int]]:
    """`(offset, log2 length)` of the pieces a run of `n` pages is cut into: chunks of
    `chunk_pages`, each in power-of-two pieces, largest first (`chunks.split`)."""
    return [(lo + offset, k) for lo in range(0, n, chunk_pages) for offset, k in binary(min(chunk_pages, n - lo))]

