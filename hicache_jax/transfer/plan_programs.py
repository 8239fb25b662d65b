"""`PlanPrograms`: one program that moves a whole plan whose allocators each move as one chunk.

A load-back of a prefix's kv pages and its window's SWA pages, or the pack of a backup batch,
then costs one dispatch instead of one per allocator (one device, no mesh).

Loads whose chunks are whole blocks have few shapes, all compiled by `warmup` (`compiled`).
A load whose chunks gather pieces of several blocks (a hit on part of a block, several
requests' hits merged) has as many shapes as its pieces have sizes: its one program
(`ready_load`, labelled "plan:load_pieces[...]") is compiled on a background thread once
its shape has been seen `fuse_after` times (`TransferConfig.fuse_after`); until it is
ready, that shape's loads move by the per-chunk programs.
"""
from __future__ import annotations

import collections
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from hicache_jax.pools.host_tier import block_rows
from hicache_jax.transfer.compile_cache import ready_program, shared_program
from hicache_jax.transfer.index_layout import aligned_join, plan_index, split_plan_index
from hicache_jax.transfer.moves import EarlyCopy, Move, Pieces, WholeBlock
from hicache_jax.transfer.programs import AllocatorPrograms, Program

SIGHTINGS_KEPT = 4096     # load shapes whose sightings are counted (the least recently seen are forgotten)

# One allocator's part of a fused load: (allocator, pages, (Program.LOAD_BLOCK, on device))
# or (allocator, pages, (Program.LOAD_PIECES, ((block rows, log2 rows, early copy), ...) in staging order)).
FusedEntry = tuple[str, int, tuple]


class PlanPrograms:
    """Programs moving several allocators' one-chunk batches at once (one device, no mesh).

    `compiled(backup, runs)` with `runs` in plan order is one jit over every allocator's
    `pack` (backup, `runs = ((allocator, pages), ...)`: arguments the allocators' pools
    tuples and the device pages (`plan_index`); results their packed rows) or `load_block`
    (load, `runs = ((allocator, pages, on device), ...)`: arguments the pools tuples, the
    blocks or their device copies, and the device pages).
    """

    def __init__(self, programs: dict[str, AllocatorPrograms], fuse_after: int = 1):
        self._programs = programs
        self._fuse_after = fuse_after
        self._sightings: collections.OrderedDict[tuple, int] = collections.OrderedDict()   # by entries
        self._cache: dict[tuple, jax.stages.Compiled] = {}   # by (backup, runs)
        self._labels: dict[tuple, str] = {}
        self.jaxprs: dict[str, object] = {}
        self.hook: Callable | None = None   # instrumentation: `TransferEngine.on_program_call`

    def compiled(self, backup: bool, runs: tuple[tuple[str, int], ...]) -> jax.stages.Compiled:
        program = self._cache.get((backup, runs))
        if program is None:
            name = Program.PACK if backup else Program.LOAD_BLOCK
            label = f"plan:{name}{list(runs)}"
            identity = (tuple(self._programs[a]._identity for a, *_ in runs), backup, runs)
            program = self._cache[(backup, runs)] = shared_program(identity, label, self.jaxprs,
                                                            lambda: self._build(backup, runs, name))
            self._labels[(backup, runs)] = label
        if self.hook is not None:
            return functools.partial(self.hook, self._labels[(backup, runs)], program)
        return program

    def _build(self, backup: bool, runs, name: Program):
        """(fn, example args, donate_argnums, out shardings) of one plan program."""
        built = [self._programs[a].build(name, *key) for a, *key in runs]
        fns = [fn for fn, *_ in built]
        sizes = [key[0] for _, *key in runs]
        home = self._programs[runs[0][0]].home
        index = tuple(jax.ShapeDtypeStruct(i.shape, jnp.int32, sharding=home)
                      for i in plan_index([np.zeros(n, np.int32) for n in sizes], lambda i: i))
        pools = tuple(args[0] for _, args, _, _ in built)
        if backup:
            def plan_pack(pools, idx):
                return tuple(fn(p, i) for fn, p, i in zip(fns, pools, split_plan_index(sizes, idx)))
            fn, args, donate = plan_pack, (pools, index), ()
            outs = tuple(o for _, _, _, o in built)
        else:
            def plan_load(pools, blocks, idx):
                moved = [fn(p, b, i) for fn, p, b, i in zip(fns, pools, blocks, split_plan_index(sizes, idx))]
                return tuple(p for p, _ in moved), moved[0][1]
            blocks = tuple(args[1] for _, args, _, _ in built)
            fn, args, donate = plan_load, (pools, blocks, index), (0,)
            outs = (tuple(o for _, _, _, (o, _) in built), home)
        return fn, args, donate, outs

    def ready_load(self, entries: tuple[FusedEntry, ...]) -> jax.stages.Compiled | None:
        """The one program of a load of `entries` (`fused_entries`) if it is compiled, else
        None (counting this load of its shape; the `fuse_after`-th starts its compilation
        in the background: module docstring)."""
        key = (False, entries)
        program = self._cache.get(key)
        if program is None:
            if not self._fuse_after:             # fused loads are off
                return None
            label = "plan:load_pieces" + repr([(a, n, e[1]) for a, n, e in entries])
            identity = (tuple(self._programs[a]._identity for a, *_ in entries), "fused_load", entries)
            program = ready_program(identity, label, self.jaxprs, lambda: self._build_fused(entries),
                                    start=self._sighted(entries))
            if program is None:
                return None
            self._cache[key], self._labels[key] = program, label
        if self.hook is not None:
            return functools.partial(self.hook, self._labels[key], program)
        return program

    def _sighted(self, entries: tuple[FusedEntry, ...]) -> bool:
        """Count one more load of shape `entries`; True once it has been seen `fuse_after` times."""
        seen = self._sightings.pop(entries, 0) + 1
        self._sightings[entries] = seen                  # the most recently seen last
        if len(self._sightings) > SIGHTINGS_KEPT:
            self._sightings.popitem(last=False)
        return seen >= self._fuse_after

    def _build_fused(self, entries: tuple[FusedEntry, ...]):
        """(fn, example args, donate_argnums, out shardings) of one fused load: each entry's
        `load_block` or `load_pieces` in turn, over a pools tuple and a source per allocator,
        every piece's start row (one array; a pieces entry takes its slice), and the page
        indices (`plan_index`)."""
        built = [self._programs[a].build(*program_key(n, e)) for a, n, e in entries]
        sizes = [args[-1].shape[0] for _, args, _, _ in built]     # each program's page index, as it lays it out
        counts = [len(e[1]) if e[0] is Program.LOAD_PIECES else 0 for _, _, e in entries]
        home = self._programs[entries[0][0]].home
        index = tuple(jax.ShapeDtypeStruct(i.shape, jnp.int32, sharding=home)
                      for i in plan_index([np.zeros(n, np.int32) for n in sizes], lambda i: i))
        starts = jax.ShapeDtypeStruct((max(1, sum(counts)),), jnp.int32, sharding=home)

        def fused_load(pools, sources, starts, idx):
            out, lo = [], 0
            for (fn, *_), (_, _, entry), p, src, i, k in zip(built, entries, pools, sources,
                                                           split_plan_index(sizes, idx), counts):
                if entry[0] is Program.LOAD_PIECES:
                    out.append(fn(p, src, starts[lo:lo + k], i)[0])
                    lo += k
                else:
                    out.append(fn(p, src, i)[0])
            return tuple(out), idx[0][0] + 0

        pools = tuple(args[0] for _, args, _, _ in built)
        sources = tuple(args[1] for _, args, _, _ in built)
        outs = (tuple(o for _, _, _, (o, _) in built), home)
        return fused_load, (pools, sources, starts, index), (0,), outs

    def labelled(self) -> dict[str, jax.stages.Compiled]:
        """Every plan program compiled so far, by label."""
        return {self._labels[key]: program for key, program in self._cache.items()}


