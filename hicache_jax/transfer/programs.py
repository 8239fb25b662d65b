"""The jitted programs that move one allocator's pages, compiled once per static shape.

A chunk whose host side is ONE run of exactly S pages (S a power of two) moves in one
program, split into `parts` sub-batches so that XLA can overlap one part's DMA with the
next part's pack (backup) or unpack (load):

    backup_run(S, parts)  host (donated), pools (read), where i32[S+1] -> host, token
    load_run(S, parts)    pools (donated), host, where i32[S+1]         -> pools, token

`where` is the chunk's device pages followed by its first host page: one small array, so
one host-to-device copy ahead of the program instead of two.

Any other chunk (several runs, or a length that is not a power of two) goes through the
engine's persistent staging buffer `[chunk_pages, row_elems]`, one program per step:

    backup:  pack(S)        pools (read), idx i32[S], staging (donated) -> staging
             d2h(k, T) x G  host (donated), staging, src i32[T], dst i32[T] -> host, token
    load:    h2d(k, T) x G  staging (donated), host, src i32[T], dst i32[T] -> staging
             unpack(S)      pools (donated), staging, idx i32[S] -> pools, token

A plan whose every allocator moves as one such chunk (a prefix's kv pages and its window's
SWA pages, say) runs as ONE program on a single device: `PlanPrograms` traces each
allocator's run program into a single jit with one concatenated `where`, so a load-back
or a backup batch costs one dispatch and one index copy whatever the allocators.

Host values are only sliced, moved and updated in place: every program's jaxpr is checked
at compile time. Replicated allocators on a mesh pack on the first device (whose shard is
the whole pool) and, on load, broadcast the chunk's rows to every rank before each rank
unpacks its own copy (so they always take the staging path on load).
"""
from __future__ import annotations

import enum
import functools
import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import pallas_kernels as pk
from hicache_jax.pools import HOST_MEMORY, ROW_ALIGN_BYTES, TP_AXIS, Devices, HostRowFormat
from hicache_jax.transfer.host_check import host_compute_violations

_HOST, _DEVICE = jax.memory.Space.Host, jax.memory.Space.Device


class Program(enum.StrEnum):
    """The transfer programs of one allocator; each is compiled once per static shape key."""

    BACKUP_RUN = "backup_run"   # (pages, parts): one whole host run, pack + copy to host
    LOAD_RUN = "load_run"       # (pages, parts): one whole host run, copy to device + unpack
    PACK = "pack"               # (pages,): gather into the staging buffer
    UNPACK = "unpack"           # (pages,): scatter the staging rows into the pools
    TAKE = "take"               # (pages,): the first staging rows, to broadcast them
    D2H = "d2h"                 # (log2 rows, pieces): staging -> host pieces
    H2D = "h2d"                 # (log2 rows, pieces): host pieces -> staging
    READ_ROWS = "read_rows"     # (log2 rows,): host rows read back (L3, tests)
    WRITE_ROWS = "write_rows"   # (log2 rows,): host rows overwritten (L3, tests)


