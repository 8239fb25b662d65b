"""`StorageLink`: the storage tier (L3) as `HiCache` uses it.

Down (L2 -> L3): a host copy is written to the store when it becomes durable
(`storage_write_policy="write_through"`, on each backup's ack) or when the host tier
evicts it ("write_back"); its rows are copied out of the host tier at that moment, so the
write never holds host pages. Objects the store already has are skipped.

Up (L3 -> L2): when a prompt reaches past what the tree holds, one batched lookup asks
the store how many of the following pages (and the window at that stop) it holds; only
then are host pages reserved (`TreeCore.start_prefetch`), and the pages are read into
staging rows in the background. When the reads end, the rows that verified are written
into the reserved host pages and attached to the tree; the rest of the reservation is
freed. A store that fails or stalls only makes lookups and reads come back empty.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import jax.numpy as jnp
import numpy as np

from hicache_jax.config import HiCacheConfig, StorageConfig, StorageWritePolicy
from hicache_jax.layout import PoolLayout
from hicache_jax.plan import Direction
from hicache_jax.storage import (GetResult, MissReason, StorageBackend, StorageOp, StorageStats, StorageTier,
                                 open_backend)
from hicache_jax.transfer import TransferEngine
from hicache_jax.tree import HostCopy, NodeId, PrefetchJob, TransferId, TreeCore, as_tokens
from hicache_jax.tree.match import cap_tokens

log = logging.getLogger("hicache_jax.storage")
RETRY_PAUSE_S = 0.5   # between attempts to reach a store that is down


class UnreachableBackend:
    """Stands for a store that could not be opened: every call fails, so the tier counts it
    and stays degraded, and the cache serves from L1/L2 only."""

    def __init__(self, url: str, error: BaseException):
        self.name, self.error = f"unreachable:{url}", error

    def _fail(self, *_args):
        raise ConnectionError(f"storage {self.name[12:]} could not be opened: {self.error}")

    contains = exists = get = put = _fail

    def register(self, array) -> None:
        return None

    def close(self) -> None:
        return None


def open_store(config: StorageConfig) -> StorageBackend:
    """The backend `config.url` names. A store that cannot be reached is tried again for
    `connect_retry_s` seconds (0: once), then stands in as unreachable; `StorageLink` says so
    in one log line (a malformed URL raises ValueError)."""
    url = config.url
    deadline = time.monotonic() + config.connect_retry_s
    while True:
        try:
            return open_backend(url, config.call_timeout_s)
        except ValueError:
            raise
        except Exception as e:           # down, refused, missing library: serve without L3
            left = deadline - time.monotonic()
            if left <= 0 or isinstance(e, ImportError):
                return UnreachableBackend(url, e)
            time.sleep(min(RETRY_PAUSE_S, left))


@dataclasses.dataclass
class _Prefetch:
    job: PrefetchJob
    reads: dict[str, StorageOp[GetResult]]   # allocator -> its read
    rows: dict[str, np.ndarray]              # allocator -> staging rows the read fills


class StorageLink:
    def __init__(self, layout: PoolLayout, config: HiCacheConfig, core: TreeCore, engine: TransferEngine,
                 backend: StorageBackend, tp: int):
        self._layout, self._config, self._core, self._engine = layout, config.storage, core, engine
        self.tier = StorageTier(layout, backend, config.storage, tp=tp)
        if isinstance(backend, UnreachableBackend):   # the one log line; later probes fail quietly
            self.tier.guard.failed("open", MissReason.ERROR, f"{backend.name[12:]} could not be opened: {backend.error}")
        self._writes: list[StorageOp] = []
        self._page = layout.page_size
        if self._config.write_policy is StorageWritePolicy.WRITE_BACK:
            core.on_host_evict(self.write)

    # -- up: storage -> host --------------------------------------------------------------
    def prefetch(self, tokens) -> TransferId | None:
        """Start bringing the pages of `tokens` the store holds past the tree's coverage into
        the host tier; None when there is nothing to bring (a miss costs one lookup)."""
        tokens = as_tokens(tokens)
        usable = tokens[: cap_tokens(len(tokens), self._page)]
        start = self._core.coverage(usable)
        if start * self._page >= len(usable):
            return None
        hashes = self.tier.page_hashes(usable)
        found = self.tier.usable_prefix(hashes[start:])
        if not found:
            return None
        job = self._core.start_prefetch(usable, start, found)
        if not isinstance(job, PrefetchJob):
            return None
        reads, rows = {}, {}
        for allocator, logical in job.logical_pages.items():
            if logical.size == 0 or allocator not in self._engine.host.formats:
                continue
            fmt = self._engine.host.formats[allocator]
            rows[allocator] = np.empty((logical.size, fmt.row_elems), np.dtype(jnp.dtype(fmt.dtype)))
            reads[allocator] = self.tier.get_pages(allocator, [hashes[i] for i in logical], rows[allocator],
                                                   np.arange(logical.size))
        self._core.attach(job.transfer, _Prefetch(job, reads, rows))
        return job.transfer

    def finish(self, tid: TransferId, wait_s: float | None = 0.0) -> tuple[int, int] | None:
        """End prefetch `tid` if its reads have returned (waiting up to `wait_s`, None: up to
        the call timeout): attach what arrived. Returns the attached pages (first, end), or
        None while it is still in flight."""
        p = self._core.carrier(tid)
        limit = self._config.call_timeout_s if wait_s is None else wait_s
        if not all(op.wait(limit) if limit else op.done() for op in p.reads.values()):
            return None
        job, anchor = p.job, self._core.anchor
        results = {a: op.result() for a, op in p.reads.items()}
        served = results[anchor].served if anchor in results else job.pages
        if any(r.served < r.pages for a, r in results.items() if a != anchor):
            served = min(served, job.pages - 1)     # the stop's window is incomplete
        for allocator, rows in p.rows.items():
            logical = job.logical_pages[allocator]
            n = int(np.count_nonzero(logical < job.start + served)) if allocator != anchor else served
            if n:
                self._engine.write_host_rows(allocator, job.host_pages[allocator][:n], rows[:n])
        return self._core.finish_prefetch(job.prefetch_id, served)

    def in_flight(self) -> list[TransferId]:
        """The prefetches in flight (from the tree's registry)."""
        return sorted((t for t in self._core.in_flight() if t.direction is Direction.PREFETCH), key=lambda t: t.number)

    # -- down: host -> storage --------------------------------------------------------------
    def written(self, nodes: list[NodeId]) -> None:
        """Backups of `nodes` were acknowledged: under write-through, store their host copies."""
        if self._config.write_policy is StorageWritePolicy.WRITE_THROUGH:
            for node in nodes:
                copy = self._core.host_copy(node)
                if copy is not None:
                    self.write(copy)

    def write(self, copy: HostCopy | None) -> None:
        """Store one host copy (its rows are read out of the host tier now)."""
        if copy is None:
            return
        hashes = self.tier.page_hashes(copy.tokens)
        for allocator, host_pages in copy.host_pages.items():
            if host_pages.size == 0 or allocator not in self._engine.host.formats:
                continue
            rows = self._engine.read_host_rows(allocator, host_pages)
            pages = [hashes[i] for i in copy.logical_pages[allocator]]
            self._writes.append(self.tier.put_pages(allocator, pages, rows, np.arange(len(pages))))
        self._writes = [op for op in self._writes if not op.done()]

    # -- the rest -----------------------------------------------------------------------------
    def drain(self) -> None:
        """End every prefetch, waiting for each at most the call timeout (a read that overruns
        it is abandoned: it only ever writes its own staging rows), and wait for writes."""
        for tid in self.in_flight():
            if self.finish(tid, wait_s=None) is None:
                self._core.finish_prefetch(self._core.carrier(tid).job.prefetch_id, 0)
        for op in self._writes:
            op.wait(self._config.call_timeout_s)
        self._writes = [op for op in self._writes if not op.done()]

    def stats(self) -> StorageStats:
        return self.tier.stats()

    def close(self) -> None:
        self.tier.close()
