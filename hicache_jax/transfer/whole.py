"""Which plans move as one program (`PlanPrograms`): a prefix's load-back or backup of every
allocator at once, on one device.

A plan qualifies when every allocator with bytes has exactly one chunk in it, in a shape
`warmup` compiles: any anchor chunk, the other allocators up to the trailing window. A backup
also needs each chunk to be one whole host run (a chunk cut into pieces has its own
`pack_cut`), and a load each chunk to be one whole host block (a power-of-two run of pages written
together), and it is read straight off the plan: that is a one-page hit's path, so it skips
the chunking the general path does.
"""
from __future__ import annotations

import numpy as np

from hicache_jax.plan import TransferPlan
from hicache_jax.pools import HostTier
from hicache_jax.transfer import chunks as chunking
from hicache_jax.transfer.programs import AllocatorPrograms


class WholePlans:
    def __init__(self, programs: dict[str, AllocatorPrograms], host: HostTier, anchor: str, window_pages: int,
                 on_mesh: bool):
        self._programs, self._host, self._anchor, self._on_mesh = programs, host, anchor, on_mesh
        self.window = chunking.next_pow2(max(1, window_pages))   # the largest non-anchor chunk

    def fits(self, allocators: list[str], pages: list[int]) -> bool:
        """Whether chunks of `pages` pages of `allocators` (plan order) make one program."""
        return (len(allocators) >= 2 and not self._on_mesh and set(allocators) == set(self._programs)
                and all(n <= self.window for a, n in zip(allocators, pages) if a != self._anchor))

    def backup_key(self, work) -> tuple[tuple[str, int], ...] | None:
        """The program key `((allocator, pages), ...)` of a backup whose every allocator packs
        one chunk that is one whole host run (`work`: the engine's `(programs, chunks)` per
        allocator), else None: a chunk cut into pieces packs and cuts in its own program."""
        if any(len(parts) != 1 or parts[0].whole_run_host_start is None for _, parts in work):
            return None
        key = tuple((progs.fmt.allocator, parts[0].padded_pages) for progs, parts in work)
        return key if self.fits([a for a, _ in key], [n for _, n in key]) else None

    def load(self, plan: TransferPlan, early: dict) -> tuple | None:
        """`(key, blocks, pages)` of a load that moves as one program: the key
        `((allocator, pages, on device), ...)`, each allocator's block (or its early copy, from
        `early`) and device pages; else None."""
        key, blocks, pages = [], [], []
        for batch in plan.batches:
            progs, n = self._programs.get(batch.allocator), batch.num_pages
            if progs is None or n == 0:           # moves nothing
                continue
            if n & (n - 1) or n > progs.chunk_pages or len(batch.host_runs) != 1:
                return None
            block = self._host.tables[batch.allocator].whole(batch.host_runs[0].host_start, n)
            if block is None:
                return None
            copied = early.get(id(block))
            key.append((batch.allocator, n, int(copied is not None)))
            blocks.append(block if copied is None else copied[1])
            pages.append(np.asarray(batch.device_pages, np.int32))
        if not self.fits([a for a, *_ in key], [n for _, n, _ in key]):
            return None
        return tuple(key), tuple(blocks), pages