class AllocatorPrograms:
    """Compiled programs of one allocator; `compiled(name, *shape_key)` caches by shape."""

    def __init__(self, fmt: HostRowFormat, pool_shapes: list[tuple[int, ...]], devices: Devices,
                 host_buffer: Callable[[], jax.Array], chunk_pages: int, impl: str, block_bytes: int):
        self.fmt, self.devices = fmt, devices
        self.pool_shapes = pool_shapes
        # Programs are traced with the live host buffer as the example argument: an abstract
        # stand-in does not carry its memory space on every JAX version.
        self._host_buffer = host_buffer
        self.chunk_pages = chunk_pages
        self.on_mesh = devices.mesh is not None
        self.sharded = fmt.sharded
        self.dtype = jnp.dtype(fmt.dtype)
        self.staging_sharding = devices.row_sharding(self.sharded)
        self.host_sharding = devices.row_sharding(self.sharded, HOST_MEMORY)
        # Programs touching host rows run where the rows live: the mesh for sharded rows,
        # else one device; pools are read there too (the first device's shard when replicated).
        self.home = devices.replicated() if self.sharded else devices.row_sharding(False)
        self.pool_shardings = [devices.pool_sharding(s) for s in fmt.pools]
        self.pool_specs = [devices.pool_spec(s) for s in fmt.pools]
        self.read_shardings = self.pool_shardings if self.sharded else [self.home] * len(fmt.pools)
        # Loads of replicated pools on a mesh unpack on every rank from broadcast rows.
        self.broadcast_load = self.on_mesh and not self.sharded
        self._gather = functools.partial(pk.gather_pages, impl=impl, block_bytes=block_bytes,
                                         align_bytes=ROW_ALIGN_BYTES)
        self._scatter = functools.partial(pk.scatter_pages, impl=impl, block_bytes=block_bytes,
                                          align_bytes=ROW_ALIGN_BYTES)
        self._cache: dict[tuple, jax.stages.Compiled] = {}
        self.jaxprs: dict[str, object] = {}

    def compiled(self, name: Program, *key: int) -> jax.stages.Compiled:
        """The compiled program `name` for static shape `key`, compiling it on first use.

        Raises RuntimeError (a bug) if the program would compute on a host-memory value.
        """
        name = Program(name)
        full = (name, *key)
        program = self._cache.get(full)
        if program is None:
            fn, args, donate, outs = _BUILDERS[name](self, *key)
            program = self._cache[full] = _compile(fn, args, donate, outs, f"{self.fmt.allocator}:{name}{list(key)}",
                                                   self.jaxprs)
        return program

    # -- pack / unpack, placed ---------------------------------------------------------------
    def _gather_rows(self, pools, idx, into=None):
        if not self.sharded:
            return self._gather(pools, idx, into=into)
        extra = () if into is None else (into,)
        specs = (*self.pool_specs, P()) + ((P(None, TP_AXIS),) if into is not None else ())
        body = lambda *a: self._gather(a[:len(pools)], a[len(pools)], into=a[-1] if into is not None else None)
        return jax.shard_map(body, mesh=self.devices.mesh, in_specs=specs, out_specs=P(None, TP_AXIS),
                             check_vma=False)(*pools, idx, *extra)

    def _scatter_rows(self, pools, rows, idx):
        if not self.on_mesh:
            return tuple(self._scatter(pools, rows, idx))
        rows_spec = P(None, TP_AXIS) if self.sharded else P()
        body = lambda *a: tuple(self._scatter(a[:-2], a[-2], a[-1]))
        return tuple(jax.shard_map(body, mesh=self.devices.mesh, in_specs=(*self.pool_specs, rows_spec, P()),
                                   out_specs=tuple(self.pool_specs), check_vma=False)(*pools, rows, idx))

    # -- program builders: (fn, example args, donate_argnums, out_shardings) ------------------
    def _spec(self, shape, sharding, dtype=None):
        return jax.ShapeDtypeStruct(shape, dtype or self.dtype, sharding=sharding)

    def _staging_spec(self, rows=None, sharding=None):
        return self._spec((rows or self.chunk_pages, self.fmt.row_elems), sharding or self.staging_sharding)

    def _index(self, n, sharding=None):
        return self._spec((n,), sharding or self.home, jnp.int32)

    def _pools(self, shardings):
        return tuple(self._spec(s, sh) for s, sh in zip(self.pool_shapes, shardings))

    def _backup_run(self, pages: int, parts: int):
        part = pages // parts

        def backup_run(host, pools, where):
            for p in range(parts):  # separate buffers per part: part p's DMA may overlap part p+1's pack
                rows = self._gather_rows(pools, where[p * part:(p + 1) * part])
                host = jax.lax.dynamic_update_slice_in_dim(host, jax.device_put(rows, _HOST), where[pages] + p * part, 0)
            return host, where[pages] + 0

        args = (self._host_buffer(), self._pools(self.read_shardings), self._index(pages + 1))
        return backup_run, args, (0,), (self.host_sharding, self.home)

    def _load_run(self, pages: int, parts: int):
        if self.broadcast_load:
            raise RuntimeError("bug: replicated pools on a mesh load through the staging path")
        part = pages // parts

        def load_run(pools, host, where):
            for p in range(parts):
                rows = jax.device_put(jax.lax.dynamic_slice_in_dim(host, where[pages] + p * part, part, 0), _DEVICE)
                pools = self._scatter_rows(pools, rows, where[p * part:(p + 1) * part])
            return pools, where[0] + 0

        args = (self._pools(self.pool_shardings), self._host_buffer(), self._index(pages + 1))
        return load_run, args, (0,), (tuple(self.pool_shardings), self.home)

    def _pack(self, pages: int):
        def pack(pools, idx, staging):
            return self._gather_rows(pools, idx, into=staging)
        args = (self._pools(self.read_shardings), self._index(pages), self._staging_spec())
        return pack, args, (2,), self.staging_sharding

    def _unpack(self, pages: int):
        rows = self._staging_spec(pages, self.devices.replicated()) if self.broadcast_load else self._staging_spec()
        index = self.devices.replicated()

        def unpack(pools, rows, idx):
            return self._scatter_rows(pools, rows, idx), idx[0] + 0

        args = (self._pools(self.pool_shardings), rows, self._index(pages, index))
        return unpack, args, (0,), (tuple(self.pool_shardings), index)

    def _take(self, pages: int):
        """The first `pages` staging rows as their own array (to broadcast them)."""
        return (lambda staging: staging[:pages]), (self._staging_spec(),), (), self.staging_sharding

    def _d2h(self, log2_rows: int, count: int):
        size = 1 << log2_rows

        def d2h(host, staging, src, dst):
            def one(t, host):
                rows = jax.lax.dynamic_slice_in_dim(staging, src[t], size, 0)
                return jax.lax.dynamic_update_slice_in_dim(host, jax.device_put(rows, _HOST), dst[t], 0)
            host = one(0, host) if count == 1 else jax.lax.fori_loop(0, count, one, host)
            return host, dst[0] + 0

        args = (self._host_buffer(), self._staging_spec(), self._index(count), self._index(count))
        return d2h, args, (0,), (self.host_sharding, self.home)

    def _h2d(self, log2_rows: int, count: int):
        size = 1 << log2_rows

        def h2d(staging, host, src, dst):
            def one(t, staging):
                rows = jax.device_put(jax.lax.dynamic_slice_in_dim(host, src[t], size, 0), _DEVICE)
                return jax.lax.dynamic_update_slice_in_dim(staging, rows, dst[t], 0)
            return one(0, staging) if count == 1 else jax.lax.fori_loop(0, count, one, staging)

        args = (self._staging_spec(), self._host_buffer(), self._index(count), self._index(count))
        return h2d, args, (0,), self.staging_sharding

    def _read_rows(self, log2_rows: int):
        """2**log2_rows host rows from `start[0]`, moved to the device (to read them back)."""
        def read_rows(host, start):
            return jax.device_put(jax.lax.dynamic_slice_in_dim(host, start[0], 1 << log2_rows, 0), _DEVICE)
        return read_rows, (self._host_buffer(), self._index(1)), (), self.staging_sharding

    def _write_rows(self, log2_rows: int):
        """Overwrite 2**log2_rows host rows from `start[0]` with rows given on the device."""
        def write_rows(host, rows, start):
            return jax.lax.dynamic_update_slice_in_dim(host, jax.device_put(rows, _HOST), start[0], 0)
        args = (self._host_buffer(), self._staging_spec(1 << log2_rows), self._index(1))
        return write_rows, args, (0,), self.host_sharding


