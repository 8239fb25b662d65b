"""`PlanPrograms`: one program that moves a whole plan whose allocators each move as one chunk.

A load-back of a prefix's kv pages and its window's SWA pages, or the pack of a backup batch,
then costs one dispatch instead of one per allocator (one device, no mesh).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from hicache_jax.transfer.compile_cache import shared_program
from hicache_jax.transfer.programs import AllocatorPrograms, Program


class PlanPrograms:
    """Programs moving several allocators' one-chunk batches at once (one device, no mesh).

    `compiled(backup, runs)` with `runs` in plan order is one jit over every allocator's
    `pack` (backup, `runs = ((allocator, pages), ...)`: arguments the allocators' pools
    tuples and the device pages (`plan_index`); results their packed rows) or `load_block`
    (load, `runs = ((allocator, pages, on device), ...)`: arguments the pools tuples, the
    blocks or their device copies, and the device pages).
    """

    def __init__(self, programs: dict[str, AllocatorPrograms]):
        self._programs = programs
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

    def labelled(self) -> dict[str, jax.stages.Compiled]:
        """Every plan program compiled so far, by label."""
        return {self._labels[key]: program for key, program in self._cache.items()}


def plan_index(indices: list[np.ndarray], one_page: Callable) -> tuple:
    """A plan program's index argument from each allocator's page index (plan order): every
    one-page allocator's own `one_page(index)` (a kept device array: `ResidentIndices`), then
    the other allocators' indices concatenated (one copy to the device for all of them)."""
    rest = [i for i in indices if i.shape != (1,)]
    return tuple(one_page(i) for i in indices if i.shape == (1,)) + ((np.concatenate(rest),) if rest else ())


def split_plan_index(sizes: list[int], idx: tuple) -> list:
    """Each allocator's page index (`sizes[k]` pages) from a `plan_index` argument."""
    ones = iter(idx)                 # the one-page allocators' own arrays come first, in order
    out, lo = [], 0
    for n in sizes:
        if n == 1:
            out.append(next(ones))
        else:                        # the rest are consecutive slices of the last argument
            out.append(idx[-1][lo:lo + n])
            lo += n
    return out


