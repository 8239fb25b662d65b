"""Run once, at warm-up, every transfer program `TransferEngine.warmup` compiled.

Compiling a program is not running it: on a GPU a compiled program's first run still loads
its kernels onto the device, a one-off of milliseconds that would land in the request whose
hit first has that shape (a new block size, a new pair of allocator chunk lengths). Each
program here runs on all-PAD pages (`pallas_kernels.PAD`): a gather reads page 0 into rows
nobody keeps, a scatter writes nothing, so the pools come back with the bytes they had,
whatever the cache holds. Host blocks are fresh zero blocks; the staging buffer's rows are
the engine's scratch. One device only: on a mesh the programs are compiled and left to
their first use.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import jax
import numpy as np

from pallas_kernels import PAD
from hicache_jax.transfer import warm
from hicache_jax.transfer.dispatch import ChunkDispatch
from hicache_jax.transfer.index_layout import plan_index
from hicache_jax.transfer.plan_programs import PlanPrograms
from hicache_jax.transfer.programs import AllocatorPrograms, Program


class WarmRuns:
    """The runs of one warm-up: `chunk(progs, key)` and `plan(backup, runs)` for each
    compiled program, in the order `warmup` compiled them, over `pools` (updated)."""

    def __init__(self, dispatch: ChunkDispatch, plan_programs: PlanPrograms, pools: dict[str, jax.Array]):
        self._dispatch, self._plan_programs, self.pools = dispatch, plan_programs, pools
        self._blocks: dict[tuple[str, int], tuple] = {}
        self._rows: dict[tuple[str, int], tuple] = {}          # PACK's output, for SLICE
        self.outputs: list = []                                 # results no later run donates
        self._staged: dict[str, AllocatorPrograms] = {}         # allocators whose staging buffer was written

    def chunk(self, progs: AllocatorPrograms, key: tuple) -> None:
        name, pages, *rest = key
        copied = rest[1:] == [1]        # an h2d / h2d_many key ending in 1: from early copies
        a, ints = progs.fmt.allocator, self._dispatch.ints
        names = [s.name for s in progs.fmt.pools]
        pools = tuple(self.pools[n] for n in names)
        run = progs.compiled(*key)
        match name:
            case Program.PACK:
                out = self._rows[(a, pages)] = run(pools, _pad(pages, ints.index))
            case Program.PACK_CUT:     # PAD starts clamp to row 0
                out = run(pools, _pad(pages + pages.bit_length() - 1, ints.index))
            case Program.SLICE:
                out = run(self._rows[(a, pages)], ints.one(0))
            case Program.H2D:      # over the staging buffer (donated): waited for as the buffer, at the end
                self._staged[a] = progs
                block = self._block(a, pages)
                if copied:
                    block = progs.compiled(Program.COPY, pages)(block)
                self._dispatch.set_staging(progs, run(self._dispatch.staging_buffer(progs), block,
                                                      ints.one(0), ints.one(0)))
                return
            case Program.H2D_MANY:     # key (log2 rows, count[, copied]): that many zero blocks, all to row 0
                self._staged[a] = progs
                blocks = tuple(self._block(a, 1 << pages) for _ in range(rest[0]))
                if copied:
                    blocks = tuple(progs.compiled(Program.COPY, 1 << pages)(b) for b in blocks)
                self._dispatch.set_staging(progs, run(self._dispatch.staging_buffer(progs), blocks,
                                                      tuple(ints.one(0) for _ in blocks)))
                return
            case Program.READ:
                out = run(self._block(a, pages), ints.one(0))
            case Program.COPY:
                out = run(self._block(a, pages))
            case Program.LOAD_BLOCK | Program.UNPACK:
                rows = (self._dispatch.staging_buffer(progs) if name is Program.UNPACK
                        else progs.compiled(Program.COPY, pages)(self._block(a, pages)) if rest[0]
                        else self._block(a, pages))
                new, out = run(pools, rows, _pad(pages, ints.index))
                self.pools.update(zip(names, new))
            case _:          # TAKE: a mesh's broadcast, not run here
                return
        self.outputs.append(out)

    def plan(self, programs: dict[str, AllocatorPrograms], backup: bool, runs: tuple) -> None:
        arrays = tuple(tuple(self.pools[s.name] for s in programs[a].fmt.pools) for a, *_ in runs)
        index = plan_index([np.full(n, PAD, np.int32) for _, n, *_ in runs], self._dispatch.ints.index)
        run = self._plan_programs.compiled(backup, runs)
        if backup:
            self.outputs.append(run(arrays, index))
            return
        blocks = tuple(programs[a].compiled(Program.COPY, n)(self._block(a, n)) if early else self._block(a, n)
                       for a, n, early in runs)
        new, token = run(arrays, blocks, index)
        for (a, *_), pools in zip(runs, new):
            self.pools.update(zip((s.name for s in programs[a].fmt.pools), pools))
        self.outputs.append(token)

    def finish(self) -> dict[str, jax.Array]:
        """The pools, once every run has ended."""
        staging = [self._dispatch.staging_buffer(progs) for progs in self._staged.values()]
        jax.block_until_ready((self.outputs, self.pools, staging))
        return self.pools

    def _block(self, allocator: str, rows: int) -> tuple:
        key = (allocator, rows)
        if key not in self._blocks:
            self._blocks[key] = self._dispatch.host.block(allocator, rows)
        return self._blocks[key]


def _pad(pages: int, index: Callable[[np.ndarray], object]):
    return index(np.full(pages, PAD, np.int32))


def run_all(dispatch: ChunkDispatch, plan_programs: PlanPrograms, programs: dict[str, AllocatorPrograms],
            chunk_keys: Iterable[tuple[str, tuple]], plans: Iterable[tuple[bool, tuple]],
            pools: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """`pools` after running each of `chunk_keys` ((allocator, program key)) and `plans`
    ((backup, runs)) once on PAD pages (module docstring)."""
    runs = WarmRuns(dispatch, plan_programs, dict(pools))
    for allocator, key in chunk_keys:
        runs.chunk(programs[allocator], key)
    for backup, key in plans:
        runs.plan(programs, backup, key)
    return runs.finish()


class EngineWarmup:
    """`TransferEngine.warmup` (compile) and `warm_runs` (run once): a mixin over the
    engine's programs, dispatch, indices and early copies."""

    def warmup(self, max_pages: int | None = None) -> int:
        """Compile ahead of use every program a chunk of up to `max_pages` pages (default:
        the chunk size) can need, in both directions: pack and unpack of each padded size,
        the pieces a backup cuts, a whole-block load of each size, and the copies of any
        piece of any block up to that size (L3 reads included); with several allocators
        on one device, the one-program plans of a prefix's load-back and backup. Allocates
        the staging buffers, and on one device keeps every one-page index on it
        (`ResidentIndices.fill`); `warm_runs` then runs them. Returns the number of programs
        compiled so far."""
        if max_pages is not None and max_pages < 1:
            raise ValueError(f"warmup needs max_pages >= 1, got {max_pages}")
        self._ints.fill()
        self._warm = ([], [])      # (allocator, program key), (backup, plan runs)
        for progs in self._programs.values():
            self._dispatch.staging_buffer(progs)
            limit = progs.chunk_pages if max_pages is None else min(progs.chunk_pages, max_pages)
            for key in warm.chunk_keys(progs, limit, lambda pages: self._early.early(progs, pages)):
                progs.compiled(*key)
                self._warm[0].append((progs.fmt.allocator, key))
        plans = [] if self.devices.mesh is not None else warm.plan_shapes(
            self._programs, self.layout.anchor.name, self._whole.window, warm.MAX_CHUNK_PAGES, max_pages)
        for runs in plans:
            load = tuple((a, n, int(self._early.early(self._programs[a], n))) for a, n in runs)
            for backup, key in ((True, runs), (False, load)):
                self._plan_programs.compiled(backup, key)
                self._warm[1].append((backup, key))
        return sum(len(p.jaxprs) for p in self._programs.values()) + len(self._plan_programs.jaxprs)

    def warm_runs(self, pools: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """`pools` (donated, bytes unchanged) after running once each program the last
        `warmup` compiled, on PAD pages (warm_runs.py; on a mesh, nothing runs)."""
        self._device.check(pools)
        if self.devices.mesh is not None:
            return dict(pools)
        out = run_all(self._dispatch, self._plan_programs, self._programs, *self._warm, pools)
        self._device.made(out)
        return out
