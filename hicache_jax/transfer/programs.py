"""The jitted programs that move one allocator's pages, compiled once per static shape.

Host pages live in pinned *blocks* (`HostTier`); a block is a whole array, so a block
moved by itself is a DMA on the copy engines. Programs never write host memory: a backup
packs rows on the device and the engine hands them to `jax.device_put` (outside any jit,
so the copy runs beside the model's next step instead of in its stream):

Rows, blocks and the staging buffer are tuples of the row's stored parts (`RowFormat.parts`):

    backup:  pack(S)            pools (read), idx i32[S] -> rows [S, part_elems] per part (device)
             pack_cut(S)        pools (read), idx i32[S + log2 S] -> the rows, and a piece of each size
                                2**k < S starting at the row idx[S + k] names
             slice(S, k)        rows, start i32[1] -> rows[start : start + 2**k]
    load:    load_block(S, 0)   pools (donated), block [S, part_elems] per part, idx i32[S] -> pools, token
             load_block(S, 1)   the same from the block's device copy (an early `copy`)
             h2d(R, k)          staging (donated), block [R, ...], src i32[1], dst i32[1] -> staging
             h2d_many(k, m)     staging (donated), m whole blocks [2**k, ...], m dst i32[1] -> staging
             unpack(S)          pools (donated), staging, idx i32[S] -> pools, token
             take(S)            staging -> its first S rows (to broadcast them)
             load_pieces(S, P)  pools (donated), one block (or early device copy) per piece, starts i32[k],
                                idx (each piece's pages: `aligned_offsets`) -> pools, token (P: each piece's
                                block rows, log2 rows and whether it is a device copy, in staging order)
    read:    read(R, k)         block [R, ...], start i32[1] -> 2**k rows on the device
             copy(R)            block [R, ...] -> the whole block on the device (a DMA)
             copy_many(R, m)    m blocks [R, ...] -> each whole on the device (m DMAs, one dispatch)

`load_block` moves a chunk that is exactly one block (a prefix backed up as one run and
loaded back whole); a large block's copy (`copy`, early.py) may start before the plan is
checked, and the program unpacks the copy; any other chunk gathers its rows block by block
into the staging buffer (`h2d`, a DMA when the piece is its whole block; several whole
blocks of one size by one `h2d_many`) and unpacks them. A plan whose every allocator moves
as one chunk runs as ONE program on a single device (`PlanPrograms`). Index arguments (i32)
of one element are arrays kept on the device where they can be (`resident.py`).
Host values are only moved or sliced: every program's jaxpr is checked at compile time.
Replicated allocators on a mesh pack on the first device (whose shard is the whole pool)
and broadcast a load's rows to every rank, each unpacking its own copy (staging path).
"""
from __future__ import annotations

import enum
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import pallas_kernels as pk
from hicache_jax.pools import ROW_ALIGN_BYTES, TP_AXIS, Devices, RowFormat
from hicache_jax.transfer.compile_cache import ready_program, shared_program
from hicache_jax.transfer.index_layout import aligned_offsets, aligned_size

_DEVICE = jax.memory.Space.Device


class Program(enum.StrEnum):
    """The transfer programs of one allocator; each is compiled once per static shape key."""

    PACK = "pack"               # (pages,): pools -> packed rows on the device
    PACK_CUT = "pack_cut"       # (pages,): pack, and cut a piece of each power-of-two size below pages
    SLICE = "slice"             # (pages, log2 rows): a piece of packed rows
    LOAD_BLOCK = "load_block"   # (pages, on device): one whole block (or its device copy) -> pools
    H2D = "h2d"                 # (block rows, log2 rows[, on device]): rows of one block (or its copy) -> staging
    H2D_MANY = "h2d_many"       # (log2 rows, count[, on device]): that many whole blocks (or copies) -> staging
    UNPACK = "unpack"           # (pages,): scatter the staging rows into the pools
    TAKE = "take"               # (pages,): the first staging rows, to broadcast them
    READ = "read"               # (block rows, log2 rows): rows of one block to the device (L3, tests)
    COPY = "copy"               # (block rows,): a whole block to the device (an early copy), no index
    COPY_MANY = "copy_many"     # (block rows, count): that many whole blocks to the device (acquire_many's)
    LOAD_PIECES = "load_pieces"  # (pages, ((block rows, log2 rows), ...)): pieces of blocks -> pools, no staging


