"""`TransferEngine`: moves pages of every pool between device pools (L1) and pinned host (L2).

    backup (device -> host):  a Pallas gather packs the chunk's pages of every pool and
                              layer into contiguous rows; each host run is one (or a few,
                              power-of-two sized) device->host copies into the donated host
                              buffer, in place.
    load   (host -> device):  each host run is copied to the device as a block; a Pallas
                              scatter unpacks it into the donated pools, in place.

Everything is dispatched asynchronously at `start`, in device stream order, so the caller
may donate the pools to its next step at once. Plans larger than the staging cap go in
chunks of `chunk_pages`; shapes are bucketed to powers of two, so a steady workload stops
compiling once its shapes were seen (`warmup` compiles the common ones ahead).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

import pallas_kernels as pk
from hicache_jax.layout import PoolLayout
from hicache_jax.plan import Direction, TransferPlan
from hicache_jax.pools import DevicePools, Devices, HostRowFormat, HostTier, checked_page_counts, shard_on
from hicache_jax.transfer import chunks as chunking
from hicache_jax.transfer.handle import TransferHandle
from hicache_jax.transfer.plan_check import check_plan
from hicache_jax.transfer.programs import AllocatorPrograms, PlanPrograms, Program

log = logging.getLogger("hicache_jax.transfer")

DEFAULT_MAX_STAGING_BYTES = 512 << 20
DEFAULT_HOST_MEMORY_LIMIT_BYTES = 64 << 30
DEFAULT_PIPELINE_PARTS = 2
MAX_CHUNK_PAGES = 1 << 15  # one kernel call handles at most 65535 pages
WARMUP_MAX_RUNS = 4        # host runs per chunk whose copy programs `warmup` compiles


class TransferEngine:
    """Device pools <-> pinned host pools for one layout (optionally on a `("tp",)` mesh).

    Holds the host tier (allocated here, zero-filled). Device staging is bounded by
    `max_staging_bytes` per device and allocator: a persistent buffer of `chunk_pages`
    rows for chunks with fragmented host runs, or the same amount of temporaries while a
    chunk of one whole run moves (the first device also holds a broadcast copy while
    loading replicated pools on a mesh). Such a chunk is split into `pipeline_parts` so
    one part's DMA overlaps the next part's pack/unpack.

    `kernels` picks the pack/unpack implementation, any name of `pallas_kernels.IMPLS`:
    "mosaic_gpu", "tpu", "triton", "reference" (plain jnp), a backend interpreted on the
    CPU ("mosaic_gpu_interpret", ...), or "auto": Mosaic GPU on NVIDIA GPUs (compute
    capability >= 9.0), Pallas TPU on TPUs, the reference elsewhere (logged once). A
    layout whose pages the chosen kernels cannot move raises ValueError here; under
    "auto" it falls back to the reference. `block_bytes` caps one copy (default: the
    backend's).
    """

    def __init__(self, layout: PoolLayout, device_pages: Mapping[str, int], host_pages: Mapping[str, int],
                 mesh: jax.sharding.Mesh | None = None, max_staging_bytes: int = DEFAULT_MAX_STAGING_BYTES,
                 host_memory_limit_bytes: int = DEFAULT_HOST_MEMORY_LIMIT_BYTES, *, kernels: str = "auto",
                 block_bytes: int | None = None, pipeline_parts: int = DEFAULT_PIPELINE_PARTS):
        self.layout = layout
        self.devices = Devices.create(mesh)
        self._device = DevicePools(layout, device_pages, self.devices)
        host_counts = checked_page_counts(layout, host_pages, "host_pages")
        if pipeline_parts < 1 or pipeline_parts & (pipeline_parts - 1):
            raise ValueError(f"pipeline_parts must be a power of two, got {pipeline_parts}")
        self.kernels = _resolve_kernels(kernels, self.devices.device, layout)
        self._parts = pipeline_parts
        chunk_pages = {}
        for a in self._device.pages:  # before the host tier is allocated: fail fast
            row_bytes = HostRowFormat.create(layout, a, self.devices).rank_row_bytes
            pages = _floor_pow2(max_staging_bytes // row_bytes)
            if pages < 1:
                raise ValueError(f"max_staging_bytes = {max_staging_bytes:,} is smaller than one page of allocator "
                                 f"{a!r} ({row_bytes:,} B per device)")
            # no batch is larger than either tier, and a host copy never exceeds the host pool
            chunk_pages[a] = min(pages, MAX_CHUNK_PAGES, _floor_pow2(min(self._device.pages[a], host_counts[a])))
        self.host = HostTier(layout, host_counts, self.devices, host_memory_limit_bytes)
        self._programs = {
            a: AllocatorPrograms(fmt, [self._device.shape(s) for s in fmt.pools], self.devices,
                                 lambda a=a: self.host.buffers[a], chunk_pages[a], self.kernels, block_bytes)
            for a, fmt in self.host.formats.items()
        }
        self._plan_programs = PlanPrograms(self._programs)
        self._staging: dict[str, jax.Array] = {}

    # -- device pools ----------------------------------------------------------------------
    def init_device_pools(self) -> dict[str, jax.Array]:
        """Zero-filled device pools `{pool: [num_layers, device pages, *page_shape]}`, placed for this engine."""
        return self._device.zeros()

    def check_device_pools(self, pools: Mapping[str, jax.Array]) -> None:
        """ValueError naming the pool and what is wrong (missing/extra pool, shape, dtype, sharding, deleted)."""
        self._device.check(pools)

    # -- transfers -------------------------------------------------------------------------
    def start(self, plan: TransferPlan, pools: Mapping[str, jax.Array]) -> tuple[Mapping[str, jax.Array], TransferHandle]:
        """Dispatch `plan` and return `(pools, handle)` without waiting for the copies.

        BACKUP reads `pools` and returns the same mapping (the caller may go on using and
        donating it: later device work is ordered after these reads). LOAD donates the
        arrays of the pools it writes and returns a new mapping holding their successors
        (other pools pass through); pages outside the plan keep their bytes on both tiers.
        A plan that does not fit raises ValueError before anything moves; so does a pool
        mapping that `check_device_pools` rejects. Errors after dispatch are raised by
        `handle.done()` / `handle.wait()`.
        """
        started = time.perf_counter()
        check_plan(plan, self.layout, self._device.pages, self.host.pages)
        self._device.check(pools)
        backup = plan.direction is Direction.BACKUP
        work = []
        for batch in plan.batches:
            progs = self._programs.get(batch.allocator)
            if progs is None or batch.num_pages == 0:
                continue
            runs = [(r.offset, r.host_start, r.length) for r in batch.host_runs]
            work.append((progs, chunking.split(np.asarray(batch.device_pages, np.int32), runs, progs.chunk_pages)))
        # compile before anything moves: a compile error leaves both tiers as they were
        whole = self._whole_plan(work, backup)
        if whole is not None:
            self._plan_programs.compiled(backup, whole)
        else:
            for progs, parts in work:
                for part in parts:
                    self._compile(progs, part, backup)
        out = pools if backup else dict(pools)
        tokens, error = [], None
        try:
            if whole is not None:
                tokens.append(self._move_plan(whole, work, backup, out))
            else:
                for progs, parts in work:
                    tokens.append(self._backup(progs, parts, pools) if backup else self._load(progs, parts, out))
        except Exception as e:  # dispatch failed mid-way: the handle reports it
            error = e
        return out, TransferHandle(plan, plan.nbytes(self.layout), started, tokens, error)

    def warmup(self, max_pages: int | None = None, max_runs: int = WARMUP_MAX_RUNS) -> int:
        """Compile ahead of use every program a chunk of up to `max_pages` pages (default:
        the chunk size) whose host side is at most `max_runs` runs can need, in both
        directions: the fused program of each power-of-two length, and the staging-path
        programs (pack / unpack of each padded size, host copies of up to `max_runs`
        pieces of each power-of-two size). Allocates the staging buffers. Returns the
        number of programs compiled so far."""
        if max_runs < 1 or (max_pages is not None and max_pages < 1):
            raise ValueError(f"warmup needs max_pages >= 1 and max_runs >= 1, got {max_pages} and {max_runs}")
        todo = {}
        for progs in self._programs.values():
            self._staging_buffer(progs)
            limit = progs.chunk_pages if max_pages is None else min(progs.chunk_pages, max_pages)
            pages = 1
            while pages <= limit:
                k = pages.bit_length() - 1
                groups = [(k, count) for count in _pow2_upto(max_runs) if count * pages <= limit]
                for key in (self._run_key(pages, True), self._run_key(pages, False),
                            *self._staged(progs, pages, groups, True), *self._staged(progs, pages, groups, False)):
                    todo[(progs.fmt.allocator, key)] = progs
                pages *= 2
            for key in ((Program.READ_ROWS, 0), (Program.WRITE_ROWS, 0)):
                todo[(progs.fmt.allocator, key)] = progs
        for (_, key), progs in todo.items():
            progs.compiled(*key)
        for runs in self._warm_plans(max_pages):
            for backup in (True, False):
                self._plan_programs.compiled(backup, tuple((a, *self._run_key(n, backup)[1:]) for a, n in runs))
        return sum(len(p.jaxprs) for p in self._programs.values()) + len(self._plan_programs.jaxprs)

    def _warm_plans(self, max_pages: int | None) -> list[tuple[tuple[str, int], ...]]:
        """Whole-plan shapes `warmup` compiles when several allocators move bytes: the anchor's
        power-of-two chunk lengths, each with every power-of-two length of the other
        allocators up to the trailing window (what a prefix's load-back carries)."""
        if len(self._programs) < 2 or self.devices.mesh is not None:
            return []
        def lengths(a: str, cap: int) -> list[int]:
            limit = min(self._programs[a].chunk_pages, cap if max_pages is None else min(cap, max_pages))
            return [1 << k for k in range(limit.bit_length())]
        anchor = self.layout.anchor.name
        if anchor not in self._programs:
            return []
        window = chunking.next_pow2(max(1, self.layout.window_pages()))
        shapes = [()]
        for a in sorted(self._programs):
            sizes = lengths(a, MAX_CHUNK_PAGES if a == anchor else window)
            shapes = [s + ((a, n),) for s in shapes for n in sizes]
        return shapes

    # -- host tier access (L3 storage, tests) ----------------------------------------------------
    def read_host_rows(self, allocator: str, host_pages) -> np.ndarray:
        """A copy of host rows `host_pages` of `allocator`: `[n, row_elems]` in the packed row
        format (`self.host.formats[allocator]`, all ranks). Blocks."""
        progs, pages = self._allocator(allocator), self._host_pages(allocator, host_pages)
        out = np.empty((pages.size, progs.fmt.row_elems), progs.dtype)
        for offset, start, log2 in _pieces(pages):
            rows = progs.compiled(Program.READ_ROWS, log2)(self.host.buffers[allocator], np.array([start], np.int32))
            out[offset:offset + (1 << log2)] = np.asarray(rows)
        return out

    def write_host_rows(self, allocator: str, host_pages, rows: np.ndarray) -> None:
        """Overwrite host rows `host_pages` of `allocator` with `rows` (`[n, row_elems]`, packed)."""
        progs, pages = self._allocator(allocator), self._host_pages(allocator, host_pages)
        rows = np.asarray(rows)
        if rows.shape != (pages.size, progs.fmt.row_elems) or rows.dtype != progs.dtype:
            raise ValueError(f"rows for {pages.size} host pages of {allocator!r} must be "
                             f"{progs.dtype}[{pages.size}, {progs.fmt.row_elems}], got {rows.dtype}{list(rows.shape)}")
        for offset, start, log2 in _pieces(pages):
            block = jax.device_put(rows[offset:offset + (1 << log2)], progs.staging_sharding)
            self.host.buffers[allocator] = progs.compiled(Program.WRITE_ROWS, log2)(
                self.host.buffers[allocator], block, np.array([start], np.int32))

    def read_host_page(self, allocator: str, host_page: int) -> dict[str, np.ndarray]:
        """`{pool: [num_layers, *page_shape]}` of one host page, whole pages (all ranks). Blocks."""
        return self._allocator(allocator).fmt.decode(self.read_host_rows(allocator, [host_page])[0])

    def write_host_page(self, allocator: str, host_page: int, pages: Mapping[str, np.ndarray]) -> None:
        """Overwrite one host page with `{pool: [num_layers, *page_shape]}` (whole pages)."""
        self.write_host_rows(allocator, [host_page], self._allocator(allocator).fmt.encode(pages)[None])

    # -- introspection ------------------------------------------------------------------------
    def chunk_pages(self, allocator: str) -> int:
        """Pages per chunk (staging rows) of `allocator`."""
        return self._allocator(allocator).chunk_pages

    def program_jaxprs(self) -> dict[str, object]:
        """Jaxprs of every program compiled so far, by label (for the host-compute check)."""
        return {**{k: v for p in self._programs.values() for k, v in p.jaxprs.items()}, **self._plan_programs.jaxprs}

    def compiled_programs(self) -> dict[str, jax.stages.Compiled]:
        """Every program compiled so far, by label (e.g. to inspect its HLO)."""
        return {**{f"{a}:{key}": c for a, p in self._programs.items() for key, c in p._cache.items()},
                **self._plan_programs.labelled()}

    # -- internals -------------------------------------------------------------------------
    def _fused(self, progs: AllocatorPrograms, part: chunking.Chunk, backup: bool) -> bool:
        return part.whole_run_host_start is not None and (backup or not progs.broadcast_load)

    def _compile(self, progs: AllocatorPrograms, part: chunking.Chunk, backup: bool) -> None:
        pages = part.padded_pages
        if self._fused(progs, part, backup):
            progs.compiled(*self._run_key(pages, backup))
            return
        for key in self._staged(progs, pages, [(g.log2_rows, len(g.staging_rows)) for g in part.groups], backup):
            progs.compiled(*key)

    def _run_key(self, pages: int, backup: bool) -> tuple:
        """Program key of a fused chunk of `pages` pages (one whole host run)."""
        return (Program.BACKUP_RUN if backup else Program.LOAD_RUN, pages, min(self._parts, pages))

    @staticmethod
    def _staged(progs: AllocatorPrograms, pages: int, groups: list[tuple[int, int]], backup: bool) -> list[tuple]:
        """Program keys of a staging-path chunk padded to `pages`, piece groups `(log2 rows, count)`."""
        if backup:
            return [(Program.PACK, pages), *((Program.D2H, *g) for g in groups)]
        return [*((Program.H2D, *g) for g in groups), *([(Program.TAKE, pages)] if progs.broadcast_load else []),
                (Program.UNPACK, pages)]

    def _whole_plan(self, work, backup: bool) -> tuple[tuple[str, int, int], ...] | None:
        """The `PlanPrograms` key when every allocator of a multi-allocator plan moves as one
        whole-run chunk on a single device (one dispatch for the whole plan), else None."""
        if len(work) < 2 or self.devices.mesh is not None:
            return None
        if any(len(parts) != 1 or not self._fused(progs, parts[0], backup) for progs, parts in work):
            return None
        return tuple((progs.fmt.allocator, *self._run_key(parts[0].padded_pages, backup)[1:]) for progs, parts in work)

    def _move_plan(self, whole, work, backup: bool, pools: dict[str, jax.Array]) -> jax.Array:
        """Dispatch a whole plan as one program (see `_whole_plan`); updates `pools` on load."""
        names = [[s.name for s in progs.fmt.pools] for progs, _ in work]
        hosts = tuple(self.host.buffers[progs.fmt.allocator] for progs, _ in work)
        arrays = tuple(tuple(pools[n] for n in ns) for ns in names)
        where = np.concatenate([_where(parts[0], parts[0].whole_run_host_start) for _, parts in work])
        program = self._plan_programs.compiled(backup, whole)
        if backup:
            new, token = program(hosts, arrays, where)
            for (progs, _), host in zip(work, new):
                self.host.buffers[progs.fmt.allocator] = host
        else:
            new, token = program(arrays, hosts, where)
            for ns, arrs in zip(names, new):
                pools.update(zip(ns, arrs))
        return token

    def _backup(self, progs: AllocatorPrograms, parts, pools) -> jax.Array:
        a = progs.fmt.allocator
        args = [pools[s.name] for s in progs.fmt.pools]
        if progs.on_mesh and not progs.sharded:  # the first device's shard is the whole pool
            args = [shard_on(x, self.devices.device) for x in args]
        args = tuple(args)
        token = None
        for part in parts:
            pages = part.padded_pages
            start = part.whole_run_host_start
            if start is not None:
                run = progs.compiled(*self._run_key(pages, True))
                self.host.buffers[a], token = run(self.host.buffers[a], args, _where(part, start))
                continue
            self._staging[a] = progs.compiled(Program.PACK, pages)(args, part.device_pages, self._staging_buffer(progs))
            for g in part.groups:
                d2h = progs.compiled(Program.D2H, g.log2_rows, len(g.staging_rows))
                self.host.buffers[a], token = d2h(self.host.buffers[a], self._staging[a], g.staging_rows, g.host_rows)
        return token

    def _load(self, progs: AllocatorPrograms, parts, out: dict[str, jax.Array]) -> jax.Array:
        a = progs.fmt.allocator
        names = [s.name for s in progs.fmt.pools]
        token = None
        for part in parts:
            pages = part.padded_pages
            pools = tuple(out[n] for n in names)
            if self._fused(progs, part, False):
                run = progs.compiled(*self._run_key(pages, False))
                new, token = run(pools, self.host.buffers[a], _where(part, part.whole_run_host_start))
                out.update(zip(names, new))
                continue
            for g in part.groups:
                h2d = progs.compiled(Program.H2D, g.log2_rows, len(g.staging_rows))
                self._staging[a] = h2d(self._staging_buffer(progs), self.host.buffers[a], g.host_rows, g.staging_rows)
            rows = self._staging[a]
            if progs.broadcast_load:  # every rank unpacks its own copy of this chunk's rows
                rows = jax.device_put(progs.compiled(Program.TAKE, pages)(rows), self.devices.replicated())
            new, token = progs.compiled(Program.UNPACK, pages)(pools, rows, part.device_pages)
            out.update(zip(names, new))
        return token

    def _staging_buffer(self, progs: AllocatorPrograms) -> jax.Array:
        a = progs.fmt.allocator
        if a not in self._staging:
            shape = (progs.chunk_pages, progs.fmt.row_elems)
            self._staging[a] = jax.jit(lambda: jnp.zeros(shape, progs.dtype), out_shardings=progs.staging_sharding)()
        return self._staging[a]

    def _allocator(self, allocator: str) -> AllocatorPrograms:
        if allocator not in self._programs:
            raise ValueError(f"allocator {allocator!r} has no host pool here (allocators with bytes: {sorted(self._programs)})")
        return self._programs[allocator]

    def _host_pages(self, allocator: str, host_pages) -> np.ndarray:
        pages = np.asarray(host_pages)
        limit = self.host.pages[allocator]
        if (pages.ndim != 1 or not (np.issubdtype(pages.dtype, np.integer) or pages.size == 0)
                or pages.dtype == np.bool_ or (pages.size and (pages.min() < 0 or pages.max() >= limit))):
            raise ValueError(f"host pages {np.asarray(host_pages).tolist()!r} of {allocator!r}: integers outside "
                             f"0..{limit - 1}")
        return pages.astype(np.int64)


def _pieces(pages: np.ndarray) -> list[tuple[int, int, int]]:
    """(offset in `pages`, first host page, log2 length) of the runs of consecutive pages,
    each cut into power-of-two pieces, largest first (programs come in log2 shapes)."""
    out, i = [], 0
    while i < pages.size:
        j = i + 1
        while j < pages.size and pages[j] == pages[j - 1] + 1:
            j += 1
        offset = i
        while offset < j:
            log2 = (j - offset).bit_length() - 1
            out.append((offset, int(pages[offset]), log2))
            offset += 1 << log2
        i = j
    return out


def _where(part: chunking.Chunk, host_start: int) -> np.ndarray:
    """A fused program's index argument: the chunk's device pages, then its first host page."""
    where = np.empty(part.padded_pages + 1, np.int32)
    where[:-1] = part.device_pages
    where[-1] = host_start
    return where


def _resolve_kernels(kernels: str, device: jax.Device, layout: PoolLayout) -> str:
    """The implementation name the programs use (never "auto")."""
    if kernels not in pk.IMPLS:
        raise ValueError(f"kernels must be one of {', '.join(pk.IMPLS)}; got {kernels!r}")
    backend, _ = pk.resolve(kernels, device)
    chosen = backend if kernels == "auto" else kernels
    granule = pk.GRANULE_BYTES.get(backend)
    odd = sorted(p.name for p in layout.pools if granule and p.page_bytes % granule)
    if odd and kernels == "auto":
        log.info("page kernels: reference (pools %s have pages that are not multiples of %d B)", odd, granule)
        return "reference"
    if odd:
        raise ValueError(f"kernels={kernels!r} move multiples of {granule} B; pools {odd} have other page sizes")
    return chosen


def _pow2_upto(n: int) -> list[int]:
    return [1 << i for i in range(n.bit_length())]


def _floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0