class PlanPrograms:
    """Programs moving several allocators' whole-run chunks at once (one device, no mesh).

    `compiled(backup, runs)` with `runs = ((allocator, pages, parts), ...)` in plan order
    is one jit over every allocator's run program; its arguments are the allocators'
    (host buffer, pools) tuples and `where`, the allocators' `where` arrays concatenated.
    """

    def __init__(self, programs: dict[str, AllocatorPrograms]):
        self._programs = programs
        self._cache: dict[str, jax.stages.Compiled] = {}   # by label
        self.jaxprs: dict[str, object] = {}

    def compiled(self, backup: bool, runs: tuple[tuple[str, int, int], ...]) -> jax.stages.Compiled:
        name = Program.BACKUP_RUN if backup else Program.LOAD_RUN
        label = f"plan:{name}{list(runs)}"
        program = self._cache.get(label)
        if program is None:
            built = [_BUILDERS[name](self._programs[a], pages, parts) for a, pages, parts in runs]
            ends = list(itertools.accumulate(pages + 1 for _, pages, _ in runs))
            bounds = list(zip([0, *ends[:-1]], ends))
            fns = [fn for fn, *_ in built]

            def plan_run(moved, read, where):  # moved: donated (hosts or pools), read: the other side
                outs = [fn(m, r, where[lo:hi])
                        for fn, m, r, (lo, hi) in zip(fns, moved, read, bounds)]
                return tuple(o for o, _ in outs), outs[0][1]

            home = self._programs[runs[0][0]].home
            moved = tuple(args[0] for _, args, _, _ in built)
            read = tuple(args[1] for _, args, _, _ in built)
            index = jax.ShapeDtypeStruct((ends[-1],), jnp.int32, sharding=home)
            outs = (tuple(o for _, _, _, (o, _) in built), home)
            program = self._cache[label] = _compile(plan_run, (moved, read, index), (0,), outs, label, self.jaxprs)
        return program

    def labelled(self) -> dict[str, jax.stages.Compiled]:
        """Every plan program compiled so far, by label."""
        return dict(self._cache)


def _compile(fn, args, donate, outs, label: str, jaxprs: dict) -> jax.stages.Compiled:
    """`fn` jitted for `args` (example values carrying their shardings), its jaxpr kept in
    `jaxprs` under `label`; RuntimeError (a bug) if it would compute on host memory."""
    ins = tuple(jax.tree.map(lambda a: a.sharding, args))
    traced = jax.jit(fn, in_shardings=ins, out_shardings=outs, donate_argnums=donate).trace(*args)
    bad = host_compute_violations(traced.jaxpr)
    if bad:
        raise RuntimeError(f"bug: transfer program {label} computes on host memory: {bad}")
    jaxprs[label] = traced.jaxpr
    return traced.lower().compile()


_BUILDERS = {
    Program.BACKUP_RUN: AllocatorPrograms._backup_run, Program.LOAD_RUN: AllocatorPrograms._load_run,
    Program.PACK: AllocatorPrograms._pack, Program.UNPACK: AllocatorPrograms._unpack,
    Program.TAKE: AllocatorPrograms._take, Program.D2H: AllocatorPrograms._d2h, Program.H2D: AllocatorPrograms._h2d,
    Program.READ_ROWS: AllocatorPrograms._read_rows, Program.WRITE_ROWS: AllocatorPrograms._write_rows,
}