class AllocatorPrograms:
    """Compiled programs of one allocator; `compiled(name, *shape_key)` caches by shape.

    `host_example(rows)` gives a pinned block of `rows` rows to trace with (an abstract
    stand-in does not carry its memory space into the jaxpr).
    """

    def __init__(self, fmt: RowFormat, pool_shapes: list[tuple[int, ...]], devices: Devices,
                 host_example: Callable[[int], jax.Array], host_sharding: jax.sharding.Sharding, chunk_pages: int,
                 impl: str, block_bytes: int):
        self.fmt, self.devices = fmt, devices
        self.pool_shapes = pool_shapes
        self._host_example = host_example
        self.chunk_pages = chunk_pages
        self.on_mesh = devices.mesh is not None
        self.sharded = fmt.sharded
        self.dtype = jnp.dtype(fmt.dtype)
        self.staging_sharding = devices.row_sharding(self.sharded)
        self.num_parts = len(fmt.parts)
        self.host_sharding = host_sharding
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
        self.hook: Callable | None = None   # instrumentation: `TransferEngine.on_program_call`
        self._identity = (fmt, tuple(map(tuple, pool_shapes)), devices.mesh, devices.device, impl, block_bytes,
                          chunk_pages)

    # Equal for equal formats, shapes, devices and kernels: a model step that lands a deferred
    # load (`Landing` holds these as static data) then traces and compiles once per process,
    # not once per engine.
    def __eq__(self, other) -> bool:
        return isinstance(other, AllocatorPrograms) and self._identity == other._identity

    def __hash__(self) -> int:
        return hash(self._identity)

    def compiled(self, name: Program, *key: int, background: bool = False) -> jax.stages.Compiled | None:
        """The compiled program `name` for static shape `key`, compiling it on first use; with
        `background` (a program of too many shapes to compile ahead: `copy_many`), None until
        it is compiled, its compilation started on the background thread.
        Raises RuntimeError (a bug) if the program would compute on a host-memory value."""
        full = (Program(name), *key)
        label = lambda: f"{self.fmt.allocator}:{full[0]}{list(key)}"   # built only off the hot path
        program = self._cache.get(full)
        if program is None:
            make = ready_program if background else shared_program
            if (program := make((self._identity, full), label(), self.jaxprs, lambda: self.build(*full))) is None:
                return None
            self._cache[full] = program
        return program if self.hook is None else functools.partial(self.hook, label(), program)

    def build(self, name: Program, *key: int) -> tuple:
        """(fn, example args, donate_argnums, out shardings) of program `name` at shape `key`."""
        return _BUILDERS[Program(name)](self, *key)

    # -- pack / unpack, placed ---------------------------------------------------------------
    def _gather_rows(self, pools, idx):
        """The packed rows of pages `idx`, one array per stored part."""
        parts = range(self.num_parts)
        gather = lambda srcs, i: tuple(self._gather(srcs, i, layers=self.fmt.kernel_layers(p)) for p in parts)
        if not self.sharded:
            return gather(pools, idx)
        body = lambda *a: gather(a[:-1], a[-1])
        return jax.shard_map(body, mesh=self.devices.mesh, in_specs=(*self.pool_specs, P()),
                             out_specs=tuple(P(None, TP_AXIS) for _ in parts), check_vma=False)(*pools, idx)

    def _scatter_rows(self, pools, rows, idx):
        """`pools` with every part of `rows` written to pages `idx`."""
        for part, part_rows in enumerate(rows):
            pools = self.scatter_part(pools, part_rows, idx, part)
        return pools

    def scatter_part(self, pools, rows, idx, part: int):
        """`pools` (this allocator's, in format order) with stored part `part` of `rows`
        written to pages `idx`: the layers of one group. Traceable inside any jit."""
        scatter = lambda srcs, r, i: tuple(self._scatter(srcs, r, i, layers=self.fmt.kernel_layers(part)))
        if not self.on_mesh:
            return scatter(pools, rows, idx)
        rows_spec = P(None, TP_AXIS) if self.sharded else P()
        body = lambda *a: scatter(a[:-2], a[-2], a[-1])
        return tuple(jax.shard_map(body, mesh=self.devices.mesh, in_specs=(*self.pool_specs, rows_spec, P()),
                                   out_specs=tuple(self.pool_specs), check_vma=False)(*pools, rows, idx))

    # -- program builders: (fn, example args, donate_argnums, out_shardings) ------------------
    def _spec(self, shape, sharding, dtype=None):
        return jax.ShapeDtypeStruct(shape, dtype or self.dtype, sharding=sharding)

    def _staging_spec(self, rows=None, sharding=None):
        return tuple(self._spec((rows or self.chunk_pages, self.fmt.part_elems(p)), sharding or self.staging_sharding)
                     for p in range(self.num_parts))

    def _index(self, n, sharding=None):
        return self._spec((n,), sharding or self.home, jnp.int32)

    def _pools(self, shardings):
        return tuple(self._spec(s, sh) for s, sh in zip(self.pool_shapes, shardings))

    def _pack(self, pages: int):
        def pack(pools, idx):
            return self._gather_rows(pools, idx)
        return pack, (self._pools(self.read_shardings), self._index(pages)), (), self._staged()

    def _staged(self):
        """Out shardings of rows on the device (one per part)."""
        return (self.staging_sharding,) * self.num_parts

    def _slice(self, pages: int, log2_rows: int):
        def piece(rows, start):
            return tuple(jax.lax.dynamic_slice_in_dim(r, start[0], 1 << log2_rows, 0) for r in rows)
        return piece, (self._staging_spec(pages), self._index(1)), (), self._staged()

    def _pack_cut(self, pages: int):
        count = pages.bit_length() - 1          # pieces of 1, 2, 4, ... pages / 2 rows

        def pack_cut(pools, idx):
            rows = self._gather_rows(pools, idx[:pages])
            return rows, tuple(tuple(jax.lax.dynamic_slice_in_dim(r, idx[pages + k], 1 << k, 0) for r in rows)
                               for k in range(count))
        outs = (self._staged(), (self._staged(),) * count)
        return pack_cut, (self._pools(self.read_shardings), self._index(pages + count)), (), outs

    def _load_block(self, pages: int, on_device: int):
        if self.broadcast_load:
            raise RuntimeError("bug: replicated pools on a mesh load through the staging path")

        def load_block(pools, block, idx):
            rows = block if on_device else tuple(jax.device_put(b, _DEVICE) for b in block)
            return self._scatter_rows(pools, rows, idx), idx[0] + 0

        block = self._staging_spec(pages) if on_device else self._host_example(pages)
        args = (self._pools(self.pool_shardings), block, self._index(pages))
        return load_block, args, (0,), (tuple(self.pool_shardings), self.home)

    def _load_pieces(self, pages: int, shape: tuple[tuple[int, int, bool], ...]):
        """A chunk gathered from pieces of host blocks in one program: each piece's rows come
        to the device (a DMA when the piece is its whole block, else a slice; nothing for an
        early copy) and are unpacked into the pools at its pages (`idx`, each piece's from its
        `aligned_offsets` place). Not joined first: on an H100, XLA joined byte rows at a seventh
        of the unpack kernel's rate (BENCHMARKS.md, "two joins of byte rows"). The unpack is
        one jit, so its kernel lowers once per piece size (about 0.25 s of Python each)."""
        if self.broadcast_load:
            raise RuntimeError("bug: replicated pools on a mesh load through the staging path")
        sizes = [1 << log2_rows for _, log2_rows, _ in shape]
        scatter = jax.jit(self._scatter_rows)

        def load_pieces(pools, blocks, starts, idx):
            for i, (block, (_, _, copied), n, lo) in enumerate(zip(blocks, shape, sizes, aligned_offsets(sizes))):
                pools = scatter(pools, block if copied else _block_rows(block, starts[i:i + 1], n), idx[lo:lo + n])
            return pools, idx[0] + 0

        blocks = tuple(self._staging_spec(rows) if copied else self._host_example(rows) for rows, _, copied in shape)
        args = (self._pools(self.pool_shardings), blocks, self._index(len(shape)), self._index(aligned_size(sizes)))
        return load_pieces, args, (0,), (tuple(self.pool_shardings), self.home)

    def _unpack(self, pages: int):
        rows = self._staging_spec(pages, self.devices.replicated()) if self.broadcast_load else self._staging_spec()
        index = self.devices.replicated()

        def unpack(pools, rows, idx):
            return self._scatter_rows(pools, rows, idx), idx[0] + 0

        args = (self._pools(self.pool_shardings), rows, self._index(pages, index))
        return unpack, args, (0,), (tuple(self.pool_shardings), index)

    def _take(self, pages: int):
        """The first `pages` staging rows as their own array (to broadcast them)."""
        return (lambda staging: tuple(s[:pages] for s in staging)), (self._staging_spec(),), (), self._staged()

    def _h2d(self, block_rows: int, log2_rows: int, copied: int = 0):
        size = 1 << log2_rows
        block = self._staging_spec(block_rows) if copied else self._host_example(block_rows)

        def h2d(staging, block, src, dst):
            return tuple(jax.lax.dynamic_update_slice_in_dim(s, r, dst[0], 0)
                         for s, r in zip(staging, _block_rows(block, src, size)))

        args = (self._staging_spec(), block, self._index(1), self._index(1))
        return h2d, args, (0,), self._staged()

    def _h2d_many(self, log2_rows: int, count: int, copied: int = 0):
        size = 1 << log2_rows
        block = self._staging_spec(size) if copied else self._host_example(size)

        def h2d_many(staging, blocks, dsts):
            for block, dst in zip(blocks, dsts):
                staging = tuple(jax.lax.dynamic_update_slice_in_dim(s, jax.device_put(b, _DEVICE), dst[0], 0)
                                for s, b in zip(staging, block))
            return staging

        args = (self._staging_spec(), (block,) * count, tuple(self._index(1) for _ in range(count)))
        return h2d_many, args, (0,), self._staged()

    def _read(self, block_rows: int, log2_rows: int):
        size = 1 << log2_rows

        def read(block, start):
            return _block_rows(block, start, size)
        return read, (self._host_example(block_rows), self._index(1)), (), self._staged()

    def _copy(self, block_rows: int):
        def copy(block):
            return tuple(jax.device_put(b, _DEVICE) for b in block)
        return copy, (self._host_example(block_rows),), (), self._staged()

    def _copy_many(self, block_rows: int, count: int):
        copy, (block,), _, outs = self._copy(block_rows)
        return (lambda blocks: tuple(map(copy, blocks))), ((block,) * count,), (), (outs,) * count


def _block_rows(block, start, size: int):
    """`size` rows of a host block (every part) from `start[0]`, on the device: the whole
    block by DMA when it is that size, else a slice of it."""
    return tuple(jax.device_put(b if size == b.shape[0] else jax.lax.dynamic_slice_in_dim(b, start[0], size, 0),
                                _DEVICE) for b in block)


_BUILDERS = {p: getattr(AllocatorPrograms, f"_{p.value}") for p in Program}   # each program's builder
