"""`HiCache`: the object a JAX serving loop embeds; where tree, allocators and engine meet.

Timing rules (SYSTEM.md §3-§4): backups found during a step are queued and merged into
one transfer dispatched at `step()`, except write-back demotions, whose device pages are
already free and are dispatched at once, before anything can write those pages again;
load-backs are dispatched at `load_back`. Completions are applied only in `step()` /
`wait()`, the one place where in-flight state ends. Device work is ordered: a model step
that reads `device_pools` after `load_back` sees the loaded pages, and a backup's reads
happen before any later step writes, so no call here blocks on a transfer except `wait`,
`drain`, and `acquire` / `alloc` when they come up short while backups are in flight (a
slow link must not turn into a refusal a fast one would not have given).

Serving-loop contract (see README): match -> lock -> (load_back -> wait) -> alloc -> model
steps with `device_pools` / `set_device_pools` -> insert + free -> unlock; `step()` once
per iteration.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

import jax
import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from hicache_jax import validate
from hicache_jax.config import HiCacheConfig
from hicache_jax.layout import PoolLayout
from hicache_jax.metrics import CacheStats, FailureCause, StatsCollector, Tally, snapshot
from hicache_jax.plan import Direction, TransferPlan
from hicache_jax.transfer import TransferEngine
from hicache_jax.transfer.engine import WARMUP_MAX_RUNS
from hicache_jax.tree import (EvictResult, InsertResult, LoadJob, LockId, MatchResult, NodeId, Refusal, TreeCore,
                              as_tokens)

log = logging.getLogger("hicache_jax")


@dataclasses.dataclass(frozen=True, eq=False)
class LoadBack:
    """The outcome of `load_back`.

    Started: `total_len` tokens are usable once `wait(...)` (or a `step()` reporting
    `"load:<load_id>"`) says it landed, and `lock` pins them, from the start, until the
    caller's `unlock(lock)`: whatever else the loop does meanwhile, `device_pages` (anchor
    pages of the whole prefix) and `swa_pages` (SWA pages of its trailing window) stay
    what they say. If the load fails, unlock it and use the match's device prefix.
    Refused: nothing was taken and `lock` is None; the match's device prefix is what
    there is (`device_pages`, `swa_pages`, `node` are the match's).
    """

    load_id: int | None
    refused: Refusal | None
    total_len: int
    loaded_tokens: int
    device_pages: np.ndarray
    swa_pages: np.ndarray
    node: NodeId
    lock: LockId | None = None

    @property
    def started(self) -> bool:
        return self.refused is None


@dataclasses.dataclass(frozen=True, eq=False)
class Prefix:
    """A prompt's usable cached prefix, pinned on device until `cache.unlock(prefix.lock)`.

    `length` tokens (page-aligned) whose anchor pages are `device_pages` and whose trailing
    window's SWA pages are `swa_pages`; `device_tokens` of them were already on device,
    `host_tokens` were loaded back. `refused` says why a host hit was not loaded, if so.
    """

    length: int
    device_pages: np.ndarray
    swa_pages: np.ndarray
    lock: LockId
    device_tokens: int
    host_tokens: int
    refused: Refusal | None = None


@dataclasses.dataclass(frozen=True)
class StepReport:
    dispatched_backup_tokens: int
    completed: tuple[str, ...]   # "backup:<ack>" / "load:<id>" completed this step
    failed: tuple[str, ...]      # the same for transfers that failed or timed out


@dataclasses.dataclass
class _InFlight:
    kind: Direction
    ident: int                   # ack id or load id
    plan: TransferPlan
    handle: object
    started: float
    host_tokens: int = 0         # a load's prompt tokens served from the host, counted when it lands


class HiCache:
    """A hierarchical KV cache for one model layout (see module docstring)."""

    def __init__(self, layout: PoolLayout, config: HiCacheConfig, mesh: jax.sharding.Mesh | None = None, *,
                 engine: TransferEngine | None = None, clock: Callable[[], float] = time.monotonic):
        if not isinstance(layout, PoolLayout):
            raise ValueError(f"HiCache takes a PoolLayout, got {type(layout).__name__}")
        if not isinstance(config, HiCacheConfig):
            raise ValueError(f"HiCache takes a HiCacheConfig, got {type(config).__name__}")
        if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
            raise ValueError(f"HiCache's mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
        if not callable(clock):
            raise ValueError(f"HiCache's clock must be a callable returning seconds, got {clock!r}")
        self.layout, self.config = layout, config
        device, host = config.page_counts(layout)
        self.core = TreeCore(layout, device_pages=device, host_pages=host, write_policy=config.write_policy,
                             write_threshold=config.write_through_threshold,
                             load_back_threshold=config.load_back_threshold)
        self.engine = engine if engine is not None else TransferEngine(
            layout, device, host, mesh, max_staging_bytes=config.max_staging_bytes,
            host_memory_limit_bytes=config.host_memory_limit_bytes)
        self._pools = self.engine.init_device_pools()
        self._inflight: list[_InFlight] = []
        self._clock = clock
        self.tally = Tally()
        self._requested_tokens = 0
        self._failed_loads: set[int] = set()   # failed loads not yet reported by `wait`
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(StatsCollector(self.stats, lambda: self.tally.durations,
                                              tuple(p.name for p in layout.byte_pools)))

    def warmup(self, max_pages: int | None = None, max_runs: int = WARMUP_MAX_RUNS) -> None:
        """Compile the transfer programs of every plan of up to `max_pages` pages per chunk in
        up to `max_runs` host runs, ahead of the first transfer (see `TransferEngine.warmup`)."""
        if max_pages is not None:
            validate.count("max_pages", max_pages, minimum=1)
        self.engine.warmup(max_pages, validate.count("max_runs", max_runs, minimum=1))

    # -- device pools ----------------------------------------------------------------------
    @property
    def device_pools(self) -> dict[str, jax.Array]:
        """`{pool: jax.Array}` the model reads and writes (donate them, then `set_device_pools`)."""
        return dict(self._pools)

    def set_device_pools(self, pools: Mapping[str, jax.Array]) -> None:
        """Adopt the pools a jitted step returned; wrong pools raise ValueError, nothing changes."""
        self.engine.check_device_pools(pools)
        self._pools = dict(pools)

    # -- read path -------------------------------------------------------------------------
    def match_prefix(self, tokens) -> MatchResult:
        """The longest usable prefix on device, and how much more a load-back would bring."""
        tokens = as_tokens(tokens)
        m = self.core.match_prefix(tokens)
        self._requested_tokens += len(tokens)
        self.tally.device_hit_tokens += m.device_len
        return self._checked(m)

    def load_back(self, match: MatchResult) -> LoadBack:
        """Bring the host part of `match` to the device, all or nothing.

        Refused (the caller recomputes) below the threshold, when the cost model says
        recomputing is faster, when another load owns a node, or without device space.
        """
        if not isinstance(match, MatchResult):
            raise ValueError(f"load_back takes a MatchResult, got {type(match).__name__}")
        return self._load_back(match, patient=False)

    def _load_back(self, match: MatchResult, patient: bool) -> LoadBack:
        """`load_back`; when `patient`, backups in flight that pin the room it needs are
        waited for rather than refused."""
        if self._not_worth_it(match):
            self.tally.refusals[Refusal.NOT_WORTH_IT.value] += 1
            return self._checked(self._refused(match, Refusal.NOT_WORTH_IT))
        job = self.core.start_load(match)
        self._flush_demotions()
        if job is Refusal.NO_DEVICE_SPACE and patient and self._land_backups():
            job = self.core.start_load(match)
            self._flush_demotions()
        if not isinstance(job, LoadJob):
            self.tally.refusals[job.value] += 1
            return self._checked(self._refused(match, job))
        if not self._start(Direction.LOAD, job.load_id, job.plan, host_tokens=job.total_len - match.device_len):
            self.core.unlock(job.lock)
            return self._checked(self._refused(match, Refusal.FAILED))
        return self._checked(LoadBack(job.load_id, None, job.total_len, job.loaded_tokens,
                                      job.device_pages, job.swa_pages, job.node, job.lock))

    def acquire(self, tokens, load_back: bool = True) -> Prefix:
        """match -> lock -> (load_back -> wait) in one call: the usable prefix, pinned.

        Blocks while its own load-back is in flight, and for backups in flight when it
        comes up short of device room or matches host copies they still write; a loop that
        serves other requests meanwhile uses `match_prefix` / `load_back` / `step` itself.
        A failed or refused load leaves the device part of the match, still pinned.
        """
        if not isinstance(load_back, (bool, np.bool_)):
            raise ValueError(f"acquire's load_back must be a bool, got {load_back!r}")
        tokens = as_tokens(tokens)
        m = self.match_prefix(tokens)
        if load_back and m.pending_len and self._land_backups():
            # the host copies it stopped at have landed: match again (the device part, and so
            # the hit tallies, cannot have changed: landing a backup moves no device page)
            m = self._checked(self.core.match_prefix(tokens))
        lock = self.lock(m.device_node)
        refused = None
        if load_back and m.host_len:
            lb = self._load_back(m, patient=True)
            if lb.started and self.wait(lb):
                self.unlock(lock)
                return Prefix(lb.total_len, lb.device_pages, lb.swa_pages, lb.lock,
                              m.device_len, lb.total_len - m.device_len)
            if lb.started:
                self.unlock(lb.lock)
            refused = lb.refused or Refusal.FAILED
        return Prefix(m.device_len, m.device_pages, m.swa_pages, lock, m.device_len, 0, refused)

    def _refused(self, match: MatchResult, why: Refusal) -> LoadBack:
        return LoadBack(None, why, match.device_len, 0, match.device_pages, match.swa_pages, match.device_node)

    def _not_worth_it(self, match: MatchResult) -> bool:
        cfg = self.config
        if cfg.recompute_seconds_per_token is None or match.host_len == 0:
            return False
        moved = match.host_len * self.layout.bytes_per_token() \
            + self.layout.window_pages() * self.layout.page_size * self.layout.window_bytes_per_token()
        return moved / cfg.link_bytes_per_second > match.host_len * cfg.recompute_seconds_per_token

    def wait(self, load: LoadBack) -> bool:
        """Block until `load` lands; True if its pages are valid, False if it failed (recompute).
        Either way its lock stays held until the caller unlocks it."""
        if not isinstance(load, LoadBack):
            raise ValueError(f"wait takes a LoadBack, got {type(load).__name__}")
        if not load.started:
            return False
        entry = next((e for e in self._inflight if e.kind is Direction.LOAD and e.ident == load.load_id), None)
        if entry is not None:
            self._complete(entry, blocking=True)
        if load.load_id in self._failed_loads:
            self._failed_loads.discard(load.load_id)
            return False
        return True

    # -- write path and pages -----------------------------------------------------------------
    def alloc(self, pages: int, swa_pages: int = 0) -> dict[str, np.ndarray] | None:
        """Held device pages for a request: {allocator: i32[n]} (the SWA pool's entry present
        whenever the layout has one), or None when even eviction cannot free enough.

        All or nothing: a bad count raises ValueError and a refusal returns None, both with
        nothing taken and nothing evicted (a request that eviction cannot satisfy is refused
        before anything is evicted). Pages under a backup cannot be evicted until it lands:
        when it comes up short while backups are in flight, this waits for them (dispatching
        queued ones first) and tries once more, so the answer does not depend on how fast
        the link is. The pages are the caller's until given to `insert` or `free`.
        """
        need = {self.core.anchor: validate.count("pages", pages)}
        swa_pages = validate.count("swa_pages", swa_pages)
        if self.core.swa is not None:
            need[self.core.swa] = swa_pages
        elif swa_pages:
            raise ValueError(f"swa_pages={swa_pages} but this layout has no SWA pool")
        if any(n > self.core.device[a].capacity - self.core.held_pages(a) for a, n in need.items()):
            return None     # more than every page not held by a request: waiting cannot help
        got = self.core.alloc_device(need)
        self._flush_demotions()
        if got is None and self._land_backups():
            got = self.core.alloc_device(need)
            self._flush_demotions()
        return self._checked(got)

    def _land_backups(self) -> bool:
        """Dispatch queued backups and wait for all in flight; False when there were none."""
        self._dispatch_backups()
        backups = [e for e in self._inflight if e.kind is Direction.BACKUP]
        for entry in backups:
            self._complete(entry, blocking=True)
        return bool(backups)

    def free(self, allocator: str, pages) -> None:
        """Give back held device pages that were not given to `insert` (i32 page ids of
        `allocator`, e.g. "kv" or "swa"). Pages not held by a request raise ValueError,
        nothing freed."""
        self.core.free_device(allocator, pages)
        self._checked(None)

    def insert(self, tokens, device_pages, swa_pages: Mapping[int, int] | None = None) -> InsertResult:
        """Register a request's computed pages (whole pages only); see `TreeCore.insert`."""
        return self._checked(self.core.insert(tokens, device_pages, swa_pages))

    def retract(self, tokens, device_pages, swa_pages: Mapping[int, int] | None = None) -> int:
        """A request leaves mid-flight: keep its whole pages, free the rest; return the
        length to resume from. State inside an unfinished page (the V4.1 ratio-2 pair ring,
        an unfinished C128 chunk, draft KV) is request-scoped and never backed up: the
        request recomputes from the returned length, it is never half-restored."""
        tokens = as_tokens(tokens)
        pages = validate.page_ids("device_pages", device_pages)
        whole = len(tokens) // self.layout.page_size
        swa = validate.page_map("swa_pages", swa_pages)
        keep = {k: v for k, v in swa.items() if k < whole}
        res = self.core.insert(tokens[: whole * self.layout.page_size], pages[:whole], keep)
        if pages.size > whole:
            self.core.free_device(self.core.anchor, pages[whole:])
        extra = [v for k, v in swa.items() if k >= whole]
        if extra:
            self.core.free_device(self.core.swa, extra)
        return self._checked(res.cached_len)

    def lock(self, node: NodeId) -> LockId:
        """Pin the prefix ending at `node` (a `MatchResult.device_node`) on device until
        `unlock`: its pages and its window's SWA pages are not evicted meanwhile. Lock right
        after `match_prefix`, before anything else can evict. A node whose pages are not
        (or no longer) on device raises ValueError."""
        return self._checked(self.core.lock(node))

    def unlock(self, lock: LockId) -> None:
        """Release a lock from `lock`, `acquire` (`Prefix.lock`) or `load_back` (`LoadBack.lock`)."""
        self.core.unlock(lock)
        self._checked(None)

    def evict(self, num_pages: int, swa_pages: int = 0) -> EvictResult:
        """Free at least `num_pages` anchor and `swa_pages` SWA device pages now, least
        recently used first (locked prefixes never): backed-up pages stay on the host,
        unbacked ones are backed up first under write-back, else dropped and counted.
        Returns what was freed (less when too little is evictable)."""
        res = self.core.evict_device(num_pages, swa_pages)
        self._flush_demotions()
        return self._checked(res)

    # -- the step boundary ------------------------------------------------------------------
    def step(self) -> StepReport:
        """Dispatch the merged backups of this step and apply every completed transfer."""
        tokens = self._dispatch_backups()
        completed, failed = [], []
        for entry in list(self._inflight):
            ok = self._complete(entry, blocking=False)
            if ok is True:
                completed.append(f"{entry.kind.value}:{entry.ident}")
            elif ok is False:
                failed.append(f"{entry.kind.value}:{entry.ident}")
        return self._checked(StepReport(tokens, tuple(completed), tuple(failed)))

    def drain(self) -> None:
        """Dispatch what is queued and wait for every transfer in flight."""
        self._dispatch_backups()
        for entry in list(self._inflight):
            self._complete(entry, blocking=True)
        self._checked(None)

    def _flush_demotions(self) -> None:
        if self.core.needs_flush:
            self._dispatch_backups()

    def _dispatch_backups(self) -> int:
        batch = self.core.take_backup_batch()
        if batch is None or not self._start(Direction.BACKUP, batch.ack_id, batch.plan):
            return 0
        return batch.tokens

    def _start(self, kind: Direction, ident: int, plan: TransferPlan, host_tokens: int = 0) -> bool:
        """Dispatch a transfer the tree has committed; if the engine raises, end it as failed."""
        try:
            self._pools, handle = self.engine.start(plan, self._pools)
        except Exception:
            log.exception("%s %d failed to start", kind.value, ident)
            self._fail(kind, ident, FailureCause.START)
            return False
        self._inflight.append(_InFlight(kind, ident, plan, handle, self._clock(), host_tokens))
        return True

    def _fail(self, kind: Direction, ident: int, cause: FailureCause) -> None:
        """The tree takes the transfer back (its nodes return to a consistent state); counted."""
        (self.core.fail_backup if kind is Direction.BACKUP else self.core.fail_load)(ident)
        self.tally.failures[(kind.value, cause.value)] += 1
        if kind is Direction.LOAD and cause is not FailureCause.START:   # a started load's `wait` reports it
            self._failed_loads.add(ident)

    def _complete(self, entry: _InFlight, blocking: bool) -> bool | None:
        """Apply `entry`'s completion if it has one: True done, False failed, None pending."""
        cause = None
        try:
            if blocking:
                entry.handle.wait()
                done = True
            else:
                done = entry.handle.done()
            if not done and self._clock() - entry.started > self.config.transfer_timeout_s:
                cause = FailureCause.TIMEOUT
        except Exception as e:
            log.error("%s %d failed: %s", entry.kind.value, entry.ident, e)
            cause = FailureCause.COMPLETION
        if cause is None and not done:
            return None
        self._inflight.remove(entry)
        if cause is not None:
            self._fail(entry.kind, entry.ident, cause)
            return False
        (self.core.ack_backup if entry.kind is Direction.BACKUP else self.core.finish_load)(entry.ident)
        self._account(entry)
        return True

    def _account(self, entry: _InFlight) -> None:
        t = self.tally
        tokens, nbytes = (t.backup_tokens, t.backup_bytes) if entry.kind is Direction.BACKUP else (t.load_tokens, t.load_bytes)
        for batch in entry.plan.batches:
            for name in batch.pools:
                tokens[name] += batch.num_pages * self.layout.page_size
        for name, b in entry.plan.pool_bytes(self.layout).items():
            nbytes[name] += b
        t.transfers[entry.kind.value] += 1
        t.host_hit_tokens += entry.host_tokens
        seconds = getattr(entry.handle, "seconds", None)
        t.observe(entry.kind.value, seconds if seconds is not None else self._clock() - entry.started)

    # -- introspection ------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        """A frozen snapshot of every number this cache counts (the same as `metrics_text`)."""
        return snapshot(self.layout, self.core, self.tally, self._requested_tokens,
                        {d.value: sum(e.kind is d for e in self._inflight) for d in Direction})

    def metrics_text(self) -> str:
        """The Prometheus text exposition of this cache's metrics."""
        return generate_latest(self.registry).decode()

    def check_invariants(self) -> None:
        """Recompute every conservation law of the control plane; validate the device pools."""
        self.core.check_invariants()
        self.engine.check_device_pools(self._pools)
        in_core = {(Direction.BACKUP, a) for a in self.core.pending_acks()} | \
                  {(Direction.LOAD, i) for i in self.core.loads_in_flight()}
        here = {(e.kind, e.ident) for e in self._inflight}
        if in_core != here:
            raise AssertionError(f"bug: transfers in flight disagree: tree {sorted(in_core)}, engine {sorted(here)}")

    def _checked(self, value):
        if self.config.check_invariants:
            self.check_invariants()
        return value
