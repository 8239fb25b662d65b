"""`ChunkDispatch`: runs the programs that move a transfer's chunks, and hands backups' rows to the host.

The engine decides how a plan moves (chunks, whole blocks, pieces, one plan program); this
calls the programs in that order and keeps what they share: the allocators' programs, the
host tier's block tables, the one-element indices kept on the device, and one staging
buffer per allocator for rows gathered from several blocks.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hicache_jax.pools import Devices, HostTier, shard_on
from hicache_jax.transfer import chunks as chunking
from hicache_jax.transfer.moves import EarlyCopy, Pieces, WholeBlock
from hicache_jax.transfer.index_layout import plan_index
from hicache_jax.transfer.plan_programs import PlanPrograms, fused_index, fused_sources
from hicache_jax.transfer.programs import AllocatorPrograms, Program
from hicache_jax.transfer.resident import ResidentIndices


def backup_keys(part: chunking.Chunk) -> list[tuple]:
    """Program keys a backup chunk needs (`ChunkDispatch._packed`): a pack for a chunk that is
    one whole host run, else a pack that cuts its pieces, and a slice for each size it has
    more than one piece of."""
    pages = part.padded_pages
    if part.whole_run_host_start is not None:
        return [(Program.PACK, pages)]
    return [(Program.PACK_CUT, pages), *((Program.SLICE, pages, g.log2_rows) for g in part.groups if g.num_real > 1)]


class ChunkDispatch:
    def __init__(self, programs: dict[str, AllocatorPrograms], plan_programs: PlanPrograms, host: HostTier,
                 ints: ResidentIndices, devices: Devices):
        self._programs, self._plan_programs, self.host = programs, plan_programs, host
        self._ints, self.devices = ints, devices
        self._staging: dict[str, tuple[jax.Array, ...]] = {}

    def load_plan(self, program, key, blocks, pages, pools: dict[str, jax.Array]) -> list[jax.Array]:
        """Call a whole load's plan program (`WholePlans.load`); updates `pools`."""
        names = [[s.name for s in self._programs[a].fmt.pools] for a, *_ in key]
        new, token = program(tuple(tuple(pools[n] for n in ns) for ns in names), blocks,
                             plan_index(pages, self._ints.index))
        for ns, arrays in zip(names, new):
            pools.update(zip(ns, arrays))
        return [token]

    def fused_load(self, program, work, moves, pools: dict[str, jax.Array]) -> list[jax.Array]:
        """Call a load's fused program (`PlanPrograms.ready_load`); updates `pools`."""
        names = [[s.name for s in progs.fmt.pools] for progs, _ in work]
        sources, starts = fused_sources(moves)
        new, token = program(tuple(tuple(pools[n] for n in ns) for ns in names), sources,
                             self._ints.index(starts), plan_index(fused_index(work, moves), self._ints.index))
        for ns, arrays in zip(names, new):
            pools.update(zip(ns, arrays))
        return [token]

    def backup_plan(self, key, work, pools) -> list[jax.Array]:
        """Dispatch a whole backup as one program (`WholePlans.backup_key`: each allocator's
        chunk is one whole host run, so its packed rows are its one block)."""
        arrays = tuple(tuple(pools[s.name] for s in progs.fmt.pools) for progs, _ in work)
        rows = self._plan_programs.compiled(True, key)(arrays, plan_index([parts[0].device_pages for _, parts in work],
                                                                          self._ints.index))
        return self._store([(progs, parts[0].whole_run_host_start, r) for (progs, parts), r in zip(work, rows)])

    def backup(self, progs: AllocatorPrograms, parts, pools) -> list[jax.Array]:
        args = [pools[s.name] for s in progs.fmt.pools]
        if progs.on_mesh and not progs.sharded:  # the first device's shard is the whole pool
            args = [shard_on(x, self.devices.device) for x in args]
        args = tuple(args)
        return self._store([piece for part in parts for piece in self._packed(progs, part, args)])

    def _store(self, pieces: list[tuple[AllocatorPrograms, int, tuple]]) -> list[jax.Array]:
        """Hand a backup's host pieces (programs, first host page, rows on the device) to the
        host: one block per piece, all of them by one `jax.device_put` (one call, whatever the pieces)."""
        blocks = jax.device_put([rows for _, _, rows in pieces], [progs.host_sharding for progs, _, _ in pieces])
        for (progs, start, _), block in zip(pieces, blocks):   # `start` released these pages
            self.host.tables[progs.fmt.allocator].add(start, block)
        return jax.tree.leaves(blocks)

    def _packed(self, progs: AllocatorPrograms, part: chunking.Chunk, args: tuple) -> list[tuple]:
        """(programs, first host page, rows on the device) of each host piece of a backup
        chunk. A chunk that is one whole host run is one `pack`, its rows one block; any other
        chunk is one `pack_cut`, which packs the rows and cuts the first piece of each size
        in the same program (a run of n pages: the pieces of n's binary digits, all of them),
        and a `slice` call for each further piece of a size already cut."""
        S = part.padded_pages
        if (start := part.whole_run_host_start) is not None:
            return [(progs, start, progs.compiled(Program.PACK, S)(args, self._ints.index(part.device_pages)))]
        rows, cut = progs.compiled(Program.PACK_CUT, S)(args, part.cut_index())
        pieces = [(progs, int(g.host_rows[0]), cut[g.log2_rows]) for g in part.groups]
        return pieces + [(progs, int(g.host_rows[i]), progs.compiled(Program.SLICE, S, g.log2_rows)(
            rows, self._ints.one(g.staging_rows[i]))) for g in part.groups for i in range(1, g.num_real)]

    def load(self, progs: AllocatorPrograms, parts, chunk_moves, out: dict[str, jax.Array]) -> list[jax.Array]:
        names = [s.name for s in progs.fmt.pools]
        tokens = []
        for part, move in zip(parts, chunk_moves):
            pools = tuple(out[n] for n in names)
            match move:
                case WholeBlock(block) | EarlyCopy(block):
                    load = progs.compiled(Program.LOAD_BLOCK, part.padded_pages, int(isinstance(move, EarlyCopy)))
                    new, token = load(pools, block, self._ints.index(part.device_pages))
                case Pieces():
                    a = progs.fmt.allocator
                    for key, group in move.calls:
                        staging, copy = self.staging_buffer(progs), progs.compiled(*key)
                        if key[0] is Program.H2D_MANY:
                            self._staging[a] = copy(staging, tuple(p.block for p in group),
                                                    tuple(self._ints.one(p.staging_row) for p in group))
                        else:
                            p = group[0]
                            self._staging[a] = copy(staging, p.block, self._ints.one(p.row),
                                                    self._ints.one(p.staging_row))
                    rows = self._staging[a]
                    if progs.broadcast_load:  # every rank unpacks its own copy of this chunk's rows
                        rows = jax.device_put(progs.compiled(Program.TAKE, part.padded_pages)(rows),
                                              self.devices.replicated())
                    unpack = progs.compiled(Program.UNPACK, part.padded_pages)
                    new, token = unpack(pools, rows, self._ints.index(part.device_pages))
            out.update(zip(names, new))
            tokens.append(token)
        return tokens

    @property
    def ints(self) -> ResidentIndices:
        return self._ints

    def set_staging(self, progs: AllocatorPrograms, staging: tuple[jax.Array, ...]) -> None:
        """Keep `staging` (a program's output over the donated buffer) as `progs`' staging buffer."""
        self._staging[progs.fmt.allocator] = staging

    def staging_buffer(self, progs: AllocatorPrograms) -> jax.Array:
        a = progs.fmt.allocator
        if a not in self._staging:
            shapes = [(progs.chunk_pages, progs.fmt.part_elems(p)) for p in range(progs.num_parts)]
            self._staging[a] = jax.jit(lambda: tuple(jnp.zeros(s, progs.dtype) for s in shapes),
                                       out_shardings=(progs.staging_sharding,) * len(shapes))()
        return self._staging[a]