def fused_entries(work, moves: list[list[Move]]) -> tuple[FusedEntry, ...] | None:
    """The entries of one fused program for a load (the engine's `work` and chunk `moves`),
    or None when it does not fuse: an allocator with several chunks, or nothing gained (a
    single allocator moving one whole block is one program already)."""
    entries = []
    for (progs, parts), chunk_moves in zip(work, moves):
        if len(parts) != 1 or progs.broadcast_load:
            return None
        match chunk_moves[0]:
            case WholeBlock():
                entry = (Program.LOAD_BLOCK, 0)
            case EarlyCopy():
                entry = (Program.LOAD_BLOCK, 1)
            case Pieces(pieces):
                entry = (Program.LOAD_PIECES, tuple((block_rows(p.block), p.log2_rows, p.copied)
                                                    for p in in_order(pieces)))
        entries.append((progs.fmt.allocator, parts[0].padded_pages, entry))
    if len(entries) < 2 and all(e[0] is Program.LOAD_BLOCK for _, _, e in entries):
        return None
    return tuple(entries)


def fused_index(work, moves: list[list[Move]]) -> list[np.ndarray]:
    """A fused load's page index per allocator (`plan_index` joins them): its chunk's device
    pages; a pieces chunk's piece by piece, each from an aligned place (`aligned_join`), as
    its program unpacks them."""
    out = []
    for (_, parts), chunk_moves in zip(work, moves):
        pages = parts[0].device_pages
        if isinstance(chunk_moves[0], Pieces):
            pages = aligned_join([pages[p.staging_row:p.staging_row + p.rows] for p in in_order(chunk_moves[0].pieces)])
        out.append(pages)
    return out


def fused_sources(moves: list[list[Move]]) -> tuple[tuple, np.ndarray]:
    """A fused load's sources (per allocator: its block, device copy, or pieces' blocks) and
    the start row of every piece (all allocators, in entry order)."""
    sources, starts = [], []
    for chunk_moves in moves:
        match chunk_moves[0]:
            case WholeBlock(block) | EarlyCopy(block):
                sources.append(block)
            case Pieces(pieces):
                ordered = in_order(pieces)
                sources.append(tuple(p.block for p in ordered))
                starts += [p.row for p in ordered]
    return tuple(sources), np.array(starts or [0], np.int32)


def in_order(pieces) -> list:
    """A chunk's pieces in staging order (they cover its rows from 0 without a gap)."""
    return sorted(pieces, key=lambda p: p.staging_row)


def program_key(pages: int, entry: tuple) -> tuple:
    """`(Program, *shape key)` of one fused entry's allocator program."""
    return (entry[0], pages, entry[1])
