"""`TransferEngine`: moves pages of every pool between device pools (L1) and pinned host (L2).

    backup (device -> host):  a Pallas gather packs the chunk's pages of every pool and
                              layer into contiguous rows on the device; each power-of-two
                              piece of a host run (the same program cuts them) becomes
                              a pinned block, every piece of the backup by one `device_put`
                              outside any jit (a copy engine, beside the model's steps).
    load   (host -> device):  a chunk that is exactly one block moves as one DMA inside
                              a program that then unpacks it (Pallas scatter) into the
                              donated pools, or, when large, by a copy program started
                              before the plan's checks (`HostBlocks`); any other chunk
                              gathers its rows block by block into a staging buffer first.

A deferred load (`start(plan, pools, deferred=True)`) dispatches nothing for its whole
blocks: the model's step moves them, layer group by layer group, inside its own jit
(`landing.py`).

Everything is dispatched asynchronously at `start`, in device stream order, so the caller
may donate the pools to its next step at once. Plans larger than the staging cap go in
chunks of `chunk_pages`; shapes are bucketed to powers of two, so a steady workload stops
compiling once its shapes were seen (`warmup` compiles the common ones ahead).
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping

import jax
import numpy as np
from pallas_kernels import PAD

from hicache_jax.config import TransferConfig
from hicache_jax.layout import PoolLayout
from hicache_jax.layout import groups
from hicache_jax.plan import Direction, TransferPlan
from hicache_jax.pools import DevicePools, Devices, HostTier, RowFormat, checked_page_counts
from hicache_jax.transfer import chunks as chunking
from hicache_jax.transfer.blocks import HostBlocks
from hicache_jax.transfer.dispatch import ChunkDispatch, backup_keys
from hicache_jax.transfer.early import EarlyCopies
from hicache_jax.transfer.engine_seams import EngineSeams
from hicache_jax.transfer.handle import TransferHandle
from hicache_jax.transfer.landing import Landing
from hicache_jax.transfer.plan_check import check_plan
from hicache_jax.transfer.plan_programs import PlanPrograms, fused_entries
from hicache_jax.transfer.kernel_choice import resolve_kernels
from hicache_jax.transfer.programs import AllocatorPrograms
from hicache_jax.transfer.resident import ResidentIndices
from hicache_jax.transfer.warm import MAX_CHUNK_PAGES
from hicache_jax.transfer.warm_runs import EngineWarmup
from hicache_jax.transfer.whole import WholePlans

log = logging.getLogger("hicache_jax.transfer")


class TransferEngine(EngineSeams, EngineWarmup):
    """Device pools <-> pinned host pools for one layout (optionally on a `("tp",)` mesh).

    Holds the host tier (its memory pinned here; pages read as zeros until written).
    Device staging is bounded by `max_staging_bytes` per device and allocator: a persistent
    buffer of `chunk_pages` rows for loads that gather rows from several blocks, and as much
    again for the rows a backup packs until they are on the host, twice that while a chunk
    cut into pieces is packed (`pack_cut` copies out one piece of each smaller size; the
    first device also holds a broadcast copy while loading replicated pools on a mesh). On a
    single device, one-page indices (and a piece's rows) are kept on the device once used,
    or all of them from `warmup` (`resident.py`): at most one small buffer per device page.

    `config` (`TransferConfig`, defaults written there): `kernels` picks the pack/unpack
    implementation, any name of `pallas_kernels.IMPLS`: "mosaic_gpu", "tpu", "triton",
    "reference" (plain jnp), a backend interpreted on the CPU ("mosaic_gpu_interpret", ...),
    or "auto": Mosaic GPU on NVIDIA GPUs (compute capability >= 9.0), Pallas TPU on TPUs,
    the reference elsewhere (logged once). A layout whose pages the chosen kernels cannot
    move raises ValueError here; under "auto" it falls back to the reference. `block_bytes`
    caps one copy (default: the backend's). A load batch that is one host block of at least
    `early_copy_bytes` starts its copy (a program of its own) before the plan is checked, so
    the copy engine works while the checks and the dispatch run; it holds a device copy of
    the block until unpacked. A deferred load leaves at most one whole host block of the
    anchor allocator to the model's step, of one of `landing_buckets` sizes (the largest
    powers of two of a chunk, `landing_sizes`): a step compiles once per size, at warm-up
    (`landing_examples`). `host_memory_limit_bytes` caps the host tier (None: the cap of
    XLA's pinned pool); a larger tier raises ValueError before anything is pinned.
    """

    def __init__(self, layout: PoolLayout, device_pages: Mapping[str, int], host_pages: Mapping[str, int],
                 mesh: jax.sharding.Mesh | None = None, config: TransferConfig = TransferConfig()):
        if not isinstance(config, TransferConfig):
            raise ValueError(f"TransferEngine takes a TransferConfig, got {config!r}")
        self.layout, self.config = layout, config
        self.layer_groups = groups.check_groups(layout, config.layer_groups)
        self.devices = Devices.create(mesh)
        self._device = DevicePools(layout, device_pages, self.devices)
        host_counts = checked_page_counts(layout, host_pages, "host_pages", minimum=0)
        self.kernels = resolve_kernels(config.kernels, self.devices.device, layout)
        chunk_pages = {}
        for a in self._device.pages:  # before the host tier is allocated: fail fast
            row_bytes = RowFormat.create(layout, a, self.devices.tp).rank_row_bytes
            pages = _floor_pow2(config.max_staging_bytes // row_bytes)
            if pages < 1:
                raise ValueError(f"max_staging_bytes = {config.max_staging_bytes:,} is smaller than one page of "
                                 f"allocator {a!r} ({row_bytes:,} B per device)")
            # no batch is larger than either tier, and a host copy never exceeds the host pool
            chunk_pages[a] = min(pages, MAX_CHUNK_PAGES, _floor_pow2(min(self._device.pages[a], host_counts[a])))
        self.host = HostTier(layout, host_counts, self.devices, config.host_limit_bytes(), config.layer_groups)
        self._programs = {
            a: AllocatorPrograms(fmt, [self._device.shape(s) for s in fmt.pools], self.devices,
                                 functools.partial(self.host.block, a), self.host.sharding(a), chunk_pages[a],
                                 self.kernels, config.block_bytes)
            for a, fmt in self.host.formats.items()
        }
        self._plan_programs = PlanPrograms(self._programs, config.fuse_after)
        self._ints = ResidentIndices(None if mesh is not None else self.devices.device,
                                     max(self._device.pages.values(), default=0))
        anchor = self._programs.get(layout.anchor.name)
        self.landing_sizes = () if anchor is None or anchor.broadcast_load else tuple(
            sorted({anchor.chunk_pages >> i for i in range(config.landing_buckets)} - {0}))
        self._early = EarlyCopies(self.host, self._programs, self._ints, config.early_copy_bytes,
                                  config.view_bytes)
        self._blocks = HostBlocks(self.host, self._programs, self._ints,
                                  {layout.anchor.name: self.landing_sizes} if self.landing_sizes else {},
                                  config.view_bytes)
        self._dispatch = ChunkDispatch(self._programs, self._plan_programs, self.host, self._ints, self.devices)
        self._whole = WholePlans(self._programs, self.host, layout.anchor.name, layout.window_pages(),
                                 mesh is not None)
        self._needed = groups.needed_groups(layout, self.layer_groups)   # per model layer (landings)
        self._warm: tuple[list, list] = ([], [])    # what `warmup` compiled, for `warm_runs`

    # -- device pools ----------------------------------------------------------------------
    def init_device_pools(self) -> dict[str, jax.Array]:
        """Zero-filled device pools `{pool: [num_layers, device pages, *page_shape]}`, placed for this engine."""
        return self._device.zeros()

    def check_device_pools(self, pools: Mapping[str, jax.Array]) -> None:
        """ValueError naming the pool and what is wrong (missing/extra pool, shape, dtype, sharding, deleted)."""
        self._device.check(pools)

    # -- transfers -------------------------------------------------------------------------
    def start(self, plan: TransferPlan, pools: Mapping[str, jax.Array], *,
              deferred: bool = False) -> tuple[Mapping[str, jax.Array], TransferHandle]:
        """Dispatch `plan` and return `(pools, handle)` without waiting for the copies.

        BACKUP reads `pools` and returns the same mapping (the caller may go on using and
        donating it: later device work is ordered after these reads). LOAD donates the
        arrays of the pools it writes and returns a new mapping holding their successors
        (other pools pass through); pages outside the plan keep their bytes on both tiers.
        A plan that does not fit raises ValueError before anything moves; so does a pool
        mapping that `check_device_pools` rejects. Errors after dispatch are raised by
        `handle.done()` / `handle.wait()`.

        `deferred` (loads only): the largest whole anchor block the plan moves whose rows are
        one of `landing_sizes` is not moved; `handle.landing` hands it to the model's step
        (`transfer/landing.py`), and the handle is not done until `handle.landed(token)`. The
        rest (replicated pools on a mesh too) moves now; with nothing deferred,
        `handle.landing` is None and the load is an ordinary one.
        """
        started = time.perf_counter()
        if not isinstance(deferred, bool):
            raise ValueError(f"deferred must be a bool, got {deferred!r}")
        early = {} if deferred else self._early.take(plan)
        check_plan(plan, self.layout, self._device.pages, self.host.pages)
        self._device.check(pools)
        backup = plan.direction is Direction.BACKUP
        if deferred and backup:
            raise ValueError("only a load can be deferred; this plan is a backup")
        # the common load-back is read straight off the plan; anything else is chunked first
        direct = None if backup or deferred else self._whole.load(plan, early)
        if direct is not None:
            program = self._plan_programs.compiled(False, direct[0])
            work, moves, landing, whole, fused = [], None, None, None, None
        else:
            work, moves, landing, whole, fused = self._prepare(plan, backup, deferred, early)
        out = pools if backup else dict(pools)
        tokens, error = [], None
        try:
            if backup:  # the pages written leave their blocks first, then room is made for them
                for batch in plan.batches:
                    if batch.allocator in self._programs and batch.num_pages:
                        self.host.tables[batch.allocator].release(np.asarray(batch.host_pages))
                        self._blocks.make_room(self._programs[batch.allocator], batch.num_pages)
            if direct is not None:
                tokens += self._dispatch.load_plan(program, *direct, out)
            elif fused is not None:
                tokens += self._dispatch.fused_load(fused, work, moves, out)
            elif whole is not None:
                tokens += self._dispatch.backup_plan(whole, work, pools)
            elif backup:
                for progs, parts in work:
                    tokens += self._dispatch.backup(progs, parts, pools)
            else:
                for (progs, parts), chunk_moves in zip(work, moves):
                    tokens += self._dispatch.load(progs, parts, chunk_moves, out)
        except Exception as e:  # dispatch failed mid-way: the handle reports it
            error = e
        if not backup and error is None:
            self._device.made(out)
        return out, TransferHandle(plan, plan.nbytes(self.layout), started, tokens, error, landing)

    def _prepare(self, plan: TransferPlan, backup: bool, deferred: bool, early: dict):
        """`(work, moves, landing, whole, fused)` of a plan that is not a whole load: its chunks
        per allocator, how each load chunk moves, a deferred load's landing, a one-program
        backup's key, a load's fused program if it is compiled (`PlanPrograms.ready_load`; else
        the load moves per chunk); every program they need compiled (a compile error leaves
        both tiers as they were)."""
        work = []
        for batch in plan.batches:
            progs = self._programs.get(batch.allocator)
            if progs is None or batch.num_pages == 0:
                continue
            runs = [(r.offset, r.host_start, r.length) for r in batch.host_runs]
            work.append((progs, chunking.split(np.asarray(batch.device_pages, np.int32), runs, progs.chunk_pages)))
        moves = None if backup else [[self._blocks.load_move(progs, part, early) for part in parts]
                                     for progs, parts in work]
        landing = None
        if deferred:
            work, moves, to_step = self._blocks.defer(work, moves)
            landing = Landing.create([(progs, names, block, jax.device_put(pages, progs.home))
                                      for progs, names, block, pages in to_step],
                                     self._needed, self.layer_groups) if to_step else None
        whole = self._whole.backup_key(work) if backup else None
        entries = None if backup or deferred or self.devices.mesh is not None else fused_entries(work, moves)
        fused = self._plan_programs.ready_load(entries) if entries else None
        if fused is not None:
            return work, moves, landing, whole, fused
        if whole is not None:
            self._plan_programs.compiled(True, whole)
        elif backup:
            for progs, parts in work:
                for part in parts:
                    for key in backup_keys(part):
                        progs.compiled(*key)
        else:
            for (progs, parts), chunk_moves in zip(work, moves):
                for part, move in zip(parts, chunk_moves):
                    for key in self._blocks.load_keys(progs, part, move):
                        progs.compiled(*key)
        return work, moves, landing, whole, None

    def land(self, landing: Landing, pools: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """`pools` (donated) with every group of a deferred load's `landing` written, by one
        program: what a step that lands it writes, for a landing no step took."""
        self._device.check(pools)
        if not isinstance(landing, Landing):
            raise ValueError(f"land takes a Landing, got {type(landing).__name__}")
        out = _land_all(dict(pools), landing)
        self._device.made(out)
        return out

    def landing_examples(self):
        """One `Landing` of each size a deferred load can leave to a step (`landing_sizes`),
        smallest first, that lands nothing (its device pages are PAD, its block zeros): a
        serving loop runs its step on each at warm-up, so no landing compiles it while
        serving. Made one at a time: each holds a pinned block of its size until dropped."""
        anchor = self.layout.anchor.name
        for rows in self.landing_sizes:
            progs = self._programs[anchor]
            pages = jax.device_put(np.full(rows, PAD, np.int32), progs.home)
            yield Landing.create([(progs, [s.name for s in progs.fmt.pools], self.host.block(anchor, rows), pages)],
                                 self._needed, self.layer_groups)

    def warm_landings(self, pools: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """`pools` (donated) after compiling `land` for every landing size (it writes nothing)."""
        out = dict(pools)
        for example in self.landing_examples():
            out = self.land(example, out)
        return out


@functools.partial(jax.jit, donate_argnums=0)
def _land_all(pools: dict, landing: Landing) -> dict:
    """Every group of `landing` written into `pools`, in one program (shared by every engine)."""
    return landing.schedule().finish(pools)


def _floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0
